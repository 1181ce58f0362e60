"""Accuracy of the closed loop on this machine: predicted vs measured step time and peak resident saved bytes.

For MLP, CNN (VGG-E), LSTM and transformer x three budgets, with the file tier: ``mcdla.report.validate``
profiles the model, plans it, predicts the step with the simulator and runs it under the runtime. The
baseline measured in the same run is the plain step (no mcdla): the table gives the runtime's overhead over
it next to the prediction error. Run::

    .venv/bin/python -m benchmarks.bench_validate            # print the table
    .venv/bin/python -m benchmarks.bench_validate --write    # also record it in benchmarks/RESULTS.md

The machine is shared: with ``--wait-quiet S`` (default 300) the run first waits up to S seconds for the
1-minute load average to drop below ``--quiet-load`` (default 0.5) and records the load it ran under.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "MLP": ("mlp", 512, {"in_features": 1024, "width": 1024, "depth": 6}),
    "CNN": ("vgg-e", 16, {"resolution": 64, "width": 0.25, "num_classes": 10}),
    "LSTM": ("lstm", 64, {"hidden": 512, "seq_len": 32, "layers": 2, "input_size": 512, "num_classes": 32, "chunk": 4}),
    "transformer": ("transformer", 8, {"d_model": 256, "heads": 4, "layers": 4, "seq_len": 256, "vocab": 512}),
}
BUDGETS = ("75%", "50%", "25%")
_START, _END = "<!-- bench_validate:start -->", "<!-- bench_validate:end -->"


def _wait_quiet(limit_s: float, threshold: float) -> float:
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def _row(label: str, budget: str, r: Any) -> dict[str, Any]:
    return {
        "model": label, "budget": budget, "layers": r.layers, "offloaded": len(r.offloaded_layers),
        "offload_mib": r.measured_offload_bytes / 2**20, "planned_mib": r.planned_offload_bytes / 2**20,
        "plain_ms": r.plain_step_s * 1e3, "pred_ms": r.predicted_step_s * 1e3, "meas_ms": r.measured_step_s * 1e3,
        "time_err": r.step_time_error, "pred_peak_mib": r.predicted_peak_saved_bytes / 2**20,
        "meas_peak_mib": r.measured_peak_saved_bytes / 2**20, "peak_err": r.peak_saved_error,
        "wait_ms": r.unpack_wait_s * 1e3, "write_gbs": r.link.offload_bytes_per_s / 1e9,
        "read_gbs": r.link.prefetch_bytes_per_s / 1e9, "planner": r.planner,
        "spread": (max(r.measured_step_samples_s) - min(r.measured_step_samples_s)) / r.measured_step_s,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| model | budget | offloaded layers (MiB) | plain ms | predicted ms | measured ms | error | "
            "measured spread | predicted peak MiB | measured peak MiB | peak error |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget']} | {r['offloaded']}/{r['layers']} ({r['offload_mib']:.1f}) | "
            f"{r['plain_ms']:.1f} | {r['pred_ms']:.1f} | {r['meas_ms']:.1f} | {r['time_err']:+.1%} | "
            f"{r['spread']:.0%} | {r['pred_peak_mib']:.2f} | {r['meas_peak_mib']:.2f} | {r['peak_err']:+.1%} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    t = [abs(r["time_err"]) for r in rows]
    p = [abs(r["peak_err"]) for r in rows]
    return (f"median |step-time error| {statistics.median(t):.1%} (max {max(t):.1%}); "
            f"median |peak-saved error| {statistics.median(p):.1%} (max {max(p):.1%}); {len(rows)} runs")


def record(text: str, path: Path) -> None:
    """Replace this benchmark's section of RESULTS.md (between its markers), or append it."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{_START}\n{text.rstrip()}\n{_END}\n"
    if _START in old and _END in old:
        new = old[: old.index(_START)] + block + old[old.index(_END) + len(_END) + 1 :]
    else:
        new = old.rstrip() + "\n\n" + block
    path.write_text(new)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--planner", default=None)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--min-bytes", type=int, default=64 << 10)
    parser.add_argument("--pool-dir", default=None)
    parser.add_argument("--wait-quiet", type=float, default=300.0)
    parser.add_argument("--quiet-load", type=float, default=0.5)
    parser.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = parser.parse_args(argv)

    from mcdla.report.validate import validate

    load_before = _wait_quiet(args.wait_quiet, args.quiet_load)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcdla-bench-validate-", dir=args.pool_dir) as pool_dir:
        for label in args.models.split(","):
            name, batch, scale = MODELS[label]
            for budget in args.budgets.split(","):
                r = validate(name, pool=f"file:{pool_dir}", budget=budget, planner=args.planner, steps=args.steps,
                             warmup=args.warmup, batch=batch, scale=scale, threads=args.threads,
                             min_bytes=args.min_bytes)
                rows.append(_row(label, budget, r))
                print(f"{label:12s} {budget:>4s}: predicted {r.predicted_step_s * 1e3:8.1f} ms, measured "
                      f"{r.measured_step_s * 1e3:8.1f} ms ({r.step_time_error:+.1%}); peak saved "
                      f"{r.peak_saved_error:+.1%}; offloaded {len(r.offloaded_layers)} layers", flush=True)
    load_after = os.getloadavg()[0]
    import torch

    command = ".venv/bin/python -m benchmarks.bench_validate " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"## Closed-loop validation: predicted vs measured (`{command.strip()}`)",
        "",
        f"CPU, file tier, {torch.get_num_threads() if args.threads is None else args.threads} torch threads, "
        f"planner {rows[0]['planner']}, {args.steps} measured rounds after {args.warmup} warm-up, min_bytes "
        f"{args.min_bytes} B; probed file tier write {statistics.median(r['write_gbs'] for r in rows):.2f} GB/s, "
        f"read {statistics.median(r['read_gbs'] for r in rows):.2f} GB/s (medians over runs); 1-min load average "
        f"{load_before:.2f} before, {load_after:.2f} after. Error = (predicted - measured) / measured; measured "
        "spread = (max - min) / median of the measured runtime steps.",
        "",
        table(rows),
        "",
        summary(rows),
    ])
    print()
    print(text)
    if args.write:
        record(text, Path(__file__).with_name("RESULTS.md"))


if __name__ == "__main__":
    main()
