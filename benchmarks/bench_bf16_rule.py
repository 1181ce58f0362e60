"""The bf16 GEMM rule (``GemmEfficiency.bf16_over_fp8``) measured against its alternatives.

The rule: on a preset with ``node.gemm_efficiency.bf16_over_fp8`` (``b200``, ``gb200-nvl72``, ``gb300-nvl72``,
``dgx-h100``) the linear layers' GEMMs, dense and routed-expert, of a bf16 (or fp16) run are priced at the fp8
GEMM rate the chip's ``fp8_fraction`` was fitted to (on the Llama FP8 rows of ``validate-llm --family
megatron-bridge-fp8``) times the chip's measured bf16/fp8 dense matmul throughput ratio
(``mcdla.sim.llm.gemm_peak_flops_per_s``): fp8 peak x ``fp8_fraction`` x ``bf16_over_fp8`` x the curve. The ratio
is Stas Bekman's "Maximum Achievable Matmul FLOPS comparison table" (https://github.com/stas00/ml-engineering,
commit 744d01e, ``compute/accelerator/README.md``): GB200 SXM 1822.0 bf16 / 3615.6 fp8 TFLOP/s (0.5039), B200 SXM
1745.0 / 3432.5 (0.5084), B300 SXM 1769.0 / 3353.3 (0.5275), H100 SXM 794.5 / 1402.6 (0.5665). The attention core
and the logits stay on the bf16 curve (the bf16 peak x the curve), as in fp8 runs.

Four variants are compared, each with every chip's ``fp8_fraction`` refitted on the Llama FP8 rows by the presets'
procedure (``benchmarks.bench_fp8_loo``: the 0.01 grid point over 0.60-1.00 with the least RMS relative error, the
lower on a tie; the B200 chip on ``b200`` and ``gb200-nvl72``, B300 on ``gb300-nvl72``, H100 on ``dgx-h100``):

* (0) bf16 at the curve: ``bf16_over_fp8`` None on every preset, every bf16 GEMM at the bf16 peak x the curve
  (``peak_fraction`` 0.7 on these presets);
* (A) the rule as shipped: the linear layers' GEMMs only;
* (B) A, and the logits (of bf16 and of fp8 runs, which compute them in bf16) at the bf16 GEMM rate of A;
* (C) B, and the attention core's FLOPs at that rate too.

A was chosen among A, B and C after measuring them (the tables below): it changes only the linear layers' GEMMs,
whose fp8 rate the fit describes, and keeps the logits and the attention core priced the same in bf16 and fp8 runs.

B and C are emulated here, not options of the model: each run's cluster gets a GPU whose ``peak_flops_per_s`` also
holds, under ``<key>@gemm``, the peak ``gemm_peak_flops_per_s`` prices a ``<key>`` GEMM against, and for the
length of one ``llm_step`` call :func:`rule_variant` replaces ``mcdla.sim.llm._layer_compute`` (the per-layer
costs every evaluation of the model reads, memoised per cluster) by a wrapper that also evaluates it with a
:class:`~mcdla.sim.llm.Precision` whose ``other_peak`` (the key the attention core and the logits run at) is
``<other_peak>@gemm``, and takes the logits (B) or the whole layer (C) from that evaluation. Each such cluster is
a fresh copy, so its memo never mixes variants. Presets without ``bf16_over_fp8`` price a bf16 GEMM at the bf16
peak, so no variant moves the families that run on them.

The second table gives, for each bf16 row of ``validate-llm --family megatron-bridge-moe``, the bf16
``peak_fraction`` at which the row is exact under (0) (bisection, ``bf16_over_fp8`` None; only that row is
evaluated, so the fp8 rows are untouched) beside the fraction of the bf16 peak the rule gives the preset's linear
GEMMs (fp8 peak / bf16 peak x ``fp8_fraction`` x ``bf16_over_fp8`` x ``peak_fraction``), and the same implied
fraction on ``dgx-h100`` beside the bf16 ``peak_fraction`` fitted on bf16 H100 runs of other frameworks
(``grand-teton-h100``, ``fms-h100-800g``). Run::

    .venv/bin/python -m benchmarks.bench_bf16_rule               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_bf16_rule --no-record   # print only
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import mcdla.sim.llm as llm_module
from benchmarks._results import markdown_table, run_table
from benchmarks.bench_fp8_loo import CHIP, GRID, MOE_FAMILY, fit
from benchmarks.bench_fp8_loo import FAMILY as FP8_FAMILY
from mcdla.hardware.cluster import Cluster, load_cluster
from mcdla.report.llm_validation import FAMILIES, MeasuredRun, run_cluster
from mcdla.sim.llm import Precision, gemm_peak_flops_per_s, llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

VARIANTS = {
    "0": "(0) bf16 at the curve",
    "A": "(A) linear GEMMs at the rule (shipped)",
    "B": "(B) A + logits at the rule",
    "C": "(C) B + attention core at the rule",
}
"""The variants compared (module docstring), by key."""
AT_GEMM = "@gemm"
"""Suffix of the extra peak keys (B, C): ``bf16@gemm`` is the peak a bf16 GEMM is priced against."""
BF16_H100 = ("grand-teton-h100", "fms-h100-800g")
"""H100 presets whose bf16 ``peak_fraction`` is fitted on bf16 runs (they carry no ``bf16_over_fp8``)."""

_layer_compute = llm_module._layer_compute  # the model's own, which the variants' wrapper calls


def with_gemm_peaks(cluster: Cluster) -> Cluster:
    """``cluster`` whose GPU also gives, for each precision but fp8, the peak a GEMM at it is priced against
    (:func:`~mcdla.sim.llm.gemm_peak_flops_per_s`) under ``<key>@gemm``: a fresh copy, its memo empty."""
    dev = cluster.device
    peaks = dict(dev.peak_flops_per_s)
    peaks.update({key + AT_GEMM: gemm_peak_flops_per_s(cluster, key) for key in dev.peak_flops_per_s if key != "fp8"})
    return dataclasses.replace(cluster, device=dataclasses.replace(dev, peak_flops_per_s=peaks))


def at_gemm_rate(prec: Precision) -> Precision:
    """``prec`` with the attention core and the logits at the GEMM rate of its ``other_peak``."""
    return dataclasses.replace(prec, other_peak=prec.other_peak + AT_GEMM)


def variant_layer_compute(variant: str) -> Callable[[TransformerSpec, Execution, Cluster, Precision], Any]:
    """The per-layer costs under ``variant`` B (the logits at the GEMM rate) or C (the logits and the attention
    core), on a cluster of :func:`with_gemm_peaks`; a cluster without the extra keys as the model prices it."""
    def layer_compute(spec: TransformerSpec, e: Execution, cluster: Cluster, prec: Precision) -> Any:
        got = _layer_compute(spec, e, cluster, prec)
        if prec.other_peak + AT_GEMM not in cluster.device.peak_flops_per_s:
            return got
        ruled = _layer_compute(spec, e, cluster, at_gemm_rate(prec))
        return ruled if variant == "C" else got._replace(logits_s=ruled.logits_s)
    return layer_compute


@contextlib.contextmanager
def rule_variant(variant: str) -> Iterator[None]:
    """Within it, the model's per-layer costs are :func:`variant_layer_compute`'s (B, C) or its own (0, A)."""
    if variant in ("B", "C"):
        with mock.patch.object(llm_module, "_layer_compute", variant_layer_compute(variant)):
            yield
    else:
        yield


def variant_cluster(run: MeasuredRun, variant: str, fp8_fraction: float | None = None) -> Cluster:
    """The run's cluster under ``variant`` (with ``fp8_fraction`` set on its preset where given)."""
    cluster = run_cluster(run, None)
    curve = cluster.gemm_efficiency
    if variant == "0":
        curve = dataclasses.replace(curve, bf16_over_fp8=None)
    if fp8_fraction is not None:
        curve = dataclasses.replace(curve, fp8_fraction=fp8_fraction)
    cluster = dataclasses.replace(cluster, gemm_efficiency=curve)
    return with_gemm_peaks(cluster) if variant in ("B", "C") else cluster


def predict(run: MeasuredRun, variant: str, fp8_fraction: float | None = None) -> float:
    """The run's predicted iteration seconds under ``variant``."""
    cluster = variant_cluster(run, variant, fp8_fraction)
    with rule_variant(variant):
        return llm_step(preset(run.model), run.execution, cluster, precision=run.precision).iteration_s


def error(run: MeasuredRun, variant: str, fp8_fraction: float | None = None) -> float:
    """The run's signed relative error under ``variant``."""
    return predict(run, variant, fp8_fraction) / run.measured_s - 1.0


@functools.cache
def fp8_refit(variant: str) -> dict[str, float]:
    """Each chip's ``fp8_fraction`` refitted under ``variant`` on its Llama FP8 rows (GRID, least RMS)."""
    fractions = {}
    for chip in sorted(set(CHIP.values())):
        rows = [r for r in FAMILIES[FP8_FAMILY] if CHIP.get(r.system) == chip]
        fractions[chip] = fit([{f: error(r, variant, f) for f in GRID} for r in rows], GRID)
    return fractions


def families(variant: str, fractions: dict[str, float]) -> dict[str, list[float]]:
    """Every family's signed errors under ``variant`` with the chips' fp8 ``fractions``."""
    return {name: [error(r, variant, fractions.get(CHIP.get(r.system, ""))) for r in runs]
            for name, runs in FAMILIES.items()}


def bf16_rows() -> list[MeasuredRun]:
    """The bf16 rows of the MoE family (all on presets with ``bf16_over_fp8``)."""
    return [r for r in FAMILIES[MOE_FAMILY] if r.precision == "bf16"]


def exact_peak_fraction(run: MeasuredRun, low: float = 0.05, high: float = 1.0, tol: float = 1e-6) -> float | None:
    """The bf16 ``peak_fraction`` at which the run is exact under (0) (``bf16_over_fp8`` None), by bisection
    (the error falls as the fraction rises); None if it is not within ``low``-``high``."""
    cluster = run_cluster(run, None)
    curve = dataclasses.replace(cluster.gemm_efficiency, bf16_over_fp8=None)

    def err(fraction: float) -> float:
        c = dataclasses.replace(cluster, gemm_efficiency=dataclasses.replace(curve, peak_fraction=fraction))
        return llm_step(preset(run.model), run.execution, c, precision=run.precision).iteration_s / run.measured_s - 1

    if err(low) < 0.0 or err(high) > 0.0:
        return None
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (mid, high) if err(mid) > 0.0 else (low, mid)
    return (low + high) / 2


def implied_bf16_fraction(cluster: Cluster) -> float:
    """The fraction of the bf16 peak the rule prices ``cluster``'s linear GEMMs at, before the curve's width and
    token terms: fp8 peak / bf16 peak x fp8_fraction x bf16_over_fp8 x peak_fraction."""
    curve = cluster.gemm_efficiency
    return gemm_peak_flops_per_s(cluster, "bf16") / cluster.device.flops_per_s("bf16") * curve.peak_fraction


def run_all() -> dict[str, Any]:
    """Each variant's refitted fractions and every family's errors, and the bf16 rows' exact fractions."""
    at = {}
    for v in VARIANTS:
        fractions = fp8_refit(v)
        at[v] = (fractions, families(v, fractions))
    rows = bf16_rows()
    exact = [(r, exact_peak_fraction(r), implied_bf16_fraction(load_cluster(r.system))) for r in rows]
    h100 = {name: load_cluster(name).gemm_efficiency.peak_fraction for name in BF16_H100}
    return {"at": at, "rows": rows, "exact": exact, "h100": h100,
            "h100_implied": implied_bf16_fraction(load_cluster("dgx-h100"))}


def _stats(values: list[float]) -> str:
    return f"{statistics.fmean(map(abs, values)):.2%} / {max(map(abs, values)):.2%}"


def _family_of(system: str) -> str:
    return next(name for name, runs in FAMILIES.items() if any(r.system == system for r in runs))


def _table(out: dict[str, Any]) -> str:
    at, rows = out["at"], out["rows"]
    names = list(FAMILIES)
    moved = [n for n in names if any(fams[n] != at["0"][1][n] for _, fams in at.values())]
    still = [n for n in names if n not in moved]
    moe = {v: dict(zip((r.name for r in FAMILIES[MOE_FAMILY]), fams[MOE_FAMILY])) for v, (_, fams) in at.items()}
    lines = [(VARIANTS[v], ", ".join(f"{c} {f:.2f}" for c, f in fractions.items()),
              *(f"{moe[v][r.name]:+.1%}" for r in rows), *(_stats(fams[n]) for n in moved))
             for v, (fractions, fams) in at.items()]
    text = ("Each variant with every chip's fp8_fraction refitted (0.60-1.00) on the Llama FP8 rows; family columns "
            "mean / max |error|:\n\n"
            + markdown_table(("variant", "fp8_fraction refitted", *(r.name for r in rows),
                              *(f"{n} mean / max" for n in moved)), lines))
    text += ("\n\nThe same under every variant (their presets carry no bf16_over_fp8): "
             + ", ".join(f"{n} {_stats(at['A'][1][n])}" for n in still) + ".")
    exact = [(r.name, f"{f:.3f}" if f is not None else "outside 0.05-1.00", f"{implied:.3f}",
              f"{moe['0'][r.name]:+.1%}", f"{moe['A'][r.name]:+.1%}") for r, f, implied in out["exact"]]
    text += ("\n\nThe bf16 rows: the bf16 peak_fraction at which each is exact under (0) (bisection; it sets the "
             "attention core and the logits too, the rule the linear GEMMs alone), beside the fraction of the bf16 "
             "peak the rule gives its preset's linear GEMMs (fp8 peak / bf16 peak x fp8_fraction x bf16_over_fp8 x "
             "peak_fraction, shipped figures):\n\n"
             + markdown_table(("bf16 row", "exact peak_fraction under (0)", "rule's implied fraction",
                               "error (0)", "error (A)"), exact))
    h100 = [("dgx-h100 (the rule's implied fraction, as above)", f"{out['h100_implied']:.3f}")]
    h100 += [(f"{name} (peak_fraction fitted on bf16 runs, {_family_of(name)})", f"{p:.2f}")
             for name, p in out["h100"].items()]
    return text + ("\n\nThe H100 check: the bf16 fraction the rule implies on dgx-h100 beside those fitted on bf16 "
                   "H100 runs of other frameworks:\n\n" + markdown_table(("H100 preset", "bf16 fraction"), h100))


def main(argv: list[str] | None = None) -> None:
    run_table(argv, __doc__, "bf16-rule", "The bf16 GEMM rule (bf16_over_fp8) against its alternatives",
              ".venv/bin/python -m benchmarks.bench_bf16_rule", lambda: _table(run_all()))


if __name__ == "__main__":
    main()
