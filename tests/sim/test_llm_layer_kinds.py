"""Each model chunk timed with the layers it holds (NOTE [layer kinds] in sim/llm.py): DeepSeek's dense leading
layers on the first chunks, the MoE layers elsewhere, against a hand computation on a FLOPs-only cluster, the
per-rank schedule and the lowered engine; Megatron's layer order over the chunks against a brute force."""

from __future__ import annotations

import dataclasses

import pytest

from mcdla.sim.llm import llm_step, stage_costs
from mcdla.sim.llm_lower import engine_step
from mcdla.workload.execution import Execution, chunk_layers
from mcdla.workload.layer_counts import dense_chunk_layers
from mcdla.workload.transformer import TransformerSpec, attention_bwd_flops_ratio, layer_fwd_flops, preset

_PEAK, _FRACTION = 300e12, 0.5  # a flat GEMM curve: every GEMM and the core at half the peak
# one dense leading layer of 4 (SwiGLU 1024 wide) and three MoE layers (2 of 8 experts of 1024 and a shared one)
_SPEC = TransformerSpec(name="dsv3-like", layers=4, hidden=1024, heads=16, vocab=512, seq_len=1024, mlp="swiglu",
                        experts=8, top_k=2, shared_experts=1, ffn_hidden=1024, dense_layers=1,
                        dense_ffn_hidden=1024, bias=False, position="rope", tied_embeddings=False, dropout=False)
# each kind's layer as its own model, written out here: the MoE layer's model and the dense layer's
_MOE = dataclasses.replace(_SPEC, dense_layers=0, dense_ffn_hidden=None)
_DENSE = TransformerSpec(name="dense", layers=4, hidden=1024, heads=16, vocab=512, seq_len=1024, mlp="swiglu",
                         ffn_hidden=1024, bias=False, position="rope", tied_embeddings=False, dropout=False)


def _layer_s(spec: TransformerSpec, b: int, e: Execution, backward_ratio: float) -> tuple[float, float]:
    """One layer's forward and backward on a FLOPs-only cluster: its GEMMs and core at half the peak, the GEMMs'
    backward ``backward_ratio`` x, the core's the kernel's ratio; nothing else costs time."""
    flops = layer_fwd_flops(spec, b, attention=e.attention)
    rate = _PEAK * _FRACTION
    return ((flops["gemm"] + flops["attention"]) / rate,
            (backward_ratio * flops["gemm"] + attention_bwd_flops_ratio(e.attention) * flops["attention"]) / rate)


def _flops_only(llm_cluster, gpus: int):
    return llm_cluster(gpus_per_node=gpus, peak_flops_per_s=_PEAK, gemm_peak_fraction=_FRACTION).for_gpus(gpus)


def test_two_stages_time_their_own_layers_by_hand(llm_cluster) -> None:
    """Two 1F1B stages: the first holds the dense layer and an MoE layer, the second two MoE layers and the
    logits (the slower one). With the second stage pacing, the iteration is the first stage's forward, ``m`` of
    the second's micro-batches, and the first stage's backward; the mean layer on both stages would differ."""
    m = 3
    e = Execution(gpus=2, pp=2, micro_batch=1, global_batch=m)
    cluster = _flops_only(llm_cluster, 2)
    ratio = cluster.gemm_efficiency.backward_ratio
    (fm, bm), (fd, bd) = _layer_s(_MOE, 1, e, ratio), _layer_s(_DENSE, 1, e, ratio)
    logits = 2.0 * _SPEC.seq_len * _SPEC.hidden * _SPEC.vocab / (_PEAK * _FRACTION)
    first_f, first_b = fd + fm, bd + bm
    last_f, last_b = 2 * fm + logits, 2 * bm + ratio * logits
    assert first_f + first_b < last_f + last_b  # the last stage paces, never waiting once fed
    want = first_f + m * (last_f + last_b) + first_b
    assert llm_step(_SPEC, e, cluster).iteration_s == pytest.approx(want, rel=1e-9)
    assert llm_step(_SPEC, e, cluster, mode="ranks").iteration_s == pytest.approx(want, rel=1e-9)
    assert engine_step(_SPEC, e, cluster).idle_iteration_s == pytest.approx(want, rel=1e-9)
    fa, ba = _layer_s(_SPEC, 1, e, ratio)  # the mean layer of the four
    mean = 2 * fa + m * (2 * fa + logits + 2 * ba + ratio * logits) + 2 * ba
    assert abs(want - mean) > 1e-3 * want


def test_one_stage_sums_each_kind(llm_cluster) -> None:
    """Without pipelining the closed form (not the schedule) prices the one stage's dense and MoE layers each at
    its own figures, and its compute part is ``m`` times their sum with the logits."""
    m = 2
    e = Execution(gpus=1, micro_batch=1, global_batch=m)
    cluster = _flops_only(llm_cluster, 1)
    ratio = cluster.gemm_efficiency.backward_ratio
    (fm, bm), (fd, bd) = _layer_s(_MOE, 1, e, ratio), _layer_s(_DENSE, 1, e, ratio)
    logits = 2.0 * _SPEC.seq_len * _SPEC.hidden * _SPEC.vocab / (_PEAK * _FRACTION)
    want = m * (3 * (fm + bm) + fd + bd + (1 + ratio) * logits)
    step = llm_step(_SPEC, e, cluster)
    assert step.iteration_s == pytest.approx(want, rel=1e-9)
    assert step.compute_s == pytest.approx(want, rel=1e-9)
    assert llm_step(_SPEC, e, cluster, mode="ranks").iteration_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("dp_overlap", [False, True])
def test_all_to_alls_only_on_moe_layers(dp_overlap: bool, llm_cluster) -> None:
    """With expert parallelism over a slow NVLink the chunk holding the dense layer runs one MoE layer's
    all-to-alls, the other two: the pacing stage's EP time is two MoE layers', the mean layer's would be 1.5
    of them, and the idle engine's lowered all-to-alls (and the reduction started with the first stage's last
    backward, its dense and MoE layer's) take the closed form's iteration."""
    e = Execution(gpus=4, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4, dp_overlap=dp_overlap)
    cluster = llm_cluster(gpus_per_node=4, peak_flops_per_s=_PEAK, gemm_peak_fraction=_FRACTION,
                          nvlink_bytes_per_s=20e9).for_gpus(4)
    c = stage_costs(_SPEC, e, cluster)
    moe, dense = c.layer_kinds
    assert dense.layer_ep_fwd_s == 0.0 < moe.layer_ep_fwd_s
    assert c.layer_ep_fwd_s == pytest.approx(0.75 * moe.layer_ep_fwd_s, rel=1e-12)  # the mean layer's 3/4
    step = llm_step(_SPEC, e, cluster)
    per_mb = 2 * (moe.layer_ep_fwd_s + moe.layer_ep_bwd_s)
    assert step.ep_comm_s == pytest.approx(e.micro_batches * per_mb, rel=1e-9)
    assert engine_step(_SPEC, e, cluster).idle_iteration_s == pytest.approx(step.iteration_s, rel=1e-9)
    if dp_overlap:  # the first chunk's backward: its dense and its MoE layer, each with its own figures
        first = sum(x.layer_bwd_s + x.layer_recompute_s + x.layer_comm_bwd_s for x in (moe, dense)) + c.p2p_s
        assert c.dp_hidden_s == pytest.approx(first, rel=1e-12) and c.dp_full_s > 0


@pytest.mark.parametrize(("pp", "v", "layers", "dense"), [(2, 2, 8, 3), (4, 2, 16, 5), (3, 1, 6, 2), (2, 3, 12, 7)])
def test_dense_layers_follow_megatrons_order_over_the_chunks(pp: int, v: int, layers: int, dense: int) -> None:
    """Layer ``i`` is dense when ``i < dense_layers``; chunk ``c`` of stage ``s`` holds the ``c p + s``-th block of
    consecutive layers: the counts against the layers written out one by one."""
    grid = tuple((layers // (pp * v),) * v for _ in range(pp))
    owner = [(s, c) for c in range(v) for s in range(pp) for _ in range(grid[s][c])]  # layer i's chunk
    want = [[sum(1 for i, o in enumerate(owner) if o == (s, c) and i < dense) for c in range(v)] for s in range(pp)]
    assert dense_chunk_layers(grid, dense) == tuple(tuple(row) for row in want)


def test_deepseek_v3_layout_puts_its_dense_layers_on_the_first_chunk() -> None:
    """The records' layout ``Et*4|(t*4|)*14tL``: the first chunk (stage 0, chunk 0) holds layers 0-3, the three
    dense ones among them; every other chunk only MoE layers."""
    spec = preset("deepseek-v3-671b")
    e = Execution(gpus=4, pp=4, virtual_stages=4, micro_batch=1, global_batch=64,
                  pipeline_layout="Et*4|(t*4|)*14tL")
    got = dense_chunk_layers(chunk_layers(e, spec), spec.dense_layers)
    assert got[0][0] == 3 and sum(sum(row) for row in got) == 3


def test_alike_layers_have_no_kinds() -> None:
    """A model whose layers are alike (dense, or MoE without dense leading layers) has no layer kinds, and its
    costs price every layer at the mean layer, which is then its every layer."""
    assert preset("mixtral-8x7b").layer_kinds() is None and preset("gpt3-175b").layer_kinds() is None
    moe, dense = _SPEC.layer_kinds()  # type: ignore[misc]
    assert moe == _MOE and dense.experts == 1 and dense.ffn_hidden == _SPEC.dense_ffn_hidden
    assert moe.params_per_layer() == _SPEC.params_per_layer() and dense.params_per_layer() == _SPEC.dense_layer_params()
