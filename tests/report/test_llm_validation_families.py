"""The validation families of ``validate-llm``: the Megatron-Bridge FP8 records against the published table, and the
fitted fp8 fraction of each GPU chip they run on against a re-run of its grid."""

import dataclasses
import math

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.hardware.gemm import DEFAULT_HALF_WIDTH
from mcdla.report.llm_validation import BRIDGE_FP8_RUNS, FAMILIES, family_runs, run_cluster, summary, validate_llm
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

# Megatron-Bridge 25.11 performance-summary.md (NVIDIA-NeMo/Megatron-Bridge): (system, model) -> GPUs, GBS, mbs, TP, PP, VP,
# tokens/s/GPU, as published.
PUBLISHED = {("dgx-h100", "llama3-8b"): (8, 128, 1, 1, 1, 1, 14451),
             ("dgx-h100", "llama3-70b"): (64, 128, 1, 4, 8, 5, 1602),
             ("gb200-nvl72", "llama3-8b"): (8, 128, 2, 1, 1, 1, 31508),
             ("gb200-nvl72", "llama3-70b"): (64, 256, 2, 1, 1, 1, 4312),
             ("dgx-h100", "llama3-405b"): (1024, 512, 1, 8, 8, 8, 292),
             ("b200", "llama3-405b"): (128, 64, 1, 4, 8, 8, 661),
             ("gb200-nvl72", "llama3-405b"): (256, 1536, 1, 4, 16, 4, 813),
             ("gb300-nvl72", "llama3-405b"): (256, 1536, 1, 2, 8, 4, 999),
             ("gb300-nvl72", "llama3-8b"): (8, 128, 2, 1, 1, 1, 37556),
             ("gb300-nvl72", "llama3-70b"): (64, 256, 2, 1, 1, 1, 4520),
             ("b200", "llama3-8b"): (8, 128, 2, 1, 1, 1, 30624)}
# the CP column of the same table for the rows that use it
PUBLISHED_CP = {("dgx-h100", "llama3-405b"): 2, ("b200", "llama3-405b"): 2, ("gb300-nvl72", "llama3-405b"): 2}


@pytest.mark.parametrize("run", BRIDGE_FP8_RUNS, ids=lambda r: r.name)
def test_bridge_records_match_the_published_table(run):
    """Each record's GPUs, batches and TP/PP/VP are the table's, and its seconds are GBS x 8192 tokens over
    (tokens/s/GPU x GPUs); it is predicted in fp8 with FlashAttention and states its unpublished choices."""
    gpus, gbs, mbs, tp, pp, vp, tokens = PUBLISHED[(run.system, run.model)]
    e = run.execution
    assert (e.gpus, e.global_batch, e.micro_batch, e.tp, e.pp, e.virtual_stages) == (gpus, gbs, mbs, tp, pp, vp)
    assert e.cp == PUBLISHED_CP.get((run.system, run.model), 1)
    assert run.measured_s == pytest.approx(gbs * 8192 / (tokens * gpus), rel=1e-12)
    assert run.precision == "fp8" and e.attention == "flash" and "Megatron-Bridge 25.11" in run.source
    assert run.choices and run.family == "megatron-bridge-fp8"


def test_a100_family_keeps_materialized_attention_and_its_accuracy():
    """The published A100 runs used Megatron's fused softmax: every record is materialized, and the family stays
    within the 5 % mean / 10 % max goal against the measured times."""
    assert all(r.execution.attention == "materialized" for r in FAMILIES["megatron-a100"])
    s = summary(validate_llm(runs=FAMILIES["megatron-a100"]))
    assert s["mean_abs_error"] <= 0.05 and s["max_abs_error"] <= 0.10


def test_all_is_every_family_in_order():
    """``all`` is the concatenation of the families."""
    assert family_runs("all") == tuple(r for runs in FAMILIES.values() for r in runs)


def test_every_published_row_is_a_record():
    """The family holds one record per published row."""
    assert {(r.system, r.model) for r in BRIDGE_FP8_RUNS} == set(PUBLISHED) and len(BRIDGE_FP8_RUNS) == len(PUBLISHED)


# Megatron-Bridge v0.2.1 (the 25.11 container's) scripts/performance/configs/llama3/workload_base_configs.py: the
# FP8-CS recipes that count layers; set_recompute_overrides makes cpu_offloading_num_layers an activation offload
# (weights kept). The H100 8B row runs the earlier base config (FSDP, no recompute: test below); the other rows'
# recipes count none.
RECIPE_COUNTS = {("gb200-nvl72", "llama3-70b"): ("none", "block", None, 40),
                 ("gb300-nvl72", "llama3-70b"): ("none", "block", None, 20)}
# The table's FSDP column (1 = Megatron-FSDP, recorded as ZeRO-3) for the Llama rows.
PUBLISHED_FSDP = {("dgx-h100", "llama3-8b"), ("gb200-nvl72", "llama3-70b"), ("gb300-nvl72", "llama3-70b")}


@pytest.mark.parametrize("run", BRIDGE_FP8_RUNS, ids=lambda r: r.name)
def test_bridge_records_shard_as_the_tables_fsdp_column(run):
    """FSDP 1 rows run ZeRO-3 over all their data-parallel ranks, FSDP 0 rows the distributed optimizer (ZeRO-1)."""
    fsdp = (run.system, run.model) in PUBLISHED_FSDP
    assert run.execution.zero == (3 if fsdp else 1)


def test_h100_8b_runs_the_base_config_its_fsdp_column_names():
    """The H100 8B row's FSDP 1 is the base config before Megatron-Bridge commit cb62f8620 (use_megatron_fsdp, no
    recompute_num_layers), so the record recomputes nothing; the choices cite both configs."""
    (run,) = (r for r in BRIDGE_FP8_RUNS if (r.system, r.model) == ("dgx-h100", "llama3-8b"))
    assert run.execution.recompute == "none" and run.execution.zero == 3
    assert "278b9baad" in run.choices and "cb62f8620" in run.choices


@pytest.mark.parametrize("run", BRIDGE_FP8_RUNS, ids=lambda r: r.name)
def test_bridge_records_carry_their_recipes_layer_counts(run):
    """The three recipes that recompute or offload only some layers are recorded with those counts (and say so in
    their choices); the others recompute and offload no layer count."""
    e = run.execution
    want = RECIPE_COUNTS.get((run.system, run.model), ("none", "block", None, None))
    assert (e.recompute, e.recompute_method, e.recompute_num_layers, e.offload_num_layers) == want
    assert e.offload_activations is (want[3] is not None) and not e.offload_weights
    for count in want[2:]:
        if count is not None:
            assert f"_num_layers={count}" in run.choices


# The presets the family runs on, grouped by the GPU chip whose fitted fp8_fraction they carry
# (node.gemm_efficiency): b200 (HGX) and gb200-nvl72 both carry the B200 and share one.
FP8_CHIPS = {"H100": ("dgx-h100",), "B200": ("b200", "gb200-nvl72"), "B300": ("gb300-nvl72",)}


def _fp8_rms(systems: tuple[str, ...], fraction: float, clusters: dict) -> float:
    """RMS relative error of the family's runs on ``systems`` with their curves' fp8_fraction set to
    ``fraction``, through llm_step; ``clusters`` holds each run's cluster (run_cluster), filled on first use."""
    errors = []
    for run in (r for r in BRIDGE_FP8_RUNS if r.system in systems):
        if id(run) not in clusters:
            clusters[id(run)] = run_cluster(run, None)
        cluster = clusters[id(run)]
        curve = dataclasses.replace(cluster.gemm_efficiency, fp8_fraction=fraction)
        step = llm_step(preset(run.model), run.execution, dataclasses.replace(cluster, gemm_efficiency=curve),
                        precision=run.precision)
        errors.append(step.iteration_s / run.measured_s - 1.0)
    return math.sqrt(sum(e * e for e in errors) / len(errors))


@pytest.mark.parametrize("chip", [chip if chip == "H100" else pytest.param(chip, marks=pytest.mark.slow)
                                  for chip in FP8_CHIPS])  # H100 by default (~1 s); B200 (the shared chip, ~4 s), B300 slow
def test_fitted_fp8_fraction_is_the_grid_minimum(chip):
    """Each chip's fp8_fraction, the same in every preset that carries the chip, is the 0.01 grid point with the
    least RMS error over those presets' rows of the family: no worse than either neighbour on that grid nor than
    any point of the 0.05 grid over 0.60-1.00 (the error is smooth in the fraction, so these bound the full 0.01
    grid's minimum); their peak fraction and half-width are those of a preset without a curve, so the fit changes
    nothing but fp8 GEMMs."""
    systems = FP8_CHIPS[chip]
    fractions = set()
    for system in systems:
        cluster = load_cluster(system)
        curve = cluster.gemm_efficiency
        assert curve.peak_fraction == cluster.device.compute_efficiency and curve.half_width == DEFAULT_HALF_WIDTH
        fractions.add(curve.fp8_fraction)
    assert len(fractions) == 1
    (fraction,) = fractions
    clusters: dict = {}
    fitted = _fp8_rms(systems, fraction, clusters)
    for other in (fraction - 0.01, fraction + 0.01, *(i / 100 for i in range(60, 101, 5))):
        assert fitted <= _fp8_rms(systems, round(other, 2), clusters) + 1e-12


def test_bridge_fp8_family_is_within_the_goal():
    """With the per-chip fp8 fractions the family's mean |error| is within 5 % and its max within 10 %."""
    s = summary(validate_llm(runs=BRIDGE_FP8_RUNS))
    assert s["mean_abs_error"] <= 0.05 and s["max_abs_error"] <= 0.10
