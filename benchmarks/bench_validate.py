"""Accuracy of the closed loop on this machine: predicted vs measured step time and peak resident saved bytes.

For MLP, CNN (VGG-E), LSTM and transformer x three budgets, with the file tier: ``mcdla.report.validate``
profiles the model, plans it, predicts the step with the simulator and runs it under the runtime. The
baseline measured in the same run is the plain step (no mcdla): the table gives the runtime's overhead over
it next to the prediction error. Run::

    .venv/bin/python -m benchmarks.bench_validate               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_validate --no-record   # print only

The machine is shared: with ``--wait-quiet S`` (default 300) the run first waits up to S seconds for the
1-minute load average to drop below ``--quiet-load`` (default 0.5) and records the load it ran under.
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._results import bench_parser

MODELS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "MLP": ("mlp", 512, {"in_features": 1024, "width": 1024, "depth": 6}),
    "CNN": ("vgg-e", 16, {"resolution": 64, "width": 0.25, "num_classes": 10}),
    "LSTM": ("lstm", 128, {"hidden": 512, "seq_len": 16, "layers": 2, "input_size": 512, "num_classes": 32, "chunk": 4}),
    "transformer": ("transformer", 8, {"d_model": 256, "heads": 4, "layers": 4, "seq_len": 128, "vocab": 512}),
}
BUDGETS = ("50%", "35%", "20%")
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
        "time_err": r.step_time_error, "engine_ms": r.engine_step_s * 1e3,
        "engine_err": (r.engine_step_s - r.measured_step_s) / r.measured_step_s,
        "copy_s_per_gb": r.copy_cost_s_per_byte * 1e9, "pred_peak_mib": r.predicted_peak_saved_bytes / 2**20,
        "meas_peak_mib": r.measured_peak_saved_bytes / 2**20, "peak_err": r.peak_saved_error,
        "wait_ms": r.unpack_wait_s * 1e3, "pack_wait_ms": r.pack_wait_s * 1e3,
        "pred_wait_ms": r.predicted_wait_s * 1e3, "cap_mib": r.saved_budget_bytes / 2**20, "write_gbs": r.link.offload_bytes_per_s / 1e9,
        "read_gbs": r.link.prefetch_bytes_per_s / 1e9, "planner": r.planner,
        "spread": (max(r.measured_step_samples_s) - min(r.measured_step_samples_s)) / r.measured_step_s,
        "load": os.getloadavg()[0],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| model | budget | offloaded layers (MiB planned / moved) | plain ms | measured ms | measured spread | predicted ms | "
            "error | engine alone ms | error | copy cost s/GB | predicted peak MiB | measured peak MiB | peak error | "
            "cap MiB | waits ms (predicted / pack / unpack) | load |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget']} | {r['offloaded']}/{r['layers']} ({r['planned_mib']:.1f} / "
            f"{r['offload_mib']:.1f}) | "
            f"{r['plain_ms']:.1f} | {r['meas_ms']:.1f} | {r['spread']:.0%} | {r['pred_ms']:.1f} | "
            f"{r['time_err']:+.1%} | {r['engine_ms']:.1f} | {r['engine_err']:+.1%} | {r['copy_s_per_gb']:.3f} | "
            f"{r['pred_peak_mib']:.2f} | {r['meas_peak_mib']:.2f} | {r['peak_err']:+.1%} | {r['cap_mib']:.2f} | "
            f"{r['pred_wait_ms']:.1f} / {r['pack_wait_ms']:.1f} / {r['wait_ms']:.1f} | {r['load']:.1f} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    t = [abs(r["time_err"]) for r in rows]
    e = [abs(r["engine_err"]) for r in rows]
    p = [abs(r["peak_err"]) for r in rows]
    return (f"median |step-time error| {statistics.median(t):.1%} (max {max(t):.1%}), engine alone "
            f"{statistics.median(e):.1%} (max {max(e):.1%}); median |peak-saved error| {statistics.median(p):.1%} "
            f"(max {max(p):.1%}); {len(rows)} runs")


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
    parser = bench_parser(__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--planner", default=None)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch compute threads; 1 leaves the second core to the runtime's I/O threads")
    parser.add_argument("--min-bytes", type=int, default=256 << 10)
    parser.add_argument("--pool-dir", default=None)
    parser.add_argument("--wait-quiet", type=float, default=300.0)
    parser.add_argument("--quiet-load", type=float, default=0.5)
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
    command = ".venv/bin/python -m benchmarks.bench_validate " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"## Closed-loop validation: predicted vs measured (`{command.strip()}`)",
        "",
        f"CPU ({os.cpu_count()} cores), file tier, {args.threads} torch compute thread(s), "
        f"planner {rows[0]['planner']}, {args.steps} measured rounds after {args.warmup} warm-up, min_bytes "
        f"{args.min_bytes} B; probed file tier write {statistics.median(r['write_gbs'] for r in rows):.2f} GB/s, "
        f"read {statistics.median(r['read_gbs'] for r in rows):.2f} GB/s (medians over runs); 1-min load average "
        f"{load_before:.2f} before, {load_after:.2f} after. Error = (predicted - measured) / measured; measured "
        "spread = (max - min) / median of the measured runtime steps; cap = the plan's budget less static bytes, "
        "which the engine and the runtime both hold resident saved bytes to (the runtime's forward waits in pack "
        "for offloads to free room); waits = the engine's compute waits (memory and prefetch stalls) and the "
        "runtime's in the median step; load = 1-min load average after the run.",
        "",
        table(rows),
        "",
        summary(rows),
    ])
    print()
    print(text)
    if not args.no_record:
        record(text, Path(__file__).with_name("RESULTS.md"))


if __name__ == "__main__":
    main()
