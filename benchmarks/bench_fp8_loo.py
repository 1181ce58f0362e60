"""Leave-one-out cross-validation of the fp8 GEMM fraction behind ``validate-llm --family megatron-bridge-fp8``.

The family's presets carry an ``fp8_fraction`` (``node.gemm_efficiency``) fitted in-sample on the rows of their
GPU chip: the 0.01 grid point over 0.60-1.00 with the least RMS relative error (``docs/llm.md`` "Megatron-Bridge
FP8", ``tests/report/test_llm_validation_families.py -k fitted``). This benchmark asks how well such fits
generalise. For each way of sharing the fraction between the rows (:data:`GROUPINGS`: one per GPU chip, as
shipped, the B200 of ``b200`` and ``gb200-nvl72`` sharing one; one per preset; one for every GPU) it fits
each group's fraction by that procedure on all its rows (in-sample) and, for every row, on its group's other rows
alone (leave-one-out), and reports each row's error both ways with the family's mean and max |error|, beside
the fraction that predicts the row exactly (its spread within a chip is what no per-chip figure can fit). A row
whose group holds no other row has no leave-one-out fit and is reported as such. The Megatron-Bridge MoE
family's fp8 rows run on the same presets; its mean and max |error| under each grouping's in-sample fractions
are reported beside, for information (its rows are not fitted here).

The second table asks whether the tokens a GEMM multiplies explain the rows the fraction leaves: Transformer
Engine's userbuffers ring exchange (``tp_comm_overlap``) splits each forward GEMM and the projection's and fc2's
dgrad into ``tp`` GEMMs of ``b s / (cp tp)`` tokens (NOTE [userbuffers ring exchange] in ``mcdla.sim.llm``), which
the curve prices at ``t / (t + half_tokens)``; for each ``half_tokens`` of :data:`HALF_TOKENS` (set on the four
presets, every GEMM at its own token count) the per-chip fractions are refitted and the family cross-validated
as above. Run::

    .venv/bin/python -m benchmarks.bench_fp8_loo               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_fp8_loo --no-record   # print only
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._results import markdown_table, run_table
from mcdla.hardware.cluster import Cluster
from mcdla.report.llm_validation import FAMILIES, MeasuredRun, run_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

FAMILY = "megatron-bridge-fp8"
MOE_FAMILY = "megatron-bridge-moe"
GRID = tuple(i / 100 for i in range(60, 101))
"""The fraction's grid: the presets' fitting procedure, 0.01 steps over 0.60-1.00."""
HALF_TOKENS = (0.0, 16.0, 32.0, 64.0, 128.0, 256.0)
"""The curve's ``half_tokens`` swept against the ring exchange's chunked GEMMs (0: the presets' own)."""

CHIP = {"dgx-h100": "H100", "b200": "B200", "gb200-nvl72": "B200", "gb300-nvl72": "B300"}
"""The GPU chip of each preset the family runs on: HGX B200 and GB200 both carry the Blackwell B200 (at 1,000 W
and 1,200 W, which their presets' peaks already differ by: 4.5 and 5 PFLOP/s fp8 dense), GB300 Blackwell Ultra."""

GROUPINGS: dict[str, Callable[[MeasuredRun], str]] = {
    "per chip (shipped, 3 fractions)": lambda run: CHIP[run.system],
    "per preset (4 fractions)": lambda run: run.system,
    "shared (1 fraction)": lambda run: "all",
}


def _predict(run: MeasuredRun, cluster: Cluster, fraction: float, half_tokens: float | None = None) -> float:
    """The run's predicted iteration seconds with its preset's ``fp8_fraction`` set to ``fraction`` (and its
    ``half_tokens`` to ``half_tokens`` where given)."""
    curve = dataclasses.replace(cluster.gemm_efficiency, fp8_fraction=fraction)
    if half_tokens is not None:
        curve = dataclasses.replace(curve, half_tokens=half_tokens)
    return llm_step(preset(run.model), run.execution, dataclasses.replace(cluster, gemm_efficiency=curve),
                    precision=run.precision).iteration_s


def _error_table(runs: Sequence[MeasuredRun], half_tokens: float | None = None) -> list[dict[float, float]]:
    """Each run's signed relative error at every grid fraction (at ``half_tokens`` where given)."""
    table = []
    for run in runs:
        cluster = run_cluster(run, None)
        table.append({f: _predict(run, cluster, f, half_tokens) / run.measured_s - 1.0 for f in GRID})
    return table


def fit(errors: Sequence[dict[float, float]], grid: Sequence[float] = GRID) -> float:
    """The ``grid`` fraction with the least RMS relative error over ``errors``' runs (the lower on a tie)."""
    return min(grid, key=lambda f: (math.sqrt(statistics.fmean(e[f] ** 2 for e in errors)), f))


def cross_validate(runs: Sequence[MeasuredRun], errors: Sequence[dict[float, float]],
                   group_of: Callable[[MeasuredRun], str], grid: Sequence[float] = GRID) -> dict[str, Any]:
    """In-sample and leave-one-out errors of the family under one grouping of its rows, each fraction fitted on
    ``grid``."""
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(group_of(run), []).append(i)
    fitted = {g: fit([errors[i] for i in members], grid) for g, members in groups.items()}
    in_sample, loo, loo_fraction = [], [], []
    for i, run in enumerate(runs):
        members = groups[group_of(run)]
        in_sample.append(errors[i][fitted[group_of(run)]])
        others = [errors[j] for j in members if j != i]
        f = fit(others, grid) if others else None
        loo_fraction.append(f)
        loo.append(errors[i][f] if f is not None else None)
    return {"fitted": fitted, "in_sample": in_sample, "loo": loo, "loo_fraction": loo_fraction}


def exact_fraction(errors: dict[float, float]) -> float | None:
    """The fraction at which a run's predicted time equals its measured one, interpolated linearly between the
    grid points its error changes sign across (None if it does not within the grid): the row's own fit."""
    for lo, hi in zip(GRID, GRID[1:]):
        if (errors[lo] >= 0.0) != (errors[hi] >= 0.0):
            return lo + (hi - lo) * errors[lo] / (errors[lo] - errors[hi])
    return None


def _moe_errors(fractions: dict[str, float], group_of_system: Callable[[str], str]) -> list[float]:
    """The MoE family's signed errors with each fp8 row's preset at its group's fitted fraction (a preset outside
    the fitted groups, or a bf16 row, as shipped)."""
    out = []
    for run in FAMILIES[MOE_FAMILY]:
        cluster = run_cluster(run, None)
        group = group_of_system(run.system) if run.system in CHIP else None
        if run.precision == "fp8" and group in fractions:
            seconds = _predict(run, cluster, fractions[group])
        else:
            seconds = _predict(run, cluster, cluster.gemm_efficiency.fp8_fraction)
        out.append(seconds / run.measured_s - 1.0)
    return out


def _stats(values: Sequence[float | None]) -> str:
    got = [abs(v) for v in values if v is not None]
    return f"{statistics.fmean(got):.1%} / {max(got):.1%}" if got else "n/a"


def run_all() -> dict[str, Any]:
    """Every grouping's cross-validation and the MoE family's errors under its in-sample fractions."""
    runs = FAMILIES[FAMILY]
    errors = _error_table(runs)
    results = {}
    for name, group_of in GROUPINGS.items():
        result = cross_validate(runs, errors, group_of)
        result["moe"] = _moe_errors(result["fitted"], lambda system, g=group_of: g(  # type: ignore[misc]
            dataclasses.replace(runs[0], system=system)))
        results[name] = result
    sweep = {}
    for half in HALF_TOKENS:
        table = errors if half == 0.0 else _error_table(runs, half)
        sweep[half] = cross_validate(runs, table, GROUPINGS["per chip (shipped, 3 fractions)"])
        sweep[half]["exact"] = [exact_fraction(e) for e in table]
    return {"runs": runs, "results": results, "exact": [exact_fraction(e) for e in errors], "sweep": sweep}


def _table(out: dict[str, Any]) -> str:
    runs, results = out["runs"], out["results"]
    summary = []
    for name, r in results.items():
        fitted = ", ".join(f"{g} {f:.2f}" for g, f in r["fitted"].items())
        summary.append((name, fitted, _stats(r["in_sample"]), _stats(r["loo"]), _stats(r["moe"])))
    text = markdown_table(("grouping", "fitted fp8_fraction (in-sample)", "in-sample mean / max",
                           "leave-one-out mean / max", f"{MOE_FAMILY} mean / max (in-sample fractions)"), summary)
    names = list(results)
    head = ["run", "measured s", "exact at"] + [f"{n}: in-sample / leave-one-out (fraction)" for n in names]
    rows = []
    for i, run in enumerate(runs):
        exact = out["exact"][i]
        cells = [run.name, f"{run.measured_s:.3f}", f"{exact:.3f}" if exact is not None else "outside the grid"]
        for n in names:
            r = results[n]
            loo = r["loo"][i]
            cells.append(f"{r['in_sample'][i]:+.1%} / " + (f"{loo:+.1%} ({r['loo_fraction'][i]:.2f})"
                                                           if loo is not None else "n/a"))
        rows.append(tuple(cells))
    return (text + "\n\nPer row (exact at: the fraction that predicts the row exactly; leave-one-out: the row's group "
                   "refitted without it, the fraction it got):\n\n"
            + markdown_table(tuple(head), rows) + "\n\n" + _sweep_table(out))


def _sweep_table(out: dict[str, Any]) -> str:
    """The ``half_tokens`` sweep: per value the refitted per-chip fractions, the family's in-sample and
    leave-one-out mean / max, and each row's in-sample / leave-one-out error and exact fraction."""
    runs, sweep = out["runs"], out["sweep"]
    summary = [(f"{half:g}", ", ".join(f"{g} {f:.2f}" for g, f in r["fitted"].items()), _stats(r["in_sample"]),
                _stats(r["loo"])) for half, r in sweep.items()]
    rows = []
    for i, run in enumerate(runs):
        tokens = run.execution.micro_batch * preset(run.model).seq_len / (run.execution.cp * run.execution.tp)
        chunk = f"{tokens:,.0f}" if run.execution.tp_comm_overlap and run.execution.tp > 1 else "-"
        cells = [run.name, chunk]
        for r in sweep.values():
            exact = r["exact"][i]
            cells.append(f"{r['in_sample'][i]:+.1%} / {r['loo'][i]:+.1%} ("
                         + (f"{exact:.2f}" if exact is not None else "-") + ")")
        rows.append(tuple(cells))
    return ("The ring exchange's chunked GEMMs against the curve's half_tokens (per chip fractions refitted):\n\n"
            + markdown_table(("half_tokens", "fitted fp8_fraction", "in-sample mean / max", "leave-one-out mean / max"),
                             summary)
            + "\n\nPer row (ring chunk: tokens a chunked GEMM multiplies; in-sample / leave-one-out (exact at)):\n\n"
            + markdown_table(("run", "ring chunk", *(f"half_tokens {h:g}" for h in sweep)), rows))


def main(argv: list[str] | None = None) -> None:
    run_table(argv, __doc__, "fp8-loo", "Leave-one-out cross-validation of the fp8 GEMM fraction (megatron-bridge-fp8)",
              ".venv/bin/python -m benchmarks.bench_fp8_loo", lambda: _table(run_all()))


if __name__ == "__main__":
    main()
