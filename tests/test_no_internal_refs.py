"""Code, tests and docs cite what a reader of the repository can follow: no issue-tracker numbers ("issue #9",
"(#10)") and no files outside the repository (the team's reference notes, ``../shared``); a figure cites its
public source and a design argument its NOTE name."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".toml", ".txt", ".proto"}

_SHARED = "shared"
_NOTES = ("paper", "simulators", "runtimes", "llm-published", "style")
INTERNAL_REF = re.compile(
    r"\bissues?\s*#?\d+"  # issue 3, issue #9, issues #9
    r"|\(#\d+\b"  # (#10)
    r"|\bPR\s*#\d+"  # PR #12
    rf"|{_SHARED}/reference|\.\./{_SHARED}\b"  # the team's reference folder, outside the repository
    rf"|(?<![\w/-])(?:{'|'.join(_NOTES)})\.md\b",  # its notes, cited by bare name
    flags=re.IGNORECASE,
)
"""What a reference outside the repository looks like. Names of the team's notes that the repository does
not have (``docs/`` has ``hardware.md`` and ``planners.md`` of its own, so those are not listed)."""



def _scanned() -> list[Path]:
    """src/, tests/, docs/ (text files), README.md and benchmarks/*.py; not benchmarks/RESULTS.md, which
    records dated runs, and not this file, whose patterns name what it looks for."""
    files = [p for top in ("src", "tests", "docs") for p in (REPO / top).rglob("*")
             if p.is_file() and p.suffix in _TEXT_SUFFIXES and "__pycache__" not in p.parts]
    files += [REPO / "README.md", *(REPO / "benchmarks").glob("*.py")]
    return sorted(p for p in files if p.resolve() != Path(__file__).resolve())


def _hits(text: str) -> list[str]:
    return [m.group(0) for m in INTERNAL_REF.finditer(text)]


def test_pattern_finds_each_kind_of_internal_reference() -> None:
    """The pattern catches issue numbers, (#N), PR numbers and the reference folder and notes, and leaves
    upstream references (pytorch#84907), NOTE names, in-repo docs and numbered items alone."""
    bad = ("see issue #9", "(issue 3)", "Modern presets (#10)", "PR #12", f"{_SHARED}/reference/hardware.md",
           f"../{_SHARED}/x", "(paper.md: 3 rings)", "via simulators.md 2")
    good = ("the save_on_cpu trap of pytorch#84907", "NOTE [plan budgets]", "docs/hardware.md", "docs/planners.md",
            "saved tensor #13 (module 'body.3')", "in issue order", "item 6 of the list")
    assert [t for t in bad if not _hits(t)] == []
    assert [t for t in good if _hits(t)] == []


def test_no_issue_numbers_or_outside_files_in_code_tests_and_docs() -> None:
    """No scanned file cites an issue number or a file outside the repository."""
    found = {}
    for path in _scanned():
        name = path.relative_to(REPO).as_posix()
        hits = _hits(path.read_text(errors="replace"))
        if hits:
            found[name] = hits
    assert found == {}


