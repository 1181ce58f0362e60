"""GPU check of the closed loop: ``mcdla validate`` for two models with the host tier on CUDA.

Prepared for the device machine (one CUDA GPU): profile, plan, predict and run the MLP and the transformer
with their saved tensors offloaded to pinned host memory, and record the prediction errors. Results go to
``$OUT`` (``--out``): ``gpu_validate.json`` and ``gpu_validate.md`` (the table to paste into
``benchmarks/RESULTS.md``), and a measured-vs-predicted timeline PNG per run. ``--tiny`` runs the same code
path on small models on whatever device there is (the CPU here), as a smoke test. Run::

    python -m benchmarks.gpu_validate_check --out "$OUT"            # on the GPU machine
    .venv/bin/python -m benchmarks.gpu_validate_check --tiny --out /tmp/gpu-check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

RUNS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "MLP": ("mlp", 4096, {"in_features": 4096, "width": 4096, "depth": 8}),
    "transformer": ("transformer", 16, {"d_model": 1024, "heads": 16, "layers": 8, "seq_len": 1024, "vocab": 8192}),
}
TINY: dict[str, tuple[str, int, dict[str, Any]]] = {
    "MLP": ("mlp", 256, {"in_features": 256, "width": 256, "depth": 3}),
    "transformer": ("transformer", 2, {"d_model": 64, "heads": 2, "layers": 2, "seq_len": 64, "vocab": 128}),
}
BUDGET = "50%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true", help="small models on any device (smoke test)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from mcdla.report.validate import validate

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_validate_check: no CUDA device; use --tiny for the CPU smoke test", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    runs = TINY if args.tiny else RUNS
    args.out.mkdir(parents=True, exist_ok=True)
    results, lines = [], []
    started = time.perf_counter()
    for label, (name, batch, scale) in runs.items():
        r = validate(name, pool="host", budget=BUDGET, batch=batch, scale=scale, steps=args.steps,
                     warmup=args.warmup, device=device, plot=args.out / f"timeline-{name}.png",
                     min_bytes=(16 << 10) if args.tiny else (256 << 10))
        print(r.summary(), flush=True)
        row = r.to_dict()
        row["label"] = label
        results.append(row)
        lines.append(
            f"| {label} | {BUDGET} | {len(r.offloaded_layers)}/{r.layers} ({r.measured_offload_bytes / 2**20:.0f} MiB) | "
            f"{r.plain_step_s * 1e3:.2f} | {r.predicted_step_s * 1e3:.2f} | {r.measured_step_s * 1e3:.2f} | "
            f"{r.step_time_error:+.1%} | {r.predicted_peak_saved_bytes / 2**20:.1f} | "
            f"{r.measured_peak_saved_bytes / 2**20:.1f} | {r.peak_saved_error:+.1%} |"
        )
    gpu = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    link = results[0]["link"]
    md = "\n".join([
        f"## GPU closed-loop check (`python -m benchmarks.gpu_validate_check --out $OUT"
        f"{' --tiny' if args.tiny else ''}`)",
        "",
        f"{gpu}, torch {torch.__version__}, host tier (pinned host memory), planner default, {args.steps} "
        f"measured rounds; probed D2H {link['offload_bytes_per_s'] / 1e9:.1f} GB/s, H2D "
        f"{link['prefetch_bytes_per_s'] / 1e9:.1f} GB/s; {time.perf_counter() - started:.0f} s in all.",
        "",
        "| model | budget | offloaded layers | plain ms | predicted ms | measured ms | error | predicted peak MiB | "
        "measured peak MiB | peak error |",
        "|" + "---|" * 10,
        *lines,
    ])
    (args.out / "gpu_validate.json").write_text(json.dumps(results, indent=2, default=float))
    (args.out / "gpu_validate.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
