"""File tier throughput against this disk's raw sequential write and read, measured in the same run.

Four ways to write the same ``--total-mib`` of float32 data, block by block (``--block-mib``), interleaved
block by block in a fresh random order per block (so that drift in the disk's speed hits all of them alike,
and each follows each other one as often: on a shared virtual disk identical writes vary several-fold from
one second to the next, and a page-cache write leaves writeback running into the next method's time):

- raw: one file, appended with ``os.write`` in 8 MiB pieces through the page cache, as ``dd bs=8M`` would;
- raw direct: the same with ``O_DIRECT`` (``dd bs=8M oflag=direct``), straight from the page-aligned source;
- plain files: one file per block, page-cache writes, no checksum (the tier's layout without the tier);
- tier: :meth:`mcdla.runtime.FileTier.write` (one file per block, CRC-32 on every block; blocks over 8 MiB, as
  here, with O_DIRECT through bounce buffers, the copies and checksums on the tier's worker thread).

The target's baseline is the better raw way of each direction ("best raw"): buffered writes only reach the
page cache and are flushed later, outside the timed region, so they are not always the disk's limit.

Then each is read back cold, again interleaved block by block: raw with ``preadv`` in 8 MiB pieces at the
block's offset (``O_DIRECT`` for raw direct), plain files the same way, the tier with ``read_into`` (which
checks the CRC). Cold means the same for every method: right before each timed read, outside the timer, that block's
bytes (the block's range of the raw file, or the whole block file) are flushed and dropped from the page
cache with ``posix_fadvise(DONTNEED)``, so no method finds pages that an earlier read's readahead brought
in. Throughput = bytes / summed time of that method; best of ``--repeats``.

    .venv/bin/python -m benchmarks.bench_runtime_file_tier [--dir DIR] [--total-mib 1024] [--block-mib 64] [--write]

``--io-threads-sweep 1,2 [--model mlp|transformer] [--rows N]`` instead times a training step (the MLP of
``bench_runtime_overlap`` or the transformer of ``bench_runtime_host_overhead``, one torch thread, every
saved tensor of at least 256 KiB offloaded to the file tier) with each number of I/O threads, interleaved,
median of ``--repeats``: the measurement behind :func:`mcdla.runtime.tiers_file.default_io_threads`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from mcdla.runtime import FileTier, virtualize
from mcdla.runtime.tiers_file import default_io_threads

CHUNK = 8 << 20
ALIGN = 4096  # O_DIRECT alignment of buffers and offsets
METHODS = ("raw", "direct", "files", "tier")


def _write_all(fd: int, view: memoryview) -> None:
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        while chunk:
            chunk = chunk[os.write(fd, chunk):]


def _drop(path: Path, offset: int = 0, length: int = 0) -> None:
    """Flush ``path`` and drop ``length`` bytes from ``offset`` (0: to the end) from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_all(fd: int, dst: memoryview, offset: int) -> None:
    pos = 0
    while pos < len(dst):
        got = os.preadv(fd, [dst[pos : pos + CHUNK]], offset + pos)
        assert got > 0, "short file"
        pos += got


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.ones(nbytes + ALIGN, dtype=np.uint8)  # touched once: no run pays its page faults
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + nbytes]


def one_repeat(directory: Path, tier: FileTier, data: memoryview, block: int, out: memoryview,
               seed: int = 0) -> dict[str, float]:
    """Seconds per method and direction for one interleaved pass over all blocks."""
    n_blocks = len(data) // block
    spent = {f"{m}_{d}": 0.0 for m in METHODS for d in ("w", "r")}
    raw_path, direct_path = directory / "raw.bin", directory / "direct.bin"
    raw_fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    direct_fd = os.open(direct_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    paths, blocks = [], []

    def write(method: str, i: int) -> None:
        view = data[i * block : (i + 1) * block]
        t0 = time.perf_counter()
        if method == "raw":
            _write_all(raw_fd, view)
        elif method == "direct":
            _write_all(direct_fd, view)
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
        if method in ("raw", "direct"):  # cold, the same way for every method (module docstring)
            _drop(raw_path if method == "raw" else direct_path, i * block, block)
        else:
            _drop(paths[i] if method == "files" else blocks[i].payload)
        t0 = time.perf_counter()
        if method in ("raw", "direct"):
            fd = os.open(raw_path, os.O_RDONLY) if method == "raw" else os.open(direct_path, os.O_RDONLY | os.O_DIRECT)
            _read_all(fd, dst, i * block)
            os.close(fd)
        elif method == "files":
            fd = os.open(paths[i], os.O_RDONLY)
            _read_all(fd, dst, 0)
            os.close(fd)
        else:
            tier.read_into(blocks[i], dst)
        spent[f"{method}_r"] += time.perf_counter() - t0

    rng = np.random.default_rng(seed)
    for i in range(n_blocks):
        for k in rng.permutation(len(METHODS)):  # a fresh order per block: each method follows each other
            write(METHODS[k], i)
    os.close(raw_fd)
    os.close(direct_fd)
    for p in [raw_path, *paths]:  # flush the page-cache writers' dirty data before any timed read
        _drop(p)
    for i in range(n_blocks):
        for k in rng.permutation(len(METHODS)):
            method = METHODS[k]
            read(method, i)
            if method == "tier":  # only the tier's read checks its bytes; check the others here
                continue
            assert bytes(out[i * block : i * block + 16]) == bytes(data[i * block : i * block + 16])
    assert bytes(out[-16:]) == bytes(data[-16:])
    for b in blocks:
        tier.free(b)
    for p in [raw_path, direct_path, *paths]:
        p.unlink()
    return spent


def run(directory: Path, total_bytes: int, block_bytes: int, repeats: int) -> dict[str, float]:
    src = _aligned(total_bytes)  # page-aligned, so that raw direct needs no copy
    src.view(np.float32)[:] = np.random.default_rng(0).standard_normal(total_bytes // 4, dtype=np.float32)
    data = memoryview(src)  # incompressible float32 bytes
    out = _aligned(total_bytes)
    tier = FileTier(directory / "tier")
    best: dict[str, float] = {}
    for r in range(repeats):
        os.sync()
        for key, seconds in one_repeat(directory, tier, data, block_bytes, memoryview(out), seed=r).items():
            best[key] = min(best.get(key, float("inf")), seconds)
    gbps = {k: total_bytes / v / 1e9 for k, v in best.items()}
    for d in ("w", "r"):
        gbps[f"ratio_best_{d}"] = gbps[f"tier_{d}"] / max(gbps[f"raw_{d}"], gbps[f"direct_{d}"])
        for m in ("raw", "direct", "files"):
            gbps[f"ratio_{m}_{d}"] = gbps[f"tier_{d}"] / gbps[f"{m}_{d}"]
    gbps["direct_io"] = float(tier.direct)
    return gbps


def io_threads_sweep(directory: Path, counts: list[int], repeats: int, model_name: str = "mlp",
                     rows: int = 65536) -> dict[str, float]:
    """Median seconds of one training step without mcdla and with the file tier at each I/O thread count.

    ``mlp``: the model of ``bench_runtime_overlap`` (12 x Linear 128 + Tanh, ``rows`` rows: one saved tensor of
    rows x 512 B per layer); ``transformer``: the one of ``bench_runtime_host_overhead`` (4 layers, d=256,
    batch 8 x 256 tokens: saved tensors of 2-8 MiB, many small ones).
    """
    import statistics

    import torch

    from benchmarks import bench_runtime_host_overhead, bench_runtime_overlap
    from benchmarks.bench_runtime_overlap import step

    torch.set_num_threads(1)
    if model_name == "mlp":
        model, x = bench_runtime_overlap.make_model(128, 12), torch.randn(rows, 128)
    else:
        model, x = bench_runtime_host_overhead.make_model(256, 4, 4), torch.randn(8, 256, 256)
    vms = {k: virtualize(FileTier(directory / f"io{k}", io_threads=k), model=model, window=3) for k in counts}
    step(model, x)  # warm-up: allocator, kernels
    for vm in vms.values():
        with vm:
            step(model, x)
    times: dict[str, list[float]] = {"compute": [], **{f"io{k}": [] for k in counts}}
    moved: dict[str, list[float]] = {f"io{k}_{d}": [] for k in counts for d in ("offload", "fetch")}
    for r in range(repeats):
        order = ["compute", *(f"io{k}" for k in counts)]
        for name in order[r % len(order) :] + order[: r % len(order)]:
            model.zero_grad()
            t0 = time.perf_counter()
            if name == "compute":
                step(model, x)
            else:
                with vms[int(name[2:])] as vm:
                    step(model, x)
            times[name].append(time.perf_counter() - t0)
            if name != "compute":
                for d in ("offload", "fetch"):  # seconds each transfer took, per GB
                    spans = [t for t in vm.report.transfers if t.kind == d]
                    moved[f"{name}_{d}"].append(sum(t.end_s - t.start_s for t in spans) / sum(t.nbytes for t in spans) * 1e9)
    for vm in vms.values():
        vm.close()
    return {name: statistics.median(v) for name, v in {**times, **moved}.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    ap.add_argument("--total-mib", type=int, default=1024)
    ap.add_argument("--block-mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    ap.add_argument("--io-threads-sweep", default=None, metavar="1,2",
                    help="time a training step with each number of I/O threads instead (prints only)")
    ap.add_argument("--model", choices=("mlp", "transformer"), default="mlp", help="--io-threads-sweep model")
    ap.add_argument("--rows", type=int, default=65536, help="batch rows of the --io-threads-sweep mlp")
    args = ap.parse_args()
    if args.io_threads_sweep:
        counts = [int(c) for c in args.io_threads_sweep.split(",")]
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            t = io_threads_sweep(Path(tmp), counts, args.repeats, args.model, args.rows)
        what = f"mlp, {args.rows} rows" if args.model == "mlp" else "transformer"
        print(f"step s ({what}), median of {args.repeats} interleaved; {os.cpu_count()} CPUs, default io_threads here "
              f"{default_io_threads()}, load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
        print("| no mcdla | " + " | ".join(f"file tier, io_threads={k}" for k in counts) + " |")
        print("|---" * (len(counts) + 1) + "|")
        print(f"| {t['compute']:.3f} | " + " | ".join(f"{t[f'io{k}']:.3f}" for k in counts) + " |")
        print("| s per GB of one transfer (offload / fetch) | " + " | ".join(
            f"{t[f'io{k}_offload']:.2f} / {t[f'io{k}_fetch']:.2f}" for k in counts) + " |")
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        r = run(Path(tmp), args.total_mib << 20, args.block_mib << 20, args.repeats)
    mode = "O_DIRECT" if r["direct_io"] else "page cache (O_DIRECT refused here)"
    text = "\n".join([
        f"{args.total_mib} MiB in {args.block_mib} MiB blocks, interleaved block by block in random order, one "
        f"calling thread, best of {args.repeats}; each read cold (its block dropped from the page cache just "
        "before, untimed).",
        "",
        "| path | write GB/s | read GB/s (cold) |",
        "|---|---|---|",
        f"| raw: one file, sequential, page cache (dd bs=8M) | {r['raw_w']:.2f} | {r['raw_r']:.2f} |",
        f"| raw: one file, sequential, O_DIRECT (dd bs=8M, direct) | {r['direct_w']:.2f} | {r['direct_r']:.2f} |",
        f"| plain files, one per block, page cache | {r['files_w']:.2f} | {r['files_r']:.2f} |",
        f"| mcdla file tier ({mode}, CRC-32 per block) | {r['tier_w']:.2f} | {r['tier_r']:.2f} |",
        f"| **tier / best raw** (target >= 0.8) | **{r['ratio_best_w']:.2f}** | **{r['ratio_best_r']:.2f}** |",
        f"| tier / raw page cache | {r['ratio_raw_w']:.2f} | {r['ratio_raw_r']:.2f} |",
        f"| tier / raw O_DIRECT | {r['ratio_direct_w']:.2f} | {r['ratio_direct_r']:.2f} |",
        f"| tier / plain files | {r['ratio_files_w']:.2f} | {r['ratio_files_r']:.2f} |",
    ])
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-file-tier", "Runtime: file tier vs raw disk",
               ".venv/bin/python -m benchmarks.bench_runtime_file_tier --write", text)


if __name__ == "__main__":
    main()
