"""The kernel-time fit of the LLM model and its error per validation family, against the unfitted baseline.

Refits, once, the device-independent kernel-time figures of :class:`~mcdla.hardware.gemm.GemmEfficiency`
(``half_tokens``, ``backward_ratio``, ``fp8_fraction``) by a grid search minimising the RMS relative error over
the two Megatron families of ``validate-llm`` (:data:`FIT_FAMILIES`: the 12 A100 Megatron-LM runs and the 11
Megatron-Bridge FP8 runs; the shipped ``fp8_fraction`` was fitted when that family held its first 8); each GPU keeps
its own width curve (the fitted ``dgx-a100`` one, the other presets' defaults). The baseline, measured in the
same run, is the model with those figures neutral (no token dependence, backward 2x, fp8 GEMMs at the bf16
fraction of the fp8 peak); the table reports each family's mean and max |error| under both. The grid's
``fp8_fraction`` replaces every preset's, so it is the device-independent default (``DEFAULT_FP8_FRACTION``); the
four Bridge presets now carry one per GPU chip, fitted on that chip's rows (``tests/report/
test_llm_validation_families.py -k fitted``, ``docs/llm.md`` "Megatron-Bridge FP8"; out of sample:
``benchmarks.bench_fp8_loo``). Run::

    .venv/bin/python -m benchmarks.bench_llm_kernel_fit               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_llm_kernel_fit --no-record   # print only
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from typing import Any

from benchmarks._results import markdown_table, run_table
from mcdla.hardware.cluster import Cluster
from mcdla.report.llm_validation import FAMILIES, MeasuredRun, run_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

HALF_TOKENS = (0.0, 256.0, 1024.0)
BACKWARD_RATIOS = (1.8, 1.9, 2.0)
FP8_FRACTIONS = tuple(x / 100 for x in range(60, 101, 2))
NEUTRAL = (0.0, 2.0, 1.0)
FIT_FAMILIES = ("megatron-a100", "megatron-bridge-fp8")
"""The families the figures were fitted on; the later ones (torchtitan, PyTorch FSDP, MoE) each fit one GEMM peak
fraction of their own preset and stay out of this fit."""


def _clusters() -> dict[str, tuple[MeasuredRun, Cluster]]:
    """Every run with the cluster validate-llm predicts it on (sized, datasheet fp8 peak where needed)."""
    return {run.name: (run, run_cluster(run, None)) for family in FIT_FAMILIES for run in FAMILIES[family]}


def _errors(runs: dict[str, tuple[MeasuredRun, Cluster]],
            figures: tuple[float, float, float]) -> dict[str, list[float]]:
    """Each family's signed relative errors with the kernel-time ``figures`` (half_tokens, ratio, fp8)."""
    half_tokens, ratio, fp8 = figures
    by_family: dict[str, list[float]] = {}
    for run, cluster in runs.values():
        curve = dataclasses.replace(cluster.gemm_efficiency, half_tokens=half_tokens, backward_ratio=ratio,
                                    fp8_fraction=fp8)
        step = llm_step(preset(run.model), run.execution, dataclasses.replace(cluster, gemm_efficiency=curve),
                        precision=run.precision)
        by_family.setdefault(run.family, []).append(step.iteration_s / run.measured_s - 1.0)
    return by_family


def _rms(by_family: dict[str, list[float]]) -> float:
    errors = [e for values in by_family.values() for e in values]
    return math.sqrt(statistics.fmean(e * e for e in errors))


def fit() -> dict[str, Any]:
    """The grid search; returns the best figures and each family's errors with them and with the baseline."""
    runs = _clusters()
    grid = list(itertools.product(HALF_TOKENS, BACKWARD_RATIOS, FP8_FRACTIONS))
    best = min(grid, key=lambda figures: _rms(_errors(runs, figures)))
    return {"best": best, "grid": len(grid), "fitted": _errors(runs, best), "baseline": _errors(runs, NEUTRAL),
            "runs": [run for run, _ in runs.values()]}


def _table(result: dict[str, Any]) -> str:
    rows = []
    for family in FIT_FAMILIES:
        fitted, base = result["fitted"][family], result["baseline"][family]
        rows.append((family, str(len(fitted)), f"{statistics.fmean(map(abs, base)):.1%}",
                     f"{max(map(abs, base)):.1%}", f"{statistics.fmean(map(abs, fitted)):.1%}",
                     f"{max(map(abs, fitted)):.1%}",
                     f"{statistics.fmean(map(abs, fitted)) / statistics.fmean(map(abs, base)):.2f}x"))
    half_tokens, ratio, fp8 = result["best"]
    head = ("family", "runs", "baseline mean", "baseline max", "fitted mean", "fitted max", "fitted / baseline mean")
    per_run = []
    seen: dict[str, int] = {}
    for run in result["runs"]:
        i = seen[run.family] = seen.get(run.family, -1) + 1
        if run.family != "megatron-a100":
            err = result["fitted"][run.family][i]
            per_run.append((run.name, f"{run.measured_s:.3f}", f"{run.measured_s * (1 + err):.3f}", f"{err:+.1%}",
                            run.choices))
    return (markdown_table(head, rows) + f"\n\nBest of {result['grid']} grid points (RMS relative error over all "
            f"runs): half_tokens {half_tokens:g}, backward_ratio {ratio:g}, fp8_fraction {fp8:g}. Baseline: 0, 2, 1."
            "\n\n" + markdown_table(("run (fitted)", "measured s", "predicted s", "error", "unpublished choices"),
                                     per_run))


def main(argv: list[str] | None = None) -> None:
    run_table(argv, __doc__, "llm-kernel-fit", "LLM kernel-time fit and validation error per family",
              ".venv/bin/python -m benchmarks.bench_llm_kernel_fit", lambda: _table(fit()))


if __name__ == "__main__":
    main()
