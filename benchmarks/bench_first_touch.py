"""A host's first-touch copy rate: copies into pageable pages the process has never touched, against the same
copies into pages already written (the baseline, measured in the same run).

``node.sockets.first_touch_copy`` prices the forward's activation copies of ``execution.offload_first_touch``
(NOTE [first-touch copies] in :mod:`mcdla.sim.llm_offload`): the CUDA driver stages a device-to-host copy into
pageable memory through pinned buffers and one host thread copies each chunk out, faulting in every destination
page it writes first. This benchmark measures that on the machine it runs on, so a system file can carry the
host's own figure. On CPU it times the host thread's part, one thread copying ``--size`` bytes from a resident
buffer into each of ``--buffers`` fresh anonymous mappings (4 KiB pages: ``MADV_NOHUGEPAGE``, as with
transparent huge pages off or on ``madvise``, the Ubuntu default) and then into the same mappings again. With a
GPU it also times the path itself: a device-to-host ``copy_`` into fresh mappings and into written ones, and into
pinned memory.

    .venv/bin/python -m benchmarks.bench_first_touch [--size 83886080] [--buffers 8] [--repeats 5] [--no-record]
"""

from __future__ import annotations

import mmap
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks._results import bench_parser, markdown_table, print_and_record

CHECKPOINT_BYTES = 10 * 1024 * 4096 * 2
"""One checkpoint of DeepSpeed's ZeRO-Offload tutorial run (batch 10 x sequence 1024 x hidden 4096, fp16)."""


def _fresh(size: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A new anonymous mapping of ``size`` bytes on 4 KiB pages, untouched, and a byte tensor over it."""
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    return region, torch.frombuffer(region, dtype=torch.uint8)


def _rate(copy: Callable[[torch.Tensor], None], targets: list[torch.Tensor], size: int) -> float:
    """Bytes per second of ``copy`` into each of ``targets`` in turn."""
    start = time.perf_counter()
    for target in targets:
        copy(target)
    return size * len(targets) / (time.perf_counter() - start)


def _passes(src: torch.Tensor, size: int, buffers: int, repeats: int) -> tuple[list[float], list[float]]:
    """Per repeat, the rate into ``buffers`` fresh mappings and then into the same mappings again."""
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)

    def copy(target: torch.Tensor) -> None:
        target.copy_(src)
        sync()

    fresh, written = [], []
    for _ in range(repeats):
        regions = [_fresh(size) for _ in range(buffers)]
        targets = [t for _r, t in regions]
        fresh.append(_rate(copy, targets, size))
        written.append(_rate(copy, targets, size))
        del targets, regions  # unmapped once the tensors over them go
    return fresh, written


def measure(size: int, buffers: int, repeats: int = 5) -> list[tuple[str, list[float], list[float]]]:
    """(path, fresh-page rates, written-page rates) in bytes/s, one of each per repeat, for the host thread's copy
    and, with CUDA, the device-to-host copy and the copy into pinned memory (fresh and written alike)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the driver's staging copy-out is one host thread
    try:
        source = torch.ones(size, dtype=torch.uint8)
        rows = [("host thread copy (CPU to pageable)", *_passes(source, size, buffers, repeats))]
        if torch.cuda.is_available():
            gpu = source.cuda()
            rows.append(("device to pageable host (cudaMemcpy via staging)", *_passes(gpu, size, buffers, repeats)))
            pinned = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
            rates = [_rate(lambda t: (t.copy_(gpu), torch.cuda.synchronize()), pinned, size) for _ in range(repeats)]
            rows.append(("device to pinned host (the link alone)", rates, rates))
        return rows
    finally:
        torch.set_num_threads(threads)


def _thp() -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.read_text().strip() if path.exists() else "unknown"


def table(rows: list[tuple[str, list[float], list[float]]], size: int, buffers: int) -> str:
    """The medians over the repeats (their range in brackets) and the median repeat's fresh / written ratio."""

    def cell(rates: list[float]) -> str:
        return f"{statistics.median(rates) / 1e9:.2f} [{min(rates) / 1e9:.2f}-{max(rates) / 1e9:.2f}]"

    body = markdown_table(("path", "fresh pages GB/s", "written pages GB/s", "fresh / written"),
                          [(name, cell(f), cell(w), f"{statistics.median(a / b for a, b in zip(f, w)):.2f}")
                           for name, f, w in rows])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"{buffers} buffers of {size / 1e6:.1f} MB each per pass, {len(rows[0][1])} passes (median [range]), "
            f"one host thread; 4 KiB pages (MADV_NOHUGEPAGE); transparent_hugepage: {_thp()}; {device}.\n\n"
            f"{body}\n\nThe fresh-page rate of the device path (or, without a GPU, of the host thread's copy, an "
            "upper bound of it) is this host's `node.sockets.first_touch_copy`.")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--size", type=int, default=CHECKPOINT_BYTES, help="bytes per buffer (default: one "
                        "checkpoint of DeepSpeed's ZeRO-Offload tutorial run, 83.9 MB)")
    parser.add_argument("--buffers", type=int, default=8, help="buffers per pass (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="passes, each into new mappings (default 5)")
    args = parser.parse_args(argv)
    if args.size < mmap.PAGESIZE or args.buffers < 1 or args.repeats < 1:
        parser.error(f"--size must be at least one page ({mmap.PAGESIZE} bytes), --buffers and --repeats at least "
                     f"1; got --size {args.size} --buffers {args.buffers} --repeats {args.repeats}")
    text = table(measure(args.size, args.buffers, args.repeats), args.size, args.buffers)
    print_and_record(args, "first-touch", "A host's first-touch copy rate (node.sockets.first_touch_copy)",
                     ".venv/bin/python -m benchmarks.bench_first_touch", text)


if __name__ == "__main__":
    main()
