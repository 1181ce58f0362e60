"""FSDP/ZeRO-3 as run (per-layer gathers and reduce-scatters, prefetch, HSDP) against hand-computed closed forms."""

import dataclasses

import pytest

from mcdla.errors import ConfigError
from mcdla.sim.llm import fsdp_exposed_s, llm_step
from mcdla.workload.execution import Execution, execution_from_dict
from mcdla.workload.transformer import TransformerSpec

SMALL = TransformerSpec(name="s", layers=8, hidden=1024, heads=16, vocab=1, seq_len=1024)
FAST = 1e18  # FLOP/s, the most a file may give: compute next to nothing, so every collective is exposed
FASTEST = 1e15  # B/s, the most a file may give: HBM and links that barely cost
NEAR = 1e-3  # the layers' elementwise kernels at FASTEST (~1e-7 s) overlap ~1e-4 of a reduce-scatter


@pytest.mark.parametrize("gather, compute", [(2.0, 1.0), (1.0, 2.0), (1.0, 1.0)])
@pytest.mark.parametrize("layers", [1, 2, 7])
def test_forward_gathers_behind_compute_two_stage_flow_shop(gather, compute, layers):
    """Forward with prefetch: the first gather is exposed, each later one by what exceeds a layer's compute,
    ``g + (k - 1) max(0, g - c)`` (two-stage flow shop of identical jobs); without prefetch all ``k g``."""
    for depth in (1, 2, 4):
        assert fsdp_exposed_s(gather, 0.0, compute, layers, prefetch=depth, backward=False) == pytest.approx(
            gather + (layers - 1) * max(0.0, gather - compute), rel=1e-12)
    assert fsdp_exposed_s(gather, 0.0, compute, layers, prefetch=0, backward=False) == pytest.approx(
        layers * gather, rel=1e-12)


@pytest.mark.parametrize("depth", [1, 2])
def test_backward_ends_compute_bound_and_link_bound(depth):
    """Backward: a compute that hides the rest leaves the first gather and the last reduce-scatter exposed
    (``g + r``); links that never idle leave ``k (g + r) - k c``."""
    g, r, k = 1.0, 0.5, 6
    assert fsdp_exposed_s(g, r, 10.0, k, prefetch=depth, backward=True) == pytest.approx(g + r, rel=1e-12)
    assert fsdp_exposed_s(g, r, 0.1, k, prefetch=depth, backward=True) == pytest.approx(k * (g + r) - k * 0.1,
                                                                                      rel=1e-12)


def test_backward_three_layers_by_hand():
    """g = r = 1, c = 1.5, prefetch 1, three layers, one link in issue order. By hand: g0 [0, 1]; layer 0
    computes [1, 2.5], g1 [1, 2], rs0 [2.5, 3.5]; layer 1 [2.5, 4], g2 issued at 2.5 runs [3.5, 4.5], rs1
    [4.5, 5.5]; layer 2 [4.5, 6], rs2 [6, 7]: 7 - 3 x 1.5 = 2.5 exposed."""
    assert fsdp_exposed_s(1.0, 1.0, 1.5, 3, prefetch=1, backward=True) == pytest.approx(2.5, rel=1e-12)


def _net_cluster(make, **kw):
    """A cluster whose compute, HBM and unnamed links (next to) never bind."""
    figures = dict(peak_flops_per_s=FAST, gemm_peak_fraction=1.0, hbm_bytes_per_s=FASTEST,
                   nvlink_bytes_per_s=FASTEST, network_bytes_per_s=FASTEST)
    return make(**{**figures, **kw})


@pytest.mark.parametrize("pp, m", [(1, 1), (1, 3), (2, 4)])
def test_zero3_gathers_each_layer_per_micro_batch(pp, m, llm_cluster):
    """No compute to hide behind: per micro-batch and layer a forward gather, a backward gather and a
    reduce-scatter, each ring ``(dp - 1)/dp x 2 bytes x layer parameters / B`` over the DP group's rails."""
    dp, bw = 4, 10e9
    cluster = _net_cluster(llm_cluster, gpus_per_node=1, nodes=dp * pp, network_bytes_per_s=bw)
    e = Execution(gpus=dp * pp, dp=dp, pp=pp, zero=3, fsdp_prefetch=0, micro_batch=1, global_batch=dp * m)
    one = (dp - 1) / dp * 2 * SMALL.params_per_layer() / bw
    step = llm_step(SMALL, e, cluster)
    assert step.fsdp_comm_s == pytest.approx(m * SMALL.layers // pp * 3 * one, rel=NEAR)


def test_zero3_with_prefetch_exposes_what_compute_does_not_hide(llm_cluster):
    """Compute slower than the links: only the first gather (forward) and the first gather plus the last
    reduce-scatter (backward) are exposed per micro-batch."""
    dp, bw, m = 4, 1e12, 2
    cluster = llm_cluster(gpus_per_node=1, nodes=dp, network_bytes_per_s=bw, peak_flops_per_s=1e12,
                          hbm_bytes_per_s=FASTEST)
    e = Execution(gpus=dp, dp=dp, zero=3, micro_batch=1, global_batch=dp * m)
    one = (dp - 1) / dp * 2 * SMALL.params_per_layer() / bw
    step = llm_step(SMALL, e, cluster)
    assert step.compute_s > 100 * SMALL.layers * one * m  # the regime this test is about
    assert step.fsdp_comm_s == pytest.approx(m * 3 * one, rel=1e-9)


def test_hsdp_shards_in_the_node_and_all_reduces_the_shard_across(llm_cluster):
    """HSDP 2 x 4: per-layer gathers over NVLink between the 2 shard ranks; once per iteration the embedding's
    reduce-scatter + all-gather inside and the all-reduce of each rank's gradient shard (2 P / 2 bytes) over
    the 4 replicas' rails; model state 16 P / 2 plus the gathered layers."""
    nv, net, m = 100e9, 10e9, 2
    cluster = _net_cluster(llm_cluster, gpus_per_node=2, nodes=4, nvlink_bytes_per_s=nv, network_bytes_per_s=net)
    e = Execution(gpus=8, dp=8, zero=3, hsdp_shard=2, fsdp_prefetch=0, micro_batch=1, global_batch=8 * m)
    step = llm_step(SMALL, e, cluster)
    layer, emb, total = SMALL.params_per_layer(), SMALL.embedding_params(), SMALL.params()
    assert total == SMALL.layers * layer + emb  # the parts below cover the model
    gather = 1 / 2 * 2 * layer / nv
    assert step.fsdp_comm_s == pytest.approx(m * SMALL.layers * 3 * gather, rel=NEAR)
    across = 2 * 3 / 4 * (2 * total / 2) / net
    inside = 2 * (1 / 2 * 2 * emb / nv)
    assert step.dp_comm_s == pytest.approx(across + inside, rel=1e-12)
    gathered = 1 * layer * 4
    state = 16 * total / 2
    assert step.weight_bytes + step.gradient_bytes + step.optimizer_bytes == pytest.approx(state + gathered,
                                                                                          rel=1e-12)


def test_zero3_parts_add_up_and_ranks_mode_agrees(llm_cluster):
    """The exposed gathers are a part of the iteration in both modes."""
    cluster = llm_cluster(gpus_per_node=2, nodes=4, nvlink_bytes_per_s=50e9, network_bytes_per_s=5e9,
                          hbm_bytes_per_s=2e12, offload_bytes_per_s=0.0)
    e = Execution(gpus=8, dp=4, pp=2, zero=3, micro_batch=1, global_batch=16)
    fast = llm_step(SMALL, e, cluster)
    ranks = llm_step(SMALL, e, cluster, mode="ranks")
    parts = ("compute_s", "recompute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "fsdp_comm_s",
             "optimizer_s", "offload_s")
    assert fast.fsdp_comm_s > 0
    assert sum(getattr(fast, k) for k in parts) == pytest.approx(fast.iteration_s, rel=1e-12)
    assert ranks.iteration_s == pytest.approx(fast.iteration_s, rel=1e-12)


@pytest.mark.parametrize("fields, message", [
    (dict(dp=4, zero=2, hsdp_shard=2), "execution.hsdp_shard: got 2 with zero=2"),
    (dict(dp=4, zero=3, hsdp_shard=3), "execution.hsdp_shard: got 3; must divide dp = 4"),
    (dict(dp=4, zero=3, fsdp_prefetch=-1), "execution.fsdp_prefetch: got -1; must be an integer >= 0"),
    (dict(dp=4, offload_optimizer=False, cpu_optimizer=True), "execution.cpu_optimizer: got true"),
    (dict(dp=4, offload_optimizer=True, delayed_param_update=True), "execution.delayed_param_update: got true"),
    (dict(dp=4, offload_tier="disk"), "execution.offload_tier: got 'disk'; must be one of host, nvme"),
])
def test_new_fields_one_line_errors(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Execution(gpus=4, global_batch=4, **fields)
    assert "\n" not in str(err.value)


def test_new_fields_read_from_a_file():
    e = execution_from_dict(dict(gpus=8, dp=8, zero=3, fsdp_prefetch=2, hsdp_shard=4, global_batch=8))
    assert (e.fsdp_prefetch, e.hsdp_shard, e.shard_ranks) == (2, 4, 4)
    with pytest.raises(ConfigError, match="execution.fsdp_prefetch"):
        execution_from_dict(dict(gpus=8, dp=8, zero=3, fsdp_prefetch=-2, global_batch=8))


def _timeline(gather, reduce, compute, layers, prefetch, backward):
    """A second implementation: every layer's gather, compute and reduce-scatter placed one by one on a link
    and a compute stream, with the issue rules of fsdp_exposed_s' docstring; no shortcut."""
    link = compute_free = rs_end = 0.0
    gather_end = {}
    for j in range(min(prefetch, layers)):
        link = max(link, 0.0) + gather
        gather_end[j] = link
    for i in range(layers):
        if not prefetch:
            link = max(link, compute_free) + gather
            gather_end[i] = link
        start = max(compute_free, gather_end[i])
        if prefetch and i + prefetch < layers:
            link = max(link, start) + gather
            gather_end[i + prefetch] = link
        compute_free = start + compute
        if backward:
            link = max(link, compute_free) + reduce
            rs_end = link
    return max(compute_free, rs_end) - layers * compute


def test_exposed_time_equals_the_layer_by_layer_timeline():
    """fsdp_exposed_s skips ahead once the pattern repeats; the full timeline agrees on random cases."""
    import random

    rng = random.Random(7)
    for _ in range(400):
        g, r, c = (rng.choice([rng.random(), 0.5, 1.0, 2.0]) for _ in range(3))
        k, d, bwd = rng.randint(1, 96), rng.randint(0, 4), rng.random() < 0.5
        assert fsdp_exposed_s(g, r, c, k, prefetch=d, backward=bwd) == pytest.approx(
            _timeline(g, r, c, k, d, bwd), rel=1e-9, abs=1e-12)


def test_zero3_with_offloaded_weights_fetches_and_stores_the_shard(llm_cluster):
    """ZeRO-3 + weight offload (ZeRO-Infinity's parameter offload): each rank fetches its 2 P / dp bytes in
    forward and again in backward (no compute to hide them) and stores that shard in the tier; the gathered
    layers stay in HBM."""
    dp, link, m = 4, 5e9, 2
    cluster = _net_cluster(llm_cluster, gpus_per_node=dp, nodes=1, offload_bytes_per_s=link)
    base = dict(gpus=dp, dp=dp, zero=3, micro_batch=1, global_batch=dp * m)
    resident = llm_step(SMALL, Execution(**base), cluster)
    step = llm_step(SMALL, Execution(**base, offload_weights=True), cluster)
    shard = 2 * SMALL.params() / dp
    assert step.offload_s == pytest.approx(m * 2 * shard / link, rel=NEAR)
    assert step.offloaded_bytes == pytest.approx(shard, rel=1e-12)
    assert resident.device_bytes - step.device_bytes == pytest.approx(shard, rel=1e-12)


def test_zero3_shards_dense_weights_over_the_dp_x_cp_group(llm_cluster):
    """With context parallelism the CP ranks hold the same weights, so ZeRO-3 shards them over the ``dp x cp``
    replicas: each per-layer gather and reduce-scatter is a ring over dp cp = 4 ranks, not over dp = 2, and
    the stored weights are 2 P / 4 bytes."""
    dp, cp, bw, m = 2, 2, 10e9, 2
    cluster = _net_cluster(llm_cluster, gpus_per_node=1, nodes=dp * cp, network_bytes_per_s=bw)
    e = Execution(gpus=dp * cp, dp=dp, cp=cp, zero=3, fsdp_prefetch=0, micro_batch=1, global_batch=dp * m)
    one = (dp * cp - 1) / (dp * cp) * 2 * SMALL.params_per_layer() / bw
    step = llm_step(SMALL, e, cluster)
    assert step.fsdp_comm_s == pytest.approx(m * SMALL.layers * 3 * one, rel=NEAR)
    gathered = 1 * SMALL.params_per_layer() * 2
    assert step.weight_bytes == pytest.approx(2 * SMALL.params() / (dp * cp) + gathered, rel=1e-12)


def test_zero3_bytes_follow_the_run_precision(llm_cluster):
    """ZeRO-3 at fp32: each per-layer gather and reduce-scatter moves 4 bytes per parameter (twice bf16's), the
    stored shard and the gathered layer hold 4-byte weights and the sharded Adam state 8 bytes (no master copy)."""
    dp, bw, m = 4, 10e9, 2
    cluster = _net_cluster(llm_cluster, gpus_per_node=1, nodes=dp, network_bytes_per_s=bw)
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(
        cluster.device, peak_flops_per_s={**cluster.device.peak_flops_per_s, "fp32": FAST}))
    e = Execution(gpus=dp, dp=dp, zero=3, fsdp_prefetch=0, micro_batch=1, global_batch=dp * m)
    one = (dp - 1) / dp * 4 * SMALL.params_per_layer() / bw
    step = llm_step(SMALL, e, cluster, precision="fp32")
    assert step.fsdp_comm_s == pytest.approx(m * SMALL.layers * 3 * one, rel=NEAR)
    assert step.weight_bytes == pytest.approx(4 * SMALL.params() / dp + 4 * SMALL.params_per_layer(), rel=1e-12)
    assert step.optimizer_bytes == pytest.approx(8 * SMALL.params() / dp, rel=1e-12)
