"""``mcdla examples``: list the example files shipped with the package, or copy them to a directory.

The examples live in the installed package (``mcdla/examples/``; ``examples/`` in a source checkout is a link
to the same files), so a user who installed mcdla from a wheel gets the same system, workload, execution
record, plan and scripts that the README and the tutorial use.
"""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Optional

import typer

from mcdla.cli._app import app, console, fail
from mcdla.errors import brief

__all__ = ["example_files", "describe"]


def example_files() -> list[Path]:
    """The shipped example files, as paths relative to the examples directory, sorted."""
    root = Path(str(files("mcdla") / "examples"))
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _root() -> Path:
    return Path(str(files("mcdla") / "examples"))


def describe(relative: Path) -> str:
    """One line saying what an example is: its first comment or docstring line, or a JSON file's format."""
    path = _root() / relative
    text = path.read_text()
    if path.suffix == ".json":
        doc = json.loads(text)
        return f"{doc.get('format', 'JSON')} document for workload {doc.get('workload', '?')}"
    for line in text.splitlines():
        stripped = line.strip().removeprefix('"""').strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            return stripped
    return ""


@app.command("examples")
def examples_cmd(
    copy: Annotated[Optional[Path], typer.Option(
        "--copy", help="Copy every example into this directory (created if missing; existing files are kept).")] = None,
) -> None:
    """List the example files shipped with mcdla (system, workload, LLM execution record, plan, scripts)."""
    names = example_files()
    if copy is None:
        from rich.table import Table

        table = Table(title=f"examples in {_root()}", title_justify="left", box=None, show_header=False)
        table.add_column("file", no_wrap=True)
        table.add_column("what")
        for name in names:
            table.add_row(name.as_posix(), describe(name))
        console.print(table)
        return
    if copy.exists() and not copy.is_dir():
        fail(f"--copy: got {brief(str(copy), 200)}; it is a file, must be a directory")
    written = kept = 0
    for name in names:
        target = copy / name
        if target.exists():
            kept += 1
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_root() / name, target)
        except OSError as exc:
            fail(f"--copy: got {brief(str(copy), 200)}; cannot write {name.as_posix()} "
                 f"({exc.strerror or type(exc).__name__})")
        written += 1
    console.print(f"copied {written} example file(s) to {copy}" + (f" ({kept} already there, kept)" if kept else ""))
