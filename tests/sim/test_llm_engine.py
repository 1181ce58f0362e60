"""Engine mode for LLMs (sim/llm_lower.py): the lowered programs on the contention-aware engine against the
analytical model, a contention case computed by hand, and the analytical per-link floor (sim/llm_floor.py)."""

from __future__ import annotations

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.sim.llm import llm_step, rank_traffic, stage_costs
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
    ("gh200", dict(gpus=4, tp=1, pp=4, dp=1, micro_batch=1, global_batch=4)),
]


@pytest.mark.parametrize(("system", "fields"), _NO_SHARED_LINK)
def test_engine_equals_the_analytical_model_without_a_shared_link(system: str, fields: dict[str, object]) -> None:
    """With no link carrying two classes at once (no offload; every stage one node), the engine's iteration equals the closed form and the per-rank
    schedule to 1e-9, and reports no contention."""
    spec = _GPT3 if system != "gh200" else preset("megatron-1.7b")
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    got = engine_step(spec, e, cluster)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster).iteration_s, rel=1e-9)
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster, mode="ranks").iteration_s, rel=1e-9)
    assert got.contention_s == pytest.approx(0.0, abs=1e-9 * got.iteration_s)


def test_lowering_folds_the_data_parallel_replicas_of_a_node() -> None:
    """One pipeline is simulated; a rank stands for the dp replicas on its node, mirrored on their GPUs; the
    replicas on other nodes are left out, and only the nodes in use are expanded."""
    e = Execution(gpus=32, tp=4, pp=2, dp=4, micro_batch=1, global_batch=8)
    lowered = lower(_GPT3, e, load_cluster("dgx-h100").for_gpus(32))
    assert sorted(p.rank for p in lowered.programs) == [0, 1, 2, 3, 16, 17, 18, 19]
    assert lowered.fold == 2 and {p.fold for p in lowered.programs} == {2}
    assert lowered.devices[16] == "n1.gpu0" and lowered.mirrors[16] == ("n1.gpu4",)
    assert len(lowered.system.devices) == 16


def test_gh200_c2c_and_grace_memory_shared_by_offload_and_weight_fetch() -> None:
    """GH200, one GPU, one micro-batch, activations and weights offloaded: in the forward the activations go
    out while the weights come in, both through Grace's LPDDR5X (500 GB/s for both directions together) behind
    the 450 GB/s-each-way C2C; in the backward both come in over the C2C. Max-min by hand: two flows share the
    bottleneck equally until the smaller ends, then the other runs alone."""
    spec = preset("megatron-1.7b")
    e = Execution(gpus=1, tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, offload_activations=True,
                  offload_weights=True)
    cluster = load_cluster("gh200").for_gpus(1)
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
    ("gb200-nvl72-memnode", dict(gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=2,
                                 offload_activations=True, offload_weights=True)),
]


@pytest.mark.parametrize(("system", "fields"), _SMALL)
def test_analytical_floor_is_never_below_the_engine(system: str, fields: dict[str, object]) -> None:
    """The analytical path with its per-link floor is at least the engine's time minus 1% on small cases
    with shared links (offload with pipeline sends on PCIe, weights and activations on C2C and NVLink)."""
    spec = _GPT3 if system == "dgx-h100" else preset("megatron-1.7b")
    e = Execution(**fields)  # type: ignore[arg-type]
    cluster = load_cluster(system).for_gpus(e.gpus)
    assert llm_step(spec, e, cluster).iteration_s >= 0.99 * engine_step(spec, e, cluster).iteration_s
