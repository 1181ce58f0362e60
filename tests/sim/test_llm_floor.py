"""The analytical per-link floor (sim/llm_floor.py) against the contention-aware engine: a fair-sharing case
computed by hand (a memory bus idling once the smaller direction is through), the cases where the floor had
been below the engine, and a sweep of offload mixes with MoE/EP, CP and ZeRO-3 on four clusters."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import cluster_from_dict, load_cluster
from mcdla.sim.collective_models import collective_time
from mcdla.sim.ir_engine import execute
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs, zero3_traffic
from mcdla.sim.llm_floor import link_floor_s
from mcdla.sim.llm_lower import engine_step, lower
from mcdla.workload.execution import Execution, check_execution
from mcdla.workload.transformer import preset


def test_fair_drain_by_hand_on_a_dgx_h100_socket() -> None:
    """Mixtral 8x7B, EP8 inside a DGX H100, activations and weights offloaded: in the forward the four GPUs of a
    socket each send activations out and fetch weights in through the socket's DDR5 (307.2 GB/s for both
    directions, dgx-h100.yaml) behind their PCIe x16 (51.2 GB/s each way). Max-min: the eight flows get
    307.2 / 8 = 38.4 GB/s each until the (smaller) weights are in, then the activations go alone at the x16's
    51.2 GB/s while the DDR5 has room to spare; the busiest resource's bytes over its capacity (the x16's
    activations) is less. In the backward both come in through the x16, which binds. The engine's copies end
    there; the floor is each phase's larger of that and its closed-form time (with the single stage's logits and
    loss, taken off again), and the analytical iteration is at least the engine's."""
    spec, cluster = preset("mixtral-8x7b"), load_cluster("dgx-h100").for_gpus(16)
    e = Execution(gpus=16, tp=1, pp=1, dp=16, ep=8, micro_batch=2, global_batch=64, offload_activations=True,
                  offload_weights=True)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    act, weights, n = t.offload_activation_bytes, t.offload_weight_bytes, c.layers_per_stage
    share, pcie = 307.2e9 / 8, 51.2e9
    assert weights < act and share < pcie < 2 * share
    fwd_copies = weights / share + (act - weights) / pcie
    assert fwd_copies > act / pcie  # fairness leaves the DDR5 idle: more than the busiest resource needs
    bwd_copies = (act + weights) / pcie
    # one stage: the copies also run beside its logits and loss, which the floor takes off again
    forward = max(n * (c.layer_fwd_s + c.layer_comm_fwd_s) + c.offload_fwd_s + c.last_fwd_s,
                  fwd_copies) - c.last_fwd_s
    backward = max(n * (c.layer_bwd_s + c.layer_recompute_s + c.layer_comm_bwd_s) + c.offload_bwd_s + c.last_bwd_s,
                   bwd_copies) - c.last_bwd_s
    assert link_floor_s(e, cluster, c, t) == pytest.approx(forward + backward, rel=1e-12)

    lowered = lower(spec, e, cluster)
    run = execute(lowered.system, lowered.programs, devices=lowered.devices, mirrors=lowered.mirrors or None)
    rank = lowered.programs[0].rank
    latency = cluster.offload.latency_s
    assert run.op_end_s[(rank, "offload0-n0.host0-f0c0")] == pytest.approx(fwd_copies + latency, rel=1e-9)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * run.makespan_s


# Cases where the floor had been more than 1% below the engine, one per mechanism: the fair drain above on a
# DGX H100; ZeRO-3's per-layer gathers through the x16 beside the weights' prefetch (DGX H100, its CXL pool);
# the reduction beside each stage's last backward slowing the CP ring on the GH200's rail (pipeline of two);
# ZeRO-3's once-per-iteration collectives beside an overlapped last backward; a hierarchical reduction, its
# phases one after another, slowed by the prefetch on the x16 in front of the NIC; the gathers beside the copies
# to a rack's memory-nodes.
_FOUND = [
    ("dgx-h100", "mixtral-8x7b", dict(gpus=16, tp=1, dp=16, ep=8, micro_batch=2, global_batch=64,
                                      offload_activations=True, offload_weights=True)),
    ("dgx-h100", "mixtral-8x7b", dict(gpus=32, tp=8, dp=4, ep=2, micro_batch=1, global_batch=8,
                                      recompute="selective", offload_activations=True, offload_weights=True,
                                      sequence_parallel=True, zero=3)),
    ("dgx-h100-cxl", "megatron-1.7b", dict(gpus=32, pp=2, dp=8, cp=2, micro_batch=1, global_batch=16,
                                           recompute="full", offload_weights=True, zero=3, cp_comm="all_gather")),
    ("gh200", "megatron-1.7b", dict(gpus=8, pp=2, dp=2, cp=2, micro_batch=2, global_batch=8, recompute="full",
                                    offload_activations=True, zero=1, dp_overlap=True)),
    ("gh200", "qwen3-30b-a3b", dict(gpus=8, pp=2, dp=4, ep=2, micro_batch=1, global_batch=16,
                                    offload_activations=True, dp_overlap=True)),
    ("gh200", "megatron-1.7b", dict(gpus=8, dp=4, cp=2, micro_batch=2, global_batch=16, offload_activations=True,
                                    zero=3, dp_overlap=True, cp_comm="all_gather")),
    ("dgx-h100", "mixtral-8x7b", dict(gpus=32, tp=2, dp=8, cp=2, ep=2, micro_batch=2, global_batch=16,
                                      offload_activations=True, sequence_parallel=True, zero=1, dp_overlap=True,
                                      cp_comm="all_gather")),
    # without offload, an overlapped reduction beside the last backward's layer communication: the CP ring on the
    # GH200's rail (the 0.94x case), the EP all-to-alls there, and a hierarchical reduction's in-node all-gather
    # beside TP and the CP ring on a DGX H100's NVLink; the CP all-gathers across nodes slowed by a reduction
    # that still hides behind the (one-stage) pass
    ("gh200", "megatron-1.7b", dict(gpus=8, pp=2, dp=2, cp=2, micro_batch=1, global_batch=8, dp_overlap=True)),
    ("gh200", "mixtral-8x7b", dict(gpus=16, pp=2, dp=8, ep=4, micro_batch=1, global_batch=16,
                                   recompute="selective", zero=1, dp_overlap=True)),
    ("dgx-h100", "megatron-1.7b", dict(gpus=32, tp=2, dp=8, cp=2, micro_batch=2, global_batch=16,
                                       recompute="selective", sequence_parallel=True, zero=1, dp_overlap=True)),
    ("dgx-h100-cxl", "megatron-1.7b", dict(gpus=32, tp=8, dp=2, cp=2, micro_batch=4, global_batch=16,
                                           sequence_parallel=True, cp_comm="all_gather", dp_overlap=True)),
    pytest.param("gb200-nvl72-memnode", "mixtral-8x7b",
                 dict(gpus=4, tp=2, dp=2, micro_batch=4, global_batch=8, recompute="selective",
                      offload_activations=True, zero=3, dp_overlap=True),
                 marks=pytest.mark.slow),  # ~2 s: a 72-GPU rack, 36 memory-nodes
]


@pytest.mark.parametrize(("system", "model", "fields"), _FOUND)
def test_floor_is_not_below_the_engine_where_it_was(system: str, model: str, fields: dict[str, object]) -> None:
    """Each mechanism's case: the analytical iteration is at least the engine's minus 1%."""
    spec, e = preset(model), Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


@pytest.mark.slow  # ~1 min: 120 engine runs, some on a 72-GPU rack with 36 memory-nodes
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(system=st.sampled_from(["dgx-h100", "gh200", "gb200-nvl72-memnode", "dgx-h100-cxl"]),
       model=st.sampled_from(["megatron-1.7b", "mixtral-8x7b", "qwen3-30b-a3b"]), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]),
       ep=st.sampled_from([1, 2, 4, 8]), micro_batch=st.sampled_from([1, 2, 4]), per_replica=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       offload=st.sampled_from([(True, False), (False, True), (True, True)]), zero=st.sampled_from([0, 1, 3]),
       dp_overlap=st.booleans(), cp_comm=st.sampled_from(["p2p", "all_gather"]))
def test_floor_is_never_below_the_engine_over_offload_mixes(system: str, model: str, tp: int, pp: int, dp: int,
                                                            cp: int, ep: int, micro_batch: int, per_replica: int,
                                                            recompute: str, offload: tuple[bool, bool], zero: int,
                                                            dp_overlap: bool, cp_comm: str) -> None:
    """Offloading executions of a dense and two MoE models with EP, CP (ring or all-gather) and ZeRO-1/3 on DGX
    H100 nodes, their CXL pool, GH200 nodes and an NVL72 rack with memory-nodes, up to 32 GPUs: the analytical
    iteration is at least the engine's minus 1%."""
    tp = 1 if system == "gh200" else tp
    ep = 1 if model == "megatron-1.7b" else ep
    assume(tp * pp * dp * cp <= 32)
    try:
        e = Execution(gpus=tp * pp * dp * cp, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=micro_batch,
                      global_batch=micro_batch * dp * pp * per_replica, recompute=recompute,  # type: ignore[arg-type]
                      offload_activations=offload[0], offload_weights=offload[1], sequence_parallel=tp > 1,
                      zero=zero if dp > 1 else 0, dp_overlap=dp_overlap and dp > 1,  # type: ignore[arg-type]
                      cp_comm=cp_comm)  # type: ignore[arg-type]
        spec = preset(model)
        check_execution(e, spec)
    except ConfigError:
        assume(False)
        return
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


def test_zero3_beside_a_cp_ring_is_not_below_the_engine() -> None:
    """Mixtral on an NVL72 rack with memory-nodes sized to 8 GPUs, DP4 CP2 (ring) EP4, ZeRO-3, weights
    offloaded: the analytical iteration is at least the engine's minus 1%. On the engine only the 8 GPUs in use
    fetch from the 36 memory-nodes, so a copy takes the GPU's whole NVLink port, and each pass's first gathers
    crawl beside it (36 flows, one per memory-node, against one) while the layers wait for them; the floor
    drains the copies on the same partly used rack (``Cluster.paths_for_gpus``), the gathers' slowdown with
    them."""
    spec = preset("mixtral-8x7b")
    e = Execution(gpus=8, tp=1, pp=1, dp=4, cp=2, ep=4, micro_batch=1, global_batch=8, recompute="none",
                  offload_weights=True, zero=3, cp_comm="p2p")
    cluster = load_cluster("gb200-nvl72-memnode").for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


def test_zero3_gathers_hide_behind_the_layers_less_the_ring_attention_by_hand() -> None:
    """Qwen3 30B-A3B on an NVL72 rack, ZeRO-3 over DP4, a CP2 ring, selective recompute, nothing offloaded or
    overlapped: the engine runs a pass's ring steps after its layers, each the attention of the block held
    beside the block's send, so that attention (``attention / cp`` per layer and step: ``cp - 1`` steps forward,
    ``3 (cp - 1)`` backward with the attention recomputed) comes out of the layer ops, less the logits' and
    loss's compute of the pass, which gives it up first (no TP or EP calls: no batched latency terms). The
    gathers (``g`` per layer, prefetched one ahead) and reduce-scatters (``r``) are longer than the layers, so
    they hide behind that much less compute: forward ``g + (k - 1)(g - c_f)``, backward ``k (g + r) - k c_b``
    (``fsdp_exposed_s``'s closed forms with the layers' compute ``c`` less the moved attention over ``k``
    layers). The analytical iteration is then the engine's; priced with the whole layers it is 1.3% below. The
    rack's GPUs are taken without their ``host_call_time``: one rank's 128 experts would make the layers wait for
    the host's per-expert GEMM calls, longer than the gathers."""
    spec = preset("qwen3-30b-a3b")
    e = Execution(gpus=8, dp=4, cp=2, micro_batch=1, global_batch=8, recompute="selective", zero=3)
    cluster = cluster_from_dict({"format": "mcdla-system/1", "extends": "gb200-nvl72-memnode",
                                 "name": "gb200-nvl72-memnode", "node": {"gpu": {"host_call_time": 0}}},
                                "test").for_gpus(e.gpus)
    c, z = stage_costs(spec, e, cluster), zero3_traffic(spec, e, 2)
    g, r = (sum(collective_time(x.kind, x.nbytes, cluster.group_dims(x.size, x.stride)) for x in colls)
            for colls in (z.gathers, z.reduces))
    k, block_s = c.layers_per_stage, c.layer_attention_fwd_s / e.cp
    moved_f, moved_b = k * block_s - c.last_fwd_s, 3 * k * block_s - c.last_bwd_s
    assert moved_f > 0 and moved_b > 0  # the ring's attention is more than the logits'
    c_f, c_b = c.layer_fwd_s - moved_f / k, c.layer_bwd_s + c.layer_recompute_s - moved_b / k
    assert g > c_b > c_f and e.fsdp_prefetch == 1  # the links never idle
    assert c.fsdp_fwd_s == pytest.approx(g + (k - 1) * (g - c_f), rel=1e-9)
    assert c.fsdp_bwd_s == pytest.approx(k * (g + r) - k * c_b, rel=1e-9)
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert step.iteration_s == pytest.approx(run.iteration_s, rel=1e-9)
    whole = step.iteration_s - e.micro_batches * ((k - 1) / k * moved_f + moved_b)  # the layers' whole compute
    assert whole < 0.99 * run.iteration_s


def test_the_last_stage_keeps_its_ring_attention_behind_its_logits_by_hand() -> None:
    """Megatron 1.7B on GH200 nodes, PP2, ZeRO-3 over DP4, a CP2 ring, nothing offloaded: the first stage's
    layers give the ring's whole attention to the ring steps (no TP or EP calls, no logits), the last stage's
    logits and loss are more than it (forward and backward) and give it up instead, so the last stage's layers
    keep it. The gathers are longer than the layers: the first stage exposes ``(k - 1) / k`` of the forward's
    moved attention and all the backward's more than the last (``fsdp_exposed_s``'s closed forms), which is
    ``last_fsdp_s``; the per-rank schedule agrees with the closed form, and the engine with both."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=16, pp=2, dp=4, cp=2, micro_batch=1, global_batch=8, zero=3)
    cluster = load_cluster("gh200").for_gpus(e.gpus)
    c, z = stage_costs(spec, e, cluster), zero3_traffic(spec, e, 2)
    g = sum(collective_time(x.kind, x.nbytes, cluster.group_dims(x.size, x.stride)) for x in z.gathers)
    k, block_s = c.layers_per_stage, c.layer_attention_fwd_s / e.cp
    ring_f, ring_b = k * block_s, 2 * k * block_s
    assert ring_f < c.last_fwd_s and ring_b < c.last_bwd_s  # the logits' compute is more than the ring's
    assert g > c.layer_bwd_s + c.layer_recompute_s  # the links never idle
    assert c.last_fsdp_s == pytest.approx(-((k - 1) / k * ring_f + ring_b), rel=1e-9)
    step = llm_step(spec, e, cluster)
    assert step.iteration_s == pytest.approx(llm_step(spec, e, cluster, mode="ranks").iteration_s, rel=1e-12)
    assert step.iteration_s == pytest.approx(engine_step(spec, e, cluster).iteration_s, rel=1e-3)


@pytest.mark.parametrize("pp", [1, 2])
def test_reduction_beside_the_ring_without_offload_by_hand(pp: int) -> None:
    """Megatron 1.7B on GH200 nodes (one GPU and one 50 GB/s NDR rail each way per node, gh200.yaml), CP2 DP2,
    ``dp_overlap``, nothing offloaded: the last backward computes, then sends its K/V ring (``2 (cp - 1)`` blocks
    per layer) through the rail the overlapped reduction is still using (it is longer than the compute). Max-min
    halves both until the ring is through: the reduction ends ``ring / B`` later; with a pipeline of two, stage
    1's ring takes ``ring / B`` longer too and stage 0's last backward waits for it. The floor adds that, and the
    engine's contention is at least it."""
    spec, e = preset("megatron-1.7b"), Execution(gpus=4 * pp, pp=pp, dp=2, cp=2, micro_batch=1, global_batch=4,
                                                  dp_overlap=True)
    cluster = load_cluster("gh200").for_gpus(e.gpus)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    ring_s = c.layers_per_stage * 2 * (e.cp - 1) * t.kv_block_bytes / 50e9
    assert c.dp_full_s > c.layers_per_stage * (c.layer_bwd_s + c.layer_recompute_s)  # still running then
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert step.contention_s == pytest.approx(pp * ring_s, rel=1e-9)
    assert run.contention_s >= pp * ring_s * (1 - 1e-9)
    assert step.iteration_s >= 0.99 * run.iteration_s


def test_no_floor_where_the_reduction_misses_the_pass_communication() -> None:
    """A DGX H100 pool of 32 GPUs, TP2 CP2 (all-gather) DP8, ``dp_overlap``, no offload: the reduction's in-node
    reduce-scatter runs while the last backward computes and its all-gather after the pass's TP and CP calls
    (the cross-node all-reduce between them). The NVLink never carries both, so the floor adds nothing and the
    analytical iteration is the engine's to 1e-9."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=32, tp=2, dp=8, cp=2, micro_batch=1, global_batch=8, recompute="selective",
                  sequence_parallel=True, cp_comm="all_gather", dp_overlap=True)
    cluster = load_cluster("dgx-h100-cxl").for_gpus(e.gpus)
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert run.contention_s == 0.0
    assert step.contention_s == 0.0
    assert step.iteration_s == pytest.approx(run.iteration_s, rel=1e-9)


@pytest.mark.slow  # ~40 s: 150 engine runs
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(system=st.sampled_from(["dgx-h100", "gh200", "gb200-nvl72-memnode", "dgx-h100-cxl"]),
       model=st.sampled_from(["megatron-1.7b", "mixtral-8x7b", "qwen3-30b-a3b"]), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8]), cp=st.sampled_from([1, 2]),
       ep=st.sampled_from([1, 2, 4, 8]), micro_batch=st.sampled_from([1, 2, 4]), per_replica=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), zero=st.sampled_from([0, 1, 3]),
       cp_comm=st.sampled_from(["p2p", "all_gather"]), tp_comm_overlap=st.booleans())
def test_overlapped_reduction_is_never_below_the_engine_without_offload(
        system: str, model: str, tp: int, pp: int, dp: int, cp: int, ep: int, micro_batch: int, per_replica: int,
        recompute: str, zero: int, cp_comm: str, tp_comm_overlap: bool) -> None:
    """Executions that offload nothing with the reduction overlapped with the last backward, CP (ring or
    all-gather), EP and PP inside and across nodes, ZeRO-1 and ZeRO-3, TP overlap, on the four clusters of the
    offload sweep, up to 32 GPUs: the analytical iteration is at least the engine's minus 1%."""
    tp = 1 if system == "gh200" else tp
    ep = 1 if model == "megatron-1.7b" else ep
    assume(tp * pp * dp * cp <= 32)
    try:
        e = Execution(gpus=tp * pp * dp * cp, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=micro_batch,
                      global_batch=micro_batch * dp * pp * per_replica, recompute=recompute,  # type: ignore[arg-type]
                      sequence_parallel=tp > 1, zero=zero, dp_overlap=True, cp_comm=cp_comm,  # type: ignore[arg-type]
                      tp_comm_overlap=tp_comm_overlap and tp > 1 and zero < 3)  # the engine: ZeRO 0-2
        spec = preset(model)
        check_execution(e, spec)
    except ConfigError:
        assume(False)
        return
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


@pytest.mark.parametrize("pp", [1, 2])
def test_zero3_gathers_beside_the_overlapped_reduction_by_hand(pp: int) -> None:
    """Megatron 1.7B on GH200 nodes (one 50 GB/s NDR rail each way per node, gh200.yaml), ZeRO-3 over DP8,
    ``dp_overlap``, nothing offloaded: the last backward's per-layer ring all-gathers and reduce-scatters keep
    the rail busy (each GPU sends 7/8 of each buffer) and gate the layers, and the once-per-iteration reduction
    (the embedding's reduce-scatter and all-gather, ``D``: 7/8 of each) shares it. The reduction starts with
    the pass, so on the last stage it has the logits' backward ``h`` to itself (the first stage of two starts
    its layers and its reduction together); what it has left, ``D - h B``, takes that much rail time from the
    layers' collectives, every second of it on the layers' critical path: each stage's pass ends
    ``(D - h B) / B`` late, less the few per-step latencies of the collectives, during which the reduction has
    the rail alone (within 2%). The floor steps the layers as the engine issues their collectives: the
    iteration is the engine's."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=8 * pp, pp=pp, dp=8, micro_batch=1, global_batch=16, zero=3, dp_overlap=True)
    cluster = load_cluster("gh200").for_gpus(e.gpus)
    c, z, rail = stage_costs(spec, e, cluster), zero3_traffic(spec, e, 2), 50e9
    layer = sum(7 / 8 * coll.nbytes for coll in (*z.gathers, *z.reduces)) / rail
    reduced = sum(7 / 8 * coll.nbytes for coll in z.step) / rail
    assert layer > c.layer_bwd_s + c.layer_recompute_s  # the rail gates the layers
    heads = [c.last_bwd_s if pp == 1 else 0.0] + [c.last_bwd_s] * (pp - 1)
    assert all(reduced > h for h in heads)
    expect = sum(reduced - h for h in heads)
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert step.contention_s == pytest.approx(expect, rel=0.02)
    assert step.contention_s > 0.01 * step.iteration_s
    assert step.iteration_s == pytest.approx(run.iteration_s, rel=1e-9)


def test_tp_calls_beside_the_gemms_slow_the_reduction_by_hand() -> None:
    """Megatron 1.7B on four DGX H100 nodes, TP4 DP8, ``tp_comm_overlap`` and ``dp_overlap``, nothing offloaded:
    the DP group is two GPUs of a node times four nodes, so the reduction (its gradients ``G``) starts with the
    last backward by the in-node reduce-scatter, each GPU sending ``G / 2`` through its 450 GB/s NVLink port
    (``r`` alone). The pass's TP all-reduces (``2 n`` calls of ``A``, NVLink SHARP in the switch: each GPU sends
    and receives ``A`` per call, ``t`` alone; dgx-h100.yaml) run beside the GEMMs from the same start, after
    their latencies ``L``. Max-min halves both once the calls start: the reduce-scatter, alone for ``L``, ends
    ``r - L`` late, and the calls at ``t + r``, still inside the GEMMs, so only the reduction is later: the
    iteration is the closed form's plus ``r - L``, on the engine and in the floor."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=32, tp=4, dp=8, micro_batch=1, global_batch=8, recompute="selective", tp_comm_overlap=True,
                  dp_overlap=True)
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    c, t, nvlink = stage_costs(spec, e, cluster), rank_traffic(spec, e), 450e9
    (grads, size, stride), = t.gradient_groups
    assert (size, stride) == (8, 4)  # two members on each node
    r = grads / 2 / nvlink
    tp_s = c.layers_per_stage * 2 * t.activation_bytes / nvlink
    ops = {op.name: op for op in lower(spec, e, cluster).programs[0].ops}
    latency = ops["tp-latency-b0c0"].seconds  # the calls' latencies, charged before them
    gemms = ops["gemm-b0c0"].seconds
    assert latency < r < tp_s and tp_s + r < gemms  # the calls stay hidden
    assert c.dp_full_s > c.dp_hidden_s  # the reduction is exposed: its delay shows
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert run.contention_s == pytest.approx(r - latency, rel=1e-6)
    assert step.contention_s == pytest.approx(r - latency, rel=1e-6)
    assert step.iteration_s == pytest.approx(run.iteration_s, rel=1e-6)


@pytest.mark.slow  # ~30 s: 100 engine runs
@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(system=st.sampled_from(["dgx-h100", "b200", "gb200-nvl72"]),
       model=st.sampled_from(["megatron-1.7b", "mixtral-8x7b", "qwen3-30b-a3b"]), tp=st.sampled_from([2, 4, 8]),
       pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8]), virtual_stages=st.sampled_from([1, 2]),
       micro_batch=st.sampled_from([1, 2, 4]), per_replica=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), zero=st.sampled_from([0, 1]),
       sequence_parallel=st.booleans(), tp_comm_overlap=st.booleans())
def test_reduction_beside_tp_and_the_pipeline_is_never_below_the_engine(
        system: str, model: str, tp: int, pp: int, dp: int, virtual_stages: int, micro_batch: int, per_replica: int,
        recompute: str, zero: int, sequence_parallel: bool, tp_comm_overlap: bool) -> None:
    """Executions that offload nothing with the reduction overlapped with the last backward beside TP calls (after
    the compute, or beside the GEMMs), its groups inside a node or hierarchical across nodes, PP up to two
    (interleaved too), ZeRO-0/1, on DGX H100 and B200 nodes and an NVL72 rack, up to 64 GPUs: the analytical
    iteration is at least the engine's minus 1%."""
    assume(tp * pp * dp <= 64)
    try:
        e = Execution(gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                      global_batch=micro_batch * dp * pp * per_replica, recompute=recompute,  # type: ignore[arg-type]
                      sequence_parallel=sequence_parallel, zero=zero, dp_overlap=True,  # type: ignore[arg-type]
                      tp_comm_overlap=tp_comm_overlap, virtual_stages=virtual_stages if pp > 1 else 1)
        spec = preset(model)
        check_execution(e, spec)
    except ConfigError:
        assume(False)
        return
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


def test_last_stage_pass_beside_the_reductions_in_node_all_gather_by_hand() -> None:
    """Megatron 1.7B on eight DGX H100 nodes, TP4 PP2 DP8, SP, full recompute, ``dp_overlap``, nothing offloaded:
    the DP group is two GPUs of a node times four nodes, so each stage's reduction (its gradients ``G``) ends with
    the in-node all-gather, ``a = (G / 2) / 450 GB/s`` on each GPU's NVLink port (dgx-h100.yaml). The last stage's
    last backward computes its layers and then the logits' backward before its TP all-gathers and
    reduce-scatters, so its reduce-scatters run over that whole all-gather: max-min halves both, the calls end
    ``a`` late, and stage 0's last backward waits for them: the engine's iteration is ``a`` past its idle one.
    The floor places the last stage's calls after the logits too: its contention is at least ``a``."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=64, tp=4, pp=2, dp=8, micro_batch=1, global_batch=16, recompute="full",
                  sequence_parallel=True, dp_overlap=True)
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    # the bf16 GEMMs at the curve's own rate (not the preset's, NOTE [bf16 from fp8]), so that the reduction ends
    # inside the last stage's reduce-scatters, the case this test is about
    cluster = cluster.with_gemm_efficiency(dataclasses.replace(cluster.gemm_efficiency, bf16_over_fp8=None))
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    (grads, size, stride), = t.gradient_groups
    assert (size, stride) == (8, 4)  # two members on each node
    a = grads / 2 / 450e9
    compute = c.layers_per_stage * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s
    tp = c.layers_per_stage * c.layer_tp_bwd_s  # the all-gathers, then as long the reduce-scatters
    assert compute + tp / 2 < c.dp_full_s - a and c.dp_full_s < compute + tp  # inside the reduce-scatters
    step, run = llm_step(spec, e, cluster), engine_step(spec, e, cluster)
    assert run.contention_s == pytest.approx(a, rel=1e-4)
    assert step.contention_s >= a * (1 - 1e-9)
    assert run.iteration_s <= step.iteration_s <= 1.001 * run.iteration_s
