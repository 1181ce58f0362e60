"""File tier throughput against this disk's raw sequential write and read, measured in the same run.

Raw baseline: one file written with ``os.write`` in 8 MiB pieces from memory, then read back with
``readinto``, the way ``dd`` would. File tier: the same bytes as ``--block-mib`` blocks through
:class:`mcdla.runtime.FileTier` (one file per block, CRC-32 on every block) from ``io_threads`` threads, as
the runtime drives it. Both write into the page cache (the tier never fsyncs; a "+sync" baseline with
fdatasync is shown for reference). Reads are "cold": before each read both the raw file and the block files
are flushed and dropped from the page cache (``posix_fadvise(DONTNEED)``). Each figure is the best of
``--repeats`` interleaved runs.

    .venv/bin/python -m benchmarks.bench_runtime_file_tier [--dir DIR] [--total-mib 2048] [--block-mib 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mcdla.runtime import FileTier

CHUNK = 8 << 20


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write(path: Path, data: memoryview, *, sync: bool) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for start in range(0, len(data), CHUNK):
        chunk = data[start : start + CHUNK]
        while chunk:
            chunk = chunk[os.write(fd, chunk):]
    if sync:
        os.fdatasync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def raw_read(path: Path, out: memoryview) -> float:
    _drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        pos = 0
        while pos < len(out):
            pos += f.readinto(out[pos : pos + CHUNK])
    return time.perf_counter() - t0


def tier_write(tier: FileTier, data: memoryview, block: int, pool: ThreadPoolExecutor) -> tuple[float, list]:
    def one(start: int):
        view = data[start : start + block]
        return tier.write(view, reserved_bytes=tier.try_reserve(len(view)), label=f"block@{start}")

    t0 = time.perf_counter()
    blocks = list(pool.map(one, range(0, len(data), block)))
    return time.perf_counter() - t0, blocks


def tier_read(tier: FileTier, blocks: list, out: memoryview, block: int, pool: ThreadPoolExecutor) -> float:
    for b in blocks:
        _drop_cache(b.payload)

    def one(i_b):
        i, b = i_b
        tier.read_into(b, out[i * block : i * block + b.nbytes])

    t0 = time.perf_counter()
    list(pool.map(one, enumerate(blocks)))
    return time.perf_counter() - t0


def run(directory: Path, total_bytes: int, block_bytes: int, repeats: int, io_threads: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    src = rng.standard_normal(total_bytes // 4, dtype=np.float32)  # activation-like, incompressible
    data = memoryview(src).cast("B")
    out = np.empty(total_bytes, dtype=np.uint8)
    out_view = memoryview(out)
    tier = FileTier(directory / "tier", io_threads=io_threads)
    raw_path = directory / "raw.bin"
    best = {k: float("inf") for k in ("raw_w", "raw_ws", "raw_r", "tier_w", "tier_r")}
    with ThreadPoolExecutor(max_workers=io_threads) as pool:
        raw_write(raw_path, data, sync=False)  # warm the file system's allocation paths
        for _ in range(repeats):
            best["raw_w"] = min(best["raw_w"], raw_write(raw_path, data, sync=False))
            best["raw_ws"] = min(best["raw_ws"], raw_write(raw_path, data, sync=True))
            best["raw_r"] = min(best["raw_r"], raw_read(raw_path, out_view))
            assert bytes(out_view[:64]) == bytes(data[:64])
            t_w, blocks = tier_write(tier, data, block_bytes, pool)
            best["tier_w"] = min(best["tier_w"], t_w)
            best["tier_r"] = min(best["tier_r"], tier_read(tier, blocks, out_view, block_bytes, pool))
            assert np.array_equal(out.view(np.float32), src)
            for b in blocks:
                tier.free(b)
    raw_path.unlink()
    gbps = {k: total_bytes / v / 1e9 for k, v in best.items()}
    gbps["write_ratio"] = gbps["tier_w"] / gbps["raw_w"]
    gbps["read_ratio"] = gbps["tier_r"] / gbps["raw_r"]
    return gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    ap.add_argument("--total-mib", type=int, default=2048)
    ap.add_argument("--block-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--io-threads", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        r = run(Path(tmp), args.total_mib << 20, args.block_mib << 20, args.repeats, args.io_threads)
    print(f"file tier vs raw disk: {args.total_mib} MiB in {args.block_mib} MiB blocks, "
          f"{args.io_threads} I/O threads, best of {args.repeats}")
    print("| path | write GB/s | read GB/s (cold) |")
    print("|---|---|---|")
    print(f"| raw sequential (page cache) | {r['raw_w']:.2f} | {r['raw_r']:.2f} |")
    print(f"| raw sequential + fdatasync | {r['raw_ws']:.2f} | - |")
    print(f"| mcdla file tier (CRC-32 per block) | {r['tier_w']:.2f} | {r['tier_r']:.2f} |")
    print(f"| **ratio tier / raw** | **{r['write_ratio']:.2f}** | **{r['read_ratio']:.2f}** |")


if __name__ == "__main__":
    main()
