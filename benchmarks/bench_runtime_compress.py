"""The compress tier against the plain file tier on incompressible and compressible floats, same run.

Three tiers write and read back the same blocks (``--blocks`` of ``--block-mib`` MiB, float32) in a temporary
directory through the page cache: the plain file tier, ``compress(file)`` as it is (a sample decides whether a
block is stored raw: NOTE [incompressible blocks] in ``mcdla.runtime.tiers_compress``), and ``compress(file)``
forced to run zstd on every block (the baseline the sample avoids). Data: random normal floats (dense
activations; zstd cannot shrink them) and ReLU outputs of the same (half zeros). Blocks of the three tiers are
interleaved; each figure is the fastest of ``--repeats`` rounds of write-then-read.

    .venv/bin/python -m benchmarks.bench_runtime_compress [--blocks 8] [--block-mib 8] [--repeats 5] [--write]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from mcdla.runtime import CompressTier, FileTier
from mcdla.runtime.pool import Tier


def _always_zstd(inner: Tier) -> CompressTier:
    tier = CompressTier(inner)
    tier._incompressible = lambda data: False  # type: ignore[method-assign]
    return tier


def round_trip_s(tier: Tier, blocks: list[np.ndarray]) -> tuple[float, int]:
    """Seconds to write every block and read each back (checked), and the bytes the medium stored."""
    out = np.empty_like(blocks[0])
    t0 = time.perf_counter()
    written = [tier.write(memoryview(b), reserved_bytes=tier.try_reserve(b.nbytes), label="bench") for b in blocks]
    stored = sum(tier.stored_bytes_of(w) for w in written)
    for b, w in zip(blocks, written):
        tier.read_into(w, memoryview(out))
        tier.free(w)
        assert np.array_equal(out, b)
    return time.perf_counter() - t0, stored


def run(blocks: int, block_mib: int, repeats: int, directory: str) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    n = block_mib << 20
    data = {"random floats": [rng.standard_normal(n // 4, dtype=np.float32).view(np.uint8) for _ in range(blocks)]}
    data["ReLU outputs"] = [np.maximum(b.view(np.float32), 0).view(np.uint8) for b in data["random floats"]]
    root = Path(directory)
    tiers: dict[str, Tier] = {
        "file": FileTier(root / "plain", direct=False),
        "compress(file)": CompressTier(FileTier(root / "c", direct=False)),
        "compress(file), zstd on every block": _always_zstd(FileTier(root / "z", direct=False)),
    }
    out: dict[str, dict[str, float]] = {}
    for kind, bl in data.items():
        best = {name: float("inf") for name in tiers}
        stored = {}
        for _ in range(repeats):
            for name, tier in tiers.items():
                s, stored[name] = round_trip_s(tier, bl)
                best[name] = min(best[name], s)
        total = blocks * n
        out[kind] = {**{f"{name} s": best[name] for name in tiers},
                     **{f"{name} stored": stored[name] / total for name in tiers}, "bytes": total}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-mib", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the tiers' files go (default: a temporary directory)")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        r = run(args.blocks, args.block_mib, args.repeats, d)
    names = ("file", "compress(file)", "compress(file), zstd on every block")
    lines = [f"{args.blocks} blocks of {args.block_mib} MiB float32, write then read back (page cache); "
             f"fastest of {args.repeats}.", "",
             "| data | tier | GB/s (write+read) | time / plain file tier | stored / written |", "|---|---|---|---|---|"]
    for kind, v in r.items():
        for name in names:
            lines.append(f"| {kind} | {name} | {v['bytes'] / v[f'{name} s'] / 1e9:.2f} | "
                         f"{v[f'{name} s'] / v['file s']:.2f}x | {100 * v[f'{name} stored']:.3f}% |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-compress-bypass", "Runtime: compress tier on incompressible floats vs the plain file tier",
               ".venv/bin/python -m benchmarks.bench_runtime_compress --write", text)


if __name__ == "__main__":
    main()
