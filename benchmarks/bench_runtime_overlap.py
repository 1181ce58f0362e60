"""Step time with the file tier against max(compute time, transfer time), on CPU, in the same run.

compute: the same step without mcdla. transfer: the step's managed bytes written to and read back from a
:class:`mcdla.runtime.FileTier` with the runtime's I/O threads and nothing else running (one block per saved
storage). step: the step under ``virtualize("file:DIR")``, everything offloaded. Perfect overlap gives
step = max(compute, transfer); the target is <= 1.15x. Torch runs ``--threads`` intra-op threads (default 1,
leaving the other core of a 2-core machine to the I/O threads, as a GPU leaves copies to its copy engines).
Each figure is the median of ``--repeats`` interleaved runs.

    .venv/bin/python -m benchmarks.bench_runtime_overlap [--rows 65536] [--width 128] [--blocks 12] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from mcdla.runtime import FileTier, virtualize


def make_model(width: int, blocks: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def step(model: torch.nn.Module, x: torch.Tensor) -> float:
    loss = model(x * 1.0).square().mean()
    loss.backward()
    return loss.item()


def transfer_only(directory: Path, sizes: list[int], io_threads: int) -> float:
    """Write one block per size and read them all back, on ``io_threads`` threads; seconds."""
    tier = FileTier(directory, io_threads=io_threads)
    data = [np.random.default_rng(i).integers(0, 255, n, dtype=np.uint8) for i, n in enumerate(sizes)]
    outs = [np.empty(n, dtype=np.uint8) for n in sizes]
    with ThreadPoolExecutor(io_threads) as pool:
        t0 = time.perf_counter()
        blocks = list(pool.map(lambda d: tier.write(memoryview(d), reserved_bytes=tier.try_reserve(d.size),
                                                    label="b"), data))
        list(pool.map(lambda bo: tier.read_into(bo[0], memoryview(bo[1])), zip(blocks, outs)))
        elapsed = time.perf_counter() - t0
    for b in blocks:
        tier.free(b)
    return elapsed


def run(rows: int, width: int, blocks: int, repeats: int, threads: int, directory: Path) -> dict[str, float]:
    torch.set_num_threads(threads)
    model = make_model(width, blocks)
    x = torch.randn(rows, width)
    vm = virtualize(f"file:{directory / 'tier'}", model=model, min_bytes=1 << 20, window=3)
    step(model, x)  # warm-up: allocator, kernels
    with vm:
        step(model, x)
    sizes = [s.nbytes for s in vm.report.transfers if s.kind == "offload"]
    compute, transfer, virtual, waits = [], [], [], []
    for _ in range(repeats):
        model.zero_grad()
        t0 = time.perf_counter()
        ref_loss = step(model, x)
        compute.append(time.perf_counter() - t0)
        transfer.append(transfer_only(directory / "raw", sizes, 2))
        model.zero_grad()
        t0 = time.perf_counter()
        with vm:
            loss = step(model, x)
        virtual.append(time.perf_counter() - t0)
        waits.append(vm.report.unpack_wait_s + vm.report.pack_wait_s)
        assert loss == ref_loss
    c, t, v = (statistics.median(z) for z in (compute, transfer, virtual))
    return {"compute_s": c, "transfer_s": t, "step_s": v, "ratio": v / max(c, t), "offloaded_bytes": sum(sizes),
            "wait_s": statistics.median(waits)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        r = run(args.rows, args.width, args.blocks, args.repeats, args.threads, Path(tmp))
    text = "\n".join([
        f"{args.blocks} x (Linear {args.width} + Tanh), {args.rows} rows, {r['offloaded_bytes'] / 2**20:.0f} MiB "
        f"offloaded per step, torch threads {args.threads}, median of {args.repeats}. Target: ratio <= 1.15.",
        "",
        "| compute s (no mcdla) | transfer s (tier only) | step s (mcdla file) | step / max(compute, transfer) | "
        "compute-side waits s |",
        "|---|---|---|---|---|",
        f"| {r['compute_s']:.3f} | {r['transfer_s']:.3f} | {r['step_s']:.3f} | **{r['ratio']:.2f}** | "
        f"{r['wait_s']:.3f} |",
    ])
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-overlap", "Runtime: step time with the file tier vs max(compute, transfer)",
               ".venv/bin/python -m benchmarks.bench_runtime_overlap --write", text)


if __name__ == "__main__":
    main()
