"""The typer app shared by the command modules, the one-line failure helper and the checks of option values
that every command shares (batch, budget, output paths, devices, strict JSON output)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mcdla.errors import brief
from mcdla.units import format_bytes, parse_bytes

__all__ = ["app", "console", "fail", "check_batch", "check_budget", "check_finite", "check_output", "check_torch_device",
           "key_value_table", "print_json", "strict_json", "write_output"]

app = typer.Typer(
    name="mcdla",
    help="Simulate, plan, run and profile deep-learning training past the device-memory wall (MC-DLA).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
_FILE_WIDTH = 1000
"""Columns of output to a pipe or a file: room for any row, so no table cuts a name (a terminal keeps its own)."""
console = Console(highlight=False, width=None if sys.stdout.isatty() else _FILE_WIDTH)

MAX_BATCH = 2**31 - 1
_MAX_MESSAGE = 600


def _print_version(value: bool) -> None:
    """``--version``: print the installed package's version (pyproject.toml's, via its metadata) and stop."""
    if value:
        from mcdla import __version__

        print(f"mcdla {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """The options of ``mcdla`` itself (``--version``); the app's help text is the Typer's."""


def key_value_table(rows: Sequence[tuple[str, str]]) -> Table:
    """Two left-aligned columns (name, value) without borders: the summary a command prints. The cells are
    plain text (a value such as a file name with ``[...]`` in it is not read as markup)."""
    table = Table.grid(padding=(0, 3))
    table.add_column(no_wrap=True)
    table.add_column()
    for name, value in rows:
        table.add_row(Text(name), Text(value))
    return table


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``mcdla: error: <message>`` on one line (at most a few hundred characters) to stderr and exit."""
    first = " ".join(str(message).split())
    if len(first) > _MAX_MESSAGE:
        first = first[: _MAX_MESSAGE - 3] + "..."
    print(f"mcdla: error: {first}", file=sys.stderr)
    raise SystemExit(code)


def check_batch(batch: int | None, option: str = "--batch") -> None:
    """Fail unless ``batch`` is None or an integer in [1, 2**31 - 1]."""
    if batch is not None and not 1 <= batch <= MAX_BATCH:
        fail(f"{option}: got {brief(batch)}; must be >= 1 and <= {MAX_BATCH}")


def check_budget(text: str | None, option: str, memory_bytes: float, device: str) -> float:
    """The byte budget ``text`` (None: the device's memory), which must carry a unit and fit the device.

    A bare number (``--budget 12``) is refused as ambiguous; write ``12B``, ``96MiB`` or ``16GiB``. A budget
    above ``memory_bytes`` (the memory of ``device``) is refused: no plan can use memory the device lacks.
    """
    if text is None:
        return memory_bytes
    budget = parse_bytes(text, option, require_unit=True)
    if not budget > 0:
        fail(f"{option}: got {brief(text)}; must be > 0")
    if budget > memory_bytes:
        fail(f"{option}: got {brief(text)}; must be at most the memory of {device} ({format_bytes(memory_bytes)})")
    return budget


def check_output(path: Path | None, option: str) -> None:
    """Fail early unless ``path`` can be written as a file: not a directory, in an existing writable one."""
    if path is None:
        return
    shown = brief(str(path), 200)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        name_max = os.pathconf(parent if parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > name_max:
        fail(f"{option}: got {shown}; a path component has {longest} bytes, must be at most {name_max}")
    try:
        path.is_dir()
    except OSError as exc:
        fail(f"{option}: got {shown}; not a usable path ({exc.strerror or type(exc).__name__})")
    if path.is_dir():
        fail(f"{option}: got {shown}; it is a directory, must be a file path")
    if not parent.is_dir():
        fail(f"{option}: got {shown}; directory {brief(str(parent), 200)} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(f"{option}: got {shown}; not writable (permission denied)")


def write_output(path: Path, text: str, option: str) -> None:
    """Write ``text`` to ``path``; an OS error becomes a one-line failure naming ``option``."""
    try:
        path.write_text(text)
    except OSError as exc:
        fail(f"{option}: got {brief(str(path), 200)}; cannot write it ({exc.strerror or type(exc).__name__})")


def check_torch_device(device: str | None, option: str = "--device") -> None:
    """Fail unless ``device`` (if given) names a torch device that exists on this machine."""
    if device is None:
        return
    import torch  # the commands that take a device need torch anyway

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        fail(f"{option}: got {brief(device)}; must be a torch device such as cpu, cuda or cuda:0")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            fail(f"{option}: got {brief(device)}; CUDA is not available on this machine (use cpu)")
        if dev.index is not None and dev.index >= count:
            fail(f"{option}: got {brief(device)}; this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif dev.type not in ("cpu", "cuda"):
        fail(f"{option}: got {brief(device)}; must be cpu or cuda[:N]")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (inf, NaN) replaced by None, so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _first_non_finite(value: Any, path: str) -> str | None:
    """The dotted path of the first non-finite float in ``value`` (a dict/list tree), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _first_non_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def check_finite(data: Any, what: str) -> None:
    """Fail (one line naming the field) unless every float in the result ``data`` is finite.

    The last guard before a result is printed: an input at the edge of its bounds must not turn into an
    ``inf`` or ``NaN`` time that a table shows or a ranking calls fastest.
    """
    where = _first_non_finite(data, "")
    if where is not None:
        value = data
        for key in where.split("."):
            value = value[int(key) if isinstance(value, (list, tuple)) else key]
        fail(f"{what}.{where}: got {value}; the inputs give no finite result (check the system's bandwidths, "
             "peaks and the execution's factors)")


def strict_json(data: Any, indent: int | None = 2) -> str:
    """``data`` as strict JSON text: ``Infinity``/``NaN`` become ``null`` (never invalid JSON)."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False, default=lambda v: _finite(float(v)))


def print_json(data: Any) -> None:
    """Print ``data`` as strict JSON (see :func:`strict_json`)."""
    print(strict_json(data))
