"""What the GPU check scripts (``gpu_runtime_check``, ``gpu_state_offload_check``) share: their command line, the
choice of device, the seeded token batches, running their parts under a time budget so that one failing or late
part loses none of the others' figures, and writing the results as JSON and Markdown under ``--out``.

The scripts run on a borrowed device machine with minutes of time, so every part is recorded, an error as one
line, and the files are written even when some parts are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def check_parser(doc: str, tiny_help: str) -> argparse.ArgumentParser:
    """The options every check takes: ``--out`` (default ``$OUT``), ``--tiny`` and ``--max-minutes``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--tiny", action="store_true", help=tiny_help)
    ap.add_argument("--max-minutes", type=float, default=8.0, help="skip the remaining parts after this")
    return ap


def pick_device(name: str, tiny: bool) -> str | None:
    """``cuda``, or ``cpu`` with ``--tiny``; None (after a one-line message) without a CUDA device otherwise."""
    import torch

    if tiny:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    print(f"{name}: no CUDA device; use --tiny for the CPU smoke test", file=sys.stderr)
    return None


def token_batch(cfg: dict[str, int], batch: int, device: str) -> tuple:
    """Seeded random tokens ``(batch, seq)`` and their next-token targets, the same in every check."""
    import torch

    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg["vocab"], (batch, cfg["seq"]), generator=g)
    return idx.to(device), torch.roll(idx, -1, 1).to(device)


def run_parts(parts: Iterable[tuple[str, Callable[[], dict[str, Any]]]], results: dict[str, Any], *,
              started: float, max_minutes: float, cuda: bool) -> None:
    """Run each ``(name, part)`` into ``results[name]``: skipped past ``max_minutes`` since ``started``, an
    exception recorded as its first line, the CUDA cache emptied between parts."""
    import torch

    for name, part in parts:
        if time.perf_counter() - started > 60 * max_minutes:
            results[name] = {"error": f"skipped: past --max-minutes {max_minutes}"}
            continue
        try:
            results[name] = part()
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others' figures
            results[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        if cuda:
            torch.cuda.empty_cache()


def write_results(out: Path, name: str, results: dict[str, Any], markdown: str) -> None:
    """``out/name.json`` and ``out/name.md``; the Markdown printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (out / f"{name}.md").write_text(markdown)
    print(markdown)
