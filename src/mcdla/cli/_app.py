"""The typer app shared by the command modules, and the one-line failure helper."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

__all__ = ["app", "console", "fail"]

app = typer.Typer(
    name="mcdla",
    help="Simulate, plan, run and profile deep-learning training past the device-memory wall (MC-DLA).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def fail(message: str) -> NoReturn:
    """Print ``mcdla: error: <message>`` on one line to stderr and exit 2."""
    first = " ".join(str(message).split())
    print(f"mcdla: error: {first}", file=sys.stderr)
    raise SystemExit(2)
