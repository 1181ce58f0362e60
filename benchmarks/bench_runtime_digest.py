"""The file tier's keyed BLAKE2b digest against its CRC-32, same bytes, same run.

Two measurements: the digests alone over ``--mib`` MiB in 256 KiB pieces on one thread (what the tier feeds
them: ``fio.SUB``), and the file tier writing and reading back ``--blocks`` blocks of ``--block-mib`` MiB
through the page cache with each digest (interleaved; fastest of ``--repeats``). NOTE [block digests] in
``mcdla.runtime.tiers_file`` says what each defends against.

    .venv/bin/python -m benchmarks.bench_runtime_digest [--mib 256] [--blocks 8] [--block-mib 8] [--write]
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_runtime_compress import round_trip_s
from mcdla.runtime import FileTier
from mcdla.runtime import _file_io as fio


def digest_gb_per_s(make, data: np.ndarray, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        d = make()
        for i in range(0, len(data), fio.SUB):
            d.update(data[i : i + fio.SUB])
        d.value()
        best = min(best, time.perf_counter() - t0)
    return len(data) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-mib", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the tier's files go (default: a temporary directory)")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, args.mib << 20, dtype=np.uint8)
    key = secrets.token_bytes(32)
    crc = digest_gb_per_s(fio.Crc32, data, args.repeats)
    mac = digest_gb_per_s(lambda: fio.KeyedBlake2b(key), data, args.repeats)
    blocks = [rng.standard_normal((args.block_mib << 20) // 4, dtype=np.float32).view(np.uint8)
              for _ in range(args.blocks)]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        tiers = {name: FileTier(Path(d) / name, digest=name, direct=False) for name in ("crc32", "blake2b")}
        best = dict.fromkeys(tiers, float("inf"))
        for _ in range(args.repeats):
            for name, tier in tiers.items():
                best[name] = min(best[name], round_trip_s(tier, blocks)[0])
    total = args.blocks * (args.block_mib << 20)
    lines = [
        f"Digest alone: {args.mib} MiB in {fio.SUB >> 10} KiB pieces, one thread; file tier: {args.blocks} blocks "
        f"of {args.block_mib} MiB float32 written and read back (page cache); fastest of {args.repeats}.", "",
        "| digest | digest alone GB/s | file tier GB/s (write+read) | file tier time / CRC-32's |",
        "|---|---|---|---|",
        f"| CRC-32 (zlib) | {crc:.2f} | {total / best['crc32'] / 1e9:.2f} | 1.00x |",
        f"| keyed BLAKE2b-128 | {mac:.2f} | {total / best['blake2b'] / 1e9:.2f} | "
        f"{best['blake2b'] / best['crc32']:.2f}x |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-digest", "Runtime: keyed BLAKE2b vs CRC-32 block digests (file tier)",
               ".venv/bin/python -m benchmarks.bench_runtime_digest --write", text)


if __name__ == "__main__":
    main()
