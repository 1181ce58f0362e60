"""Context parallelism across nodes: the K/V ring exchange, its overlap, the all-gather variant, CP replicas in the
gradient reduction (sim/llm_cp.py, NOTE [context parallel exchange]), against hand-computed closed forms."""

from __future__ import annotations

import pytest

from mcdla.sim.llm import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec

PEAK, EFF = 300e12, 0.5
# MHA, GELU, no vocabulary to speak of: the attention core's forward is 4 b s^2 h FLOP (QK^T and xV).
SPEC = TransformerSpec(name="cp", layers=2, hidden=1024, heads=16, vocab=1, seq_len=4096)


def _block_bytes(b: int, tp: int, cp: int) -> float:
    """One rank's K and V on one TP rank: 2 tensors x b (s / cp) (h / tp) elements of 2 bytes (MHA)."""
    return 2 * 2 * b * SPEC.seq_len / cp * SPEC.hidden / tp


def _attention_s(b: int, tp: int, cp: int) -> float:
    """The rank's attention-core forward: 4 b s^2 h / (tp cp) FLOP at peak x efficiency (infinite HBM)."""
    return 4 * b * SPEC.seq_len ** 2 * SPEC.hidden / (tp * cp) / (PEAK * EFF)


@pytest.mark.parametrize("gpus_per_node, nodes, across", [(2, 4, True), (8, 1, False)])
def test_ring_exchange_exposes_send_minus_block_attention(gpus_per_node, nodes, across, llm_cluster):
    """Per layer and micro-batch the ring exposes (cp - 1) max(0, a + block/B - attention/cp) in forward and twice
    that in backward, on the network when CP spans nodes (tp*cp > a node) and on NVLink inside one."""
    tp, cp, b, m, bw, lat = 2, 4, 1, 2, 25e9, 5e-6
    fabric = dict(network_bytes_per_s=bw, network_latency_s=lat) if across else dict(nvlink_bytes_per_s=bw,
                                                                                    nvlink_latency_s=lat)
    cluster = llm_cluster(gpus_per_node=gpus_per_node, nodes=nodes, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          **fabric)
    e = Execution(gpus=8, tp=tp, cp=cp, micro_batch=b, global_batch=m, attention="materialized")
    step = llm_step(SPEC, e, cluster)
    send = lat + _block_bytes(b, tp, cp) / bw
    exposed = (cp - 1) * max(0.0, send - _attention_s(b, tp, cp) / cp)
    assert exposed > 0
    assert step.cp_comm_s == pytest.approx(m * SPEC.layers * 3 * exposed, rel=1e-9)


def test_fast_ring_is_hidden_behind_attention(llm_cluster):
    """A send shorter than one block's attention is hidden: no CP time, and the iteration less the gradient
    reduction (over the CP replicas, on the network) equals the one with an infinitely fast fabric."""
    kw = dict(gpus_per_node=2, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    e = Execution(gpus=8, tp=2, cp=4, micro_batch=1, global_batch=2)
    send_s = _block_bytes(1, 2, 4) / 1e13
    assert send_s < _attention_s(1, 2, 4) / 4
    fast = llm_step(SPEC, e, llm_cluster(**kw, network_bytes_per_s=1e13))
    assert fast.cp_comm_s == 0.0
    free = llm_step(SPEC, e, llm_cluster(**kw))
    assert fast.iteration_s - fast.dp_comm_s == pytest.approx(free.iteration_s, rel=1e-12)


def test_all_gather_exchange_is_not_overlapped(llm_cluster):
    """cp_comm=all_gather: forward all-gathers the cp blocks, backward all-gathers them again and
    reduce-scatters their gradients; on a ring of cp nodes each is (cp-1)/cp x cp x block / B + (cp-1) a."""
    cp, bw, lat, m = 4, 25e9, 5e-6, 2
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=bw, network_latency_s=lat)
    e = Execution(gpus=4, cp=cp, micro_batch=1, global_batch=m, cp_comm="all_gather")
    one = (cp - 1) / cp * cp * _block_bytes(1, 1, cp) / bw + (cp - 1) * lat
    assert llm_step(SPEC, e, cluster).cp_comm_s == pytest.approx(m * SPEC.layers * 3 * one, rel=1e-9)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputed_attention_repeats_the_forward_exchange(recompute, llm_cluster):
    """Recomputing the attention core runs its ring again in backward: 4 exchanges' worth instead of 3."""
    cluster = llm_cluster(gpus_per_node=2, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=25e9)
    kw = dict(gpus=8, tp=2, cp=4, micro_batch=1, global_batch=2)
    none = llm_step(SPEC, Execution(**kw), cluster).cp_comm_s
    again = llm_step(SPEC, Execution(**kw, recompute=recompute), cluster).cp_comm_s
    assert none > 0
    assert again == pytest.approx(4 / 3 * none, rel=1e-12)


def test_gradients_are_reduced_over_dp_times_cp_replicas(llm_cluster):
    """CP ranks hold the same weights: the gradient all-reduce runs over the dp x cp = 4 ranks of 2 nodes of 2
    GPUs, hierarchically (NVLink free here), so the network all-reduces half the gradients over 2 nodes:
    2 (1/2) (2 bytes x parameters / 2) / B, half of what a reduction over dp alone would cost."""
    bw = 10e9
    cluster = llm_cluster(gpus_per_node=2, nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=bw)
    step = llm_step(SPEC, Execution(gpus=4, cp=2, dp=2, micro_batch=1, global_batch=2), cluster)
    assert step.dp_comm_s == pytest.approx(2 * 1 / 2 * (2 * SPEC.params() / 2) / bw, rel=1e-9)


def test_per_rank_schedule_agrees_with_the_closed_form(llm_cluster):
    """The per-rank engine charges the same exchange: mode=ranks gives the fast path's iteration."""
    cluster = llm_cluster(gpus_per_node=2, nodes=8, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=25e9, nvlink_bytes_per_s=100e9)
    e = Execution(gpus=16, tp=2, cp=4, pp=2, micro_batch=1, global_batch=4)
    fast, ranks = llm_step(SPEC, e, cluster), llm_step(SPEC, e, cluster, mode="ranks")
    assert fast.cp_comm_s > 0
    assert ranks.iteration_s == pytest.approx(fast.iteration_s, rel=1e-9)
    assert ranks.cp_comm_s == pytest.approx(fast.cp_comm_s, rel=1e-12)


def test_the_slowest_hop_paces_the_ring(llm_cluster):
    """A CP group of 4 over two GPUs per node crosses NVLink (0-1, 2-3) and the network (1-2, 3-0). With NVLink
    the slower of the two here (10 GB/s against 1 TB/s), every ring step waits for the NVLink hops: the send
    is 1 us + block / 10 GB/s, not the network's 5 us + block / 1 TB/s."""
    cp, m = 4, 2
    cluster = llm_cluster(gpus_per_node=2, nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          nvlink_bytes_per_s=10e9, nvlink_latency_s=1e-6, network_bytes_per_s=1e12,
                          network_latency_s=5e-6)
    e = Execution(gpus=4, tp=1, cp=cp, micro_batch=1, global_batch=m, attention="materialized")
    send = 1e-6 + _block_bytes(1, 1, cp) / 10e9
    assert send > 5e-6 + _block_bytes(1, 1, cp) / 1e12
    exposed = (cp - 1) * max(0.0, send - _attention_s(1, 1, cp) / cp)
    assert exposed > 0
    assert llm_step(SPEC, e, cluster).cp_comm_s == pytest.approx(m * SPEC.layers * 3 * exposed, rel=1e-9)
