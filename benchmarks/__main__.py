"""Run every benchmark module (``python -m benchmarks``) or the ones named (``python -m benchmarks sim plan``).

Benchmarks are measurements, not tests: each prints ratios against a baseline measured in the same run and
appends its table to ``benchmarks/RESULTS.md``. GPU scripts (``gpu_*.py``) are not run here.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name.removeprefix("bench_") for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    chosen = argv or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"benchmarks: got {unknown[0]!r}; must be one of {', '.join(names)}", file=sys.stderr)
        return 2
    for name in chosen:
        print(f"== benchmarks.bench_{name}", flush=True)
        module = importlib.import_module(f"benchmarks.bench_{name}")
        sys.argv = [f"benchmarks.bench_{name}"]  # each benchmark parses its own (default) options
        module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
