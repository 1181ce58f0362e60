"""GPU check of optimizer and parameter offload: exactness of the CUDA paths, then step time and device memory
of a ~1.4B-parameter Llama-like model with AdamW state and weights on the device vs in mcdla's pool.

Prepared for the device machine (one CUDA GPU); ``--tiny`` runs every part on the CPU with tiny models (the
test suite does, ``tests/runtime/test_optimizer_offload.py``). Parts, each recorded even if another fails:

- ``exact``: a small model in bfloat16 on the device, three AdamW steps with fp32 masters, four ways from the
  same weights and data: a hand-written reference (gradients copied to the CPU, ``torch.optim.AdamW`` on CPU
  fp32 masters, weights copied back), ``offload_optimizer`` with the host tier, with the file tier, and with
  ``offload_parameters(prefetch=1)`` joined through ``parameters=`` and ``free_gradients=True``. Losses and weights must be equal to the
  reference's bit for bit (deterministic algorithms, attention written out, so gradients are reproducible).
  This runs the side streams, events, pinned copies and ``record_stream`` of both APIs.
- ``scale``: the ~1.4B model in bfloat16 (batch ``--batch`` x 1024 tokens): "device" keeps fp32 masters and
  AdamW state on the device (fused AdamW, 16 B per parameter with weights and gradients), "optimizer_host"
  offloads state and masters to the host tier (4 B per parameter left), "params_and_optimizer" also offloads
  the weights (``prefetch=2``) and drops each gradient once copied out (``free_gradients=True``). Per mode: median step seconds, peak and static device bytes; ratios to
  "device".
- ``file``: optimizer offload to ``file:`` on the device machine's disk (``--scratch``), on a ~150M model.

    python -m benchmarks.gpu_state_offload_check --out "$OUT"                        # on the GPU machine
    .venv/bin/python -m benchmarks.gpu_state_offload_check --tiny --out /tmp/gpu-st   # CPU smoke test

Needs torch, numpy and psutil, plus ``src`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks._gpu_check import check_parser, pick_device, run_parts, token_batch, write_results

LLAMA_1B = {"layers": 24, "dim": 2048, "heads": 16, "ffn": 5632, "vocab": 32000, "seq": 1024}
LLAMA_150M = {"layers": 8, "dim": 1024, "heads": 8, "ffn": 2816, "vocab": 32000, "seq": 512}
EXACT = {"layers": 2, "dim": 256, "heads": 4, "ffn": 512, "vocab": 1024, "seq": 128}
TINY = {"layers": 2, "dim": 32, "heads": 2, "ffn": 64, "vocab": 64, "seq": 16}


def build_model(cfg: dict[str, int]) -> Any:
    """A Llama-like decoder with an untied head (RMSNorm, attention written out, SwiGLU MLP); returns the loss."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg["dim"]
            self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.gate, self.up = nn.Linear(d, cfg["ffn"], bias=False), nn.Linear(d, cfg["ffn"], bias=False)
            self.down = nn.Linear(cfg["ffn"], d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, cfg["heads"], -1).transpose(1, 2) for z in self.qkv(self.norm1(x)).chunk(3, -1))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1) / math.sqrt(d // cfg["heads"])).masked_fill(~mask, float("-inf"))
            x = x + self.out((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.norm = nn.RMSNorm(cfg["dim"])
            self.head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    torch.manual_seed(0)
    return Llama()


class _ReferenceAdamW:
    """The hand-written reference: fp32 masters on the CPU, gradients copied there, weights copied back."""

    def __init__(self, model: Any, **hyper: Any) -> None:
        import torch

        self.params = [p for p in model.parameters()]
        self.masters = [p.detach().to("cpu", torch.float32).requires_grad_() for p in self.params]
        self.opt = torch.optim.AdamW(self.masters, **hyper)

    def step(self) -> None:
        import torch

        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.to("cpu", torch.float32)
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m.to(p.dtype).to(p.device))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def exact_part(device: str, cfg: dict[str, int], scratch: str, steps: int = 3) -> dict[str, Any]:
    """Losses and weights of the three offloaded ways against the reference, after ``steps`` AdamW steps."""
    import torch

    import mcdla

    hyper = {"lr": 1e-3, "weight_decay": 0.1}
    data = token_batch(cfg, 2, device)

    def run(kind: str) -> tuple[list[float], list[Any]]:
        model = build_model(cfg).to(device, torch.bfloat16)
        params = None
        if kind == "reference":
            opt: Any = _ReferenceAdamW(model, **hyper)
        else:
            if kind == "params_and_optimizer":
                params = mcdla.offload_parameters(model, pool="host", prefetch=1)
            pool = f"file:{scratch}" if kind == "optimizer_file" else "host"
            opt = mcdla.offload_optimizer(torch.optim.AdamW(model.parameters(), **hyper), pool=pool,
                                          parameters=params, free_gradients=params is not None)
        losses = []
        try:
            for _ in range(steps):
                loss = model(*data)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        finally:
            if kind != "reference":
                opt.close()
            if params is not None:
                params.close()
        return losses, [p.detach().cpu() for p in model.parameters()]

    want_losses, want_params = run("reference")
    out: dict[str, Any] = {"reference_losses": want_losses}
    for kind in ("optimizer_host", "optimizer_file", "params_and_optimizer"):
        try:
            losses, params = run(kind)
            out[kind] = {"same_losses": losses == want_losses,
                         "same_params": all(torch.equal(a, b) for a, b in zip(want_params, params))}
        except Exception as exc:  # noqa: BLE001 - one way failing must not lose the others
            out[kind] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return out


def _measure(step: Any, cuda: bool, steps: int) -> dict[str, Any]:
    import torch

    step()  # warm-up: state created, pinned buffers cached
    if cuda:
        torch.cuda.synchronize()
        static = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"step_s": statistics.median(times), "step_s_min": min(times)}
    if cuda:
        out.update(static_bytes=static, peak_bytes=torch.cuda.max_memory_allocated())
    return out


def scale_mode(mode: str, device: str, cfg: dict[str, int], batch: int, steps: int, pool: str) -> dict[str, Any]:
    """One training setup of the scale or file part: median step time and device bytes."""
    import torch

    import mcdla

    cuda = device == "cuda"
    model = build_model(cfg).to(device, torch.bfloat16)
    data = token_batch(cfg, batch, device)
    params = None
    if mode == "device":
        masters = [p.detach().float().requires_grad_() for p in model.parameters()]
        opt: Any = torch.optim.AdamW(masters, lr=1e-4, **({"fused": True} if cuda else {}))
    else:
        if mode == "params_and_optimizer":
            params = mcdla.offload_parameters(model, pool="host", prefetch=2)
        opt = mcdla.offload_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4), pool=pool, parameters=params,
                                      free_gradients=params is not None)

    def step() -> None:
        model(*data).backward()
        if mode == "device":
            for p, m in zip(model.parameters(), masters):
                m.grad = p.grad.float()
            opt.step()
            with torch.no_grad():
                for p, m in zip(model.parameters(), masters):
                    p.copy_(m)
            model.zero_grad()
        else:
            opt.step()
            opt.zero_grad()

    try:
        out = _measure(step, cuda, steps)
    finally:
        if mode != "device":
            out_stored = opt.stored_bytes
            opt.close()
        if params is not None:
            out_peak_params = params.peak_resident_bytes
            params.close()
    out["params"] = sum(p.numel() for p in model.parameters())
    if mode != "device":
        out["stored_bytes"] = out_stored
    if params is not None:
        out["peak_resident_param_bytes"] = out_peak_params
    return out


def main(argv: list[str] | None = None) -> int:
    ap = check_parser(__doc__, "tiny models on the CPU (smoke test)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--scratch", default=None, help="directory of the file tier (default: a temporary one)")
    args = ap.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: reproducible GEMMs

    import torch

    device = pick_device("gpu_state_offload_check", args.tiny)
    if device is None:
        return 2
    cuda = device == "cuda"
    torch.use_deterministic_algorithms(True, warn_only=True)
    started = time.perf_counter()
    steps = 1 if args.tiny else args.steps
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    with contextlib.ExitStack() as stack:
        scratch = args.scratch or stack.enter_context(tempfile.TemporaryDirectory(prefix="mcdla-gpu-state-"))
        parts = [("exact", lambda: exact_part(device, TINY if args.tiny else EXACT, scratch))]
        big = TINY if args.tiny else LLAMA_1B
        for mode in ("device", "optimizer_host", "params_and_optimizer"):
            parts.append((f"scale.{mode}", lambda m=mode: scale_mode(m, device, big, args.batch, steps, "host")))
        parts.append(("file", lambda: scale_mode("optimizer_file", device, TINY if args.tiny else LLAMA_150M,
                                                  args.batch, steps, f"file:{scratch}")))
        run_parts(parts, results, started=started, max_minutes=args.max_minutes, cuda=cuda)
    base = results.get("scale.device", {})
    for mode in ("optimizer_host", "params_and_optimizer"):
        r = results.get(f"scale.{mode}", {})
        if "step_s" in r and "step_s" in base:
            r["step_ratio"] = r["step_s"] / base["step_s"]
            if "peak_bytes" in r:
                r["peak_ratio"] = r["peak_bytes"] / base["peak_bytes"]
    results["wall_s"] = time.perf_counter() - started
    write_results(args.out, "gpu_state_offload_check", results, _markdown(results))
    return 0


def _markdown(r: dict[str, Any]) -> str:
    gib = 2**30
    lines = [f"{r['device']}, torch {r['torch']}", "", "| exactness vs the hand-written reference | losses | weights |",
             "|---|---|---|"]
    exact = r["exact"]
    for kind in ("optimizer_host", "optimizer_file", "params_and_optimizer"):
        e = exact.get(kind, exact)
        if "error" in e:
            lines.append(f"| {kind} | {e['error']} | |")
        else:
            lines.append(f"| {kind} | {'equal' if e['same_losses'] else 'DIFFER'} | "
                         f"{'equal' if e['same_params'] else 'DIFFER'} |")
    lines += ["", "| mode | step s (median) | vs device | peak GiB | static GiB | vs device peak |", "|---|---|---|---|---|---|"]
    for name in ("scale.device", "scale.optimizer_host", "scale.params_and_optimizer", "file"):
        m = r[name]
        if "error" in m:
            lines.append(f"| {name} | {m['error']} | | | | |")
            continue
        peak = f"{m['peak_bytes'] / gib:.2f}" if "peak_bytes" in m else "-"
        static = f"{m['static_bytes'] / gib:.2f}" if "static_bytes" in m else "-"
        ratio = f"{m['step_ratio']:.2f}x" if "step_ratio" in m else "-"
        peak_ratio = f"{m['peak_ratio']:.2f}" if "peak_ratio" in m else "-"
        lines.append(f"| {name} | {m['step_s']:.3f} | {ratio} | {peak} | {static} | {peak_ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
