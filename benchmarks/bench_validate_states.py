"""Accuracy of ``mcdla validate --states`` on this machine: predicted vs measured Adam step with weights, gradients
and optimizer state offloaded.

Six cases (MLPs at batch 128, ``--threads 1``): widths and depths, the host and the file tier, and two plans
beside the default one (every module's weights, gradients and optimizer state offloaded): ``opt-only``
(gradients and optimizer state, weights kept) and ``weights-only``. Each case runs ``--runs`` times, the cases
interleaved so that load drifting over minutes hits them alike. Run::

    .venv/bin/python -m benchmarks.bench_validate_states               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_validate_states --no-record   # print only

The machine is shared: with ``--wait-quiet S`` the run first waits up to S seconds for the 1-minute load
average to drop below ``--quiet-load``; every run records the load it started under.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import sys
import tempfile
from typing import Any

from benchmarks._results import bench_parser, markdown_table, print_and_record
from benchmarks.bench_validate import _wait_quiet

CASES: tuple[tuple[str, int, int, str, str], ...] = (  # label, width, depth, pool ("file": a temporary dir), plan
    ("w1024 d4 host", 1024, 4, "host", "all"),
    ("w1024 d8 host", 1024, 8, "host", "all"),
    ("w512 d4 host", 512, 4, "host", "all"),
    ("w1024 d4 file", 1024, 4, "file", "all"),
    ("w1024 d4 host opt-only", 1024, 4, "host", "opt-only"),
    ("w1024 d4 host weights-only", 1024, 4, "host", "weights-only"),
)


def _plan(resolved: Any, kind: str) -> Any:
    """The default plan (``None``) or the default plan with the weights (``opt-only``) or the gradients and
    optimizer state (``weights-only``) kept on the device."""
    if kind == "all":
        return None
    from mcdla.profile.profiler import profile_run
    from mcdla.report.validate_states import offload_all_plan
    from mcdla.workload.plan import Placement

    prof = profile_run(resolved.model, resolved.example_inputs, resolved.loss_fn, warmup_steps=1, measured_steps=1,
                       name=resolved.name)
    base = offload_all_plan(prof.workload, {n for n, _ in resolved.model.named_modules()})
    kept = ({"weights": Placement.DEVICE} if kind == "opt-only"
            else {"gradients": Placement.DEVICE, "optimizer_state": Placement.DEVICE})
    return dataclasses.replace(base, state=tuple(dataclasses.replace(sd, **kept) for sd in base.state))


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--wait-quiet", type=float, default=0.0)
    parser.add_argument("--quiet-load", type=float, default=1.0)
    args = parser.parse_args(argv)

    from mcdla.profile.resolve import resolve_model
    from mcdla.report.validate_states import validate_states

    rows: list[tuple[str, ...]] = []
    errors: list[float] = []
    fastest: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mcdla-bench-states-") as pool_dir:
        for run in range(args.runs):
            for label, width, depth, pool, kind in CASES:
                load = _wait_quiet(args.wait_quiet, args.quiet_load)
                resolved = resolve_model("mlp", batch=128, scale={"width": width, "depth": depth})
                r = validate_states(resolved, pool=f"file:{pool_dir}" if pool == "file" else pool,
                                    plan=_plan(resolved, kind), steps=args.steps, threads=1)
                errors.append(abs(r.step_time_error))
                fastest.append(abs(r.fastest_error))
                spread = max(r.measured_step_samples_s) / min(r.measured_step_samples_s) - 1
                rows.append((label, str(run + 1), f"{load:.1f}", f"{r.predicted_step_s * 1e3:.1f}",
                             f"{r.measured_step_s * 1e3:.1f}", f"{r.step_time_error:+.1%}",
                             f"{r.fastest_predicted_step_s * 1e3:.1f} / {min(r.measured_step_samples_s) * 1e3:.1f}",
                             f"{r.fastest_error:+.1%}",
                             f"{r.spare_core_error:+.1%}", f"{r.serial_step_error:+.1%}",
                             f"{r.cpu_sharing[0]:.2f}, {r.cpu_sharing[1]:.2f}",
                             f"{r.offloader_s_per_unit_pass * 1e3:.2f}", f"{spread:.0%}"))
                print(" | ".join(rows[-1]), flush=True)
    header = ("case", "run", "load", "predicted ms", "measured ms", "error",
              "least disturbed: predicted / fastest ms", "error", "spare-core error", "serial error",
              "sharing (compute, update)", "offloader ms / unit-pass", "step spread")
    command = ".venv/bin/python -m benchmarks.bench_validate_states " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"MLPs at batch 128, `--threads 1 --steps {args.steps}`, {args.runs} run(s) per case interleaved; load = "
        "1-minute load average when the run started; least disturbed: the prediction from each measured "
        "part's fastest round against the fastest step (NOTE [least disturbed] in `mcdla/report/validate_states.py`); "
        "step spread = slowest / fastest measured step - 1.",
        "",
        markdown_table(header, rows),
        "",
        f"Median |error| {statistics.median(errors):.1%} over {len(errors)} runs (max {max(errors):.1%}); least "
        f"disturbed {statistics.median(fastest):.1%} (max {max(fastest):.1%}).",
    ])
    print()
    print_and_record(args, "bench_validate_states", "`mcdla validate --states`: the six cases", command.strip(), text)


if __name__ == "__main__":
    main()
