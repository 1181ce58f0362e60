"""GPU check of the runtime: step time and peak memory of a GPT-2-medium-size transformer with no offload,
``torch.autograd.graph.save_on_cpu(pin_memory=True)`` and mcdla's host tier.

Prepared for the device machine (one CUDA GPU). Target: mcdla's host tier saves at least 40% of
activation memory at no more than 5% slowdown against no offload. Activation memory is the peak allocated
during a step minus what is allocated before it (weights, gradients, optimizer state). The batch fills most
of the device, capped so that save_on_cpu's full offload fits in 45% of host RAM (``--batch N`` overrides).
"mcdla_host" offloads ``1 - --keep`` of the baseline's activation bytes (its ``budget`` is the managed saved
bytes, counted in a calibration step, minus that), those used last in backward first; "mcdla_host_all"
offloads every managed saved tensor, as save_on_cpu does but on side streams. Each mode starts from the same weights and data; the first step's loss must be
identical across modes. Results go to ``--out`` (``gpu_runtime_check.json`` and ``.md``).

    python -m benchmarks.gpu_runtime_check --out "$OUT"                       # on the GPU machine
    .venv/bin/python -m benchmarks.gpu_runtime_check --tiny --out /tmp/gpu-rt   # CPU smoke test

Needs torch, numpy and psutil, plus ``src`` on ``PYTHONPATH`` (the runtime does not import mcdla.workload
unless a plan is given, so pydantic and yaml are not needed).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from typing import Any

from benchmarks._gpu_check import check_parser, pick_device, run_parts, token_batch, write_results

GPT2_MEDIUM = {"layers": 24, "dim": 1024, "heads": 16, "seq": 1024, "vocab": 50257}
TINY = {"layers": 2, "dim": 64, "heads": 4, "seq": 64, "vocab": 256}


def build_model(cfg: dict[str, int]) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg["dim"]
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, cfg["heads"], -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.wpe = nn.Embedding(cfg["seq"], cfg["dim"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln_f = nn.LayerNorm(cfg["dim"])

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    torch.manual_seed(0)
    return GPT()


class _Runner:
    """Runs training steps in one mode and measures time and device memory."""

    def __init__(self, cfg: dict[str, int], device: str, batch: int, state: dict, data: tuple) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.model = build_model(cfg).to(device)
        self.model.load_state_dict(state)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, **({"fused": True} if self.cuda else {}))
        self.idx, self.targets = data

    def autocast(self) -> Any:
        if self.cuda:
            return self.torch.autocast("cuda", dtype=self.torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, ctx: Any, *, update: bool = True) -> Any:
        self.opt.zero_grad(set_to_none=False)
        with ctx, self.autocast():
            loss = self.model(self.idx, self.targets)
            loss.backward()
        if update:
            self.opt.step()
        return loss.detach()

    def measure(self, make_ctx: Any, warmup: int, steps: int) -> dict[str, float]:
        torch = self.torch
        first = self.step(make_ctx()).item()
        for _ in range(max(0, warmup - 1)):
            self.step(make_ctx())
        if self.cuda:
            torch.cuda.synchronize()
            static = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step(make_ctx())
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out = {"first_loss": first, "step_s": statistics.median(times), "step_s_min": min(times)}
        if self.cuda:
            out["static_bytes"] = static
            out["peak_bytes"] = torch.cuda.max_memory_allocated()
            out["activation_bytes"] = out["peak_bytes"] - static
        return out


def _batch_for(cfg: dict[str, int], device: str, state: dict, requested: int | None) -> tuple[int, dict]:
    """Measure activation bytes per sample at batch 2 and size the batch to the device and the host."""
    import psutil
    import torch

    if requested:
        return requested, {"batch_rule": "given"}
    if device != "cuda":
        return 4, {"batch_rule": "tiny"}
    probe = 2
    data = token_batch(cfg, probe, device)
    run = _Runner(cfg, device, probe, state, data)
    per_sample = run.measure(contextlib.nullcontext, 1, 1)["activation_bytes"] / probe
    total = torch.cuda.get_device_properties(0).total_memory
    static = torch.cuda.memory_allocated()
    del run
    torch.cuda.empty_cache()
    by_device = math.floor(0.85 * (total - 2 * static) / per_sample)
    by_host = math.floor(0.45 * psutil.virtual_memory().total / per_sample)  # pinned rounding needs headroom
    rule = "device (85% of memory)" if by_device <= by_host else "host (save_on_cpu must fit 45% of RAM)"
    return max(1, min(by_device, by_host)), {"batch_rule": rule, "activation_bytes_per_sample": per_sample,
                                             "batch_by_device": by_device, "batch_by_host": by_host}


def main(argv: list[str] | None = None) -> int:
    ap = check_parser(__doc__, "a tiny model on the CPU (smoke test)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--keep", type=float, default=0.55, help="fraction of activation bytes kept on the device")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)

    import psutil
    import torch

    import mcdla
    from mcdla.runtime import HostTier

    device = pick_device("gpu_runtime_check", args.tiny)
    if device is None:
        return 2
    cuda = device == "cuda"
    cfg = TINY if args.tiny else GPT2_MEDIUM
    started = time.perf_counter()
    state = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}
    batch, sizing = _batch_for(cfg, device, state, args.batch)
    data = token_batch(cfg, batch, device)
    steps, warmup = (2, 1) if args.tiny else (args.steps, args.warmup)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                               "config": cfg, "batch": batch, **sizing, "keep": args.keep}

    base = _Runner(cfg, device, batch, state, data).measure(contextlib.nullcontext, warmup, steps)
    results["none"] = base
    act = base.get("activation_bytes")
    min_bytes = 4096 if args.tiny else 1 << 20
    host_bytes = int(0.8 * psutil.virtual_memory().total)  # the host tier may use 80% of RAM here

    def soc() -> dict[str, Any]:
        return _Runner(cfg, device, batch, state, data).measure(
            lambda: torch.autograd.graph.save_on_cpu(pin_memory=cuda), warmup, steps)

    def mcdla_mode(keep: float) -> dict[str, Any]:
        runner = _Runner(cfg, device, batch, state, data)
        pool = [HostTier(capacity_bytes=host_bytes)]
        calib = mcdla.virtualize(pool, budget=1 << 62, model=runner.model, min_bytes=min_bytes)
        runner.step(calib, update=False)  # counts the managed saved bytes; moves nothing, changes nothing
        managed = calib.report.managed_bytes
        # offload (1 - keep) of the baseline's activation bytes, taken from the saved storages used last
        budget = None if keep == 0.0 else max(0, int(managed - (1 - keep) * (act or managed)))
        vm = mcdla.virtualize(pool, budget=budget, model=runner.model, min_bytes=min_bytes)
        try:
            out = runner.measure(lambda: vm, warmup, steps)
        finally:
            vm.close()
        r = vm.report
        out.update({"budget_bytes": budget, "managed_bytes": managed, "offloaded_bytes": r.offloaded_bytes,
                    "peak_resident_saved_bytes": r.peak_resident_saved_bytes, "unpack_wait_s": r.unpack_wait_s,
                    "pack_wait_s": r.pack_wait_s, "fetches_on_demand": r.fetches_on_demand})
        return out

    modes = (("save_on_cpu", soc), ("mcdla_host", lambda: mcdla_mode(args.keep)),
             ("mcdla_host_all", lambda: mcdla_mode(0.0)))
    run_parts(modes, results, started=started, max_minutes=args.max_minutes, cuda=cuda)
    for mode, _ in modes:
        r = results[mode]
        if "step_s" in r:
            r["slowdown"] = r["step_s"] / base["step_s"] - 1
            r["same_first_loss"] = r["first_loss"] == base["first_loss"]
            if act:
                r["activation_saved"] = 1 - r["activation_bytes"] / act
    m = results["mcdla_host"]
    results["target_met"] = bool(act) and "step_s" in m and m["activation_saved"] >= 0.40 and m["slowdown"] <= 0.05
    results["wall_s"] = time.perf_counter() - started
    write_results(args.out, "gpu_runtime_check", results, _markdown(results))
    return 0


def _markdown(r: dict[str, Any]) -> str:
    gib = 2**30
    lines = [f"{r['device']}, torch {r['torch']}, batch {r['batch']} x seq {r['config']['seq']} "
             f"({r.get('batch_rule', '')}), {r['config']['layers']} layers x {r['config']['dim']}",
             "| mode | step s (median) | slowdown | peak GiB | activation GiB | activation saved | first loss equal |",
             "|---|---|---|---|---|---|---|"]
    for mode in ("none", "save_on_cpu", "mcdla_host", "mcdla_host_all"):
        m = r[mode]
        if "error" in m:
            lines.append(f"| {mode} | {m['error']} | | | | | |")
            continue
        peak = f"{m['peak_bytes'] / gib:.2f}" if "peak_bytes" in m else "-"
        act = f"{m['activation_bytes'] / gib:.2f}" if "activation_bytes" in m else "-"
        saved = f"{100 * m['activation_saved']:.0f}%" if "activation_saved" in m else "-"
        slow = f"{100 * m['slowdown']:+.1f}%" if "slowdown" in m else "-"
        lines.append(f"| {mode} | {m['step_s']:.3f} | {slow} | {peak} | {act} | {saved} | "
                     f"{m.get('same_first_loss', True)} |")
    lines.append(f"target (>= 40% activation memory saved at <= 5% slowdown) met: {r['target_met']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
