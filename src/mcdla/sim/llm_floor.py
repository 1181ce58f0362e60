"""The per-link floor of the analytical LLM model: no shared resource is priced as idle.

The closed form of :mod:`mcdla.sim.llm` prices each traffic class on its own: the offload against the compute
it hides behind, the TP collectives and the pipeline sends on idle links. Links that two classes cross (a DGX
H100 GPU's PCIe x16 carries its offload and its NIC's GPUDirect RDMA; a memory-node rack's NVLink ports carry
TP all-reduces and prefetches; a GH200's C2C carries every offload of its GPU) are then never priced as busy
with both. :func:`link_floor_s` is one micro-batch's time on one stage where each phase takes at least what
its busiest such resource needs, from the bytes each class moves per micro-batch (:class:`~mcdla.sim.llm.RankTraffic`) and the resources each
class crosses (:attr:`Cluster.paths <mcdla.hardware.cluster.Cluster.paths>`, :mod:`mcdla.hardware.traffic`).

NOTE [link floor]
Per micro-batch and phase (forward, backward), one GPU of a stage moves, each way:

* ``offload``: in the forward the stage's activations out (``offload_activations``) and its weights in
  (``offload_weights``); in the backward the activations and the weights in;
* ``scale-up``: the bandwidth term of its TP collectives (``2 n`` per phase, ``4 n`` in a fully recomputed
  backward, per stage of ``n`` layers: what each one moves through the GPU's port, the collective's time at twice its bytes minus
  its time at its bytes, times the port's bandwidth), and the pipeline sends and receives when neighbouring
  stages share a node;
* ``scale-out``: the pipeline's ``v`` sends and ``v`` receives per phase when neighbouring stages are on other
  nodes.

A resource crossed by ``g`` GPUs of the node, each sending the fraction ``f`` of a class through it, is busy
``bytes g f / capacity`` per class (NOTE [symmetric closed form] in :mod:`mcdla.hardware.traffic`); a link's two
directions are apart, a memory's are one bus. Each phase takes the larger of the closed form's time for it and
its busiest resource's; :func:`mcdla.sim.llm.llm_step` stretches a stage's micro-batch to the sum and counts the
stretch as exposed offload. The data-parallel
reduction runs once per iteration and is not in the per-micro-batch floor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcdla.sim.collective_models import collective_time
from mcdla.workload.parallel_dims import ParallelDims

if TYPE_CHECKING:  # sim.llm calls this module; the types only
    from mcdla.hardware.cluster import Cluster
    from mcdla.sim.llm import RankTraffic, StageCosts
    from mcdla.workload.execution import Execution

__all__ = ["class_bytes_per_micro_batch", "link_floor_s"]


def class_bytes_per_micro_batch(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                                ) -> dict[str, dict[str, tuple[float, float]]]:
    """Bytes one GPU of a stage moves per micro-batch, per phase (``forward``, ``backward``), ``(out, in)`` per
    traffic class (NOTE [link floor])."""
    e = execution
    moved: dict[str, dict[str, list[float]]] = {"forward": {}, "backward": {}}

    def add(phase: str, cls: str, out: float, inward: float) -> None:
        got = moved[phase].setdefault(cls, [0.0, 0.0])
        got[0] += out
        got[1] += inward

    if cluster.offload is not None:
        act = traffic.stage_activation_bytes if e.offload_activations else 0.0
        weights = traffic.weight_bytes if e.offload_weights else 0.0
        add("forward", "offload", act, weights)
        add("backward", "offload", 0.0, act + weights)
    layout = ParallelDims.of(e)
    dims = cluster.group_dims(layout.tp, layout.stride("tp"))
    if dims:
        n = traffic.activation_bytes
        kinds = ("all-gather", "reduce-scatter") if e.sequence_parallel else ("all-reduce",)
        per_call = sum(collective_time(k, 2 * n, dims) - collective_time(k, n, dims) for k in kinds)
        per_call_bytes = per_call * dims[0].bytes_per_s
        for phase, calls in (("forward", 2), ("backward", 4 if e.recompute == "full" else 2)):
            tp_bytes = costs.layers_per_stage * calls * per_call_bytes
            add(phase, "scale-up", tp_bytes, tp_bytes)
    if e.pp > 1:
        sends = e.virtual_stages * traffic.p2p_bytes
        within = layout.stride("pp") < cluster.gpus_per_node and cluster.scale_up is not None
        for phase in ("forward", "backward"):
            add(phase, "scale-up" if within else "scale-out", sends, sends)
    return {phase: {cls: (o, i) for cls, (o, i) in by_cls.items()} for phase, by_cls in moved.items()}


def _busiest_s(cluster: Cluster, moved: dict[str, tuple[float, float]]) -> float:
    """Seconds the busiest resource of a GPU's paths needs for ``moved`` (``(out, in)`` bytes per class)."""
    busy: dict[tuple[str, ...], list[float]] = {}
    duplex: dict[tuple[str, ...], bool] = {}
    for path in cluster.paths:
        out, inward = moved.get(path.traffic, (0.0, 0.0))
        for res in path.resources:
            if res.resource[0] == "hbm":  # the GPU's own memory: the compute's, priced by the cost model
                continue
            per_byte = res.load_s_per_byte()
            load = busy.setdefault(res.resource, [0.0, 0.0])
            load[0] += out * per_byte
            load[1] += inward * per_byte
            duplex[res.resource] = res.duplex
    return max((max(o, i) if duplex[r] else o + i for r, (o, i) in busy.items()), default=0.0)


def link_floor_s(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic) -> float:
    """One micro-batch on one stage with no shared resource priced as idle: each phase (forward, backward) takes
    at least what its busiest resource needs (NOTE [link floor]); at least the closed form's stage time."""
    e, c = execution, costs
    n, v = c.layers_per_stage, e.virtual_stages
    phase_s = {"forward": n * (c.layer_fwd_s + c.layer_tp_fwd_s) + v * c.p2p_s + c.offload_fwd_s,
               "backward": n * (c.layer_bwd_s + c.layer_recompute_s + c.layer_tp_bwd_s) + v * c.p2p_s
               + c.offload_bwd_s}
    moved = class_bytes_per_micro_batch(e, cluster, c, traffic)
    return sum(max(phase_s[phase], _busiest_s(cluster, moved[phase])) for phase in phase_s)
