"""Step time and device bytes of a small Llama-like model with AdamW (and its weights) offloaded by mcdla vs
plain AdamW.

Modes, interleaved step by step from the same weights and data: "plain" (``torch.optim.AdamW``), "host"
and "file" (``mcdla.offload_optimizer`` with the state in that tier, updates overlapped with backward),
"host, no overlap" (``overlap=False``: every update in ``step()``, to show what the overlap hides) and
"host + weights" (``mcdla.offload_parameters(prefetch=1)`` joined through ``parameters=``). Step times are
the fastest of ``--steps`` steps after one warm-up step (other load on this shared machine only ever adds
time), with the median alongside; ratios are of the fastest, against "plain" in the same run.
"state bytes on device" is what the optimizer holds in memory between steps (the plain optimizer's moments;
the offloaded one's scalars), "state bytes in tier" what the pool holds, "weight bytes on device (peak)" the
parameter offloader's peak resident bytes (the plain model's parameter bytes otherwise). On this CPU-only
machine the device
is the CPU, so the copies out and back are plain copies; the final parameters of every mode must equal the
plain run's (checked, and printed).

    .venv/bin/python -m benchmarks.bench_runtime_optimizer [--steps 7] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from benchmarks.gpu_state_offload_check import build_model
from mcdla.runtime import offload_optimizer, offload_parameters

SMALL = {"layers": 4, "dim": 256, "heads": 4, "ffn": 688, "seq": 128, "vocab": 4096}


def _plain_state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def run(steps: int, directory: str, batch: int = 4) -> dict[str, dict[str, Any]]:
    """Measure every mode; returns per mode its median step seconds, bytes and whether it matched plain."""
    torch.manual_seed(0)
    idx = torch.randint(0, SMALL["vocab"], (batch, SMALL["seq"]))
    targets = torch.randint(0, SMALL["vocab"], (batch, SMALL["seq"]))
    specs = {"plain": None, "host": ("host", True), "file": (f"file:{directory}", True),
             "host, no overlap": ("host", False), "host + weights": ("host", True)}
    models, opts, weights = {}, {}, None
    for mode, spec in specs.items():
        models[mode] = build_model(SMALL)
        if mode == "host + weights":
            weights = offload_parameters(models[mode], pool="host", prefetch=1)
        inner = torch.optim.AdamW(models[mode].parameters(), lr=1e-3)
        opts[mode] = inner if spec is None else offload_optimizer(inner, pool=spec[0], overlap=spec[1],
                                                                  parameters=weights if mode == "host + weights" else None)
    times: dict[str, list[float]] = {m: [] for m in specs}
    for i in range(steps + 1):
        for mode in specs:
            t0 = time.perf_counter()
            models[mode](idx, targets).backward()
            opts[mode].step()
            opts[mode].zero_grad()
            if i > 0:
                times[mode].append(time.perf_counter() - t0)
            if i == 0 and weights is not None:
                weights.reset_report()  # the peak of the steps after the first, whose forward order is known
    assert weights is not None
    weights_peak = weights.peak_resident_bytes
    weights.close()  # the weights back on the device before they are compared (an emptied storage has no bytes)
    param_bytes = sum(p.numel() * p.element_size() for p in models["plain"].parameters())
    plain_s = min(times["plain"])
    out = {}
    for mode in specs:
        opt = opts[mode]
        same = all(torch.equal(a, b) for a, b in zip(models["plain"].parameters(), models[mode].parameters()))
        on_device = _plain_state_bytes(opt) if mode == "plain" else opt.resident_state_bytes
        out[mode] = {"step_s": min(times[mode]), "median_s": statistics.median(times[mode]),
                     "ratio": min(times[mode]) / plain_s,
                     "state_on_device_bytes": on_device,
                     "state_in_tier_bytes": 0 if mode == "plain" else opt.stored_bytes,
                     "weights_on_device_bytes": weights_peak if mode == "host + weights" else param_bytes,
                     "same_params": same}
        if mode != "plain":
            opt.close()
    out["plain"]["params"] = sum(p.numel() for p in models["plain"].parameters())
    return out


def _table(r: dict[str, dict[str, Any]]) -> str:
    from benchmarks._results import markdown_table

    rows = [(m, f"{v['step_s']:.3f}", f"{v['median_s']:.3f}", f"{v['ratio']:.2f}x", f"{v['state_on_device_bytes'] / 2**20:.2f} MiB",
             f"{v['state_in_tier_bytes'] / 2**20:.2f} MiB", f"{v['weights_on_device_bytes'] / 2**20:.2f} MiB",
             "yes" if v["same_params"] else "NO")
            for m, v in r.items()]
    head = ("mode", "step s (fastest)", "step s (median)", "vs plain (fastest)", "state bytes on device", "state bytes in tier",
            "weight bytes on device (peak)", "params equal plain")
    return (markdown_table(head, rows)
            + f"\n\nLlama-like model {SMALL}, {r['plain']['params']:,} parameters, batch 4, AdamW, float32, CPU "
            "(one torch thread). Here the CPU is also the training device, so the overlapped updates compete with "
            "backward for the same two cores and the step-time ratios measure the offload's CPU cost (copies, "
            "tier I/O, per-parameter bookkeeping); on a GPU the updates run beside the device's backward.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mcdla-bench-opt-") as d:
        r = run(args.steps, d)
    text = _table(r)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-optimizer", "Runtime: optimizer and weight offload (AdamW state, weights in the pool) vs plain AdamW",
               f".venv/bin/python -m benchmarks.bench_runtime_optimizer --steps {args.steps} --write", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
