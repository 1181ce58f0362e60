"""The header every results file carries: which mcdla, which commit, which command, when and where.

A results file read weeks later must say what produced it. :func:`results_meta` gathers that once per file;
:func:`write_results_json` writes ``{"meta": ..., "rows": [...]}`` and :func:`write_results_csv` writes the
same header as ``# key: value`` lines before the CSV header row (``pandas.read_csv(path, comment="#")``,
or skip the lines that start with ``#``).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["results_meta", "meta_comment_lines", "write_results_json", "write_results_csv"]

_GIT_TIMEOUT_S = 5.0


def _git_commit() -> str | None:
    """The commit of the git checkout mcdla is imported from (``+dirty`` with local changes), or None.

    None also for an installed copy that merely sits inside some other repository (a virtualenv in a
    project's checkout): the commit counts only when git tracks this very file."""
    here = Path(__file__).resolve()
    where = here.parent
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", here.name], cwd=where, capture_output=True,
                                 text=True, timeout=_GIT_TIMEOUT_S, check=False)
        if tracked.returncode != 0:
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def results_meta(command: Sequence[str] | None = None) -> dict[str, Any]:
    """The header of a results file.

    Args:
        command: the command line that produced the file (default: this process's ``sys.argv``).
    """
    from mcdla import __version__

    argv = list(sys.argv if command is None else command)
    return {
        "mcdla_version": __version__,
        "git_commit": _git_commit(),
        "command": shlex.join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()})",
    }


def meta_comment_lines(meta: Mapping[str, Any] | None = None) -> str:
    """``meta`` (default: :func:`results_meta`) as ``# key: value`` lines, the header of a CSV results file."""
    header = results_meta() if meta is None else meta
    return "".join(f"# {key}: {' '.join(str(value).split())}\n" for key, value in header.items())


def write_results_json(path: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``{"meta": meta, "rows": rows}`` (``meta`` default: :func:`results_meta`) to ``path``."""
    data = {"meta": dict(results_meta() if meta is None else meta), "rows": [dict(r) for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_results_csv(path: Path, rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str],
                      meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``rows`` as CSV under ``# key: value`` header lines (``meta`` default: :func:`results_meta`)."""
    with path.open("w", newline="") as f:
        f.write(meta_comment_lines(meta))
        writer = csv.DictWriter(f, fieldnames=list(fieldnames), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path
