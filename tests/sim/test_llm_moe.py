"""MoE with expert parallelism: all-to-all on the EP group's fabric dimensions, capacity factor, expert weights and
their reduction per rank (sim/llm_moe.py, NOTE [expert parallelism]), against hand-computed closed forms."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.gemm import GemmEfficiency
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.errors import HardwareError
from mcdla.hardware.cluster import Cluster, cluster_from_dict, load_cluster
from mcdla.sim.llm_moe import (ep_all_to_all_s, ep_ranks_per_token, fp8_padding_applies, fp8_padding_bytes,
                               fp8_padding_launches, grouped_gemm_issue_s, grouped_gemm_launches, hybridep_bytes_per_s,
                               hybridep_priced, permutation_bytes, router_preprocess_launches, tokens_per_local_expert)
from mcdla.workload.execution import Execution
from mcdla.workload.hf_config import load_hf_config
from mcdla.workload.transformer import TransformerSpec, preset

PEAK, EFF = 300e12, 0.5
MOE = TransformerSpec(name="moe", layers=2, hidden=1024, heads=16, vocab=1, seq_len=1024, ffn_hidden=2048,
                      mlp="swiglu", experts=8, top_k=2, dropout=False, bias=False, position="rope",
                      tied_embeddings=False)
# The routed experts' weights: layers x experts x 3 SwiGLU matrices of h x f.
EXPERT_PARAMS = MOE.layers * MOE.experts * 3 * MOE.hidden * int(MOE.ffn_hidden)
EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "mcdla" / "examples"


def _a2a_bytes(b: int, tp: int, capacity: float) -> float:
    """One dispatch's send buffer: b s / tp tokens x top_k x h elements of 2 bytes x capacity."""
    return b * MOE.seq_len / tp * MOE.top_k * MOE.hidden * 2 * capacity


@pytest.mark.parametrize("capacity", [1.0, 1.25])
def test_all_to_all_across_nodes(capacity, llm_cluster):
    """EP 4 over 4 nodes: 4 all-to-alls per layer and micro-batch (dispatch and combine, forward and backward),
    each (p - 1)/p n / B + a."""
    bw, lat, b, m = 25e9, 5e-6, 2, 3
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=bw, network_latency_s=lat)
    e = Execution(gpus=4, dp=4, ep=4, micro_batch=b, global_batch=4 * b * m, capacity_factor=capacity)
    one = 3 / 4 * _a2a_bytes(b, 1, capacity) / bw + lat
    assert llm_step(MOE, e, cluster).ep_comm_s == pytest.approx(m * MOE.layers * 4 * one, rel=1e-9)


@pytest.mark.parametrize("ep, nvlink_share, network_share", [(2, 1 / 2, 0.0), (4, 1 / 4, 1 / 2)])
def test_all_to_all_on_the_ep_groups_dimensions(ep, nvlink_share, network_share, llm_cluster):
    """Two GPUs per node: EP 2 stays on NVLink (half of n crosses it); EP 4 sends 1/4 of n over NVLink and 1/2
    over the network, one level after the other."""
    nv, net, m = 100e9, 25e9, 2
    cluster = llm_cluster(gpus_per_node=2, nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          nvlink_bytes_per_s=nv, network_bytes_per_s=net)
    e = Execution(gpus=4, dp=4, ep=ep, micro_batch=1, global_batch=4 * m)
    n = _a2a_bytes(1, 1, 1.0)
    one = nvlink_share * n / nv + network_share * n / net
    assert llm_step(MOE, e, cluster).ep_comm_s == pytest.approx(m * MOE.layers * 4 * one, rel=1e-9)


def test_all_to_all_of_a_job_on_part_of_each_node(llm_cluster):
    """Nodes of 6 GPUs, 8 ranks, EP 4: packed 6 per node the groups 0-3 and 4-7 are priced with gcd(4, 6) = 2
    per node over 2 nodes (1/4 of n over NVLink, 1/2 over the network); on 4 GPUs of each node every group is
    one node's and sends 3/4 of n over NVLink alone."""
    nv, net, m = 100e9, 25e9, 2
    cluster = llm_cluster(gpus_per_node=6, nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          nvlink_bytes_per_s=nv, network_bytes_per_s=net)
    e = Execution(gpus=8, dp=8, ep=4, micro_batch=1, global_batch=8 * m)
    n = _a2a_bytes(1, 1, 1.0)
    packed = n / 4 / nv + n / 2 / net
    assert llm_step(MOE, e, cluster).ep_comm_s == pytest.approx(m * MOE.layers * 4 * packed, rel=1e-9)
    placed = cluster.with_gpus_per_node(4).for_gpus(8)
    assert llm_step(MOE, e, placed).ep_comm_s == pytest.approx(m * MOE.layers * 4 * 3 / 4 * n / nv, rel=1e-9)


def test_sequence_parallel_tokens_and_full_recompute(llm_cluster):
    """With TP 2 and SP a rank dispatches b s / 2 tokens; EP ranks are TP 2 apart, so EP 4 spans the 4 nodes;
    full recomputation adds the forward's two all-to-alls: 6 per layer."""
    bw, m = 25e9, 2
    cluster = llm_cluster(gpus_per_node=2, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=bw)
    e = Execution(gpus=8, tp=2, dp=4, ep=4, sequence_parallel=True, micro_batch=1, global_batch=4 * m,
                  recompute="full")
    one = 3 / 4 * _a2a_bytes(1, 2, 1.0) / bw
    assert llm_step(MOE, e, cluster).ep_comm_s == pytest.approx(m * MOE.layers * 6 * one, rel=1e-9)


def test_capacity_factor_scales_the_routed_expert_flops(llm_cluster):
    """Capacity C runs C x the routed tokens through the experts: compute grows by 3 (fwd + bwd) x (C - 1) x
    3 matrices x 2 b s h top_k f per layer, over peak x efficiency."""
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    kw = dict(gpus=4, dp=4, ep=4, micro_batch=1, global_batch=8)
    base = llm_step(MOE, Execution(**kw), cluster).compute_s
    padded = llm_step(MOE, Execution(**kw, capacity_factor=1.5), cluster).compute_s
    routed = 3 * 2 * 1 * MOE.seq_len * MOE.hidden * MOE.top_k * int(MOE.ffn_hidden)
    assert padded - base == pytest.approx(2 * MOE.layers * 3 * 0.5 * routed / (PEAK * EFF), rel=1e-9)


def test_tokens_per_local_expert_by_hand():
    """Qwen3-30B-A3B on EP 8 (128 experts, top-8, sequence 4096): 8 ranks x MBS x 4096 tokens x 8 over 128
    experts = 2048 x MBS per expert; capacity 1.25 pads each to 1.25 x; CP 2 halves each rank's tokens."""
    spec = preset("qwen3-30b-a3b")
    for b in (1, 4):
        e = Execution(gpus=8, dp=8, ep=8, micro_batch=b, global_batch=8 * b)
        assert tokens_per_local_expert(spec, e) == pytest.approx(2048 * b, rel=1e-12)
    e = Execution(gpus=16, dp=8, cp=2, ep=8, micro_batch=1, global_batch=8, capacity_factor=1.25)
    assert tokens_per_local_expert(spec, e) == pytest.approx(4096 / 2 * 8 * 1.25 * 8 / 128, rel=1e-12)
    assert tokens_per_local_expert(preset("llama3-8b"), Execution(gpus=1, micro_batch=1, global_batch=1)) == math.inf


def test_permutation_bytes_by_hand():
    """Qwen3-30B-A3B on EP 8, MBS 1 (bf16, every layer MoE): the permute reads 4096 tokens and writes 8 rows each,
    the unpermute the reverse, the two sorts of the 16 local experts read and write 8 x 4096 rows each:
    (2 x 4096 x 9 + 4 x 8 x 4096) x 2048 x 2 bytes. EP 128 leaves one expert per rank (no sorts); TP 2 with
    sequence parallelism halves the permuted tokens, the sorts run on the gathered 4096; a dense model has none."""
    spec = preset("qwen3-30b-a3b")
    assert (spec.top_k, spec.hidden, spec.experts, spec.moe_layers) == (8, 2048, 128, spec.layers)
    e = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8)
    assert permutation_bytes(spec, e) == pytest.approx((2 * 4096 * 9 + 4 * 8 * 4096) * 2048 * 2, rel=1e-12)
    e = Execution(gpus=128, dp=128, ep=128, micro_batch=1, global_batch=128)
    assert permutation_bytes(spec, e) == pytest.approx(2 * 4096 * 9 * 2048 * 2, rel=1e-12)
    e = Execution(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True)
    assert permutation_bytes(spec, e) == pytest.approx((2 * 2048 * 9 + 4 * 8 * 4096) * 2048 * 2, rel=1e-12)
    assert permutation_bytes(preset("llama3-8b"), Execution(gpus=1, micro_batch=1, global_batch=1)) == 0.0


@pytest.mark.parametrize("experts, top_k, ep", [(8, 2, 4), (8, 3, 2), (12, 4, 6), (8, 2, 8)])
def test_ranks_per_token_by_enumeration(experts, top_k, ep):
    """Every ``top_k`` subset of the experts equally likely (forced balance): the mean count of distinct ranks
    (expert i on rank i // (experts / ep)) over all subsets, enumerated."""
    import itertools

    spec = replace(MOE, experts=experts, top_k=top_k)
    local = experts // ep
    subsets = list(itertools.combinations(range(experts), top_k))
    mean = sum(len({x // local for x in chosen}) for chosen in subsets) / len(subsets)
    e = Execution(gpus=ep, dp=ep, ep=ep, micro_batch=1, global_batch=ep)
    assert ep_ranks_per_token(spec, e) == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("ep, dispatch, combine", [(32, 484.22e9, 464.54e9), (8, 545.71e9, 568.94e9),
                                                   (12, (545.71e9 + 523.48e9) / 2, (568.94e9 + 521.55e9) / 2),
                                                   (64, 479.02e9, 447.89e9)])
def test_hybridep_dispatch_and_combine_by_hand(ep, dispatch, combine):
    """Qwen3-235B-A22B (hidden 4096, 128 experts, top 8, every layer MoE), MBS 1 on one 72-GPU NVLink domain of
    900 GB/s: a rank receives 4096 tokens x D rows of 8 KB, D = ep (1 - prod_i (128 - L - i) / (128 - i)), once at
    DeepEP's GB200 dispatch rate and once at its combine rate (32 SMs; 12 ranks halfway between the 8- and 16-rank
    figures, 64 at the 36-rank ones), less the measured calls' copy of those bytes (read and written at GB200's
    HBM rate, 8 TB/s x 0.8 in the preset), forward, and as much backward; the alltoall dispatcher's two
    all-to-alls of 4096 x 8 rows ((ep - 1) / ep of them leave) differ."""
    spec = preset("qwen3-235b-a22b")
    assert (spec.hidden, spec.experts, spec.top_k, spec.moe_layers) == (4096, 128, 8, spec.layers)
    local = 128 // ep
    d = ep * (1 - math.prod((128 - local - i) / (128 - i) for i in range(8)))
    nbytes = 4096 * d * 4096 * 2
    cluster = load_cluster("gb200-nvl72").for_gpus(ep)
    e = Execution(gpus=ep, dp=ep, ep=ep, micro_batch=1, global_batch=ep, ep_dispatcher="hybridep")
    fwd, bwd = ep_all_to_all_s(spec, e, cluster)
    copy = 2 * nbytes / (8e12 * 0.8)
    assert (cluster.device.hbm_bytes_per_s, cluster.device.memory_efficiency) == (8e12, 0.8)
    assert fwd == pytest.approx(nbytes / dispatch + nbytes / combine - 2 * copy, rel=1e-9)
    assert bwd == pytest.approx(fwd, rel=1e-12)
    plain = ep_all_to_all_s(spec, replace(e, ep_dispatcher="alltoall"), cluster)[0]
    assert plain == pytest.approx(2 * ((ep - 1) / ep * 4096 * 8 * 4096 * 2 / 900e9 + 1e-6), rel=1e-9)


def test_hybridep_scales_with_the_domains_bandwidth_and_leaves_cross_node_groups_to_the_all_to_all(llm_cluster):
    """EP 8 of 8 experts, top 2 (D = 8 (1 - C(7, 2) / C(8, 2)) = 2 ranks a token): on a 450 GB/s NVLink domain
    HybridEP's measured time less its copy at the GPU's HBM rate takes twice as long as on GB200's 900 GB/s; a group
    that spans nodes, or nodes of one GPU each, is priced as the all-to-all dispatcher's (HybridEP's measured rates
    are one NVLink domain's)."""
    e = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, ep_dispatcher="hybridep")
    nbytes = MOE.seq_len * 2 * MOE.hidden * 2
    one_node = llm_cluster(gpus_per_node=8, nodes=1, peak_flops_per_s=PEAK, nvlink_bytes_per_s=450e9)
    fwd, _ = ep_all_to_all_s(MOE, e, one_node)
    copy = 2 * nbytes / (one_node.device.hbm_bytes_per_s * one_node.device.memory_efficiency)
    assert fwd == pytest.approx(2 * (nbytes / 545.71e9 + nbytes / 568.94e9 - 2 * copy), rel=1e-9)
    spread = llm_cluster(gpus_per_node=4, nodes=2, peak_flops_per_s=PEAK, nvlink_bytes_per_s=450e9,
                         network_bytes_per_s=25e9)
    assert ep_all_to_all_s(MOE, e, spread) == ep_all_to_all_s(MOE, replace(e, ep_dispatcher="alltoall"), spread)
    single = llm_cluster(gpus_per_node=1, nodes=8, peak_flops_per_s=PEAK, network_bytes_per_s=25e9)
    assert ep_all_to_all_s(MOE, e, single) == ep_all_to_all_s(MOE, replace(e, ep_dispatcher="alltoall"), single)


@pytest.mark.parametrize("ep", [2, 4])
def test_hybridep_below_its_measured_8_ranks_is_priced_as_the_all_to_all(ep, llm_cluster):
    """HybridEP runs on 2 to 7 ranks of one NVLink domain but DeepEP publishes no rate there: the dispatch and
    combine of an EP group of ``ep`` ranks inside one node are the all-to-all's, two ring all-to-alls of the
    rank's 4096 x top 2 rows of 2 KB ((ep - 1) / ep of them leave) each way at 450 GB/s; the rate function itself
    refuses such a count in one line."""
    e = Execution(gpus=ep, dp=ep, ep=ep, micro_batch=1, global_batch=ep, ep_dispatcher="hybridep")
    node = llm_cluster(gpus_per_node=8, nodes=1, peak_flops_per_s=PEAK, nvlink_bytes_per_s=450e9)
    assert not hybridep_priced(e, node)
    latency = node.dims[0].latency_s
    one = (ep - 1) / ep * MOE.seq_len * 2 * MOE.hidden * 2 / 450e9 + latency
    assert ep_all_to_all_s(MOE, e, node)[0] == pytest.approx(2 * one, rel=1e-9)
    with pytest.raises(ConfigError, match=f"hybridep ranks: got {ep};.*8 ranks") as info:
        hybridep_bytes_per_s(ep, 900e9)
    assert "\n" not in str(info.value)


def test_hybridep_permutation_bytes_by_hand():
    """Qwen3-30B-A3B on EP 8, MBS 1, HybridEP: the permute reads the D x 4096 rows received and writes 8 x 4096
    expert rows, the unpermute the reverse, 2 x 4096 (D + 8) rows of 4 KB; no source permute, no sorts."""
    spec = preset("qwen3-30b-a3b")
    e = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, ep_dispatcher="hybridep")
    d = 8 * (1 - math.prod((112 - i) / (128 - i) for i in range(8)))
    assert permutation_bytes(spec, e) == pytest.approx(2 * 4096 * (d + 8) * 2048 * 2, rel=1e-12)


def test_permutations_are_charged_at_hbm_rate_forward_and_backward(llm_cluster):
    """8 experts on 8 ranks: EP 4 keeps 2 local experts and sorts their rows, EP 8 one (no sort); everything else
    a rank computes is the same, so the compute differs by the two sorts' 4 x top_k x b s x h x 2 bytes per
    layer, forward and backward, over the HBM rate."""
    hbm, b, m = 2e12, 2, 3
    cluster = llm_cluster(gpus_per_node=8, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, hbm_bytes_per_s=hbm)
    rate = hbm * cluster.device.memory_efficiency
    runs = {ep: llm_step(MOE, Execution(gpus=8, dp=8, ep=ep, micro_batch=b, global_batch=8 * b * m), cluster)
            for ep in (4, 8)}
    sorts = 4 * MOE.top_k * b * MOE.seq_len * MOE.hidden * 2
    assert runs[4].compute_s - runs[8].compute_s == pytest.approx(m * MOE.layers * 2 * sorts / rate, rel=1e-9)


def test_routed_expert_gemms_run_at_their_own_token_count(llm_cluster):
    """With ``half_tokens`` H the dense GEMMs (and the core and logits) run at ``t / (t + H)`` of the curve for
    ``t = b s`` tokens, the routed experts' grouped GEMMs for their own ``b s top_k ep / experts`` tokens: EP 2,
    micro-batch 2, 8 experts top-2 gives 2048 dense and 1024 expert tokens. The routed part, by hand, is
    ``m l 3 x 3 x 2 b s h top_k f / (P e)`` (forward + twice it backward), and every other kernel is
    compute-bound at the dense point, so the run with H is the run without it, its dense part slowed by
    ``e0 / eD`` and its routed part by ``e0 / eE``."""
    m, b, big_h = 2, 2, 1024.0
    base = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    curved = base.with_gemm_efficiency(GemmEfficiency(peak_fraction=EFF, half_width=0.0, half_tokens=big_h))
    e = Execution(gpus=4, dp=4, ep=2, micro_batch=b, global_batch=4 * b * m)
    dense_tokens, expert_tokens = b * MOE.seq_len, b * MOE.seq_len * MOE.top_k * 2 / MOE.experts
    assert (dense_tokens, expert_tokens) == (2048, 1024)
    e_dense = EFF * dense_tokens / (dense_tokens + big_h)
    e_expert = EFF * expert_tokens / (expert_tokens + big_h)
    routed = m * MOE.layers * 3 * (3 * 2 * b * MOE.seq_len * MOE.hidden * MOE.top_k * int(MOE.ffn_hidden)) / (PEAK * EFF)
    flat = llm_step(MOE, e, base).compute_s
    expected = (flat - routed) * EFF / e_dense + routed * EFF / e_expert
    assert llm_step(MOE, e, curved).compute_s == pytest.approx(expected, rel=1e-9)


def test_grouped_gemm_issue_by_hand():
    """Qwen3-30B-A3B (every layer MoE) on EP 8 keeps 128 / 8 = 16 local experts: 2 x 16 calls forward (fc1, fc2)
    and 4 x 16 backward (their data and weight gradients), each ``call_s``; EP 128 keeps one expert, a dense
    model none. In fp8 the two forward inputs and the two backward gradients are quantized per expert split:
    current scaling 3 kernels a split (amax, scale, cast): 32 + 2 x 3 x 16 = 128 forward, 64 + 96 = 160 backward;
    MXFP8 one a split plus two scale swizzles per grouped call: 32 + 32 + 2 x 2 = 68 and 64 + 32 + 4 x 2 = 104;
    delayed scaling one fused cast of all splits: 32 + 2 = 34 and 64 + 2 = 66."""
    spec, call = preset("qwen3-30b-a3b"), 40e-6
    e = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, moe_router_graph=True)
    # plus the router's graph: its input's copy and replay forward, three gradients' copies and replay backward
    assert grouped_gemm_issue_s(spec, e, call) == pytest.approx((34 * call, 68 * call), rel=1e-12)
    for scaling, launches in (("current", (128, 160)), ("mxfp8", (68, 104)), ("delayed", (34, 66))):
        e8 = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, fp8_scaling=scaling, moe_router_graph=True)
        assert grouped_gemm_launches(spec, e8, True) == launches
        assert grouped_gemm_launches(spec, e8, False) == (32, 64)
        # plus the fp8 row padding's 3 kernels each way (16 local experts, one kernel a call)
        assert grouped_gemm_issue_s(spec, e8, call, fp8=True) == pytest.approx(
            ((launches[0] + 2 + 3) * call, (launches[1] + 4 + 3) * call), rel=1e-12)
    e = Execution(gpus=128, dp=128, ep=128, micro_batch=1, global_batch=128, moe_router_graph=True)
    assert grouped_gemm_issue_s(spec, e, call) == pytest.approx((4 * call, 8 * call), rel=1e-12)
    assert grouped_gemm_launches(spec, e, True) == (2 + 6, 4 + 6)  # current scaling, one expert
    assert grouped_gemm_issue_s(preset("llama3-8b"), Execution(gpus=1, micro_batch=1, global_batch=1), call) == (0, 0)


def test_fp8_padding_bytes_and_launches_by_hand():
    """Qwen3-30B-A3B (every layer MoE, h 2048, top-8 of 128) on EP 8, MBS 1, seq 4096, fp8 with the alltoall
    dispatcher, dropless: the rank's 16 experts take 8 x 4096 rows; the hidden states' pad and the fc2 output's
    unpad each read and write them, 4 x 32768 x 2048 x 2 bytes forward; one padding kernel per call (up to 64
    experts a kernel): hidden, probabilities, output forward, their gradients backward. TP 2 with sequence
    parallelism: the experts still take the gathered 4096 tokens' rows. EP 1 keeps 128 experts, two kernels a
    call. Nothing in bf16, with HybridEP (its permute pads), for a dense model, nor padded to a capacity whose
    rows are aligned: C 1.25 gives ceil(4096 x 8 / 128 x 1.25) x 8 = 2560 rows an expert (a multiple of 32), C 1.1
    gives 282 x 8 = 2256 (of 16, not of 32: only MXFP8 pads)."""
    spec = preset("qwen3-30b-a3b")
    assert (spec.top_k, spec.hidden, spec.experts, spec.seq_len, spec.moe_layers) == (8, 2048, 128, 4096, spec.layers)
    ep8 = dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8)
    copies = 4 * 8 * 4096 * 2048 * 2
    for scaling in ("current", "mxfp8", "delayed"):
        e = Execution(**ep8, fp8_scaling=scaling)
        assert fp8_padding_bytes(spec, e, True) == pytest.approx(copies, rel=1e-12)
        assert fp8_padding_launches(spec, e, True) == (3, 3)
        assert fp8_padding_bytes(spec, e, False) == 0.0 and fp8_padding_launches(spec, e, False) == (0, 0)
        hybrid = Execution(**ep8, fp8_scaling=scaling, ep_dispatcher="hybridep")
        assert fp8_padding_bytes(spec, hybrid, True) == 0.0 and fp8_padding_launches(spec, hybrid, True) == (0, 0)
    e = Execution(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True)
    assert fp8_padding_bytes(spec, e, True) == pytest.approx(copies, rel=1e-12)
    e = Execution(gpus=8, dp=8, micro_batch=2, global_batch=16)
    assert fp8_padding_bytes(spec, e, True) == pytest.approx(2 * copies, rel=1e-12)
    assert fp8_padding_launches(spec, e, True) == (6, 6)
    for scaling, pads in (("current", False), ("mxfp8", True)):
        assert not fp8_padding_applies(spec, Execution(**ep8, capacity_factor=1.25, fp8_scaling=scaling), True)
        assert fp8_padding_applies(spec, Execution(**ep8, capacity_factor=1.1, fp8_scaling=scaling), True) == pads
    assert fp8_padding_bytes(spec, Execution(**ep8, capacity_factor=1.1, fp8_scaling="mxfp8"), True) == (
        pytest.approx(copies * 1.1, rel=1e-12))
    dense = Execution(gpus=1, micro_batch=1, global_batch=1)
    assert fp8_padding_bytes(preset("llama3-8b"), dense, True) == 0.0
    assert fp8_padding_launches(preset("llama3-8b"), dense, True) == (0, 0)


@pytest.mark.parametrize("mode", ["fast", "ranks"])
def test_fp8_padding_is_charged_at_hbm_rate_forward_and_backward(mode, monkeypatch):
    """Qwen3-30B-A3B on one H100 node (EP 8, MBS 1, 2 micro-batches, fp8, host_call_time 0): the padding adds its
    4 x 8 x 4096 x 2048 x 2 bytes at the HBM rate to each of the 48 layers' forward and backward of each
    micro-batch, against the same run with the padding priced at nothing, in the closed form and in the per-rank
    engine alike."""
    import mcdla.sim.llm as llm

    def h100() -> Cluster:  # a fresh cluster each time: its memo holds the model's figures
        return cluster_from_dict({"format": "mcdla-system/1", "extends": "dgx-h100", "name": "h100",
                                  "node": {"gpu": {"host_call_time": 0.0}}}, "test").for_gpus(8)
    spec, cluster = preset("qwen3-30b-a3b"), h100()
    e = Execution(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=16)
    padded = llm_step(spec, e, cluster, precision="fp8", mode=mode).iteration_s
    rate = cluster.device.hbm_bytes_per_s * cluster.device.memory_efficiency
    monkeypatch.setattr(llm, "fp8_padding_bytes", lambda *args: 0.0)
    plain = llm_step(spec, e, h100(), precision="fp8", mode=mode).iteration_s
    assert padded - plain == pytest.approx(2 * 48 * 2 * 4 * 8 * 4096 * 2048 * 2 / rate, rel=1e-6)


def test_router_and_preprocess_launches_by_hand():
    """Outside a CUDA graph (Megatron-LM 0d8e0714, Transformer Engine 2.9) a MoE layer's host issues forward: the
    pre-MLP RMSNorm (1); the router's gating GEMM, the forced balance's clone and normal_, the fused top-k, the
    fused aux-loss scores, the routing map's sum, the fused aux loss, the tracker's division and add (9); the
    alltoall dispatcher's token counts with EP (sum, split sum, all-gather, contiguous slice, three sums: 7; the
    sum alone without EP and TP) and the fused permute (three row-id passes and the permute: 4). Backward: the
    norm's kernel, its finalize and the sum of its output's two gradients (3); the aux-loss scaler's ones_like and
    product, three fused backwards, the logits' gradient sum, two gating GEMMs (8); the permute's gradient (1).
    HybridEP's flex preprocess is views at TP 1. In a graph: the input's copy into the graph's buffer and the replay
    forward, the copies of the three outputs' gradients and the replay backward."""
    ep8 = dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8)
    assert router_preprocess_launches(Execution(**ep8)) == (1 + 9 + 7 + 4, 3 + 8 + 1)
    assert router_preprocess_launches(Execution(gpus=1, micro_batch=1, global_batch=1)) == (1 + 9 + 1 + 4, 3 + 8 + 1)
    assert router_preprocess_launches(Execution(**ep8, ep_dispatcher="hybridep")) == (1 + 9, 3 + 8)
    assert router_preprocess_launches(Execution(**ep8, moe_router_graph=True)) == (1 + 1, 3 + 1)
    spec, call = preset("qwen3-30b-a3b"), 40e-6
    assert grouped_gemm_issue_s(spec, Execution(**ep8), call) == pytest.approx(((32 + 21) * call, (64 + 12) * call),
                                                                               rel=1e-12)
    with pytest.raises(ConfigError, match="execution.moe_router_graph: got"):
        Execution(**ep8, moe_router_graph="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("call_s", [5e-6, 15e-6, 50e-6])
def test_issue_time_binds_only_past_the_expert_gemms(call_s, llm_cluster):
    """One rank holds all 8 experts (EP 1). The routed GEMMs of a layer take ``g = 3 x 2 b s h top_k f / (P e)``
    forward and ``2 g`` backward on a flat curve; the host issues ``2 x 8`` calls forward and ``4 x 8`` backward of
    ``call_s`` each. The run with ``host_call_s`` computes ``m l (max(0, 16 c - g) + max(0, 32 c - 2 g))`` longer
    than the run without it: nothing at 5 us (80 us of calls against g = 172 us), part of the calls at 15 us,
    most of them at 50 us."""
    m, b = 3, 1
    plain = llm_cluster(gpus_per_node=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    hosted = llm_cluster(gpus_per_node=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF, host_call_s=call_s)
    assert hosted.device.host_call_s == call_s and hosted.gemm_efficiency.backward_ratio == 2.0
    e = Execution(gpus=1, micro_batch=b, global_batch=b * m, moe_router_graph=True)
    g = 3 * 2 * b * MOE.seq_len * MOE.hidden * MOE.top_k * int(MOE.ffn_hidden) / (PEAK * EFF)
    # the source-side permute (read t h, write top_k t h) also hides the host's launches
    p = (1 + MOE.top_k) * b * MOE.seq_len * MOE.hidden * 2 / (hosted.device.hbm_bytes_per_s
                                                              * hosted.device.memory_efficiency)
    local = MOE.experts
    wait = max(0.0, (2 * local + 2) * call_s - g - p) + max(0.0, (4 * local + 4) * call_s - 2 * g - p)
    assert (wait == 0.0) == (call_s == 5e-6)
    extra = llm_step(MOE, e, hosted).compute_s - llm_step(MOE, e, plain).compute_s
    assert extra == pytest.approx(m * MOE.layers * wait, rel=1e-9, abs=1e-15)
    dense = TransformerSpec(name="dense", layers=2, hidden=1024, heads=16, vocab=1, seq_len=1024, ffn_hidden=2048,
                            mlp="swiglu", dropout=False, bias=False, position="rope", tied_embeddings=False)
    assert llm_step(dense, e, hosted) == llm_step(dense, e, plain)


def test_host_call_time_of_the_presets_and_its_bounds(llm_cluster):
    """The four systems of the Megatron-Bridge MoE rows carry one fitted figure (its value is the grid minimum,
    tests/report/test_llm_validation_sourced.py, slow); a preset without the figure charges nothing; a time past
    the latency bounds is a one-line error."""
    figures = {load_cluster(name).device.host_call_s for name in ("dgx-h100", "b200", "gb200-nvl72", "gb300-nvl72")}
    assert len(figures) == 1 and 0.0 < figures.pop() < 1e-3
    assert load_cluster("dgx-a100").device.host_call_s == 0.0
    with pytest.raises(HardwareError, match="host_call_time"):
        llm_cluster(host_call_s=2.0)


@pytest.mark.parametrize("tp", [1, 2])
def test_routed_expert_gemms_run_at_their_narrowest_width(tp, llm_cluster):
    """With ``half_width`` W an expert narrower than the hidden size (f = 512 < h = 1024) runs its grouped GEMMs
    at ``f / tp`` on the curve, the dense GEMMs (and the core and logits) at ``h / tp``: the run with W is the run
    without it, its dense part slowed by ``e0 / eD`` and its routed part (``m l 3 x 3 x 2 b s h top_k f / (tp P
    e0)`` by hand) by ``e0 / eE``. An expert wider than the hidden size keeps ``h / tp`` (no change)."""
    narrow = TransformerSpec(name="narrow", layers=2, hidden=1024, heads=16, vocab=1, seq_len=1024,
                             ffn_hidden=512, mlp="swiglu", experts=8, top_k=2, dropout=False, bias=False,
                             position="rope", tied_embeddings=False)
    m, b, w = 2, 1, 256.0
    base = llm_cluster(gpus_per_node=2, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    curved = base.with_gemm_efficiency(GemmEfficiency(peak_fraction=EFF, half_width=w))
    flat_curve = base.with_gemm_efficiency(GemmEfficiency(peak_fraction=EFF, half_width=0.0))
    e = Execution(gpus=8, tp=tp, dp=8 // tp, ep=2, micro_batch=b, global_batch=8 // tp * b * m,
                  sequence_parallel=tp > 1)
    h, f = narrow.hidden / tp, int(narrow.ffn_hidden) / tp
    e_dense, e_expert = EFF * h / (h + w), EFF * f / (f + w)
    routed = (m * narrow.layers * 3 * (3 * 2 * b * narrow.seq_len * narrow.hidden * narrow.top_k
                                       * int(narrow.ffn_hidden)) / (tp * PEAK * EFF))
    flat = llm_step(narrow, e, flat_curve).compute_s
    expected = (flat - routed) * EFF / e_dense + routed * EFF / e_expert
    assert llm_step(narrow, e, curved).compute_s == pytest.approx(expected, rel=1e-9)
    wide = (llm_step(MOE, e, curved).compute_s, llm_step(MOE, e, flat_curve).compute_s)  # f = 2048 > h
    assert wide[0] == pytest.approx(wide[1] * EFF / e_dense, rel=1e-9)


def test_expert_weights_and_sharded_state_per_rank(llm_cluster):
    """A rank holds 1/ep of the routed experts and all the rest; with ZeRO-1 the dense state is sharded over
    dp and the experts' over dp/ep, so each rank keeps 12 bytes x all parameters / dp of optimizer state."""
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    step = llm_step(MOE, Execution(gpus=4, dp=4, ep=4, zero=1, micro_batch=1, global_batch=4), cluster)
    total = MOE.params()
    assert step.weight_bytes == pytest.approx(2 * (total - EXPERT_PARAMS + EXPERT_PARAMS / 4), rel=1e-12)
    assert step.optimizer_bytes == pytest.approx(12 * total / 4, rel=1e-12)


def test_expert_gradients_reduce_over_dp_cp_over_ep(llm_cluster):
    """dp 4, ep 2 on 4 nodes: the dense gradients all-reduce over 4 ranks, the experts' (half of them per rank)
    over the 2 ranks holding the same experts: 2 (3/4) 2 (P - E) / B + 2 (1/2) 2 (E/2) / B."""
    bw = 10e9
    cluster = llm_cluster(gpus_per_node=1, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          network_bytes_per_s=bw)
    step = llm_step(MOE, Execution(gpus=4, dp=4, ep=2, micro_batch=1, global_batch=4), cluster)
    dense = MOE.params() - EXPERT_PARAMS
    expected = 2 * 3 / 4 * 2 * dense / bw + 2 * 1 / 2 * 2 * (EXPERT_PARAMS / 2) / bw
    assert step.dp_comm_s == pytest.approx(expected, rel=1e-9)


def test_per_rank_schedule_agrees_with_the_closed_form(llm_cluster):
    """The per-rank engine charges the same all-to-alls: mode=ranks gives the fast path's iteration."""
    cluster = llm_cluster(gpus_per_node=2, nodes=4, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF,
                          nvlink_bytes_per_s=100e9, network_bytes_per_s=25e9)
    e = Execution(gpus=8, pp=2, dp=4, ep=4, micro_batch=1, global_batch=8)
    fast, ranks = llm_step(MOE, e, cluster), llm_step(MOE, e, cluster, mode="ranks")
    assert fast.ep_comm_s > 0
    assert ranks.iteration_s == pytest.approx(fast.iteration_s, rel=1e-9)


@pytest.mark.parametrize("spec, kwargs, field", [
    (MOE, dict(gpus=6, dp=6, ep=3, global_batch=6), "ep"),  # 3 does not divide 8 experts
    (preset("megatron-1.7b"), dict(gpus=2, dp=2, ep=2, global_batch=2), "ep"),  # a dense model
])
def test_ep_that_does_not_split_the_experts_is_refused(spec, kwargs, field, llm_cluster):
    """An EP degree must divide the model's experts: a one-line error naming execution.ep."""
    with pytest.raises(ConfigError, match=rf"execution\.{field}: got"):
        llm_step(spec, Execution(**kwargs), llm_cluster(gpus_per_node=1, nodes=8))


@pytest.mark.parametrize("kwargs, field", [
    (dict(gpus=4, dp=4, ep=3, global_batch=4), "ep"),
    (dict(gpus=4, tp=2, dp=2, ep=2, global_batch=2), "sequence_parallel"),
    (dict(gpus=4, dp=4, ep=2, global_batch=4, capacity_factor=0.0), "capacity_factor"),
    (dict(gpus=4, cp=4, cp_comm="ring"), "cp_comm"),
    (dict(gpus=4, dp=4, ep=2, global_batch=4, ep_dispatcher="deepep"), "ep_dispatcher"),
])
def test_bad_ep_fields_are_one_line_errors(kwargs, field):
    """EP not dividing dp*cp, EP with TP but no SP, a capacity factor <= 0 and an unknown cp_comm are refused."""
    with pytest.raises(ConfigError, match=rf"execution\.{field}: got"):
        Execution(**kwargs)


@pytest.mark.parametrize("name, example", [("mixtral-8x7b", "hf-mixtral-8x7b"), ("deepseek-v3-671b", "hf-deepseek-v3")])
def test_moe_presets_match_their_config_json(name, example):
    """The presets are the shipped config.json read by the HF mapping (a second path): same shape and counts."""
    spec, read = preset(name), load_hf_config(EXAMPLES / f"{example}.json")
    assert spec.params() == read.params() and spec.active_params() == read.active_params()
    assert (spec.experts, spec.top_k, spec.shared_experts, spec.mla) == (read.experts, read.top_k,
                                                                          read.shared_experts, read.mla)



@pytest.mark.parametrize(("pp", "vp", "m", "alone"), [(1, 1, 4, 1), (1, 1, 1, 1), (2, 3, 8, 2 * 2 + 1),
                                                      (2, 4, 4, 3 * 2 + 1), (2, 2, 2, 3)])
def test_a2a_overlap_hides_up_to_the_other_micro_batchs_compute_in_combined_steps(pp, vp, m, alone, llm_cluster):
    """moe_a2a_overlap: per combined step the forward's all-to-alls hide behind the other micro-batch's backward
    compute and the backward's behind its forward (min of the two), over the combined share of the last stage's
    m v passes: without pipelining all but the first forward and the last backward, interleaved all but the
    (v - 1) pp + 1 warm-up forwards (and as many cool-down backwards); by hand from the stage costs without it.
    Off, nothing changes."""
    cluster = llm_cluster(nodes=4, gpus_per_node=4, network_bytes_per_s=25e9)
    dp = 16 // pp
    e = Execution(gpus=16, dp=dp, pp=pp, virtual_stages=vp, ep=min(dp, 8), micro_batch=1, global_batch=m * dp,
                  pp_comm_overlap=vp > 1)
    spec = replace(MOE, layers=2 * pp * vp)
    off = stage_costs(spec, e, cluster)
    on = stage_costs(spec, replace(e, moe_a2a_overlap=True), cluster)
    share = max(0, m * vp - alone) / (m * vp)
    assert off.layer_ep_fwd_s > 0 and off.layer_ep_hidden_fwd_s == off.layer_ep_hidden_bwd_s == 0.0
    hide_f = share * min(off.layer_ep_fwd_s, off.layer_bwd_s + off.layer_recompute_s)
    hide_b = share * min(off.layer_ep_bwd_s, off.layer_fwd_s)
    assert on.layer_ep_hidden_fwd_s == pytest.approx(hide_f, rel=1e-12, abs=0.0)
    assert on.layer_ep_hidden_bwd_s == pytest.approx(hide_b, rel=1e-12, abs=0.0)
    assert on.layer_ep_fwd_s == pytest.approx(off.layer_ep_fwd_s - hide_f, rel=1e-12, abs=1e-18)
    assert on.layer_ep_bwd_s == pytest.approx(off.layer_ep_bwd_s - hide_b, rel=1e-12, abs=1e-18)
    step_off, step_on = llm_step(spec, e, cluster), llm_step(spec, replace(e, moe_a2a_overlap=True), cluster)
    assert step_on.iteration_s <= step_off.iteration_s
    assert step_on.compute_s == pytest.approx(step_off.compute_s, rel=1e-12)


def test_a2a_overlap_hides_all_when_compute_is_long_and_only_the_compute_when_short(llm_cluster):
    """Both regimes of min(EP time, the other micro-batch's compute): on a fast network the whole all-to-all
    hides in the combined steps; on a slow one the hidden part equals the compute it hides behind."""
    e = Execution(gpus=16, dp=16, ep=8, micro_batch=1, global_batch=16 * 5, moe_a2a_overlap=True)
    share = 4 / 5  # m = 5, the first forward and the last backward alone
    fast = stage_costs(MOE, e, llm_cluster(nodes=4, gpus_per_node=4, network_bytes_per_s=1e15))
    whole = stage_costs(MOE, replace(e, moe_a2a_overlap=False),
                        llm_cluster(nodes=4, gpus_per_node=4, network_bytes_per_s=1e15))
    assert fast.layer_ep_hidden_fwd_s == pytest.approx(share * whole.layer_ep_fwd_s, rel=1e-12)
    slow = stage_costs(MOE, e, llm_cluster(nodes=4, gpus_per_node=4, network_bytes_per_s=1e6))
    assert slow.layer_ep_hidden_fwd_s == pytest.approx(share * (slow.layer_bwd_s + slow.layer_recompute_s), rel=1e-12)
    assert slow.layer_ep_hidden_bwd_s == pytest.approx(share * slow.layer_fwd_s, rel=1e-12)


@pytest.mark.parametrize(("fields", "needle"), [
    (dict(gpus=8, dp=8, ep=1), "ep=1"),
    (dict(gpus=8, dp=8, ep=8, recompute="full"), "recompute=full"),
    (dict(gpus=16, dp=8, pp=2, ep=8), "virtual_stages=1"),
])
def test_a2a_overlap_refuses_what_megatron_core_refuses(fields, needle):
    """transformer_config.py's checks for overlap_moe_expert_parallel_comm: EP > 1, no full recompute, a virtual
    pipeline with PP > 1; one line naming the field."""
    with pytest.raises(ConfigError, match=f"execution.moe_a2a_overlap: got true with .*{needle}") as err:
        Execution(micro_batch=1, global_batch=64, moe_a2a_overlap=True, **fields)
    assert "\n" not in str(err.value)


def test_a2a_overlap_reads_from_a_file_and_rejects_a_non_boolean():
    from mcdla.workload.execution import execution_from_dict
    e = execution_from_dict({"gpus": 8, "dp": 8, "ep": 8, "global_batch": 8, "moe_a2a_overlap": True})
    assert e.moe_a2a_overlap is True
    with pytest.raises(ConfigError, match="moe_a2a_overlap"):
        execution_from_dict({"gpus": 8, "dp": 8, "ep": 8, "global_batch": 8, "moe_a2a_overlap": "often"})
