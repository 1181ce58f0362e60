"""Engine mode for ZeRO-3/FSDP, uneven pipeline splits, the CPU optimizer and the NVMe tier
(sim/llm_lower_zero.py): the lowered programs against the analytical model where no link is shared, and sharing
cases computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import Cluster, cluster_from_dict, load_cluster
from mcdla.sim.collective_models import collective_time
from mcdla.sim.ir import CollectiveOp, Compute
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs
from mcdla.sim.llm_lower import engine_step, lower, lowering_rejection
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, preset

_SPEC = preset("megatron-1.7b")

_ZERO3 = [
    dict(gpus=8, dp=8, micro_batch=1, global_batch=16, zero=3, fsdp_prefetch=0),
    dict(gpus=8, dp=8, micro_batch=1, global_batch=16, zero=3, fsdp_prefetch=1),
    dict(gpus=8, dp=8, micro_batch=1, global_batch=16, zero=3, fsdp_prefetch=2, recompute="full"),
    dict(gpus=8, dp=8, micro_batch=2, global_batch=32, zero=3, fsdp_prefetch=4, recompute="selective"),
    dict(gpus=16, tp=2, pp=2, dp=4, micro_batch=1, global_batch=16, zero=3, sequence_parallel=True),
    dict(gpus=16, dp=16, micro_batch=1, global_batch=16, zero=3),  # the shard group across two nodes
    dict(gpus=16, dp=16, micro_batch=1, global_batch=16, zero=3, hsdp_shard=8),  # shard in a node, replicate across
    dict(gpus=16, dp=16, micro_batch=1, global_batch=16, zero=3, hsdp_shard=4, fsdp_prefetch=0),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize("fields", _ZERO3)
def test_zero3_on_the_engine_equals_the_analytical_model(fields: dict[str, object], replicas: str) -> None:
    """ZeRO-3 as run on DGX H100 nodes, no offload (the gathers and reduce-scatters use NVLink and the rails, which
    nothing else loads at the same time): the engine's iteration equals the closed form to 1e-9 for several
    prefetch depths, recomputation, TP x PP, a shard group across nodes and HSDP, with one pipeline (the
    collectives at their closed-form times) or every replica (the collectives on the shard groups' links)."""
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got = engine_step(_SPEC, e, cluster, replicas=replicas)
    assert got.analytical.fsdp_comm_s > 0  # the per-layer collectives are exposed, so the match is not vacuous
    assert got.iteration_s == pytest.approx(llm_step(_SPEC, e, cluster).iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)


_WITH_CP_EP = [
    ("megatron-1.7b", dict(gpus=16, tp=4, cp=2, dp=2, micro_batch=1, global_batch=8, zero=3)),  # the CP ring
    ("megatron-1.7b", dict(gpus=16, tp=4, cp=2, dp=2, micro_batch=1, global_batch=8, zero=3, cp_comm="all_gather")),
    ("mixtral-8x7b", dict(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, zero=3, sequence_parallel=True)),
    ("mixtral-8x7b", dict(gpus=16, tp=2, dp=8, ep=4, micro_batch=1, global_batch=8, zero=3, sequence_parallel=True,
                          hsdp_shard=4)),
    ("megatron-1.7b", dict(gpus=32, tp=4, pp=2, cp=2, dp=2, micro_batch=1, global_batch=8, layers_first_stage=8)),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize(("model", "fields"), _WITH_CP_EP)
def test_zero3_and_uneven_splits_with_context_and_expert_parallelism(model: str, fields: dict[str, object],
                                                                      replicas: str) -> None:
    """ZeRO-3 beside the CP ring (its attention steps taken off the layers) or all-gather, beside the MoE
    all-to-alls with the routed experts sharded over their own group (HSDP too), and an uneven split with CP:
    the engine equals the closed form to 1e-9 on DGX H100 nodes."""
    spec, e = preset(model), Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got = engine_step(spec, e, cluster, replicas=replicas)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster).iteration_s, rel=1e-9)


def test_zero3_programs_gather_each_layer_in_forward_and_backward_and_reduce_scatter_in_backward() -> None:
    """Per micro-batch and layer: one all-gather in the forward, one in the backward (full recompute reuses it), one
    reduce-scatter in the backward, each of the layer's 16-bit weights over the rank's HSDP shard group (the
    dp / hsdp_shard = 2 groups of 8 consecutive ranks); the once-per-iteration all-reduce of the shard across the
    replica group (ranks 3 and 11)."""
    e = Execution(gpus=16, dp=16, micro_batch=1, global_batch=32, zero=3, hsdp_shard=8, recompute="full")
    lowered = lower(_SPEC, e, load_cluster("dgx-h100").for_gpus(16), replicas="all")
    program = next(p for p in lowered.programs if p.rank == 3)
    colls = [op.collective for op in program.ops if isinstance(op, CollectiveOp)]
    layer_bytes = 2 * _SPEC.params_per_layer()  # bf16, tp = 1
    per_layer = [c for c in colls if c.nbytes == layer_bytes]
    m, layers = e.micro_batches, _SPEC.layers
    assert {c.group for c in per_layer} == {tuple(range(8))}
    assert sum(c.kind == "all-gather" for c in per_layer) == 2 * m * layers
    assert sum(c.kind == "reduce-scatter" for c in per_layer) == m * layers
    shard_reduce = [c for c in colls if c.kind == "all-reduce"]
    assert [c.group for c in shard_reduce] == [(3, 11)]


_UNEVEN = [
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, micro_batch=1, global_batch=8, layers_first_stage=8)),
    ("dgx-h100", dict(gpus=24, tp=8, pp=3, micro_batch=1, global_batch=6, layers_last_stage=4, recompute="full")),
    ("dgx-h100", dict(gpus=32, tp=8, pp=4, micro_batch=1, global_batch=8, layers_first_stage=3,
                      layers_last_stage=3, sequence_parallel=True)),
    ("dgx-h100", dict(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, virtual_stages=2,
                      layers_first_stage=8, zero=1)),
    ("gh200", dict(gpus=5, pp=5, micro_batch=1, global_batch=10, account_for_embedding_in_pipeline_split=True)),
    ("dgx-h100", dict(gpus=16, tp=8, pp=2, micro_batch=1, global_batch=4, virtual_stages=2,
                      pipeline_layout="Et*2|t*10|t*4|t*8L")),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize(("system", "fields"), _UNEVEN)
def test_uneven_split_on_the_engine_equals_the_rank_schedule(system: str, fields: dict[str, object],
                                                             replicas: str) -> None:
    """Uneven splits (first/last stage counts, the embedding counted as a layer, interleaved chunks of unequal
    stages, a layout string's chunks of unequal size): each stage's program runs its own layers and the engine's 1F1B equals the per-rank schedule (the
    analytical model's closed form of an uneven split) to 1e-9."""
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert len(set(stage_costs(_SPEC, e, cluster).stage_layers)) > 1
    got = engine_step(_SPEC, e, cluster, replicas=replicas)
    assert got.iteration_s == pytest.approx(llm_step(_SPEC, e, cluster).iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)


def test_uneven_stage_programs_hold_their_own_layers() -> None:
    """A stage of 8 layers and one of 16: each chunk's TP all-reduces carry its own 2 n layers' activations, and
    the forward compute of the 16-layer stage is longer by at least its 8 more layers and the logits and loss
    (the rest: the latency terms of its 16 more all-reduce calls)."""
    e = Execution(gpus=16, tp=8, pp=2, micro_batch=1, global_batch=2, layers_first_stage=8)
    cluster = load_cluster("dgx-h100").for_gpus(16)
    c, t = stage_costs(_SPEC, e, cluster), rank_traffic(_SPEC, e)
    lowered = lower(_SPEC, e, cluster)
    first = {op.name: op for op in next(p for p in lowered.programs if p.rank == 0).ops}
    last = {op.name: op for op in next(p for p in lowered.programs if p.rank == 8).ops}
    for ops, layers in ((first, 8), (last, 16)):
        tp = ops["tp0-f0c0"]
        assert isinstance(tp, CollectiveOp) and tp.collective.nbytes == pytest.approx(2 * layers * t.activation_bytes)
    f0, f1 = first["compute-f0c0"], last["compute-f0c0"]
    assert isinstance(f0, Compute) and isinstance(f1, Compute) and f0.seconds is not None and f1.seconds is not None
    assert f1.seconds - f0.seconds >= 8 * c.layer_fwd_s + c.last_fwd_s


def _host_cluster(llm_cluster, **kw):
    """Four GPUs, each with its own 50 GB/s socket link to host memory of 200 GB/s, NVMe drives of 20 GB/s read
    and 10 GB/s write, no latencies: transfers cost their bytes over the bandwidth only, as in the closed form."""
    figures = dict(gpus_per_node=4, peak_flops_per_s=300e12, hbm_bytes_per_s=2e12, nvlink_bytes_per_s=400e9,
                   offload_bytes_per_s=50e9, host_dram_bytes_per_s=200e9, nvme_read_bytes_per_s=20e9,
                   nvme_write_bytes_per_s=10e9)
    return llm_cluster(**{**figures, **kw})


_OFFLOAD_STEP = [
    dict(gpus=4, tp=2, pp=2, micro_batch=1, global_batch=8, offload_optimizer=True, cpu_optimizer=True),
    dict(gpus=4, pp=2, dp=2, micro_batch=1, global_batch=8, zero=2, offload_optimizer=True, cpu_optimizer=True),
    dict(gpus=4, pp=2, dp=2, micro_batch=1, global_batch=8, zero=2, offload_optimizer=True, cpu_optimizer=True,
         delayed_param_update=True),
    dict(gpus=4, dp=4, micro_batch=1, global_batch=8, zero=3, offload_optimizer=True, cpu_optimizer=True,
         offload_tier="nvme"),
    dict(gpus=4, tp=4, micro_batch=1, global_batch=8, offload_optimizer=True, offload_tier="nvme"),
    dict(gpus=4, dp=4, micro_batch=1, global_batch=8, zero=1, offload_optimizer=True, offload_tier="nvme"),
    dict(gpus=4, dp=4, micro_batch=1, global_batch=8, zero=2, recompute="full", offload_activations=True,
         activation_offload_sync=True, offload_optimizer=True, cpu_optimizer=True),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize("fields", _OFFLOAD_STEP)
def test_cpu_optimizer_and_nvme_on_the_engine_equal_the_analytical_model(llm_cluster, fields: dict[str, object],
                                                                         replicas: str) -> None:
    """ZeRO-Offload (the gradients out during the last backward, the CPU's Adam, the parameters back; the
    delayed update beside the next iteration) and ZeRO-Infinity (the GPU optimizer's state read from and written
    to the node's drives, the GPUs sharing them; the CPU's Adam streaming from them): with every rank of a stage
    starting its step together, the engine's iteration equals the closed form to 1e-9."""
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = _host_cluster(llm_cluster)
    got = engine_step(_SPEC, e, cluster, replicas=replicas)
    want = llm_step(_SPEC, e, cluster)
    assert want.optimizer_s + want.offload_s > 0.01 * want.iteration_s or e.delayed_param_update
    assert got.iteration_s == pytest.approx(want.iteration_s, rel=1e-9)


def _shared_socket_cluster(cpu_adam: float | None) -> Cluster:
    """Four GPUs on one socket (each with its own 10 GB/s link, the socket's 100 GB/s DRAM and 4 TB pool shared),
    two NVMe drives, optionally a measured CPU-Adam rate: a job of fewer GPUs gets more of the DRAM, the pool and
    the drives (Cluster.pool_link_for_gpus, paths_for_gpus)."""
    sockets: dict[str, object] = {"count": 1, "source": "test",
                                  "memory": {"kind": "host", "capacity": 4e12, "dram_bandwidth": 100e9,
                                             "source": "test"},
                                  "gpu_link": {"kind": "pcie", "bandwidth": 10e9, "source": "test"}}
    if cpu_adam is not None:
        sockets["cpu_adam"] = {"params_per_s": cpu_adam, "source": "test"}
    sockets["first_touch_copy"] = {"bandwidth": 2e9, "source": "test"}  # read only with offload_first_touch
    node = {"gpus": 4, "source": "test", "sockets": sockets,
            "gpu": {"peak_flops_per_s": {"bf16": 1e14}, "hbm": 80e9, "hbm_bandwidth": 2e12, "source": "test"},
            "gemm_efficiency": {"peak_fraction": 1.0, "half_width": 0.0, "source": "test"},
            "scale_up": {"bandwidth": 1e15, "source": "test"},
            "nvme": {"drives": 2, "capacity": 1e15, "read_bandwidth": 8e9, "write_bandwidth": 4e9, "source": "test"}}
    return cluster_from_dict({"format": "mcdla-system/1", "name": "shared", "node": node,
                              "scale_out": {"nodes": 1, "bandwidth": 1e15, "source": "test"}}, "test")


_JOB_STEP = [
    dict(gpus=1, micro_batch=1, global_batch=2),
    dict(gpus=1, micro_batch=1, global_batch=2, dp_overlap=True),
    dict(gpus=2, dp=2, micro_batch=1, global_batch=4, zero=2, dp_overlap=True),
    dict(gpus=4, dp=2, pp=2, micro_batch=1, global_batch=8, zero=2),
    dict(gpus=2, dp=2, micro_batch=1, global_batch=4, zero=2, offload_tier="nvme"),
    dict(gpus=1, micro_batch=1, global_batch=2, recompute="full", offload_activations=True,
         activation_offload_sync=True),
    dict(gpus=1, micro_batch=1, global_batch=2, recompute="full", offload_activations=True,
         activation_offload_sync=True, offload_first_touch=True),
    dict(gpus=2, dp=2, micro_batch=1, global_batch=4, zero=2, recompute="full", offload_activations=True,
         offload_first_touch=True),
]


@pytest.mark.parametrize("cpu_adam", [None, 1e9])
@pytest.mark.parametrize("fields", _JOB_STEP)
def test_cpu_optimizer_of_jobs_sharing_a_socket_on_the_engine_equal_the_analytical_model(
        fields: dict[str, object], cpu_adam: float | None) -> None:
    """ZeRO-Offload on jobs of 1, 2 and 4 GPUs of a node whose GPUs share one socket: the fp32 gradients going out
    beside the first stage's last backward (its head's with one stage) with dp_overlap and after the pipeline
    without, the socket's DRAM, drives and CPU-Adam rate shared by the job's GPUs alone, the blocking activation
    copies, or overlapped ones outlasting the passes, logits and loss included (into fresh pages at the host's
    first-touch rate, beside the link's copy): the engine's iteration equals the closed form to 1e-9, the
    transfers and the step a visible part of it."""
    e = Execution(**fields, offload_optimizer=True, cpu_optimizer=True)  # type: ignore[arg-type]
    cluster = _shared_socket_cluster(cpu_adam)
    want = llm_step(_SPEC, e, cluster)
    assert want.optimizer_s + want.offload_s > 0.05 * want.iteration_s
    got = engine_step(_SPEC, e, cluster, replicas="all")
    assert got.iteration_s == pytest.approx(want.iteration_s, rel=1e-9)


def test_nvme_weights_shared_by_the_node_gpus_by_hand(llm_cluster) -> None:
    """Four GPUs (DP4, ZeRO-1), one micro-batch, weights on the NVMe tier: every forward and backward fetches the
    rank's weights W from the drives, 20 GB/s of reads shared by the four GPUs (5 GB/s each, below the 50 GB/s
    socket link), beside the pass's compute; the next pass waits for the fetch. By hand: each pass takes the
    longer of its compute and W / 5 GB/s; then the reduction, the optimizer step."""
    e = Execution(gpus=4, dp=4, micro_batch=1, global_batch=4, zero=1, offload_weights=True, offload_tier="nvme")
    cluster = _host_cluster(llm_cluster)
    c, t = stage_costs(_SPEC, e, cluster), rank_traffic(_SPEC, e)
    n, fetch = c.layers_per_stage, t.weight_bytes / (20e9 / 4)
    forward = max(n * c.layer_fwd_s + c.last_fwd_s, fetch)
    backward = max(n * (c.layer_bwd_s + c.layer_recompute_s) + c.last_bwd_s, fetch)
    assert fetch > n * c.layer_fwd_s + c.last_fwd_s  # the drives bind
    got = engine_step(_SPEC, e, cluster, replicas="all")
    dp = collective_time("all-reduce", t.gradient_bytes, cluster.group_dims(4))
    assert got.iteration_s == pytest.approx(forward + backward + dp + c.optimizer_s, rel=1e-9)


_TINY = TransformerSpec(name="tiny", layers=4, hidden=1024, heads=16, vocab=1, seq_len=1024)


def test_zero3_gathers_share_the_x16_with_the_activation_offload_by_hand(llm_cluster) -> None:
    """Two nodes of one GPU, ZeRO-3 over both (dp 2), no prefetch, activations offloaded; the NIC sits behind the
    GPU's x16 (``via_gpu_link``), so a gather's ring step (half the layer's weights, to the other node) leaves
    through the x16 the offload is draining through, and in the backward the peer's gather and reduce-scatter
    steps come in through the x16 the prefetch uses. Max-min by hand: while the copy is in flight each of the two
    flows gets half the x16 (the rails are as fast as the x16); the copy takes the whole x16 while the layers
    compute; the collectives alone take their closed-form time."""
    x16 = 20e9
    cluster = llm_cluster(gpus_per_node=1, nodes=2, peak_flops_per_s=200e12, hbm_bytes_per_s=2e12,
                          network_bytes_per_s=x16, offload_bytes_per_s=x16, via_gpu_link=True)
    e = Execution(gpus=2, dp=2, micro_batch=1, global_batch=2, zero=3, fsdp_prefetch=0, offload_activations=True)
    c, t = stage_costs(_TINY, e, cluster), rank_traffic(_TINY, e)
    step = 2 * _TINY.params_per_layer() / 2  # one ring step of a 2-rank all-gather or reduce-scatter: half the layer
    copy = t.stage_activation_bytes
    now, left = 0.0, copy

    def shared(nbytes: float) -> None:  # a collective step beside the copy on one x16 direction
        nonlocal now, left
        if left >= nbytes:
            now, left = now + nbytes / (x16 / 2), left - nbytes
        else:
            now, left = now + left / (x16 / 2) + (nbytes - left) / x16, 0.0

    def compute(seconds: float) -> None:
        nonlocal now, left
        now, left = now + seconds, max(0.0, left - x16 * seconds)

    for _ in range(_TINY.layers):  # forward: gather, then the layer
        shared(step)
        compute(c.layer_fwd_s)
    compute(c.last_fwd_s)
    assert left > 0  # the offload outlasts the forward
    now, left = now + left / x16, copy  # the backward waits for the offload; then the prefetch
    compute(c.last_bwd_s)
    for _ in range(_TINY.layers):  # backward: gather, the layer, its reduce-scatter
        shared(step)
        compute(c.layer_bwd_s)
        shared(step)
    assert left == 0  # the prefetch ends during the last layer's reduce-scatter
    now += c.dp_exposed_s  # then the embedding's reduce-scatter and gather, alone
    got = engine_step(_TINY, e, cluster, replicas="all")
    assert got.iteration_s == pytest.approx(now + c.optimizer_s, rel=1e-9)
    assert got.contention_s > 0 and set(got.contention_by_class_s) == {"pcie"}


def test_nvme_with_replicas_across_nodes_is_refused_in_one_line() -> None:
    """Twelve GPUs over two DGX H100 nodes, DP6 x PP2 folded into one pipeline: the second stage's replicas
    straddle the nodes, whose drives the fold cannot mirror, so the lowering refuses in one line, and
    lowering_rejection says so beforehand; with every replica simulated it lowers."""
    e = Execution(gpus=12, pp=2, dp=6, micro_batch=1, global_batch=12, zero=1, offload_optimizer=True,
                  offload_tier="nvme")
    with pytest.raises(ConfigError, match=r"offload_tier: got 'nvme' with the replicas of a rank on other") as err:
        lower(_SPEC, e, load_cluster("dgx-h100").for_gpus(12), replicas="fold")
    assert "\n" not in str(err.value)
    cluster = load_cluster("dgx-h100").for_gpus(12)
    assert lowering_rejection(_SPEC, e, cluster, replicas="fold") == str(err.value)  # the search passes it over
    assert lowering_rejection(_SPEC, e, cluster, replicas="all") is None


def test_zero3_cpu_optimizer_nvme_and_uneven_splits_are_lowered() -> None:
    """The engine no longer refuses ZeRO-3, the CPU optimizer, the NVMe tier or an uneven split."""
    cluster = load_cluster("dgx-h100").for_gpus(16)
    for fields in (dict(zero=3), dict(zero=1, offload_optimizer=True, cpu_optimizer=True),
                   dict(zero=1, offload_optimizer=True, offload_tier="nvme"), dict(layers_first_stage=8)):
        e = Execution(gpus=16, tp=4, pp=2, dp=2, micro_batch=1, global_batch=8, **fields)  # type: ignore[arg-type]
        assert lowering_rejection(_SPEC, e, cluster) is None


@settings(max_examples=30, deadline=None,  # ~0.5 s: small programs
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(layers=st.sampled_from([1, 3, 8]), dp=st.sampled_from([2, 4]), per_node=st.sampled_from([1, 2]),
       prefetch=st.integers(0, 4), m=st.sampled_from([1, 3]), recompute=st.sampled_from(["none", "selective", "full"]),
       hsdp=st.booleans(), peak=st.sampled_from([1e13, 1e14, 1e15]), net=st.sampled_from([1e9, 1e10, 1e11]))
def test_zero3_engine_equals_the_analytical_model_sweep(llm_cluster, layers: int, dp: int, per_node: int,
                                                        prefetch: int, m: int, recompute: str, hsdp: bool,
                                                        peak: float, net: float) -> None:
    """The same agreement over a sweep of small ZeRO-3 executions (one pipeline stage, so nothing but the shard
    group's collectives crosses the rails and the NVLink) whose compute ranges from hiding every collective to
    hiding none, every replica simulated."""
    spec = TransformerSpec(name="s", layers=layers, hidden=1024, heads=16, vocab=1, seq_len=1024)
    cluster = llm_cluster(gpus_per_node=per_node, nodes=dp // per_node, peak_flops_per_s=peak,
                          hbm_bytes_per_s=2e12, nvlink_bytes_per_s=10 * net, network_bytes_per_s=net)
    e = Execution(gpus=dp, dp=dp, micro_batch=1, global_batch=dp * m, zero=3, fsdp_prefetch=prefetch,
                  recompute=recompute, hsdp_shard=per_node if hsdp and per_node > 1 else 0)  # type: ignore[arg-type]
    got = engine_step(spec, e, cluster, replicas="all")
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster).iteration_s, rel=1e-9)
