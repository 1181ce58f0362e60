"""Step time and optimizer bytes of a small GPT-2-like model with AdamW offloaded by mcdla vs plain AdamW.

Modes, interleaved step by step from the same weights and data: "plain" (``torch.optim.AdamW``), "host"
and "file" (``mcdla.offload_optimizer`` with the state in that tier, updates overlapped with backward) and
"host, no overlap" (``overlap=False``: every update in ``step()``, to show what the overlap hides). Each
figure is the median of ``--steps`` steps after one warm-up step; ratios are against "plain" in the same run.
"state bytes on device" is what the optimizer holds in memory between steps (the plain optimizer's moments;
the offloaded one's scalars), "state bytes in tier" what the pool holds. On this CPU-only machine the device
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

from benchmarks.gpu_runtime_check import build_model
from mcdla.runtime import offload_optimizer

SMALL = {"layers": 4, "dim": 256, "heads": 4, "seq": 128, "vocab": 4096}


def _plain_state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def run(steps: int, directory: str, batch: int = 4) -> dict[str, dict[str, Any]]:
    """Measure every mode; returns per mode its median step seconds, bytes and whether it matched plain."""
    torch.manual_seed(0)
    idx = torch.randint(0, SMALL["vocab"], (batch, SMALL["seq"]))
    targets = torch.randint(0, SMALL["vocab"], (batch, SMALL["seq"]))
    specs = {"plain": None, "host": ("host", True), "file": (f"file:{directory}", True),
             "host, no overlap": ("host", False)}
    models, opts = {}, {}
    for mode, spec in specs.items():
        models[mode] = build_model(SMALL)
        inner = torch.optim.AdamW(models[mode].parameters(), lr=1e-3)
        opts[mode] = inner if spec is None else offload_optimizer(inner, pool=spec[0], overlap=spec[1])
    times: dict[str, list[float]] = {m: [] for m in specs}
    for i in range(steps + 1):
        for mode in specs:
            t0 = time.perf_counter()
            models[mode](idx, targets).backward()
            opts[mode].step()
            opts[mode].zero_grad()
            if i > 0:
                times[mode].append(time.perf_counter() - t0)
    plain_s = statistics.median(times["plain"])
    out = {}
    for mode in specs:
        opt = opts[mode]
        same = all(torch.equal(a, b) for a, b in zip(models["plain"].parameters(), models[mode].parameters()))
        on_device = _plain_state_bytes(opt) if mode == "plain" else opt.resident_state_bytes
        out[mode] = {"step_s": statistics.median(times[mode]), "ratio": statistics.median(times[mode]) / plain_s,
                     "state_on_device_bytes": on_device,
                     "state_in_tier_bytes": 0 if mode == "plain" else opt.stored_bytes,
                     "same_params": same}
        if mode != "plain":
            opt.close()
    out["plain"]["params"] = sum(p.numel() for p in models["plain"].parameters())
    return out


def _table(r: dict[str, dict[str, Any]]) -> str:
    from benchmarks._results import markdown_table

    rows = [(m, f"{v['step_s']:.3f}", f"{v['ratio']:.2f}x", f"{v['state_on_device_bytes'] / 2**20:.2f} MiB",
             f"{v['state_in_tier_bytes'] / 2**20:.2f} MiB", "yes" if v["same_params"] else "NO")
            for m, v in r.items()]
    head = ("mode", "step s (median)", "vs plain", "state bytes on device", "state bytes in tier",
            "params equal plain")
    return (markdown_table(head, rows)
            + f"\n\nGPT-2-like model {SMALL}, {r['plain']['params']:,} parameters, batch 4, AdamW, float32, CPU.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mcdla-bench-opt-") as d:
        r = run(args.steps, d)
    text = _table(r)
    print(text)
    if args.write:
        from benchmarks._results import record

        record("runtime-optimizer", "Runtime: optimizer offload (AdamW state in the pool) vs plain AdamW",
               f".venv/bin/python -m benchmarks.bench_runtime_optimizer --steps {args.steps} --write", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
