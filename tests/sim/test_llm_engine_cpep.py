"""Engine lowering of context and expert parallelism (sim/llm_lower_cpep.py): the engine against the analytical
model where no link is shared, the lowered ops against groups and bytes written out by hand, and two contention
cases computed by hand (max-min on one network rail)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mcdla.hardware.cluster import load_cluster
from mcdla.sim.ir import CollectiveOp, Recv, Send
from mcdla.sim.ir_engine import execute
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs
from mcdla.sim.llm_floor import link_floors
from mcdla.sim.llm_lower import engine_step, lower
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

_NO_SHARED_LINK = [
    # CP ring inside a node (NVLink), across two nodes, and rings of 8 that leave the node at two of their hops
    ("gpt3-175b", dict(gpus=8, tp=4, cp=2, micro_batch=1, global_batch=2)),
    ("gpt3-175b", dict(gpus=16, tp=8, cp=2, micro_batch=1, global_batch=2)),
    ("gpt3-175b", dict(gpus=16, tp=2, cp=8, micro_batch=1, global_batch=2, recompute="selective")),
    ("gpt3-175b", dict(gpus=16, tp=4, cp=2, pp=2, micro_batch=1, global_batch=4, virtual_stages=2)),
    ("gpt3-175b", dict(gpus=32, tp=2, cp=8, pp=2, micro_batch=1, global_batch=2)),
    # CP all-gather inside a node and across nodes, with full recompute and the gradient reduction over dp x cp
    ("gpt3-175b", dict(gpus=8, tp=2, cp=4, micro_batch=1, global_batch=2, cp_comm="all_gather")),
    ("gpt3-175b", dict(gpus=32, tp=4, cp=2, dp=2, pp=2, micro_batch=1, global_batch=8, cp_comm="all_gather",
                       recompute="full")),
    # EP inside a node, across nodes (stride tp = 2), over two replicas that stand for the node's others (with
    # CP too: EP4 over cp x dp), with a capacity factor
    ("mixtral-8x7b", dict(gpus=8, tp=1, dp=8, ep=8, micro_batch=1, global_batch=8)),
    ("mixtral-8x7b", dict(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True)),
    ("mixtral-8x7b", dict(gpus=8, tp=1, dp=8, ep=2, micro_batch=1, global_batch=8)),
    ("mixtral-8x7b", dict(gpus=16, tp=1, cp=2, dp=8, ep=4, micro_batch=1, global_batch=8)),
    ("mixtral-8x7b", dict(gpus=16, tp=1, dp=8, pp=2, ep=4, micro_batch=1, global_batch=16, capacity_factor=1.25)),
    # CP and EP together (EP over the cp x dp ranks), full recompute; DeepSeek-V3's 58 MoE layers of 61
    ("mixtral-8x7b", dict(gpus=32, tp=2, cp=2, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True,
                          recompute="full")),
    ("deepseek-v3-671b", dict(gpus=16, tp=1, dp=16, ep=16, micro_batch=1, global_batch=16)),
    # HybridEP inside one node: its dispatch and combine beside the pass's compute, nothing on the links
    ("qwen3-30b-a3b", dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=16, ep_dispatcher="hybridep")),
    # moe_a2a_overlap: the combined steps' hidden all-to-alls, without pipelining and interleaved, and HybridEP's
    ("mixtral-8x7b", dict(gpus=8, tp=1, dp=8, ep=8, micro_batch=1, global_batch=32, moe_a2a_overlap=True)),
    ("mixtral-8x7b", dict(gpus=16, tp=1, dp=8, pp=2, virtual_stages=2, ep=4, micro_batch=1, global_batch=64,
                          moe_a2a_overlap=True)),
    ("qwen3-30b-a3b", dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=32, ep_dispatcher="hybridep",
                           moe_a2a_overlap=True)),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize(("model", "fields"), _NO_SHARED_LINK)
def test_engine_equals_the_analytical_model_for_cp_and_ep(model: str, fields: dict[str, object],
                                                          replicas: str) -> None:
    """On DGX H100 nodes with no link carrying two classes at once, the engine's iteration equals the closed form
    and the per-rank schedule to 1e-9 and reports no contention: the ring's overlap rule, the all-gathers, the
    all-to-alls and the reductions over dp x cp and dp cp / ep are the model's."""
    spec, e = preset(model), Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got = engine_step(spec, e, cluster, replicas=replicas)
    want = llm_step(spec, e, cluster)
    assert want.cp_comm_s > 0 or want.ep_comm_s > 0  # the exchange is there to be lowered
    assert got.iteration_s == pytest.approx(want.iteration_s, rel=1e-9)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster, mode="ranks").iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)


# MHA, GELU: the K/V block of a rank is 2 tensors x b (s / cp) (h / tp) elements of 2 bytes
_SMALL = TransformerSpec(name="cp", layers=2, hidden=1024, heads=16, vocab=1, seq_len=4096)


@pytest.mark.parametrize("network", [1e13, 25e9])
@pytest.mark.parametrize("across", [False, True])
def test_ring_hidden_and_exposed_inside_and_across_nodes(network: float, across: bool, llm_cluster) -> None:
    """The ring's two regimes: a send shorter than a block's attention (hidden, no CP time) and a longer one
    (exposed), on the network (CP across nodes) or on NVLink (inside one): the engine equals the closed form."""
    fabric = (dict(gpus_per_node=2, nodes=4, network_bytes_per_s=network, network_latency_s=5e-6) if across else
              dict(gpus_per_node=8, nodes=1, nvlink_bytes_per_s=network, nvlink_latency_s=5e-6))
    cluster = llm_cluster(peak_flops_per_s=300e12, gemm_peak_fraction=0.5, **fabric)
    e = Execution(gpus=8, tp=2, cp=4, micro_batch=1, global_batch=2, attention="materialized")
    want = llm_step(_SMALL, e, cluster)
    assert (want.cp_comm_s > 0) == (network < 1e12)
    got = engine_step(_SMALL, e, cluster)
    assert got.iteration_s == pytest.approx(want.iteration_s, rel=1e-9)


def test_ring_sends_each_block_to_the_next_rank_of_the_cp_group() -> None:
    """TP2 CP4: rank 0's CP group is ranks 0, 2, 4, 6 (tp fastest); it sends to 2 and receives from 6, cp - 1 = 3
    times per forward and 3 (cp - 1) per backward with selective recompute, each the K/V of the stage's 96
    layers: 2 tensors x s / cp x h / tp elements of 2 bytes per layer (MHA)."""
    spec = preset("gpt3-175b")
    e = Execution(gpus=8, tp=2, cp=4, micro_batch=1, global_batch=1, recompute="selective")
    program = next(p for p in lower(spec, e, load_cluster("dgx-h100").for_gpus(8)).programs if p.rank == 0)
    block = 96 * 2 * (2048 / 4) * (12288 / 2) * 2
    sends = [op for op in program.ops if isinstance(op, Send) and op.stream == "cp-send"]
    recvs = [op for op in program.ops if isinstance(op, Recv) and op.stream == "cp-recv"]
    assert {op.peer for op in sends} == {2} and {op.peer for op in recvs} == {6}
    assert len(sends) == len(recvs) == 3 + 9
    assert [op.nbytes for op in sends + recvs] == [pytest.approx(block, rel=1e-12)] * 24


def test_all_to_alls_run_on_the_ep_group_with_the_dispatched_tokens() -> None:
    """TP2 (SP) DP8 EP8 on 16 GPUs: rank 3's EP group is the 8 ranks tp = 2 apart holding it, 1, 3, ..., 15; per
    forward the 32 layers' dispatches and combines (64 all-to-alls) of b s / tp x top_k x h elements of 2 bytes,
    per backward 64 more."""
    spec = preset("mixtral-8x7b")
    e = Execution(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, sequence_parallel=True)
    program = next(p for p in lower(spec, e, load_cluster("dgx-h100").for_gpus(16), replicas="all").programs
                   if p.rank == 3)
    a2a = [op.collective for op in program.ops if isinstance(op, CollectiveOp) and op.collective.kind == "all-to-all"]
    assert {c.group for c in a2a} == {tuple(range(1, 16, 2))}
    one = 4096 / 2 * 2 * 4096 * 2
    assert [c.nbytes for c in a2a] == [pytest.approx(64 * one, rel=1e-12)] * 2


def test_gradient_reduction_per_parameter_group() -> None:
    """CP2 DP4 EP4 (every replica): rank 5 all-reduces its dense gradients over all 8 ranks (the dp x cp
    replicas) and its routed experts' over the dp cp / ep = 2 ranks holding the same experts, 4 apart (1, 5);
    together the rank's gradient bytes."""
    spec = preset("mixtral-8x7b")
    e = Execution(gpus=8, tp=1, cp=2, dp=4, ep=4, micro_batch=1, global_batch=4)
    program = next(p for p in lower(spec, e, load_cluster("dgx-h100").for_gpus(8), replicas="all").programs
                   if p.rank == 5)
    reduction = [op.collective for op in program.ops if isinstance(op, CollectiveOp) and op.stream == "dp"]
    assert [(c.kind, c.group) for c in reduction] == [("all-reduce", tuple(range(8))), ("all-reduce", (1, 5))]
    assert sum(c.nbytes for c in reduction) == pytest.approx(rank_traffic(spec, e).gradient_bytes, rel=1e-12)


def test_one_pipeline_simulates_whole_ep_groups_and_folds_the_rest() -> None:
    """DP8 EP2 on one node, one pipeline: the EP group of replica 0 holds replica 1, so replicas 0 and 1 run
    (ranks 0, 1) and stand for the other three pairs on the node (GPUs 2, 4, 6 mirror rank 0)."""
    e = Execution(gpus=8, tp=1, dp=8, ep=2, micro_batch=1, global_batch=8)
    lowered = lower(preset("mixtral-8x7b"), e, load_cluster("dgx-h100").for_gpus(8), replicas="fold")
    assert sorted(p.rank for p in lowered.programs) == [0, 1] and lowered.fold == 4
    assert lowered.mirrors[0] == ("gpu2", "gpu4", "gpu6")


def _one_gpu_nodes(llm_cluster, bandwidth: float):
    """Two nodes of one GPU each, joined by their network rails of ``bandwidth`` each way, no latency."""
    return llm_cluster(gpus_per_node=1, nodes=2, peak_flops_per_s=3000e12, gemm_peak_fraction=0.5,
                       network_bytes_per_s=bandwidth)


def test_all_to_all_shares_the_rail_with_the_overlapped_reduction(llm_cluster) -> None:
    """DP2 EP2 on two one-GPU nodes, one micro-batch, the reduction overlapped with the backward (dp_overlap):
    the ring all-reduce of two ranks sends its G gradient bytes once each way from the start of the backward; when
    the backward's compute ends the all-to-all's X bytes to the other rank join it on the rail. By hand
    (max-min): alone the reduction moves B c; then the two flows split B until the all-to-all is through
    (2 X / B, as X < what the reduction has left), then the reduction finishes alone."""
    B = 2e9
    spec = preset("mixtral-8x7b")
    e = Execution(gpus=2, tp=1, dp=2, ep=2, micro_batch=1, global_batch=2, dp_overlap=True)
    cluster = _one_gpu_nodes(llm_cluster, B)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    n = c.layers_per_stage
    grads = t.gradient_bytes - 2 * n * spec.experts / 2 * spec.ffn_matrices * spec.hidden * spec.ffn_hidden  # dense
    x_fwd = x_bwd = 2 * n * t.all_to_all_bytes / 2  # 64 all-to-alls, half of each buffer to the other rank
    forward = n * c.layer_fwd_s + c.last_fwd_s + x_fwd / B
    compute_b = n * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s
    left = grads - B * compute_b
    assert 0 < x_bwd < left  # the reduction outlasts the backward's compute and the all-to-all
    a2a_end = forward + compute_b + 2 * x_bwd / B
    reduce_end = forward + compute_b + (left + x_bwd) / B
    lowered = lower(spec, e, cluster, replicas="all")
    run = execute(lowered.system, lowered.programs, devices=lowered.devices)
    assert run.op_end_s[(0, "x0-b0c0")] == pytest.approx(a2a_end, rel=1e-9)
    assert run.op_end_s[(0, "dp0")] == pytest.approx(reduce_end, rel=1e-9)
    got = engine_step(spec, e, cluster, replicas="all")
    assert got.iteration_s == pytest.approx(reduce_end + c.optimizer_s, rel=1e-9)
    assert got.contention_s > 0 and set(got.contention_by_class_s) == {"network"}


def test_ring_sends_share_the_rail_with_the_overlapped_reduction(llm_cluster) -> None:
    """CP2 on two one-GPU nodes, the reduction over the two CP replicas overlapped with the backward: its ring
    flow of G bytes each way runs alone during the backward's compute, then beside each of the backward's two
    ring steps (the K/V block S, then its gradient), where max-min gives each flow B / 2 while both run: a step
    takes max(attention / cp, 2 S / B) and the reduction moves S + B max(0, attention / cp - 2 S / B) in it."""
    B = 20e9
    e = Execution(gpus=2, tp=1, cp=2, micro_batch=1, global_batch=1, dp_overlap=True, attention="materialized")
    cluster = _one_gpu_nodes(llm_cluster, B)
    c, t = stage_costs(_SMALL, e, cluster), rank_traffic(_SMALL, e)
    n = c.layers_per_stage
    block = n * 2 * 2 * (4096 / 2) * 1024  # the stage's layers' K/V, 2 tensors x s / cp x h elements of 2 bytes
    attention = n * c.layer_attention_fwd_s / 2  # one ring step's attention
    forward = n * c.layer_fwd_s + c.last_fwd_s - attention + max(attention, block / B)
    compute_b = n * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s - 2 * attention
    step = max(attention, 2 * block / B)
    left = t.gradient_bytes - B * compute_b - 2 * (block + B * max(0.0, attention - 2 * block / B))
    assert left > 0 and 2 * block / B > attention  # the reduction outlasts the ring, whose sends are exposed
    got = engine_step(_SMALL, e, cluster, replicas="all")
    lowered = lower(_SMALL, e, cluster, replicas="all")
    run = execute(lowered.system, lowered.programs, devices=lowered.devices)
    assert run.op_end_s[(0, "cp1-b0c0")] == pytest.approx(forward + compute_b + 2 * step, rel=1e-9)
    assert got.iteration_s == pytest.approx(forward + compute_b + 2 * step + left / B + c.optimizer_s, rel=1e-9)
    assert got.contention_s > 0 and set(got.contention_by_class_s) == {"network"}


def test_overlapped_reduction_floor_over_the_cp_replicas_by_hand() -> None:
    """TP8 CP2 over two DGX H100 nodes, activations offloaded, the reduction overlapped with the last backward:
    the gradients g are all-reduced over the two CP replicas (a ring of two across the network: g once each way)
    while the backward's two ring steps send and receive the stage's K/V blocks S each (2 S each way), both
    through the GPU's x16 to its NIC (dgx-h100.yaml ``via_gpu_link``), where the prefetch brings the
    activations A in. So the backward needs at least (A + g + 2 S) / 51.2 GB/s there (the rail: (g + 2 S) / 50
    GB/s; the socket's DDR5: 4 A / 307.2 GB/s); what exceeds its closed-form time is exposed."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=16, tp=8, cp=2, micro_batch=1, global_batch=1, offload_activations=True, dp_overlap=True,
                  recompute="none")
    cluster = load_cluster("dgx-h100").for_gpus(16)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    act, g, n = t.stage_activation_bytes, t.gradient_bytes, c.layers_per_stage
    assert spec.kv_hidden == spec.v_width == spec.hidden  # MHA: K and V are h wide
    ring = 2 * n * (spec.seq_len / 2) * (2 * spec.hidden / 8) * 2  # 2 steps x n layers x K and V, s/cp x h/tp, 2 bytes
    busiest = max((act + g + ring) / 51.2e9, (g + ring) / 50e9, 4 * act / 307.2e9)
    backward = n * (c.layer_bwd_s + c.layer_recompute_s + c.layer_comm_bwd_s) + c.offload_bwd_s
    assert busiest > backward  # the floor binds
    assert link_floors(e, cluster, c, t).dp_exposed_s == pytest.approx(busiest - backward, rel=1e-12)


_OFFLOADED = [
    ("gpt3-175b", "dgx-h100", dict(gpus=16, tp=8, cp=2, micro_batch=1, global_batch=2, offload_activations=True)),
    ("gpt3-175b", "dgx-h100", dict(gpus=16, tp=8, cp=2, micro_batch=1, global_batch=2, offload_activations=True,
                                   offload_weights=True, cp_comm="all_gather")),
    ("mixtral-8x7b", "dgx-h100", dict(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8,
                                      offload_activations=True, offload_weights=True, sequence_parallel=True)),
    ("mixtral-8x7b", "dgx-h100", dict(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8,
                                      offload_activations=True, sequence_parallel=True, dp_overlap=True)),
    ("deepseek-v3-671b", "dgx-h100", dict(gpus=16, tp=1, dp=16, ep=16, micro_batch=1, global_batch=16,
                                          offload_activations=True, capacity_factor=1.5)),
    ("megatron-1.7b", "gh200", dict(gpus=4, tp=1, cp=4, micro_batch=1, global_batch=2, offload_activations=True,
                                    offload_weights=True)),
    ("megatron-1.7b", "dgx-h100", dict(gpus=16, tp=1, cp=2, dp=8, micro_batch=1, global_batch=8,
                                       offload_activations=True, dp_overlap=True)),
    ("megatron-1.7b", "dgx-h100", dict(gpus=16, tp=8, cp=2, micro_batch=1, global_batch=1, offload_activations=True,
                                       dp_overlap=True, recompute="none")),  # the floor's case by hand above
]


@pytest.mark.parametrize(("model", "system", "fields"), _OFFLOADED)
def test_analytical_floor_is_never_below_the_engine_with_cp_and_ep(model: str, system: str,
                                                                   fields: dict[str, object]) -> None:
    """With CP and EP traffic beside the offload (ring sends and all-to-alls through a DGX H100's x16, the
    reduction over dp x cp overlapped), the analytical path with its per-link floor is at least the engine's
    time minus 1%."""
    spec, e = preset(model), Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


_MOE = TransformerSpec(name="moe", layers=4, hidden=1024, heads=16, vocab=1000, seq_len=2048, experts=4, top_k=2,
                       dense_layers=1, dense_ffn_hidden=4096)  # three MoE layers of four: the mean layer runs 3/4 of the all-to-alls


@pytest.mark.slow  # ~10 s: 40 engine runs
@settings(max_examples=40, deadline=None,  # llm_cluster is a stateless factory
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2]),
       pp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 4]), micro_batches=st.sampled_from([1, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), cp_comm=st.sampled_from(["p2p", "all_gather"]),
       replicas=st.sampled_from(["fold", "all"]), network=st.sampled_from([2e9, 1e12]))
def test_idle_engine_equals_the_analytical_model_sweep(tp: int, cp: int, dp: int, pp: int, ep: int,
                                                       micro_batches: int, recompute: str, cp_comm: str,
                                                       replicas: str, network: float, llm_cluster) -> None:
    """Over small CP x EP x TP x PP x DP executions on two nodes of four GPUs (the ring exposed on a slow
    network, hidden on a fast one), the engine's programs with every transfer alone take the closed form's
    iteration: the lowering moves exactly what the model prices (with links shared, a pipeline send may meet an
    all-to-all at a GPU's port, which is contention, not a lowering error)."""
    assume(tp * cp * dp * pp <= 8 and (cp * dp) % ep == 0)
    e = Execution(gpus=tp * cp * dp * pp, tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, micro_batch=1,
                  global_batch=micro_batches * dp, recompute=recompute, cp_comm=cp_comm,  # type: ignore[arg-type]
                  sequence_parallel=tp > 1)
    cluster = llm_cluster(gpus_per_node=4, nodes=2, peak_flops_per_s=300e12, nvlink_bytes_per_s=100e9,
                          nvlink_latency_s=2e-6, network_bytes_per_s=network, network_latency_s=5e-6)
    got = engine_step(_MOE, e, cluster.for_gpus(e.gpus), replicas=replicas)
    assert got.idle_iteration_s == pytest.approx(llm_step(_MOE, e, cluster.for_gpus(e.gpus)).iteration_s, rel=1e-9)


def test_ring_paced_by_its_slowest_hop_on_the_engine(llm_cluster) -> None:
    """A CP ring of 4 over two GPUs per node whose NVLink hops (10 GB/s) are slower than its network hops
    (1 TB/s): on the engine the ranks at the NVLink hops pace every step, as the closed form's slowest hop."""
    cluster = llm_cluster(gpus_per_node=2, nodes=2, peak_flops_per_s=300e12, gemm_peak_fraction=0.5,
                          nvlink_bytes_per_s=10e9, nvlink_latency_s=1e-6, network_bytes_per_s=1e12,
                          network_latency_s=5e-6)
    e = Execution(gpus=4, tp=1, cp=4, micro_batch=1, global_batch=2, attention="materialized")
    want = llm_step(_SMALL, e, cluster)
    assert want.cp_comm_s > 0
    assert engine_step(_SMALL, e, cluster).iteration_s == pytest.approx(want.iteration_s, rel=1e-9)
