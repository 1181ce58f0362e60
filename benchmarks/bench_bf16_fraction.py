"""A bf16 GEMM peak fraction for Blackwell fitted on the MoE family's three bf16 rows (measured, not adopted).

The ``b200``, ``gb200-nvl72`` and ``gb300-nvl72`` presets carry ``node.gemm_efficiency.peak_fraction`` 0.7, the
value of a preset without a curve: no fitting source publishes a dense bf16 run on these GPUs with its
configuration (``docs/llm.md`` "Megatron-Bridge MoE"). The only bf16 rows on them are three of
``validate-llm --family megatron-bridge-moe`` (Qwen3-235B-A22B on GB200 and GB300, DeepSeek-V3 on GB200). This
fits one fraction, set on the three presets, to those rows as the fp8 fractions are fitted (the 0.01 grid point
over 0.40-0.80 with the least RMS relative error, the lower on a tie) and cross-validates it leaving one row out.
The bf16 rows read no ``fp8_fraction``; the fp8 rows on the same presets read both (their GEMMs at
``fp8_fraction`` of the bf16 curve against the fp8 peak, their attention core and logits on the bf16 curve), so at
each fraction the per-chip ``fp8_fraction`` is refitted on the Llama FP8 rows by its own procedure (0.01 grid
over 0.60-1.00, B200 on ``b200`` and ``gb200-nvl72``, B300 on ``gb300-nvl72``) and every family's mean and max
|error| are reported with it (the families on other presets do not move). ``--joint`` also fits the fraction on
the bf16 rows and the eight Blackwell Llama FP8 rows together (the least RMS over the eleven, 0.02 grid over
0.50-0.76, each point with its refitted fp8 fractions). Run::

    .venv/bin/python -m benchmarks.bench_bf16_fraction               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_bf16_fraction --no-record   # print only
    .venv/bin/python -m benchmarks.bench_bf16_fraction --joint       # also the joint fit (about 10 CPU minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
from typing import Any

from benchmarks._results import markdown_table, record
from benchmarks.bench_fp8_loo import GRID as FP8_GRID
from benchmarks.bench_fp8_loo import cross_validate, fit
from mcdla.report.llm_validation import FAMILIES, MeasuredRun, run_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

GRID = tuple(i / 100 for i in range(40, 81))
"""The bf16 peak fraction's grid, 0.01 steps over 0.40-0.80."""
CHIP = {"b200": "B200", "gb200-nvl72": "B200", "gb300-nvl72": "B300"}
"""The Blackwell presets the fraction is set on, with the GPU chip whose fp8_fraction each carries."""
SHOWN = (0.50, 0.55, 0.60, 0.65, 0.70)
"""Fractions reported with every family beside the fitted one (0.70: the presets')."""
JOINT_GRID = tuple(i / 100 for i in range(50, 77, 2))
"""The joint fit's grid (``--joint``), 0.02 steps over 0.50-0.76: each point refits both chips' fp8_fraction."""


def error(run: MeasuredRun, peak_fraction: float, fp8_fraction: float | None = None) -> float:
    """The run's signed relative error with a Blackwell preset's ``peak_fraction`` (and ``fp8_fraction`` where
    given) set; a run on another preset as shipped."""
    cluster = run_cluster(run, None)
    if run.system in CHIP:
        fields: dict[str, float] = {"peak_fraction": peak_fraction}
        if fp8_fraction is not None:
            fields["fp8_fraction"] = fp8_fraction
        cluster = cluster.with_gemm_efficiency(dataclasses.replace(cluster.gemm_efficiency, **fields))
    step = llm_step(preset(run.model), run.execution, cluster, precision=run.precision)
    return step.iteration_s / run.measured_s - 1.0


@functools.cache
def fp8_refit(peak_fraction: float) -> tuple[dict[str, float], list[float]]:
    """Each Blackwell chip's fp8_fraction refitted at ``peak_fraction`` on its Llama FP8 rows (megatron-bridge-fp8),
    and those rows' signed errors at it."""
    fractions, errors = {}, []
    for chip in sorted(set(CHIP.values())):
        rows = [r for r in FAMILIES["megatron-bridge-fp8"] if CHIP.get(r.system) == chip]
        table = [{f: error(r, peak_fraction, f) for f in FP8_GRID} for r in rows]
        fractions[chip] = fit(table, FP8_GRID)
        errors += [t[fractions[chip]] for t in table]
    return fractions, errors


def families(peak_fraction: float, fractions: dict[str, float]) -> dict[str, list[float]]:
    """Every family's signed errors at ``peak_fraction`` with the chips' fp8 ``fractions``."""
    return {name: [error(r, peak_fraction, fractions.get(CHIP.get(r.system, ""))) for r in runs]
            for name, runs in FAMILIES.items()}


def run_all(joint: bool = False) -> dict[str, Any]:
    """The fit on the bf16 rows, its leave-one-out, every family at the fitted and the shown fractions and, with
    ``joint``, the fraction with the least RMS over the bf16 rows and the Blackwell Llama FP8 rows together (each
    point with its refitted fp8 fractions)."""
    rows = [r for r in FAMILIES["megatron-bridge-moe"] if r.precision == "bf16"]
    assert all(r.system in CHIP for r in rows)
    errors = [{p: error(r, p) for p in GRID} for r in rows]
    cv = cross_validate(rows, errors, lambda run: "all", GRID)
    fitted = cv["fitted"]["all"]
    shown = {*SHOWN, fitted}
    joint_rms = {}
    if joint:
        for p in JOINT_GRID:
            _, llama = fp8_refit(p)
            joint_rms[p] = math.sqrt(statistics.fmean(e * e for e in [*(row[p] for row in errors), *llama]))
        shown.add(min(joint_rms, key=lambda p: (joint_rms[p], p)))
    at = {}
    for p in sorted(shown):
        fractions, _ = fp8_refit(p)
        at[p] = (fractions, families(p, fractions))
    return {"rows": rows, "errors": errors, "cv": cv, "fitted": fitted, "at": at, "joint": joint_rms}


def _stats(values: list[float]) -> str:
    return f"{statistics.fmean(map(abs, values)):.1%} / {max(map(abs, values)):.1%}"


def _table(out: dict[str, Any]) -> str:
    rows, cv, fitted, errors = out["rows"], out["cv"], out["fitted"], out["errors"]
    per_row = [(r.name, f"{errors[i][0.7]:+.1%}", f"{cv['in_sample'][i]:+.1%}",
                f"{cv['loo'][i]:+.1%} ({cv['loo_fraction'][i]:.2f})") for i, r in enumerate(rows)]
    per_row.append(("mean / max", _stats([e[0.7] for e in errors]), _stats(cv["in_sample"]),
                    _stats(cv["loo"])))
    text = (f"Fitted on the three bf16 rows: peak_fraction {fitted:.2f}.\n\n"
            + markdown_table(("bf16 row", "at 0.70 (presets)", f"in-sample ({fitted:.2f})",
                              "leave-one-out (its fraction)"), per_row))
    names, joint = list(FAMILIES), out["joint"]
    best = min(joint, key=lambda p: (joint[p], p)) if joint else None
    if joint:
        text += ("\n\nJointly over the three bf16 rows and the eight Blackwell Llama FP8 rows (RMS relative error, "
                 "each point's fp8 fractions refitted): " + ", ".join(f"{p:.2f} {r:.2%}" for p, r in joint.items())
                 + f"; least at {best:.2f}.")
    lines = []
    for p, (fractions, fams) in out["at"].items():
        moe = zip(FAMILIES["megatron-bridge-moe"], fams["megatron-bridge-moe"])
        bf16 = [e for r, e in moe if r.precision == "bf16"]
        tag = " (fit)" if p == fitted else " (joint fit)" if p == best else ""
        lines.append((f"{p:.2f}{tag}",
                      ", ".join(f"{c} {f:.2f}" for c, f in fractions.items()),
                      " / ".join(f"{e:+.1%}" for e in bf16), *(_stats(fams[n]) for n in names)))
    return (text + "\n\nEvery family at each fraction, the chips' fp8_fraction refitted (0.60-1.00) on the Llama FP8 "
                   "rows:\n\n"
            + markdown_table(("peak_fraction", "fp8_fraction refitted", "bf16 rows (as above)",
                              *(f"{n} mean / max" for n in names)), lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Print only; leave RESULTS.md alone.")
    parser.add_argument("--joint", action="store_true", help="Also fit jointly with the Llama FP8 rows (slow).")
    args = parser.parse_args(argv)
    text = _table(run_all(args.joint))
    print(text)
    if not args.no_record:
        record("bf16-fraction",
               "A bf16 peak fraction for Blackwell fitted on the bf16 MoE rows (measured, not adopted)",
               ".venv/bin/python -m benchmarks.bench_bf16_fraction" + (" --joint" if args.joint else ""), text)


if __name__ == "__main__":
    main()
