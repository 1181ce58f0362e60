"""The docs check: every ``mcdla`` command in README.md and docs/*.md runs and exits as documented.

The commands are read from the docs, not listed here: each line of a fenced ``sh`` (``bash``, ``shell``,
``console``) block that starts with ``mcdla``, ``.venv/bin/mcdla`` or ``$ mcdla`` is one command; a trailing
``\\`` joins the next line; a ``# ...`` comment is dropped, except that ``# exits N`` documents a non-zero exit
status; optional parts written ``[--json]`` are left out (the command runs in its shortest documented form).
The commands of one block run in order in one fresh directory that holds the shipped examples under
``examples/`` (as a checkout does), so a block may use what an earlier command of it wrote.

The default suite runs every command for real except those of the commands in ``_HEAVY`` (minutes, or tens
of seconds, each), whose command lines it only parses (option names, types and choices; click's parser
without the command's body), together with the rest of their block; the slow suite runs every command for
real.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from mcdla.cli import _register, app, main

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
EXAMPLES = REPO / "src" / "mcdla" / "examples"
# Commands that take tens of seconds to minutes (reproduce ~1-5 min, validate ~20 s-5 min, probe ~25 s,
# search ~10 s): the default suite only parses their command lines.
_HEAVY = frozenset({"reproduce", "validate", "probe", "search"})
_SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```", re.S | re.M)
_PREFIX = re.compile(r"^(?:\$\s+)?(?:\S*/)?mcdla(?=\s|$)")
_EXITS = re.compile(r"#.*\bexits?\s+(?:with\s+)?(?:status\s+)?(?P<code>\d+)")


@dataclass(frozen=True)
class Command:
    """One documented command line: its arguments after ``mcdla`` and the exit status the docs give."""

    argv: tuple[str, ...]
    exit_code: int
    line: int

    @property
    def heavy(self) -> bool:
        return bool(self.argv) and self.argv[0] in _HEAVY


@dataclass(frozen=True)
class Block:
    """The commands of one fenced shell block, in order."""

    where: str
    commands: tuple[Command, ...]


def _logical_lines(body: str, first_line: int) -> list[tuple[int, str]]:
    """The block's lines with ``\\`` continuations joined, each with its line number in the file."""
    out: list[tuple[int, str]] = []
    pending, start = "", first_line
    for offset, raw in enumerate(body.splitlines()):
        if not pending:
            start = first_line + offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def parse_command(text: str, line: int) -> Command | None:
    """The command on one logical line, or None when the line is not an ``mcdla`` command."""
    stripped = text.strip()
    prefix = _PREFIX.match(stripped)
    if prefix is None:
        return None
    exits = _EXITS.search(stripped)
    rest = re.sub(r"\[[^\[\]]*\]", " ", stripped[prefix.end():])  # optional parts: left out
    argv = tuple(shlex.split(rest, comments=True))
    return Command(argv=argv, exit_code=int(exits.group("code")) if exits else 0, line=line)


def extract_blocks(path: Path) -> list[Block]:
    """Every fenced shell block of ``path`` that holds at least one ``mcdla`` command."""
    text = path.read_text()
    blocks = []
    for fence in _FENCE.finditer(text):
        if fence.group("lang").lower() not in _SHELL_LANGS:
            continue
        first = text.count("\n", 0, fence.start("body")) + 1
        commands = tuple(c for n, s in _logical_lines(fence.group("body"), first) if (c := parse_command(s, n)))
        if commands:
            blocks.append(Block(where=f"{path.relative_to(REPO)}:{first}", commands=commands))
    return blocks


BLOCKS = [block for doc in DOCS for block in extract_blocks(doc)]


def _run(argv: tuple[str, ...], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out.out + out.err


def _parse_only(argv: tuple[str, ...]) -> None:
    """Check a command line against the CLI's options (names, types, choices) without running it."""
    _register()
    group = typer.main.get_command(app)
    name, *args = argv
    command = group.get_command(None, name)
    assert command is not None, f"no command {name!r}"
    command.make_context(name, list(args))


def _check_block(block: Block, tmp_path: Path, monkeypatch, capsys, *, for_real: bool) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    parse_rest = False
    for command in block.commands:
        shown = f"{block.where.split(':')[0]}:{command.line}: mcdla {shlex.join(command.argv)}"
        parse_rest = parse_rest or (command.heavy and not for_real)
        if parse_rest:
            _parse_only(command.argv)
            continue
        code, output = _run(command.argv, capsys)
        assert code == command.exit_code, f"{shown}\nexited {code}, documented {command.exit_code}:\n{output[-2000:]}"


def test_the_docs_have_commands() -> None:
    """The extractor finds the README's commands (a check that reads nothing would pass trivially)."""
    readme = [c for b in BLOCKS if b.where.startswith("README.md") for c in b.commands]
    assert len(readme) >= 5 and all(c.argv for c in readme)


def test_extractor_reads_continuations_options_and_exit_status() -> None:
    """Continuations join, ``[...]`` parts drop, comments drop, and ``# exits 1`` sets the status."""
    lines = _logical_lines("mcdla simulate --system a \\\n  --workload b [--json]   # exits 1\nmake x\n", 10)
    assert [n for n, _ in lines] == [10, 12]
    command = parse_command(lines[0][1], lines[0][0])
    assert command == Command(argv=("simulate", "--system", "a", "--workload", "b"), exit_code=1, line=10)
    assert parse_command(".venv/bin/mcdla plan --out p.json  # a plan", 1).argv == ("plan", "--out", "p.json")
    assert parse_command(lines[1][1], 12) is None


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_documented_commands_run(block: Block, tmp_path, monkeypatch, capsys) -> None:
    """Each documented command exits with its documented status (heavy ones: their command line parses)."""
    _check_block(block, tmp_path, monkeypatch, capsys, for_real=False)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if any(c.heavy for c in b.commands)], ids=lambda b: b.where)
def test_documented_heavy_commands_run_for_real(block: Block, tmp_path, monkeypatch, capsys) -> None:
    """The blocks with heavy commands, every command run for real."""
    _check_block(block, tmp_path, monkeypatch, capsys, for_real=True)
