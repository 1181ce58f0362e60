"""The analytical LLM iteration model against closed forms, and against the published Megatron runs."""

import dataclasses
import math

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import load_cluster
from mcdla.hardware.gemm import GemmEfficiency
from mcdla.report.llm_validation import RUNS, summary, validate_llm
from mcdla.sim.llm import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, activation_bytes_per_layer, hardware_flops_per_iteration, preset

PEAK, EFF = 300e12, 0.5


def _cluster(make, nvlink=math.inf, network=math.inf, hbm=math.inf, offload=0.0, capacity=80e9, nodes=8):
    """A cluster whose only cost is FLOPs unless a bandwidth is given (infinite HBM: no elementwise time)."""
    return make(nodes=nodes, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, hbm_bytes=capacity,
                hbm_bytes_per_s=hbm, nvlink_bytes_per_s=nvlink, network_bytes_per_s=network,
                offload_bytes_per_s=offload)


SMALL = TransformerSpec(name="s", layers=8, hidden=1024, heads=16, vocab=1, seq_len=1024)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("tp", [1, 4])
def test_flops_bound_iteration_is_hardware_flops_over_rate(recompute, tp, llm_cluster):
    """Without communication or memory-bound time, one iteration = hardware FLOPs / (GPUs x peak x eff)."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=tp, tp=tp, micro_batch=2, global_batch=8, recompute=recompute,
                  attention="materialized")
    step = llm_step(spec, e, _cluster(llm_cluster))
    assert step.iteration_s == pytest.approx(hardware_flops_per_iteration(spec, 8, recompute) / (tp * PEAK * EFF),
                                             rel=1e-9)


@pytest.mark.parametrize("p, v, m", [(4, 1, 8), (4, 2, 8), (8, 1, 32), (2, 4, 6)])
def test_pipeline_bubble_closed_form(p, v, m, llm_cluster):
    """With a balanced pipeline, iteration = ideal x (1 + (p - 1) / (m v)) (SC21, sec. 2.2); vocabulary 1
    leaves the last stage's logits ~1e-5 of the work, hence the tolerance."""
    e = Execution(gpus=p, pp=p, virtual_stages=v, micro_batch=1, global_batch=m, attention="materialized")
    ideal = hardware_flops_per_iteration(SMALL, m, "none") / (p * PEAK * EFF)
    step = llm_step(SMALL, e, _cluster(llm_cluster))
    assert step.iteration_s == pytest.approx(ideal * (1 + (p - 1) / (m * v)), rel=1e-4)
    assert step.bubble_s / (step.iteration_s - step.bubble_s) == pytest.approx(e.bubble_fraction, rel=1e-4)


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_four_ring_all_reduces_per_layer(sp, llm_cluster):
    """TP costs 4 ring all-reduces of b s h elements per layer and micro-batch (Megatron: 2 forward, 2 backward;
    with SP all-gather + reduce-scatter, the same traffic)."""
    bw, t, b, m = 100e9, 8, 2, 3
    e = Execution(gpus=t, tp=t, sequence_parallel=sp, micro_batch=b, global_batch=b * m)
    step = llm_step(SMALL, e, _cluster(llm_cluster, nvlink=bw))
    one = 2 * (t - 1) / t * 2 * b * SMALL.seq_len * SMALL.hidden / bw
    assert step.tp_comm_s == pytest.approx(m * SMALL.layers * 4 * one, rel=1e-12)


def test_full_recompute_repeats_forward_collectives(llm_cluster):
    """Full recomputation adds the two forward all-reduces again: 6 per layer instead of 4."""
    e = dict(gpus=4, tp=4, micro_batch=1, global_batch=2)
    none = llm_step(SMALL, Execution(**e), _cluster(llm_cluster, nvlink=50e9)).tp_comm_s
    full = llm_step(SMALL, Execution(**e, recompute="full"), _cluster(llm_cluster, nvlink=50e9)).tp_comm_s
    assert full == pytest.approx(1.5 * none, rel=1e-12)


@pytest.mark.parametrize("tp, dp, inside, across", [(8, 4, 1, 4), (2, 8, 4, 2), (1, 4, 4, 1), (1, 16, 8, 2)])
def test_dp_all_reduce_hierarchical_over_nvlink_and_network(tp, dp, inside, across, llm_cluster):
    """The gradient all-reduce of n = 2 bytes x params/tp: a reduce-scatter and an all-gather ring over the
    ``inside`` members of a node (NVLink 300 GB/s), an all-reduce ring of the n/inside shard over the ``across``
    nodes (25 GB/s rails): 2 (k-1)/k n/B_up + 2 (m-1)/m (n/k)/B_out."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=tp * dp, tp=tp, dp=dp, micro_batch=1, global_batch=dp)
    step = llm_step(spec, e, _cluster(llm_cluster, nvlink=300e9, network=25e9))
    n = 2 * spec.params() / tp
    expected = 2 * (inside - 1) / inside * n / 300e9 + 2 * (across - 1) / across * (n / inside) / 25e9
    assert step.dp_comm_s == pytest.approx(expected, rel=1e-12)


def test_dp_overlap_hides_reduction_behind_backward(llm_cluster):
    """Overlapping the reduction with the last backward never exposes more, and here exposes less."""
    spec, common = preset("megatron-1.7b"), dict(gpus=32, dp=32, micro_batch=4, global_batch=512)
    c = _cluster(llm_cluster, nvlink=300e9, network=25e9)
    plain = llm_step(spec, Execution(**common), c)
    overlapped = llm_step(spec, Execution(**common, dp_overlap=True), c)
    assert overlapped.dp_comm_s < plain.dp_comm_s


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_zero3_shards_weights_gradients_and_optimizer(prefetch, llm_cluster):
    """ZeRO-3 keeps 16/dp bytes of model state per parameter instead of 16 (Rajbhandari et al. 2020), plus the
    ``prefetch + 1`` layers gathered whole with their gradients (2 + 2 bytes per parameter)."""
    spec = preset("megatron-7.5b")
    common = dict(gpus=8, dp=8, micro_batch=1, global_batch=8)
    plain = llm_step(spec, Execution(**common), _cluster(llm_cluster))
    zero3 = llm_step(spec, Execution(**common, zero=3, fsdp_prefetch=prefetch), _cluster(llm_cluster))
    gathered = 4 * (prefetch + 1) * spec.params_per_layer()
    assert plain.device_bytes - zero3.device_bytes == pytest.approx(16 * spec.params() * 7 / 8 - gathered, rel=1e-12)


def test_first_stage_holds_p_micro_batches_of_activations(llm_cluster):
    """1F1B keeps p micro-batches in flight on the first stage: activations = l x per-layer bytes (pp-free),
    times 1 + (p - 1)/(p v) when interleaved (Korthikanti et al. 2022, sec. 4.2.3)."""
    spec = preset("gpt3-175b")
    per_layer = activation_bytes_per_layer(spec, 1, tp=8, sp=True, recompute="selective")
    base = dict(gpus=64, tp=8, pp=8, sequence_parallel=True, recompute="selective", micro_batch=1, global_batch=64,
                attention="materialized")
    plain = llm_step(spec, Execution(**base), _cluster(llm_cluster))
    inter = llm_step(spec, Execution(**base, virtual_stages=3), _cluster(llm_cluster))
    assert inter.device_bytes - plain.device_bytes == pytest.approx(spec.layers * per_layer * 7 / 24, rel=1e-9)


def test_offload_moves_bytes_off_device_and_slow_link_is_exposed(llm_cluster):
    """Offloaded activations leave device memory; over a slow link their transfer time shows up."""
    spec = preset("megatron-1.7b")
    base = dict(gpus=1, micro_batch=4, global_batch=8)
    keep = llm_step(spec, Execution(**base), _cluster(llm_cluster, offload=1e9))
    fast = llm_step(spec, Execution(**base, offload_activations=True), _cluster(llm_cluster, offload=1e15))
    slow = llm_step(spec, Execution(**base, offload_activations=True), _cluster(llm_cluster, offload=1e9))
    assert keep.device_bytes - fast.device_bytes == pytest.approx(fast.offloaded_bytes) and fast.offloaded_bytes > 0
    assert fast.offload_s == 0 and slow.offload_s > 0
    assert slow.iteration_s == pytest.approx(keep.iteration_s + slow.offload_s, rel=1e-12)


def test_offload_without_second_tier_is_an_error(llm_cluster):
    """Asking to offload on a cluster without a second tier is a one-line error."""
    with pytest.raises(ConfigError, match="offload"):
        llm_step(SMALL, Execution(gpus=1, offload_weights=True), _cluster(llm_cluster))


def test_tp_wider_than_a_node_is_an_error(llm_cluster):
    """Tensor parallelism must stay inside one NVLink domain."""
    spec = TransformerSpec(name="w", layers=2, hidden=2048, heads=16, vocab=8, seq_len=64)
    with pytest.raises(ConfigError, match="NVLink domain"):
        llm_step(spec, Execution(gpus=16, tp=16), _cluster(llm_cluster))


def test_published_runs_within_goal():
    """Korthikanti Table 5 and SC21 Table 1 (1.7B-18.4B): mean |error| <= 5%, max <= 10%."""
    s = summary(validate_llm())
    assert s["mean_abs_error"] <= 0.05 and s["max_abs_error"] <= 0.10, s


def test_selective_plus_sp_faster_than_full_as_measured():
    """The model orders each Korthikanti pair as measured: selective + SP beats full recomputation."""
    rows = {r.run.name: r.predicted.iteration_s for r in validate_llm()}
    for model in ("megatron-22b", "gpt3-175b", "megatron-530b", "megatron-1t"):
        assert rows[f"{model} selective+SP"] < rows[f"{model} full"]


def test_curve_fitted_on_korthikanti_predicts_sc21():
    """Out of sample: the efficiency curve fitted on Korthikanti's 8 runs alone (0.78, 190; docs/llm.md)
    predicts the 4 SC21 runs within 7.5% each and 5% on average."""
    sc21 = tuple(r for r in RUNS if r.name.endswith("SC21"))
    curve = GemmEfficiency(peak_fraction=0.78, half_width=190.0)
    rows = validate_llm(load_cluster("dgx-a100").with_gemm_efficiency(curve), sc21)
    s = summary(rows)
    assert len(rows) == 4 and s["max_abs_error"] <= 0.075 and s["mean_abs_error"] <= 0.05, s


def test_fits_counts_the_offload_tier_too():
    """GPT-3 175B TP8 PP8 (micro-batch 8, no recompute) with activations, weights and optimizer offloaded on DGX
    H100: within HBM, but the offloaded state (14 bytes per parameter of the rank plus 8 micro-batches of
    activations) exceeds the 2 x 1 TB / 8 = 250 GB host share of each GPU, so it does not fit."""
    spec, cluster = preset("gpt3-175b"), load_cluster("dgx-h100").for_gpus(64)
    e = Execution(gpus=64, tp=8, pp=8, sequence_parallel=True, micro_batch=8, global_batch=64,
                  offload_activations=True, offload_weights=True, offload_optimizer=True, attention="materialized")
    step = llm_step(spec, e, cluster)
    params = (96 // 8 * spec.params_per_layer() + spec.embedding_params()) / 8
    acts = 8 * 96 // 8 * activation_bytes_per_layer(spec, 8, tp=8, sp=True, recompute="none")
    assert cluster.offload.pool_bytes == pytest.approx(250e9)
    assert step.offloaded_bytes == pytest.approx(14 * params + acts, rel=1e-12) and step.offloaded_bytes > 250e9
    assert step.device_bytes <= 80e9 and not step.fits
    small = llm_step(spec, dataclasses.replace(e, micro_batch=1), cluster)  # 8x fewer activation bytes
    assert small.offloaded_bytes <= 250e9 and small.device_bytes <= 80e9 and small.fits


def test_validation_runs_on_the_shipped_preset():
    """validate_llm's default system is the dgx-a100 preset itself: the same rows as passing it by name."""
    by_default = [r.predicted.iteration_s for r in validate_llm()]
    assert by_default == [r.predicted.iteration_s for r in validate_llm("dgx-a100")]
