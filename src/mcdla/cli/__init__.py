"""The ``mcdla`` command line: one typer app, one module per command group.

User mistakes (any :class:`mcdla.errors.McdlaError`, or a bad option value) print one line on stderr and exit
with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from mcdla.cli._app import app, fail
from mcdla.errors import McdlaError

__all__ = ["app", "main"]


_COMMAND_MODULES = ("sim_cmd", "plan_cmd", "runtime_cmd", "validate_cmd")


def _register() -> None:
    """Import each command module present; importing one adds its commands to ``app``."""
    for name in _COMMAND_MODULES:
        if importlib.util.find_spec(f"mcdla.cli.{name}") is not None:
            importlib.import_module(f"mcdla.cli.{name}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``mcdla`` console script."""
    _register()
    try:
        app(args=argv, standalone_mode=True)
    except McdlaError as exc:
        fail(str(exc))
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)
