"""The host tier's bookkeeping overhead against ``torch.autograd.graph.save_on_cpu`` on CPU, same run.

On CPU ``save_on_cpu`` packs a tensor as ``tensor.cpu()`` (the tensor itself) and unpacks it with
``.to("cpu")``: its cost is the bare hook calls. mcdla is measured twice: "bookkeeping" (``budget`` larger
than the step, so every saved storage gets a record, a handle, a dedupe lookup, accounting and timeline
samples, but stays put) and "host tier" (every storage copied into and back from the pooled host buffers,
which is real work save_on_cpu does not do on CPU). Overheads are per step over the plain step, and per
saved tensor. The model is a small transformer (many small saved tensors, the worst case for
bookkeeping). Steps of the four modes are interleaved; each figure is the fastest of ``--repeats`` steps (the
minimum, since other load on the machine only ever adds time) with the median alongside. Wall time and the
main thread's CPU time (``time.thread_time``) are both reported: every mode runs on that one thread (the host
tier copies in the caller's thread), and CPU time is what other jobs on a shared machine disturb least.

    .venv/bin/python -m benchmarks.bench_runtime_host_overhead [--repeats 50] [--write]

``--micro N`` instead times a chain of N ``sin`` on a 64-float tensor (one saved storage per op, nothing else
to do), main-thread CPU time, fastest of ``--repeats``: the bookkeeping per saved tensor with the least noise.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mcdla.runtime import virtualize


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_model(dim: int, layers: int, heads: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[_Block(dim, heads) for _ in range(layers)])


def run(repeats: int, dim: int, layers: int, seq: int, batch: int) -> dict[str, float]:
    model = make_model(dim, layers, 4)
    x = torch.randn(batch, seq, dim)
    book = virtualize("host", budget=1 << 40, min_bytes=0, model=model)
    host = virtualize("host", min_bytes=0, model=model)
    modes: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=False),
        "mcdla bookkeeping": lambda: book,
        "mcdla host tier": lambda: host,
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    losses: dict[str, float] = {}
    for i in range(repeats + 2):
        for name, ctx in modes.items():
            model.zero_grad()
            t0, c0 = time.perf_counter(), time.thread_time()
            with ctx():
                loss = model(x * 1.0).square().mean()
                loss.backward()
            if i >= 2:  # the first two rounds warm caches and buffer pools
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
            losses[name] = loss.item()
    assert len(set(losses.values())) == 1, losses
    saved = book.report.saved_count
    best = {m: min(t) for m, t in times.items()}
    med = {m: statistics.median(t) for m, t in times.items()}
    return {**{f"{m}_s": v for m, v in best.items()}, **{f"{m}_median_s": v for m, v in med.items()},
            **{f"{m}_cpu_s": min(v) for m, v in cpu.items()},
            "saved_tensors": saved,
            "managed": book.report.managed_count, "host_bytes": host.report.offloaded_bytes}


def micro(chain: int, repeats: int) -> dict[str, float]:
    """CPU seconds per saved tensor over the plain step for save_on_cpu and mcdla's bookkeeping (``--micro``)."""
    x = torch.randn(64, requires_grad=True)
    book = virtualize("host", budget=1 << 40, min_bytes=0)
    modes: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=False),
        "mcdla bookkeeping": lambda: book,
    }
    best = dict.fromkeys(modes, math.inf)
    for i in range(repeats + 3):
        for name, ctx in modes.items():
            c0 = time.thread_time()
            with ctx():
                y = x
                for _ in range(chain):
                    y = y.sin()
                y.sum().backward()
            if i >= 3:
                best[name] = min(best[name], time.thread_time() - c0)
    return {m: (best[m] - best["plain"]) / chain for m in ("save_on_cpu", "mcdla bookkeeping")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro", type=int, default=0, help="time a chain of this many sin ops instead (see above)")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.micro:
        m = micro(args.micro, args.repeats)
        print(f"CPU per saved tensor over plain: save_on_cpu {1e6 * m['save_on_cpu']:.1f} us, mcdla bookkeeping "
              f"{1e6 * m['mcdla bookkeeping']:.1f} us ({m['mcdla bookkeeping'] / m['save_on_cpu']:.1f}x)")
        return
    r = run(args.repeats, args.dim, args.layers, args.seq, args.batch)
    plain, n = r["plain_s"], r["saved_tensors"]
    lines = [
        f"Transformer {args.layers} x dim {args.dim}, batch {args.batch} x seq {args.seq}; {n} saved tensors "
        f"({r['managed']} storages), {r['host_bytes'] / 2**20:.1f} MiB per step; fastest of {args.repeats}, torch "
        f"threads {args.threads}.",
        "",
        "| mode | step ms (fastest) | step ms (median) | overhead ms | overhead per saved tensor us | "
        "CPU ms (fastest) | CPU overhead per saved tensor us |",
        "|---|---|---|---|---|---|---|",
    ]
    plain_cpu = r["plain_cpu_s"]
    for m in ("plain", "save_on_cpu", "mcdla bookkeeping", "mcdla host tier"):
        over = r[f"{m}_s"] - plain
        lines.append(f"| {m} | {1e3 * r[f'{m}_s']:.2f} | {1e3 * r[f'{m}_median_s']:.2f} | {1e3 * over:.2f} | "
                     f"{1e6 * over / n:.1f} | {1e3 * r[f'{m}_cpu_s']:.2f} | "
                     f"{1e6 * (r[f'{m}_cpu_s'] - plain_cpu) / n:.1f} |")
    lines.append("")
    for label, key, base in (("wall", "_s", plain), ("CPU", "_cpu_s", plain_cpu)):
        soc, book = r["save_on_cpu" + key] - base, r["mcdla bookkeeping" + key] - base
        lines.append(f"- {label}: bookkeeping overhead / save_on_cpu overhead: {book / soc:.1f}x" if soc > 0 else
                     f"- {label}: save_on_cpu overhead not measurable against noise")
    text = "\n".join(lines)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-host-overhead-cpu-time",
               "Runtime: host tier bookkeeping vs save_on_cpu (CPU), wall and CPU time",
               ".venv/bin/python -m benchmarks.bench_runtime_host_overhead --write", text)


if __name__ == "__main__":
    main()
