"""Recording benchmark tables in ``benchmarks/RESULTS.md`` (each in its own marked section)."""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def context() -> str:
    """Date, interpreter and the machine's load when the run ended (others' jobs share this machine)."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{date.today()}, Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {load}")


def record(name: str, title: str, command: str, text: str, path: Path = RESULTS) -> None:
    """Replace the section of benchmark ``name`` in RESULTS.md, or append it."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n## {title}\n\n`{command}` ({context()}).\n\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end) + 1 :]
    else:
        new = old.rstrip() + "\n\n" + block
    path.write_text(new)


def markdown_table(header: tuple[str, ...] | list[str], rows: list[tuple[str, ...]]) -> str:
    """A Markdown table of string cells (stripped), as RESULTS.md sections hold them."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.strip() for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def bench_parser(doc: str | None, **kwargs: str) -> argparse.ArgumentParser:
    """A benchmark's command line: described by its docstring's first line, with ``--no-record`` (print the
    table, leave RESULTS.md alone)."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None, **kwargs)
    parser.add_argument("--no-record", action="store_true", help="Print only; leave RESULTS.md alone.")
    return parser


def print_and_record(args: argparse.Namespace, name: str, title: str, command: str, text: str) -> None:
    """Print ``text`` and, unless ``--no-record`` was given, record it as benchmark ``name``'s section."""
    print(text)
    if not args.no_record:
        record(name, title, command, text)


def run_table(argv: list[str] | None, doc: str | None, name: str, title: str, command: str,
              table: Callable[[], str]) -> None:
    """The whole ``main()`` of a benchmark whose only option is ``--no-record``: parse ``argv``, build the table,
    print and record it."""
    print_and_record(bench_parser(doc).parse_args(argv), name, title, command, table())
