"""File tier throughput against this disk's raw sequential write and read, measured in the same run.

Three ways to write the same ``--total-mib`` of float32 data, block by block (``--block-mib``), interleaved
block by block so that drift in the disk's speed hits all three alike (on a shared virtual disk identical
writes vary several-fold from one second to the next):

- raw: one file, appended with ``os.write`` in 8 MiB pieces, as ``dd`` would (the target's baseline);
- plain files: one file per block, same writes, no checksum (the tier's layout without the tier);
- tier: :meth:`mcdla.runtime.FileTier.write` (one file per block, CRC-32 on every block).

Then each is read back cold (flushed and dropped from the page cache with ``posix_fadvise(DONTNEED)``),
again interleaved block by block: raw with ``preadv`` at the block's offset, plain files with ``readinto``,
the tier with ``read_into`` (which checks the CRC). All writes go into the page cache (the tier never
fsyncs its scratch blocks). Throughput = bytes / summed time of that method; best of ``--repeats``.

    .venv/bin/python -m benchmarks.bench_runtime_file_tier [--dir DIR] [--total-mib 1024] [--block-mib 64] [--write]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from mcdla.runtime import FileTier

CHUNK = 8 << 20
METHODS = ("raw", "files", "tier")


def _write_all(fd: int, view: memoryview) -> None:
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        while chunk:
            chunk = chunk[os.write(fd, chunk):]


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one_repeat(directory: Path, tier: FileTier, data: memoryview, block: int, out: memoryview) -> dict[str, float]:
    """Seconds per method and direction for one interleaved pass over all blocks."""
    n_blocks = len(data) // block
    spent = {f"{m}_{d}": 0.0 for m in METHODS for d in ("w", "r")}
    raw_path = directory / "raw.bin"
    raw_fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    paths, blocks = [], []

    def write(method: str, i: int) -> None:
        view = data[i * block : (i + 1) * block]
        t0 = time.perf_counter()
        if method == "raw":
            _write_all(raw_fd, view)
        elif method == "files":
            path = directory / f"plain-{i}.bin"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            _write_all(fd, view)
            os.close(fd)
            paths.append(path)
        else:
            blocks.append(tier.write(view, reserved_bytes=tier.try_reserve(len(view)), label=f"block {i}"))
        spent[f"{method}_w"] += time.perf_counter() - t0

    def read(method: str, i: int) -> None:
        dst = out[i * block : (i + 1) * block]
        t0 = time.perf_counter()
        if method == "raw":
            with open(raw_path, "rb", buffering=0) as f:
                f.seek(i * block)
                pos = 0
                while pos < block:
                    pos += f.readinto(dst[pos:])
        elif method == "files":
            with open(paths[i], "rb", buffering=0) as f:
                pos = 0
                while pos < block:
                    pos += f.readinto(dst[pos:])
        else:
            tier.read_into(blocks[i], dst)
        spent[f"{method}_r"] += time.perf_counter() - t0

    for i in range(n_blocks):
        for k in range(len(METHODS)):  # rotate the order block by block
            write(METHODS[(i + k) % len(METHODS)], i)
    os.close(raw_fd)
    for p in [raw_path, *paths, *(b.payload for b in blocks)]:
        _drop(p)
    for i in range(n_blocks):
        for k in range(len(METHODS)):
            method = METHODS[(i + k) % len(METHODS)]
            read(method, i)
            if method == "tier":  # only the tier's read checks its bytes; check the others here
                continue
            assert bytes(out[i * block : i * block + 16]) == bytes(data[i * block : i * block + 16])
    assert bytes(out[-16:]) == bytes(data[-16:])
    for b in blocks:
        tier.free(b)
    for p in [raw_path, *paths]:
        p.unlink()
    return spent


def run(directory: Path, total_bytes: int, block_bytes: int, repeats: int) -> dict[str, float]:
    src = np.random.default_rng(0).standard_normal(total_bytes // 4, dtype=np.float32)  # incompressible
    data = memoryview(src).cast("B")
    out = np.ones(total_bytes, dtype=np.uint8)  # touched once: no run pays its page faults
    tier = FileTier(directory / "tier")
    best: dict[str, float] = {}
    for _ in range(repeats):
        os.sync()
        for key, seconds in one_repeat(directory, tier, data, block_bytes, memoryview(out)).items():
            best[key] = min(best.get(key, float("inf")), seconds)
    gbps = {k: total_bytes / v / 1e9 for k, v in best.items()}
    for d in ("w", "r"):
        gbps[f"ratio_raw_{d}"] = gbps[f"tier_{d}"] / gbps[f"raw_{d}"]
        gbps[f"ratio_files_{d}"] = gbps[f"tier_{d}"] / gbps[f"files_{d}"]
    return gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    ap.add_argument("--total-mib", type=int, default=1024)
    ap.add_argument("--block-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        r = run(Path(tmp), args.total_mib << 20, args.block_mib << 20, args.repeats)
    text = "\n".join([
        f"{args.total_mib} MiB in {args.block_mib} MiB blocks, interleaved block by block, one thread, best of "
        f"{args.repeats}.",
        "",
        "| path | write GB/s | read GB/s (cold) |",
        "|---|---|---|",
        f"| raw: one file, sequential | {r['raw_w']:.2f} | {r['raw_r']:.2f} |",
        f"| plain files, one per block | {r['files_w']:.2f} | {r['files_r']:.2f} |",
        f"| mcdla file tier (CRC-32 per block) | {r['tier_w']:.2f} | {r['tier_r']:.2f} |",
        f"| **tier / raw** (target >= 0.8) | **{r['ratio_raw_w']:.2f}** | **{r['ratio_raw_r']:.2f}** |",
        f"| tier / plain files | {r['ratio_files_w']:.2f} | {r['ratio_files_r']:.2f} |",
    ])
    print(text)
    if args.write:
        from benchmarks._runtime_results import record

        record("runtime-file-tier", "Runtime: file tier vs raw disk",
               ".venv/bin/python -m benchmarks.bench_runtime_file_tier --write", text)


if __name__ == "__main__":
    main()
