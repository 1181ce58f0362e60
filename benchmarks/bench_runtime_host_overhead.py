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
to do), main-thread CPU time, fastest of ``--repeats``: the bookkeeping per saved tensor with the least noise,
and the host tier on the same chain (every storage copied out and back, in this thread). It also times a pair of identity hooks (what calling any Python hook pair costs) and "minimal bookkeeping"
(``_Minimal``: a lower bound, not a runtime: a record, a handle with ``__del__``, a dedupe lookup, a lock per
hook and two timeline samples per storage, none of mcdla's other guarantees; every unpack returns the first
save's alias, right for this chain only), and, with ``--split``,
each of mcdla's three per-tensor parts on the same chain: the pack hook, the unpack hook and the handle's
death (``perf_counter_ns`` around each call, less the cost of that timing, measured on an empty function).

``--baseline SRC`` (with ``--micro``) measures two versions of mcdla in one run: ``--rounds`` rounds, each
running the ``--micro`` measurement in a fresh interpreter with ``SRC`` (say, another checkout's ``src``) on
the path, then with the ``src`` this run imports, back to back; it prints each round and the min and median
over rounds of both, and ``--write`` records that table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from array import array
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


class _MinimalRecord:
    __slots__ = ("key", "step", "nbytes", "version", "source", "alias", "handles", "consumed")


class _MinimalHandle:
    __slots__ = ("rec", "size", "first", "unpacked")

    def __del__(self) -> None:
        self.rec.step.dead(self.rec)


class _Minimal:
    """The least bookkeeping a record-per-storage hook pair does, for ``--micro`` (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_root: dict[int, _MinimalRecord] = {}
        self.resident = 0
        self.times, self.values = array("d"), array("q")

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor) -> object:
        if type(t) is not torch.Tensor or t.layout is not torch.strided or (t.requires_grad and t.is_leaf):
            return t.detach()
        root = t._base
        if root is None:
            root = t
        storage = t.untyped_storage()
        with self.lock:
            rec = self.by_root.get(id(root))
            h = _MinimalHandle()
            h.size, h.unpacked = t.size(), False
            if rec is not None and rec.source is storage and rec.version == t._version:
                rec.handles += 1
                h.rec, h.first = rec, False
                return h
            rec = _MinimalRecord()
            rec.key, rec.step, rec.nbytes, rec.version = id(root), self, storage.nbytes(), t._version
            rec.source, rec.alias, rec.handles, rec.consumed = storage, t.detach(), 1, False
            self.by_root[rec.key] = rec
            self.resident += rec.nbytes
            self.times.append(time.perf_counter())
            self.values.append(self.resident)
            h.rec, h.first = rec, True
            return h

    def unpack(self, h: object) -> torch.Tensor:
        if type(h) is not _MinimalHandle:
            return h  # type: ignore[return-value]
        rec = h.rec
        with self.lock:
            h.unpacked = True
            if not rec.consumed:
                rec.consumed = True
                self.resident -= rec.nbytes
                self.times.append(time.perf_counter())
                self.values.append(self.resident)
            return rec.alias

    def dead(self, rec: _MinimalRecord) -> None:
        with self.lock:
            rec.handles -= 1
            if rec.handles == 0:
                rec.source = rec.alias = None
                if self.by_root.get(rec.key) is rec:
                    del self.by_root[rec.key]


def micro(chain: int, repeats: int) -> dict[str, float]:
    """CPU seconds per saved tensor over the plain step for save_on_cpu, mcdla's bookkeeping and host tier, and
    the two reference hook pairs (``--micro``)."""
    x = torch.randn(64, requires_grad=True)
    book = virtualize("host", budget=1 << 40, min_bytes=0)
    host = virtualize("host", min_bytes=0)
    modes: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=False),
        "mcdla bookkeeping": lambda: book,
        "mcdla host tier": lambda: host,
        "identity hooks": lambda: torch.autograd.graph.saved_tensors_hooks(_identity, _identity),
        "minimal bookkeeping": lambda: _Minimal().hooks(),
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
    return {m: (best[m] - best["plain"]) / chain for m in modes if m != "plain"}


def split(chain: int, repeats: int) -> dict[str, float]:
    """Seconds per saved tensor in mcdla's pack hook, unpack hook and handle death (``--split``), fastest of
    ``repeats`` steps, each less the cost of the timing wrapper."""
    from mcdla.runtime._records import _Handle
    from mcdla.runtime._step import _Step

    ns = time.perf_counter_ns
    spent = {"pack": 0, "unpack": 0, "handle death": 0}
    parts = ((_Step, "pack", "pack"), (_Step, "unpack", "unpack"), (_Handle, "__del__", "handle death"))
    real = {key: getattr(cls, name) for cls, name, key in parts}

    def timed(key: str) -> Callable[..., object]:
        fn = real[key]

        def call(*args: object) -> object:
            t0 = ns()
            try:
                return fn(*args)
            finally:
                spent[key] += ns() - t0
        return call

    def empty(*args: object) -> None:
        return None

    real["empty"], spent["empty"] = empty, 0
    probe = timed("empty")
    for _ in range(20_000):
        probe(None)
    wrapper_ns = spent.pop("empty") / 20_000
    for cls, name, key in parts:
        setattr(cls, name, timed(key))
    try:
        x = torch.randn(64, requires_grad=True)
        book = virtualize("host", budget=1 << 40, min_bytes=0)
        best = dict.fromkeys(spent, math.inf)
        for i in range(repeats + 3):
            for key in spent:
                spent[key] = 0
            with book:
                y = x
                for _ in range(chain):
                    y = y.sin()
                y.sum().backward()
            if i >= 3:
                n = book.report.managed_count
                for key, total in spent.items():
                    best[key] = min(best[key], (total / n - wrapper_ns) * 1e-9)
    finally:
        for cls, name, key in parts:
            setattr(cls, name, real[key])
    return best


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _micro_in(src: Path, chain: int, repeats: int) -> dict[str, float]:
    """``micro`` run in a fresh interpreter with mcdla imported from ``src`` (``--baseline``)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_runtime_host_overhead", "--micro", str(chain),
                          "--repeats", str(repeats), "--json"], env=env, cwd=Path(__file__).parents[1],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def compare(baseline: Path, rounds: int, chain: int, repeats: int) -> str:
    """``--baseline``: the micro figures of mcdla from ``baseline`` and from this run's ``src``, alternating."""
    import mcdla

    current = Path(mcdla.__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    lines = ["| round | save_on_cpu before | mcdla before | ratio before | host tier before | save_on_cpu after | "
             "mcdla after | ratio after | host tier after |", "|---|---|---|---|---|---|---|---|---|"]
    for i in range(rounds):
        for key, src in (("before", baseline), ("after", current)):
            runs[key].append(_micro_in(src, chain, repeats))
        cells = []
        for key in ("before", "after"):
            m = runs[key][-1]
            cells += [f"{1e6 * m['save_on_cpu']:.2f} us", f"{1e6 * m['mcdla bookkeeping']:.2f} us",
                      f"{m['mcdla bookkeeping'] / m['save_on_cpu']:.2f}x",
                      f"{1e6 * m['mcdla host tier']:.2f} us ({m['mcdla host tier'] / m['save_on_cpu']:.1f}x)"]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    for label, fn in (("min", min), ("median", statistics.median)):
        cells = []
        for key in ("before", "after"):
            soc = fn(m["save_on_cpu"] for m in runs[key])
            book = fn(m["mcdla bookkeeping"] for m in runs[key])
            ratio = fn(m["mcdla bookkeeping"] / m["save_on_cpu"] for m in runs[key])
            host = fn(m["mcdla host tier"] for m in runs[key])
            host_ratio = fn(m["mcdla host tier"] / m["save_on_cpu"] for m in runs[key])
            cells += [f"{1e6 * soc:.2f} us", f"{1e6 * book:.2f} us", f"{ratio:.2f}x",
                      f"{1e6 * host:.2f} us ({host_ratio:.1f}x)"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro", type=int, default=0, help="time a chain of this many sin ops instead (see above)")
    ap.add_argument("--split", action="store_true", help="with --micro: also time pack, unpack and handle death")
    ap.add_argument("--baseline", type=Path, help="with --micro: also time mcdla from this src directory (above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: rounds of before and after")
    ap.add_argument("--json", action="store_true", help="with --micro: print the figures as one JSON line")
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.micro and args.baseline is not None:
        text = compare(args.baseline, args.rounds, args.micro, args.repeats)
        print(text)
        if args.write:
            from benchmarks._results import record

            record("runtime-host-overhead-micro",
                   "Runtime: bookkeeping per saved tensor vs save_on_cpu, two versions in one run (CPU time)",
                   f"PYTHONPATH=src .venv/bin/python -m benchmarks.bench_runtime_host_overhead --micro {args.micro} "
                   f"--repeats {args.repeats} --baseline BEFORE/src --rounds {args.rounds} --write", text)
        return
    if args.micro and args.json:
        print(json.dumps(micro(args.micro, args.repeats)))
        return
    if args.micro:
        m = micro(args.micro, args.repeats)
        print(f"CPU per saved tensor over plain: save_on_cpu {1e6 * m['save_on_cpu']:.1f} us, mcdla bookkeeping "
              f"{1e6 * m['mcdla bookkeeping']:.1f} us ({m['mcdla bookkeeping'] / m['save_on_cpu']:.1f}x), host tier "
              f"{1e6 * m['mcdla host tier']:.1f} us ({m['mcdla host tier'] / m['save_on_cpu']:.1f}x); "
              f"identity hooks {1e6 * m['identity hooks']:.1f} us, minimal bookkeeping "
              f"{1e6 * m['minimal bookkeeping']:.1f} us ({m['minimal bookkeeping'] / m['save_on_cpu']:.1f}x)")
        if args.split:
            parts = split(args.micro, args.repeats)
            print("wall per managed saved tensor inside mcdla's hooks: "
                  + ", ".join(f"{key} {1e6 * v:.2f} us" for key, v in parts.items())
                  + f" (sum {1e6 * sum(parts.values()):.2f} us)")
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
