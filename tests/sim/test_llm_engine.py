"""Engine mode for LLMs (sim/llm_lower.py): the lowered programs on the contention-aware engine against the
analytical model, a contention case computed by hand, and the analytical per-link floor (sim/llm_floor.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import load_cluster
from mcdla.sim.collective_models import collective_time
from mcdla.sim.ir import CollectiveOp
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs
from mcdla.sim.llm_floor import link_floor_s, link_floors
from mcdla.sim.llm_lower import engine_step, lower
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

_GPT3 = preset("gpt3-175b")

_NO_SHARED_LINK = [
    ("dgx-h100", dict(gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=2)),
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, dp=1, micro_batch=1, global_batch=4)),
    ("dgx-h100", dict(gpus=32, tp=8, pp=4, dp=1, micro_batch=1, global_batch=8, virtual_stages=2,
                      sequence_parallel=True, recompute="selective")),
    ("dgx-h100", dict(gpus=32, tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, recompute="full")),
    ("dgx-h100", dict(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, dp_overlap=True, zero=1)),
    ("dgx-h100", dict(gpus=16, tp=8, pp=1, dp=2, micro_batch=1, global_batch=4, zero=2)),
    ("gh200", dict(gpus=4, tp=1, pp=4, dp=1, micro_batch=1, global_batch=4)),
    ("dgx-h100", dict(gpus=32, tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, virtual_stages=2,
                      recompute="full", recompute_num_layers=5)),  # block: 5 of each chunk's 24 layers
    # TP collectives beside their GEMMs: hidden (micro-batch 4) and exposed (micro-batch 1, sequence parallel)
    ("dgx-h100", dict(gpus=8, tp=8, pp=1, dp=1, micro_batch=4, global_batch=8, tp_comm_overlap=True)),
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, dp=1, micro_batch=1, global_batch=4, tp_comm_overlap=True,
                      sequence_parallel=True, recompute="full")),
    ("dgx-h100", dict(gpus=32, tp=4, pp=4, dp=2, micro_batch=2, global_batch=16, virtual_stages=2,
                      tp_comm_overlap=True, recompute="selective")),
    # sends beside the next chunk: the receivers still wait for them (fill and drain cross 2 (v p - 1))
    ("dgx-h100", dict(gpus=32, tp=8, pp=4, dp=1, micro_batch=1, global_batch=8, virtual_stages=2,
                      sequence_parallel=True, pp_comm_overlap=True)),
    ("dgx-h100", dict(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, virtual_stages=3,
                      pp_comm_overlap=True, dp_overlap=True, zero=1)),
    # a partly used NVL72 rack: groups whose stride does not divide the rack's 72 GPUs are still all NVLink
    ("gb200-nvl72", dict(gpus=32, tp=8, dp=2, cp=2, micro_batch=1, global_batch=8, zero=3,
                         sequence_parallel=True)),
    ("gb200-nvl72", dict(gpus=32, tp=8, dp=4, micro_batch=1, global_batch=8, zero=1, sequence_parallel=True)),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize(("system", "fields"), _NO_SHARED_LINK)
def test_engine_equals_the_analytical_model_without_a_shared_link(system: str, fields: dict[str, object],
                                                                   replicas: str) -> None:
    """With no link carrying two classes at once (no offload; every stage one node), the engine's iteration
    equals the closed form and the per-rank schedule to 1e-9 and reports no contention, with one pipeline
    (the reduction's closed form) or every replica (the reduction as collectives)."""
    spec = _GPT3 if system == "dgx-h100" else preset("megatron-1.7b")
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    got = engine_step(spec, e, cluster, replicas=replicas)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster).iteration_s, rel=1e-9)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster, mode="ranks").iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)


def test_lowering_folds_the_data_parallel_replicas_of_a_node() -> None:
    """One pipeline is simulated; a rank stands for the dp replicas on its node, mirrored on their GPUs; the
    replicas on other nodes are left out, and only the nodes in use are expanded."""
    e = Execution(gpus=32, tp=4, pp=2, dp=4, micro_batch=1, global_batch=8)
    lowered = lower(_GPT3, e, load_cluster("dgx-h100").for_gpus(32), replicas="fold")
    assert sorted(p.rank for p in lowered.programs) == [0, 1, 2, 3, 16, 17, 18, 19]
    assert lowered.fold == 2 and {p.fold for p in lowered.programs} == {2}
    assert lowered.devices[16] == "n1.gpu0" and lowered.mirrors[16] == ("n1.gpu4",)
    assert len(lowered.system.devices) == 16


def test_every_replica_runs_the_data_parallel_reduction_as_collectives() -> None:
    """replicas="all": every rank has a program and an all-reduce (ZeRO-2: the same traffic) on its DP group."""
    e = Execution(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, zero=2)
    lowered = lower(_GPT3, e, load_cluster("dgx-h100").for_gpus(16), replicas="all")
    assert sorted(p.rank for p in lowered.programs) == list(range(16)) and lowered.fold == 1
    program = next(p for p in lowered.programs if p.rank == 5)
    reduction = [op for op in program.ops if isinstance(op, CollectiveOp) and op.stream == "dp"]
    kinds, groups = [op.collective.kind for op in reduction], {op.collective.group for op in reduction}
    assert kinds == ["all-reduce"] and groups == {(1, 5)}


def test_bad_replicas_is_one_line() -> None:
    e = Execution(gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=1)
    with pytest.raises(ConfigError, match=r"replicas: got 'some'; must be one of auto, fold, all"):
        lower(_GPT3, e, load_cluster("dgx-h100"), replicas="some")


def test_gh200_c2c_and_grace_memory_shared_by_offload_and_weight_fetch() -> None:
    """GH200, one GPU, one micro-batch, activations and weights offloaded: in the forward the activations go
    out while the weights come in, both through Grace's LPDDR5X (500 GB/s for both directions together) behind
    the 450 GB/s-each-way C2C; in the backward both come in over the C2C. Max-min by hand: two flows share the
    bottleneck equally until the smaller ends, then the other runs alone."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=1, tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, offload_activations=True,
                  offload_weights=True, attention="materialized")
    cluster = load_cluster("gh200").for_gpus(1)
    # the bf16 GEMMs at the curve's own rate (not the preset's, NOTE [bf16 from fp8]), so that the backward's copies
    # outlast its compute, the case this test is about
    cluster = cluster.with_gemm_efficiency(dataclasses.replace(cluster.gemm_efficiency, bf16_over_fp8=None))
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    c2c, dram, latency = 450e9, 500e9, cluster.offload.latency_s  # gh200.yaml figures

    def two_flows(a: float, b: float, shared: float, alone: float) -> float:
        small, big = sorted((a, b))
        return small / shared + (big - small) / alone

    act, weights = t.stage_activation_bytes, t.weight_bytes
    fwd_copies = two_flows(act, weights, dram / 2, c2c) + latency  # DRAM binds with two directions at once
    bwd_copies = (act + weights) / c2c + latency  # one C2C direction carries both, work-conserving
    n = c.layers_per_stage
    forward = max(n * c.layer_fwd_s + c.last_fwd_s, fwd_copies)
    backward = max(n * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s, bwd_copies)
    got = engine_step(spec, e, cluster)
    assert bwd_copies > n * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s  # the sharing is exposed
    assert got.iteration_s == pytest.approx(forward + backward + c.optimizer_s, rel=1e-9)
    assert got.contention_s > 0 and set(got.contention_by_class_s) <= {"pcie", "dram", "cpu-interconnect", "other"}


_SMALL = [
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, dp=1, micro_batch=1, global_batch=4, offload_activations=True)),
    ("dgx-h100", dict(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, offload_weights=True)),
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, dp=1, micro_batch=2, global_batch=8, offload_activations=True,
                      offload_weights=True, recompute="selective")),
    ("dgx-h100", dict(gpus=32, tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, virtual_stages=2,
                      offload_activations=True, offload_optimizer=True, zero=1)),
    ("gh200", dict(gpus=2, tp=1, pp=2, dp=1, micro_batch=4, global_batch=8, offload_activations=True,
                   offload_weights=True)),
    ("gh200", dict(gpus=1, tp=1, pp=1, dp=1, micro_batch=8, global_batch=8, offload_activations=True,
                   offload_weights=True)),
    ("gh200", dict(gpus=1, tp=1, pp=1, dp=1, micro_batch=8, global_batch=8, offload_activations=True,
                   offload_weights=True, offload_num_layers=10)),  # the first 10 of 24 layers
    pytest.param("gb200-nvl72-memnode", dict(gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=2,
                                             offload_activations=True, offload_weights=True),
                 marks=pytest.mark.slow),  # ~2 s: a 72-GPU rack, 36 memory-nodes
]


@pytest.mark.parametrize(("system", "fields"), _SMALL)
def test_analytical_floor_is_never_below_the_engine(system: str, fields: dict[str, object]) -> None:
    """The analytical path with its per-link floor is at least the engine's time minus 1% on small cases
    with shared links (offload with pipeline sends on PCIe, weights and activations on C2C and NVLink)."""
    spec = _GPT3 if system == "dgx-h100" else preset("megatron-1.7b")
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


def test_dgx_h100_pcie_shared_by_the_nic_send_and_the_offload() -> None:
    """Two DGX H100 nodes, one stage each (TP8 PP2), one micro-batch, activations offloaded: stage 0's
    activation send leaves through the GPU's PCIe x16 to its ConnectX-7 (dgx-h100.yaml ``via_gpu_link``) while
    the offload still drains through the same x16 to host memory. By hand: the two flows split the 51.2 GB/s
    x16 until the send's bytes are through; every other transfer runs alone (the four GPUs of a socket offload
    at 4 x 51.2 < 307.2 GB/s of DDR5, so the x16 binds)."""
    e = Execution(gpus=16, tp=8, pp=2, dp=1, micro_batch=1, global_batch=1, offload_activations=True)
    cluster = load_cluster("dgx-h100").for_gpus(16)
    c, t = stage_costs(_GPT3, e, cluster), rank_traffic(_GPT3, e)
    pcie, lat_off = 51.2e9, cluster.offload.latency_s  # dgx-h100.yaml gpu_link
    send_latency = cluster.scale_out.latency_s
    n, act, p2p = c.layers_per_stage, t.stage_activation_bytes, t.p2p_bytes
    tf, tb = n * c.layer_tp_fwd_s, n * c.layer_tp_bwd_s
    t1 = n * c.layer_fwd_s + tf  # stage 0's forward compute and collectives
    assert act - pcie * t1 > p2p  # the offload is still draining when the send starts
    send_end = t1 + p2p / (pcie / 2) + send_latency
    off0_end = t1 + (act + p2p) / pcie + lat_off  # work-conserving x16
    f1_end = send_end + n * c.layer_fwd_s + c.last_fwd_s + tf + c.p2p_s
    b1 = max(f1_end, send_end + act / pcie + lat_off)
    s1_end = b1 + n * c.layer_bwd_s + c.last_bwd_s + tb + c.p2p_s  # the gradient goes out, the prefetch comes in
    final1 = max(s1_end, b1 + act / pcie + lat_off) + c.optimizer_s
    b0 = max(s1_end, off0_end)
    final0 = max(b0 + n * c.layer_bwd_s + tb + c.p2p_s, b0 + act / pcie + lat_off) + c.optimizer_s
    got = engine_step(_GPT3, e, cluster)
    assert got.iteration_s == pytest.approx(max(final0, final1), rel=1e-9)
    assert got.contention_s == pytest.approx(p2p / (pcie / 2) - p2p / 50e9, rel=1e-6)  # the send's slowdown
    assert set(got.contention_by_class_s) == {"pcie"}


def _port_shared(copy_left: float, coll: float, copy_flows: int, port: float) -> tuple[float, float]:
    """Max-min by hand on one port direction: ``copy_flows`` equal flows still carrying ``copy_left`` bytes in
    all and one collective flow of ``coll`` bytes start together; each flow gets ``port / (copy_flows + 1)``
    until one side is through, then the other has the port. Returns (collective's time, copies' time); copies
    already through (``copy_left <= 0``) leave the collective alone."""
    if copy_left <= 0:
        return coll / port, copy_left / port
    share = port / (copy_flows + 1)
    per_copy = copy_left / copy_flows
    if coll <= per_copy:
        return coll / share, (copy_left + coll) / port
    return (copy_left + coll) / port, per_copy / share


def test_gb200_memory_nodes_share_nvlink_ports_with_tp_all_reduces() -> None:
    """One NVL72 rack with memory-nodes behind the NVSwitch, TP8, one micro-batch, activations offloaded to the
    36 memory-nodes: the offload (forward) and the prefetch (backward) cross the GPU's 900 GB/s NVLink port with
    the TP all-reduce's flow up to (forward) or down from (backward) the reducing switch; the other direction's
    flow runs alone. By hand (:func:`_port_shared`): max-min over the port's 36 copy flows and the all-reduce's
    (here the forward's offload outlasts its compute; the backward's prefetch does not)."""
    spec = preset("llama3-8b")
    e = Execution(gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=1, offload_activations=True,
                  attention="materialized")
    cluster = load_cluster("gb200-nvl72-memnode").for_gpus(8)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    port, lat, mems = 900e9, cluster.offload.latency_s, 36  # gb200-nvl72-memnode.yaml scale_up, memory_nodes
    n, act = c.layers_per_stage, t.stage_activation_bytes
    big = 2 * n * t.activation_bytes  # the 2 n all-reduces of a pass as one (NOTE [LLM lowering])
    dims = cluster.group_dims(8)
    one = collective_time("all-reduce", big, dims)  # the one collective; the rest of 2 n calls' time is latency
    cf = n * c.layer_fwd_s + c.last_fwd_s + n * c.layer_tp_fwd_s - one  # compute and those latencies
    cb = n * c.layer_bwd_s + c.last_bwd_s + n * c.layer_tp_bwd_s - one
    assert act > port * cf  # the offload is still in flight when the forward's all-reduces start
    tp_f, off_f = _port_shared(act - port * cf, big, mems, port)
    f_end = cf + one + tp_f - big / port
    b = max(f_end, cf + off_f + lat)
    tp_b, pre_b = _port_shared(act - port * cb, big, mems, port)
    b_end = max(b + cb + one + tp_b - big / port, b + cb + pre_b + lat)
    got = engine_step(spec, e, cluster)
    assert got.iteration_s == pytest.approx(b_end + c.optimizer_s, rel=1e-9)
    assert got.contention_s > 0 and "nvlink" in got.contention_by_class_s


@pytest.mark.slow  # ~10 s: 25 engine runs, some on a 72-GPU rack with 36 memory-nodes
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(["dgx-h100", "gh200", "gb200-nvl72-memnode"]), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]), micro_batch=st.sampled_from([1, 4]),
       per_replica=st.sampled_from([1, 2, 4]), recompute=st.sampled_from(["none", "selective", "full"]),
       offload=st.sampled_from([(True, False), (False, True), (True, True)]), dp_overlap=st.booleans())
def test_analytical_floor_is_never_below_the_engine_sweep(system: str, tp: int, pp: int, dp: int, micro_batch: int,
                                                          per_replica: int, recompute: str,
                                                          offload: tuple[bool, bool], dp_overlap: bool) -> None:
    """The same bound over a sweep of small offloading executions of Megatron 1.7B (GH200 nodes hold one GPU)."""
    if system == "gh200":
        tp = 1
    e = Execution(gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                  global_batch=micro_batch * dp * per_replica * pp, recompute=recompute,  # type: ignore[arg-type]
                  offload_activations=offload[0], offload_weights=offload[1], dp_overlap=dp_overlap and dp > 1)
    spec, cluster = preset("megatron-1.7b"), load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s


def test_link_floor_by_hand_on_gh200_at_16384_gpus() -> None:
    """The floor of a GH200 GPU offloading activations and weights, at 16,384 GPUs (DP over all of them): in the
    forward the activations out and the weights in share the LPDDR5X (500 GB/s both ways together) behind the
    450 GB/s-each-way C2C, max-min fairly: 250 GB/s each until the smaller is through, then the larger alone at
    the C2C's 450 GB/s (the DRAM then has room to spare); in the backward both come in over the C2C; each phase
    at least its closed-form time, on this single stage with its logits and loss, which the copies also run
    beside (the floor is of the phase without them). The analytical iteration keeps it: every micro-batch of the
    stage takes at least the floor and its logits and loss."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=16384, tp=1, pp=1, dp=16384, micro_batch=1, global_batch=16384, offload_activations=True,
                  offload_weights=True)
    cluster = load_cluster("gh200").for_gpus(16384)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    act, weights, n = t.stage_activation_bytes, t.weight_bytes, c.layers_per_stage
    small, big = sorted((act, weights))
    shared_dram = small / 250e9 + (big - small) / 450e9
    assert shared_dram > (act + weights) / 500e9  # fairness leaves the DRAM idle once the smaller flow is through
    forward = max(n * (c.layer_fwd_s + c.layer_tp_fwd_s) + c.offload_fwd_s + c.last_fwd_s,
                  shared_dram) - c.last_fwd_s
    backward = max(n * (c.layer_bwd_s + c.layer_recompute_s + c.layer_tp_bwd_s) + c.offload_bwd_s + c.last_bwd_s,
                   (act + weights) / 450e9, (act + weights) / 500e9) - c.last_bwd_s
    assert link_floor_s(e, cluster, c, t) == pytest.approx(forward + backward, rel=1e-12)
    step = llm_step(spec, e, cluster)
    assert step.iteration_s - step.dp_comm_s - step.optimizer_s >= e.micro_batches * (forward + backward) + \
        c.last_fwd_s + c.last_bwd_s - 1e-12


def test_overlapped_reduction_floor_by_hand_on_dgx_h100() -> None:
    """TP8 DP2 over two DGX H100 nodes, activations offloaded, the reduction overlapped with the last backward:
    the ring all-reduce of p = 2 moves the gradients g once each way through the GPU's x16 to its NIC while the
    prefetch brings the activations in through the same x16, so the backward with the reduction needs at least
    (A + g) / 51.2 GB/s there (the rail, g / 50 GB/s, and the socket's DDR5, 4 A / 307.2 GB/s, need less); what
    exceeds the backward's closed-form time is exposed."""
    e = Execution(gpus=16, tp=8, pp=1, dp=2, micro_batch=1, global_batch=2, offload_activations=True,
                  dp_overlap=True)
    spec, cluster = preset("megatron-1.7b"), load_cluster("dgx-h100").for_gpus(16)
    c, t = stage_costs(spec, e, cluster), rank_traffic(spec, e)
    act, g, n = t.stage_activation_bytes, t.gradient_bytes, c.layers_per_stage
    busiest = max((act + g) / 51.2e9, g / 50e9, 4 * act / 307.2e9)
    backward = n * (c.layer_bwd_s + c.layer_recompute_s + c.layer_tp_bwd_s) + c.offload_bwd_s
    assert busiest > backward  # the floor binds
    assert link_floors(e, cluster, c, t).dp_exposed_s == pytest.approx(busiest - backward, rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("nvlink", [20e9, 200e9, 5e12])
def test_engine_overlaps_tp_collectives_with_their_gemms_as_the_closed_form(llm_cluster, nvlink: float,
                                                                           recompute: str) -> None:
    """With ``tp_comm_overlap`` the engine runs a chunk's TP collectives beside its GEMMs, then the rest of the
    chunk; per layer that exposes max(0, R - G) like the closed form (R the layer's collectives, G the GEMMs
    they pair with), whether the collectives hide behind the GEMMs (fast NVLink) or show (slow NVLink), with a
    pipeline of two stages and every replica simulated. Without the overlap the engine is slower by what the
    GEMMs hide on each of the m + p - 1 passes of the 1F1B critical path."""
    from mcdla.workload.transformer import TransformerSpec
    spec = TransformerSpec(name="g", layers=8, hidden=1024, heads=16, vocab=1000, seq_len=2048)
    cluster = llm_cluster(gpus_per_node=4, nodes=2, nvlink_bytes_per_s=nvlink, network_bytes_per_s=50e9,
                          network_latency_s=1e-6)
    fields = dict(gpus=8, tp=4, pp=2, dp=1, micro_batch=1, global_batch=4, recompute=recompute)
    plain, overlap = Execution(**fields), Execution(**fields, tp_comm_overlap=True)  # type: ignore[arg-type]
    got = engine_step(spec, overlap, cluster, replicas="all")
    assert got.iteration_s == pytest.approx(llm_step(spec, overlap, cluster).iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)
    c = stage_costs(spec, overlap, cluster)
    hidden = engine_step(spec, plain, cluster, replicas="all").iteration_s - got.iteration_s
    tp_plain = stage_costs(spec, plain, cluster)
    per_mb = c.layers_per_stage * sum(min(full, hide) for full, hide in (
        (tp_plain.layer_tp_fwd_s, c.layer_tp_hide_fwd_s), (tp_plain.layer_tp_bwd_s, c.layer_tp_hide_bwd_s)))
    # 1F1B of even stages: m + p - 1 micro-batch passes on the critical path
    assert hidden == pytest.approx((overlap.micro_batches + overlap.pp - 1) * per_mb, rel=1e-6)


def test_engine_refuses_tp_overlap_with_a_partial_recompute() -> None:
    """A recompute of some layers mixes two per-layer overlap rules in a chunk: refused in one line."""
    e = Execution(gpus=16, tp=8, pp=2, dp=1, micro_batch=1, global_batch=4, recompute="full",
                  recompute_num_layers=5, tp_comm_overlap=True)
    with pytest.raises(ConfigError, match=r"^execution\.tp_comm_overlap: got true") as info:
        engine_step(_GPT3, e, load_cluster("dgx-h100").for_gpus(16))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fields", [
    dict(gpus=16, tp=8, pp=1, dp=2, micro_batch=1, global_batch=4, zero=1),
    dict(gpus=32, tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, zero=1),
    dict(gpus=32, tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, zero=1, virtual_stages=2),
    dict(gpus=16, tp=2, pp=1, dp=8, micro_batch=1, global_batch=16, recompute="full"),
    dict(gpus=16, tp=8, pp=1, dp=2, micro_batch=1, global_batch=4, zero=3, fsdp_prefetch=2),
    dict(gpus=16, tp=8, pp=1, dp=2, micro_batch=1, global_batch=4, zero=1, tp_comm_overlap=True),
])
def test_overlapped_reduction_hides_behind_the_last_pass_in_both_evaluators(fields: dict[str, object]) -> None:
    """With ``dp_overlap`` the reduction starts with the first stage's last backward pass and hides behind
    all of it, its TP calls and pipeline hold included (NOTE [overlapped reduction]): the engine's idle-fabric
    iteration equals the closed form to 1e-9, where the reduction is partly exposed (a pipeline, interleaved
    chunks, ZeRO-3, TP overlap) or hidden; the per-link floor's part (sim/llm_floor.py: under ZeRO-3 the
    layers' gathers share the NVLink with the reduction) aside, and the floor is not below the engine's."""
    e = Execution(**fields, dp_overlap=True)  # type: ignore[arg-type]
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got, step = engine_step(_GPT3, e, cluster, replicas="all"), llm_step(_GPT3, e, cluster)
    assert got.idle_iteration_s == pytest.approx(step.iteration_s - step.contention_s, rel=1e-9)
    assert got.iteration_s >= got.idle_iteration_s * (1 - 1e-12)
    assert step.iteration_s >= 0.99 * got.iteration_s


# TP2 DP2 stages fill half a DGX H100: stages 0 and 1 on node 0, 2 and 3 on node 1, so the boundary between
# stages 1 and 2 (and, interleaved, the last stage's send to the first) crosses the network, the others NVLink
_MIXED_BOUNDARIES = [
    dict(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=8),
    dict(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=8, dp_overlap=True, zero=1),
    dict(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=16, virtual_stages=2),
    dict(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=16, virtual_stages=2, pp_comm_overlap=True),
    dict(gpus=16, tp=2, pp=8, dp=1, micro_batch=1, global_batch=16),
    dict(gpus=8, tp=2, pp=4, dp=1, micro_batch=1, global_batch=8),  # every boundary inside one node
]


@pytest.mark.parametrize("fields", _MIXED_BOUNDARIES)
def test_each_pipeline_send_on_the_link_its_boundary_crosses(fields: dict[str, object]) -> None:
    """Stage boundaries some inside, some across DGX H100 nodes: on an idle fabric (every transfer alone; a send
    still meets its receiver's TP calls on the NVLink port with contention) the engine, whose sends cross the
    links their ranks are on, equals the closed form and the per-rank schedule to 1e-9."""
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got = engine_step(_GPT3, e, cluster, replicas="fold")
    assert got.idle_iteration_s == pytest.approx(llm_step(_GPT3, e, cluster).iteration_s, rel=1e-9)
    assert got.idle_iteration_s == pytest.approx(llm_step(_GPT3, e, cluster, mode="ranks").iteration_s, rel=1e-9)


def test_boundary_sends_by_hand_on_dgx_h100() -> None:
    """TP2 PP4 DP2 on two DGX H100s: one send of ``b s h / tp`` bf16 bytes takes 1 us + bytes / 450 GB/s on
    NVLink (stages 0-1, 2-3) and 5 us + bytes / 50 GB/s on the NDR rail (stages 1-2, and 3-0); a pass with no
    peer holds the slowest, and each stage's micro-batch carries the sends of its own two boundaries."""
    e = Execution(gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=8)
    c = stage_costs(_GPT3, e, load_cluster("dgx-h100").for_gpus(16))
    nbytes = 2 * _GPT3.seq_len * _GPT3.hidden / 2
    nvlink, network = 1e-6 + nbytes / 450e9, 5e-6 + nbytes / 50e9
    assert c.boundary_p2p_s == pytest.approx((nvlink, network, nvlink, network), rel=1e-12)
    assert c.p2p_s == pytest.approx(network, rel=1e-12)
    assert [c.stage_sends_s(s, 1) for s in range(4)] == pytest.approx(
        [nvlink + network, network + nvlink, nvlink + network, network + nvlink], rel=1e-12)
