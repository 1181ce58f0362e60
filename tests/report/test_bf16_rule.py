"""``benchmarks/bench_bf16_rule.py``: its emulated variants against the model as shipped, the model with
``bf16_over_fp8`` unset, and the logits and attention times worked out by hand from the presets' figures."""

import dataclasses

import pytest

import mcdla.sim.llm as llm_module
from benchmarks.bench_bf16_rule import (CHIP, bf16_rows, implied_bf16_fraction, predict, rule_variant,
                                        variant_layer_compute, with_gemm_peaks)
from mcdla.report.llm_validation import FAMILIES, run_cluster
from mcdla.sim.llm import llm_step, precision_of
from mcdla.workload.transformer import preset

ROW = "deepseek-v3-671b gb200-nvl72"


def _run(name, family="megatron-bridge-moe"):
    return next(r for r in FAMILIES[family] if r.name == name)


def _runs():
    """A bf16 MoE row, the Llama 3 8B fp8 row of each chip the rule reaches as published and as a bf16 run
    (a quick bf16 run on every chip), and an fp8 MoE row."""
    llama = [r for r in FAMILIES["megatron-bridge-fp8"] if r.model == "llama3-8b"]
    assert {CHIP[r.system] for r in llama} == set(CHIP.values())
    return [_run(ROW), _run("qwen3-30b-a3b dgx-h100"), *llama,
            *(dataclasses.replace(r, precision="bf16") for r in llama)]


def _step(run, cluster):
    return llm_step(preset(run.model), run.execution, cluster, precision=run.precision).iteration_s


def test_a_is_the_shipped_model_and_0_the_model_without_the_ratio():
    """(A) with the preset's own fp8_fraction is llm_step on the shipped preset; (0) is llm_step on the preset
    rebuilt with bf16_over_fp8 None, which differs from (A) on the bf16 rows only."""
    for run in _runs():
        shipped = run_cluster(run, None)
        assert predict(run, "A", shipped.gemm_efficiency.fp8_fraction) == _step(run, shipped)
        without = shipped.with_gemm_efficiency(dataclasses.replace(shipped.gemm_efficiency, bf16_over_fp8=None))
        zero = predict(run, "0")
        assert zero == _step(run, without)
        assert (zero == _step(run, shipped)) == (run.precision == "fp8")


def _hand_rates(run):
    """The bf16 GEMM rate of the rule and the bf16 curve's rate at the run's dense GEMMs, from the preset's
    figures: fp8 peak x fp8_fraction x bf16_over_fp8, and the bf16 peak, each x the curve."""
    cluster = run_cluster(run, None)
    g, peaks, e, spec = cluster.gemm_efficiency, cluster.device.peak_flops_per_s, run.execution, preset(run.model)
    width, tokens = spec.hidden / e.tp, e.micro_batch * spec.seq_len / e.cp
    curve = g.peak_fraction * width / (width + g.half_width) * (tokens / (tokens + g.half_tokens) if g.half_tokens
                                                                  else 1.0)
    return peaks["fp8"] * g.fp8_fraction * g.bf16_over_fp8 * curve, peaks["bf16"] * curve


@pytest.mark.parametrize("variant", ["B", "C"])
def test_b_prices_the_logits_and_c_the_attention_core_at_the_rule(variant):
    """B's logits take 2 b s h V / (tp cp) FLOPs at the rule's bf16 GEMM rate; its attention core stays at the
    bf16 curve's rate (the shipped time), C's moves to the rule's rate by the hand ratio of the two rates."""
    run = _run(ROW)
    spec, e, prec = preset(run.model), run.execution, precision_of(run.precision)
    cluster = run_cluster(run, None)
    shipped = llm_module._layer_compute(spec, e, cluster, prec)
    got = variant_layer_compute(variant)(spec, e, with_gemm_peaks(cluster), prec)
    rule, bf16 = _hand_rates(run)
    logits = 2.0 * e.micro_batch * spec.seq_len * spec.hidden * spec.vocab / (e.tp * e.cp)
    assert got.logits_s == pytest.approx(logits / rule, rel=1e-12)
    assert shipped.logits_s == pytest.approx(logits / bf16, rel=1e-12)
    ratio = bf16 / rule
    assert ratio > 1.0
    assert got.attention_s == pytest.approx(shipped.attention_s * (ratio if variant == "C" else 1.0), rel=1e-12)
    assert got.gemm_s == shipped.gemm_s


def test_the_variant_slows_a_row_only_within_its_scope():
    """Within rule_variant the B/C wrapper prices a one-stage fp8 row (its logits in bf16) more slowly than A, C
    more slowly than B; the model's own per-layer costs are back once it exits."""
    run = _run("llama3-8b gb200-nvl72", "megatron-bridge-fp8")
    original = llm_module._layer_compute
    assert predict(run, "C") > predict(run, "B") > predict(run, "A")
    with rule_variant("B"):
        assert llm_module._layer_compute is not original
    assert llm_module._layer_compute is original


def test_implied_fraction_from_the_presets_figures():
    """The rule's implied bf16 fraction on gb200-nvl72: fp8 peak / bf16 peak x fp8_fraction x bf16_over_fp8 x
    peak_fraction, by hand from the datasheet peaks (5 and 2.5 PFLOP/s dense)."""
    cluster = run_cluster(_run(ROW), None)
    g = cluster.gemm_efficiency
    assert implied_bf16_fraction(cluster) == pytest.approx(2 * g.fp8_fraction * g.bf16_over_fp8 * g.peak_fraction)
