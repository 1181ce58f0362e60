"""Partial recompute and partial offload by layer count (Megatron-LM's ``--recompute-method block|uniform
--recompute-num-layers N``, Transformer Engine's ``--cpu-offloading-num-layers``): memory and recompute FLOPs
against Korthikanti et al.'s per-layer bytes and Narayanan et al.'s per-layer FLOPs, computed here by hand."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import ConfigError
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs
from mcdla.workload.execution import Execution, check_execution, execution_from_dict
from mcdla.workload.transformer import TransformerSpec, hardware_flops_per_iteration

PEAK, EFF = 300e12, 0.5
# GPT layers (4h FFN, GELU, biases, dropout), 8 of them; vocabulary 1 leaves the logits negligible
SPEC = TransformerSpec(name="p", layers=8, hidden=1024, heads=16, vocab=1, seq_len=1024)
S, H, A = SPEC.seq_len, SPEC.hidden, SPEC.heads
SBH = S * H  # micro-batch 1
PLAIN = SBH * (34 + 5 * A * S / H)  # Korthikanti et al. 2022, Table 2: no parallelism, no recompute
INPUT = 2 * SBH  # full recompute keeps the layer's input only
LAYER_FLOPS = 24 * S * H * H + 4 * S * S * H  # Narayanan et al. SC21: one layer's forward, materialized scores
# pp 2 x v 2: four model chunks of 2 layers; 4 micro-batches; the first stage holds 2 (1 + 1/4) in flight
PIPE = dict(gpus=2, pp=2, virtual_stages=2, micro_batch=1, global_batch=4, attention="materialized")
IN_FLIGHT, CHUNKS_PER_STAGE, CHUNK = 2 * (1 + 1 / 4), 2, 2


def _cluster(make, offload: float = 0.0):
    """Only FLOPs cost time (infinite bandwidths) unless an offload bandwidth is given."""
    return make(nodes=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, hbm_bytes=80e9, hbm_bytes_per_s=math.inf,
                nvlink_bytes_per_s=math.inf, network_bytes_per_s=math.inf, offload_bytes_per_s=offload)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_block_recompute_memory_and_flops_by_hand(n, llm_cluster):
    """``block`` with N of a chunk's 2 layers: the first stage stores N inputs and 2 - N layers' activations per
    chunk and micro-batch in flight; the devices run N x (pp v) extra layer forwards per sample."""
    step = llm_step(SPEC, Execution(**PIPE, recompute="full", recompute_num_layers=n), _cluster(llm_cluster))
    want = IN_FLIGHT * CHUNKS_PER_STAGE * (n * INPUT + (CHUNK - n) * PLAIN)
    assert step.activation_bytes == pytest.approx(want, rel=1e-12)
    none = hardware_flops_per_iteration(SPEC, 4, "none")
    assert step.hardware_flops - none == pytest.approx(n * 4 * 4 * LAYER_FLOPS, rel=1e-12)
    # recompute time on a stage: N layers per chunk, 2 chunks, 4 micro-batches, at PEAK x EFF
    assert step.recompute_s == pytest.approx(4 * n * CHUNKS_PER_STAGE * LAYER_FLOPS / (PEAK * EFF), rel=1e-9)


def test_block_with_zero_layers_is_no_recompute_and_all_layers_is_full(llm_cluster):
    """N = 0 predicts exactly what recompute ``none`` does, N = the chunk's layers exactly what ``full`` does."""
    cluster = _cluster(llm_cluster)
    for n, same in ((0, "none"), (CHUNK, "full")):
        got = llm_step(SPEC, Execution(**PIPE, recompute="full", recompute_num_layers=n), cluster)
        assert got.to_dict() == llm_step(SPEC, Execution(**PIPE, recompute=same), cluster).to_dict()


def test_uniform_groups_store_one_input_per_group_and_recompute_every_layer(llm_cluster):
    """``uniform`` with N = 2 (one group per chunk): one input stored per chunk and micro-batch in flight, plus the
    group's other layer live while it recomputes; every layer recomputed, as with full recompute."""
    cluster = _cluster(llm_cluster)
    got = llm_step(SPEC, Execution(**PIPE, recompute="full", recompute_method="uniform", recompute_num_layers=2),
                   cluster)
    assert got.activation_bytes == pytest.approx(IN_FLIGHT * CHUNKS_PER_STAGE * INPUT + PLAIN, rel=1e-12)
    full = llm_step(SPEC, Execution(**PIPE, recompute="full"), cluster)
    assert got.hardware_flops == full.hardware_flops and got.iteration_s == full.iteration_s
    one = llm_step(SPEC, Execution(**PIPE, recompute="full", recompute_method="uniform", recompute_num_layers=1),
                   cluster)
    assert one.to_dict() == full.to_dict()


@pytest.mark.parametrize("n", [0, 3, 8])
def test_partial_activation_offload_by_hand(n, llm_cluster):
    """Offloading the first N of 8 layers (one GPU, one chunk) moves N layers' activations off the device, and over a
    slow link exposes what the 8 layers' forward (backward), with the single stage's loss, does not hide of their
    transfer."""
    bw = 2e9
    base = dict(gpus=1, micro_batch=1, global_batch=2, attention="materialized")
    keep = llm_step(SPEC, Execution(**base), _cluster(llm_cluster, offload=bw))
    got = llm_step(SPEC, Execution(**base, offload_activations=True, offload_num_layers=n),
                   _cluster(llm_cluster, offload=bw))
    assert got.offloaded_bytes == got.offloaded_activation_bytes == pytest.approx(n * PLAIN, rel=1e-12)
    assert keep.device_bytes - got.device_bytes == pytest.approx(n * PLAIN, rel=1e-12)
    fwd = 8 * LAYER_FLOPS / (PEAK * EFF)
    move = n * PLAIN / bw
    head = stage_costs(SPEC, Execution(**base, offload_activations=True, offload_num_layers=n),
                       _cluster(llm_cluster, offload=bw))
    exposed = max(0.0, move - fwd - head.last_fwd_s) + max(0.0, move - 2 * fwd - head.last_bwd_s)
    assert got.offload_s == pytest.approx(2 * exposed, rel=1e-9, abs=1e-15)
    if n == 8:  # all layers: the same as offloading every layer's activations without a count
        every = llm_step(SPEC, Execution(**base, offload_activations=True), _cluster(llm_cluster, offload=bw))
        assert got.to_dict() == every.to_dict()


def test_partial_weight_offload_keeps_the_other_layers_and_the_embedding(llm_cluster):
    """With ``offload_weights`` and N = 3, the tier holds 3 layers' 16-bit weights (12 h^2 + 13 h parameters each,
    Narayanan et al.), and each forward and backward fetches those bytes."""
    e = Execution(gpus=1, micro_batch=1, global_batch=2, offload_weights=True, offload_num_layers=3)
    got = llm_step(SPEC, e, _cluster(llm_cluster, offload=1e12))
    layer_params = 12 * H * H + 13 * H
    assert got.offloaded_bytes == got.offloaded_weight_bytes == pytest.approx(2 * 3 * layer_params, rel=1e-12)
    assert rank_traffic(SPEC, e).offload_weight_bytes == pytest.approx(2 * 3 * layer_params, rel=1e-12)


@pytest.mark.parametrize(("fields", "words"), [
    (dict(recompute="full", recompute_num_layers=3), "execution.recompute_num_layers: got 3; must be at most the 2"),
    (dict(recompute="selective", recompute_num_layers=1), "needs recompute=full"),
    (dict(recompute="full", recompute_method="uniform", recompute_num_layers=0), "must be an integer >= 1"),
    (dict(recompute="full", recompute_method="chunk"), "execution.recompute_method: got 'chunk'"),
    (dict(offload_num_layers=1), "execution.offload_num_layers: got 1 with neither"),
    (dict(offload_activations=True, offload_num_layers=5), "execution.offload_num_layers: got 5; must be at most"),
    (dict(offload_activations=True, offload_num_layers=1, recompute="full", recompute_num_layers=1),
     "choose one layer count"),
    (dict(offload_activations=True, offload_num_layers=1, layers_first_stage=2, layers_last_stage=6,
          virtual_stages=1), "needs every chunk the same size"),
])
def test_bad_layer_counts_are_one_line(fields, words):
    """A count past a chunk's layers, with the wrong recompute or no offload, both counts, or an uneven split: a
    one-line ConfigError naming the field."""
    with pytest.raises(ConfigError) as err:
        check_execution(Execution(**{**PIPE, **fields}), SPEC)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_layer_counts_read_from_a_file_refuse_negative_counts():
    """The file boundary refuses a negative count in one line, naming the field."""
    with pytest.raises(ConfigError, match=r"execution\.recompute_num_layers: got -1"):
        execution_from_dict({"gpus": 1, "recompute": "full", "recompute_num_layers": -1})
    e = execution_from_dict({"gpus": 1, "recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 2})
    assert (e.recompute_method, e.recompute_num_layers) == ("uniform", 2)
