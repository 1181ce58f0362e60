"""The per-link floor of the analytical LLM model: no shared resource is priced as idle.

The closed form of :mod:`mcdla.sim.llm` prices each traffic class on its own: the offload against the compute
it hides behind, the TP collectives and the pipeline sends on idle links. Links that two classes cross (a DGX
H100 GPU's PCIe x16 carries its offload and its NIC's GPUDirect RDMA; a memory-node rack's NVLink ports carry
TP all-reduces and prefetches; a GH200's C2C carries every offload of its GPU) are then never priced as busy
with both. :func:`link_floor_s` is one micro-batch's time on one stage where each phase takes at least
what its flows need on such resources shared max-min fairly, from the bytes each class moves per micro-batch
(:class:`~mcdla.sim.llm.RankTraffic`) and the resources each class crosses (:attr:`Cluster.paths
<mcdla.hardware.cluster.Cluster.paths>`, :mod:`mcdla.hardware.traffic`).

NOTE [link floor]
Per micro-batch and phase (forward, backward), one GPU of a stage moves, each way:

* ``offload``: in the forward the stage's activations out (``offload_activations``) and its weights in
  (``offload_weights``); in the backward the activations and the weights in;
* ``scale-up``: the bandwidth term of its TP collectives (``2 n`` per phase, ``4 n`` in a fully recomputed
  backward, per stage of ``n`` layers: what each one moves through the GPU's port, its bandwidth term times the
  port's bandwidth), and the pipeline sends and receives when neighbouring
  stages share a node;
* ``scale-out``: the pipeline's ``v`` sends and ``v`` receives per phase when neighbouring stages are on other
  nodes;
* context parallelism: the ring's K/V sends and receives (``cp - 1`` per layer in the forward, ``2 (cp - 1)``
  in the backward, ``cp - 1`` more with a recomputed attention) on the class of the CP group's outermost
  dimension (a GPU whose hop leaves the node sends them through its NIC), or the all-gathers and
  reduce-scatter per fabric dimension;
  expert parallelism: the all-to-alls' bytes per fabric dimension of the EP group (NOTE [collective closed
  forms]: the traffic whose highest differing level is that dimension), ``2`` per mean MoE layer in the
  forward, ``2`` (``4`` with full recompute) in the backward;
* ZeRO-3: each layer's gathers in the forward and again in the backward, its reduce-scatters in the backward,
  per fabric dimension of the shard group (flows of their own, :func:`zero3_bytes_per_micro_batch`).

Each class's bytes one way are one flow; the phase's flows start together and drain max-min fairly (NOTE [fair
drain]). Each phase takes the larger of its drain and the closed form's time for it, the latter plus what the
copies slow ZeRO-3's collectives (their end with the copies less their end without: the layers wait for
them); on a single stage that time includes its logits and loss, which the copies also run beside (the
engine's chunk holds them), and is taken off the floor again; :func:`mcdla.sim.llm.llm_step` stretches a
stage's micro-batch to the sum and counts the stretch as exposed offload.

The data-parallel reduction runs once per iteration. Overlapped with the last backward (``dp_overlap``), it shares
that backward's resources: its bytes (per fabric dimension of each reduction group, :func:`reduction_bytes`;
ZeRO-3's once-per-iteration collectives) are flows beside the backward's, and when the drain of both ends beyond
the backward's closed-form time, the difference is the least the reduction exposes (``LinkFloors.dp_exposed_s``;
a DGX H100's x16 carries the prefetch and the NIC's all-reduce). The reduction's collectives also run one after
another, each its phases in turn (an in-node phase leaves the NIC idle): so it takes at least its closed-form
time plus what the backward's flows slow it (its flows' end beside them less their end alone), beside the whole
pass (its closed-form hiding pass with the pass's exposed copies and stretch). Each stage's reduction starts with its own last
backward (the engine's rule), so on each of the ``p - 1`` stages after the first it slows a pass on the
iteration's critical path: by how much later that pass's communication ends beside it (its copies: beyond the
pass), ``LinkFloors.last_backward_s`` (one chunk's share with interleaving).

Without offload no stage stretch applies (the closed form prices each class on its own link there), only the
reduction's part, on the engine's schedule: the pass's layer communication (CP ring or all-gathers, EP
all-to-alls, TP collectives; not the pipeline send, which the first stage's last backward does not make, nor TP
calls beside the GEMMs that hide them) starts after the pass's compute and runs until the closed-form pass
ends; beside it drain the bytes the reduction moves in that window, its all-reduces' phases as late as they run,
one group after another (a hierarchical one's in-node reduce-scatter, the all-reduce across nodes, the in-node
all-gather last), ZeRO-3's once-per-iteration collectives spread evenly over their time. The first stage then
ends with the later of its reduction and its own pass, slowed as the others' are. Where no flow ends later for
it (or no resource carries both), both floors are 0: the iteration is the closed form's.

Under ZeRO-3 the pass's per-layer gathers and reduce-scatters share the links with the reduction too
(:func:`mcdla.sim.llm_floor_zero3.zero3_beside`): the reduction starts with the pass and has the logits' backward to itself, then the
layers run beside what it has left, stepped as the engine issues their collectives (:func:`~mcdla.sim.llm_floor_zero3.layers_beside`)
and at least as late as all their bytes drained beside it from the layers' start; the chunk's TP, CP and EP
calls follow the layers beside what is still left. What the pass ends beyond its closed form slows each
stage's pass, the larger of this and the layer communication's part counting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from mcdla.hardware.cluster import FabricDim
from mcdla.sim.collective_models import collective_time
from mcdla.sim.llm_floor_drain import _DRAINED, Ends, Flow, _drain_ends, _flows, _PathTable, _table
from mcdla.workload.memo import slot_init
from mcdla.workload.parallel_dims import group_strides

if TYPE_CHECKING:  # sim.llm calls this module; the types only

    from mcdla.hardware.cluster import Cluster
    from mcdla.sim.llm import RankTraffic, StageCosts, Zero3Traffic
    from mcdla.workload.execution import Execution

__all__ = ["LinkFloors", "class_bytes_per_micro_batch", "link_floor_s", "link_floors", "reduction_bytes",
           "zero3_bytes_per_micro_batch"]


def class_bytes_per_micro_batch(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                                *, sends: bool = True, tp: bool = True) -> dict[str, dict[str, tuple[float, float]]]:
    """Bytes one GPU of a stage moves per micro-batch, per phase (``forward``, ``backward``), ``(out, in)`` per
    traffic class (NOTE [link floor]), ZeRO-3's per-layer collectives apart (:func:`zero3_bytes_per_micro_batch`);
    ``sends=False`` leaves the pipeline's sends out, ``tp=False`` the TP collectives."""
    moved = _class_bytes(execution, cluster, costs, traffic, sends=sends, tp=tp)
    return {phase: {cls: (o, i) for cls, (o, i) in by_cls.items()} for phase, by_cls in moved.items()}


def _class_bytes(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                 *, sends: bool = True, tp: bool = True) -> dict[str, dict[str, list[float]]]:
    """:func:`class_bytes_per_micro_batch` as ``[out, in]`` lists, which :func:`_flows` reads as they are (the
    floor asks this once or twice per evaluation). Each class's bytes are sums from 0.0 in the order the classes
    come (offload, TP, pipeline sends, CP, EP), the first add of a class making its entry: the order of a
    phase's classes is the order of its flows."""
    e = execution
    fwd: dict[str, list[float]] = {}
    bwd: dict[str, list[float]] = {}

    def add(by_cls: dict[str, list[float]], cls: str, out: float, inward: float) -> None:
        got = by_cls.get(cls)
        if got is None:
            by_cls[cls] = [0.0 + out, 0.0 + inward]
        else:
            got[0] += out
            got[1] += inward

    if cluster.offload is not None:  # the first class of each phase
        act, weights = traffic.offload_activation_bytes, traffic.offload_weight_bytes
        fwd["offload"] = [0.0 + act, 0.0 + weights]
        bwd["offload"] = [0.0, 0.0 + (act + weights)]
    n = costs.layers_per_stage
    if tp:  # scale-up's first bytes (only offload comes before)
        per_call = _tp_call(e, cluster, traffic)[0]
        tp_bytes = n * 2.0 * per_call
        if tp_bytes > 0:
            fwd["scale-up"] = [0.0 + tp_bytes, 0.0 + tp_bytes]
        tp_bytes = n * (2 + 2 * costs.recomputed_share) * per_call
        if tp_bytes > 0:
            bwd["scale-up"] = [0.0 + tp_bytes, 0.0 + tp_bytes]
    if e.pp > 1 and sends:
        pp_stride = group_strides(e.tp, e.cp, e.dp, e.pp, e.ep)[1]
        p2p = e.virtual_stages * traffic.p2p_bytes
        cls = "scale-up" if pp_stride < cluster.gpus_per_node and cluster.scale_up is not None else "scale-out"
        add(fwd, cls, p2p, p2p)
        add(bwd, cls, p2p, p2p)
    if e.cp == 1 and (e.ep == 1 or not traffic.all_to_all_bytes):
        return {"forward": fwd, "backward": bwd}
    _tp_stride, _pp_stride, cp_stride, ep_stride = group_strides(e.tp, e.cp, e.dp, e.pp, e.ep)
    moved = {"forward": fwd, "backward": bwd}
    recomputes = e.recomputes_attention
    calls: list[tuple[str, str, float, tuple[FabricDim, ...]]] = []  # (phase, kind, bytes, dimensions)
    if e.cp > 1:
        dims = cluster.group_dims(e.cp, cp_stride)
        if e.cp_comm == "p2p":
            for phase, steps in (("forward", e.cp - 1), ("backward", (e.cp - 1) * (3 if recomputes else 2))):
                ring = n * steps * traffic.kv_block_bytes
                add(moved[phase], _dim_class(cluster, dims[-1]), ring, ring)
        else:
            gathered = n * e.cp * traffic.kv_block_bytes
            calls += [("forward", "all-gather", gathered, dims),
                      ("backward", "all-gather", gathered * (2 if recomputes else 1), dims),
                      ("backward", "reduce-scatter", gathered, dims)]
    if e.ep > 1 and traffic.all_to_all_bytes:
        dims = cluster.group_dims(e.ep, ep_stride)
        per_layer = n * traffic.moe_layer_share * traffic.all_to_all_bytes
        calls += [("forward", "all-to-all", 2 * per_layer, dims),
                  ("backward", "all-to-all", (4 if e.recompute == "full" else 2) * per_layer, dims)]
    for phase, kind, nbytes, dims in calls:
        for cls, moved_bytes in _dims_bytes(cluster, kind, nbytes, dims).items():
            add(moved[phase], cls, moved_bytes, moved_bytes)
    return moved


def _tp_call(execution: Execution, cluster: Cluster, traffic: RankTraffic, *, timed: bool = False,
             ) -> tuple[float, float]:
    """One layer's TP call (an all-reduce, or with SP its all-gather + reduce-scatter pair): the bytes one GPU
    moves each way through its TP group's dimensions and (``timed``) its closed-form time; 0 with no TP group."""
    e = execution
    tp_stride = group_strides(e.tp, e.cp, e.dp, e.pp, e.ep)[0]
    kinds = ("all-gather", "reduce-scatter") if e.sequence_parallel else ("all-reduce",)
    # the bytes per byte of buffer depend on the group alone: kept in the cluster's model_memo (None: no group)
    key = (_TP_KEY, e.tp, tp_stride, e.sequence_parallel)
    memo = cluster.model_memo
    if key in memo:
        per_byte = memo[key]
    else:
        dims = cluster.group_dims(e.tp, tp_stride)
        per_byte = memo[key] = sum(_level_bytes_per_byte(k, dims)[0] for k in kinds) if dims else None
    if per_byte is None:
        return 0.0, 0.0
    nbytes = traffic.activation_bytes
    return (nbytes * per_byte,  # type: ignore[operator]
            sum(collective_time(k, nbytes, cluster.group_dims(e.tp, tp_stride)) for k in kinds) if timed else 0.0)


_TP_KEY = "floor-tp-bytes"
"""The first item of :func:`_tp_call`'s keys in a cluster's ``model_memo``."""


def zero3_bytes_per_micro_batch(cluster: Cluster, costs: StageCosts, zero3: Zero3Traffic,
                                ) -> dict[str, dict[str, tuple[float, float]]]:
    """Bytes one GPU of a stage moves per micro-batch in ZeRO-3's per-layer collectives, per phase and class,
    ``(out, in)`` (NOTE [link floor]): each layer's gathers in the forward and again in the backward, its
    reduce-scatters in the backward."""
    moved: dict[str, dict[str, tuple[float, float]]] = {"forward": {}, "backward": {}}
    for coll, phases in [*((g, ("forward", "backward")) for g in zero3.gathers),
                         *((r, ("backward",)) for r in zero3.reduces)]:
        nbytes = costs.layers_per_stage * coll.nbytes
        for cls, got in _dims_bytes(cluster, coll.kind, nbytes, cluster.group_dims(coll.size, coll.stride)).items():
            for phase in phases:
                out, inward = moved[phase].get(cls, (0.0, 0.0))
                moved[phase][cls] = (out + got, inward + got)
    return moved


def _phase_s(execution: Execution, costs: StageCosts) -> dict[str, float]:
    """The closed form's time of one micro-batch's forward and backward on the last stage, without its logits
    (its layers' compute and TP, CP and EP communication, its pipeline transfers, the exposed offload)."""
    c, v = costs, execution.virtual_stages
    last = execution.pp - 1  # the stage the closed form's steady state runs
    # each kind of layer at its own figures (NOTE [layer kinds] in mcdla.sim.llm)
    kinds = c.kinds(c.layers_per_stage, c.stage_dense(last))
    return {"forward": sum(n * (x.layer_fwd_s + x.layer_comm_fwd_s) for x, n in kinds)
            + c.pass_sends_s(last, v, forward=True) + c.offload_fwd_s + c.fsdp_fwd_s,
            "backward": sum(n * (x.layer_bwd_s + x.layer_recompute_s + x.layer_comm_bwd_s) for x, n in kinds)
            + c.pass_sends_s(last, v, forward=False) + c.offload_bwd_s + c.fsdp_bwd_s}


def _single_stage_head_s(execution: Execution, costs: StageCosts) -> dict[str, float]:
    """The logits' and loss's time of each phase on a single stage, which the copies also run beside (the phase's
    floor is taken with it, then it is taken off again: the closed form adds it after the floor); 0 with several
    stages, whose closed form charges the last stage's copies as the others'."""
    if execution.pp > 1:
        return {"forward": 0.0, "backward": 0.0}
    return {"forward": costs.last_fwd_s, "backward": costs.last_bwd_s}


def link_floor_s(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                 zero3: Zero3Traffic | None = None) -> float:
    """One micro-batch on one stage with no shared resource priced as idle: each phase (forward, backward) takes
    at least what its flows need sharing the resources fairly, and its closed-form time plus what the copies
    slow ZeRO-3's collectives (NOTE [link floor]); ``zero3``: a ZeRO-3 execution's collectives."""
    phase_s = _phase_s(execution, costs)
    flows = _phase_flows(execution, cluster, costs, traffic, zero3)
    table = _table(cluster, execution.gpus)
    head = _single_stage_head_s(execution, costs)
    return sum(_phase_floor_s(table, phase_s[phase], flows[phase], head_s=head[phase]) for phase in phase_s)


def _phase_flows(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                 zero3: Zero3Traffic | None) -> dict[str, dict[tuple[str, str, int], Flow]]:
    """Each phase's flows (:func:`_flows`): one per class and way, ZeRO-3's per-layer collectives tagged
    ``fsdp``."""
    moved = _class_bytes(execution, cluster, costs, traffic)
    if zero3 is None:
        return {phase: _flows(by_cls) for phase, by_cls in moved.items()}
    gathered = zero3_bytes_per_micro_batch(cluster, costs, zero3)
    return {phase: {**_flows(moved[phase]), **_flows(gathered.get(phase, {}), "fsdp")} for phase in moved}


def _phase_floor_s(table: _PathTable, phase_s: float, flows: dict[tuple[str, str, int], Flow],
                   ends: dict[tuple[str, str, int], float] | None = None, *, zero3: bool = True,
                   head_s: float = 0.0) -> float:
    """A phase's floor: its flows drained fairly on ``table`` (``ends``, where the caller drained them already),
    and its closed-form time ``phase_s`` plus what the copies slow ZeRO-3's collectives, which the layers wait for
    (NOTE [link floor]); ``zero3=False``: no ZeRO-3 flows among them (none looked for); ``head_s``: the single
    stage's logits and loss the flows also run beside, taken off the floor again."""
    if ends is None:
        ends = _drain_ends(table, flows)
    slowed = 0.0
    if zero3 and any(key[0] == "fsdp" for key in flows) and any(key[1] == "offload" for key in flows):
        alone = _drain_ends(table, {key: flow for key, flow in flows.items() if key[1] != "offload"})
        slowed = max(0.0, *(ends[key] - alone[key] for key in flows if key[0] == "fsdp"))
    drained = max(ends.values()) if ends else 0.0
    return drained - head_s if drained > phase_s + head_s + slowed else phase_s + slowed


def reduction_bytes(execution: Execution, cluster: Cluster, traffic: RankTraffic,
                    zero3: Zero3Traffic | None = None) -> dict[str, float]:
    """Bytes one GPU moves each way per traffic class in the data-parallel reduction: per reduction group
    (:attr:`~mcdla.sim.llm.RankTraffic.gradient_groups`) and fabric dimension it spans, the all-reduce's bytes
    there (:func:`_dims_bytes`); under ZeRO-3 (``zero3``) its once-per-iteration collectives' instead."""
    calls = ([(c.kind, c.nbytes, c.size, c.stride) for c in zero3.step] if zero3 is not None else
             [("all-reduce", nbytes, size, stride) for nbytes, size, stride in traffic.gradient_groups])
    moved: dict[str, float] = {}
    for kind, nbytes, size, stride in calls:
        for cls, per_bytes in _group_levels(cluster, kind, size, stride):
            got = 0.0  # the group's bytes in this class, summed as _dims_bytes sums them
            for per_byte in per_bytes:
                got += nbytes * per_byte
            moved[cls] = moved.get(cls, 0.0) + got
    return moved


def _reduction_flows(execution: Execution, cluster: Cluster, traffic: RankTraffic,
                     zero3: Zero3Traffic | None) -> dict[tuple[str, str, int], Flow]:
    """The reduction's flows, one per class and way of :func:`reduction_bytes` keyed ``("dp", class, way)`` (as
    :func:`_flows` keys them). Without ZeRO-3 they depend on the reduction groups' bytes alone, so they are kept
    in the cluster's ``model_memo`` by :attr:`~mcdla.sim.llm.RankTraffic.gradient_groups` (many executions of a
    search share them); callers only read the answer."""
    key = (_DP_FLOWS_KEY, traffic.gradient_groups) if zero3 is None else None
    if key is not None:
        got = cluster.model_memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
    reduced = reduction_bytes(execution, cluster, traffic, zero3)
    dp = {("dp", cls, way): (cls, way, b) for cls, b in reduced.items() if b > 0 for way in (0, 1)}
    if key is not None:
        cluster.model_memo[key] = dp
    return dp


_DP_FLOWS_KEY = "floor-dp-flows"
"""The first item of :func:`_reduction_flows`' keys in a cluster's ``model_memo``."""


def _reduction_alone(cluster: Cluster, table: _PathTable, traffic: RankTraffic,
                     dp: dict[tuple[str, str, int], Flow], zero3: Zero3Traffic | None) -> Ends:
    """The ends of the reduction's flows ``dp`` (:func:`_reduction_flows`) drained alone on ``table``, the job's
    path table on ``cluster`` (:func:`_table`). Without ZeRO-3 they depend on the table and the reduction groups'
    bytes alone, so they are kept in the cluster's ``model_memo`` beside the flows; callers only read the answer."""
    key = (_DP_ALONE_KEY, table, traffic.gradient_groups) if zero3 is None else None  # a partly used node's own
    if key is not None:
        got = cluster.model_memo.get(key)
        if got is not None:
            return got  # type: ignore[return-value]
    ends = _drain_ends(table, dp)
    if key is not None:
        cluster.model_memo[key] = ends
    return ends


_DP_ALONE_KEY = "floor-dp-alone"
"""The first item of :func:`_reduction_alone`' keys in a cluster's ``model_memo``."""


def _group_levels(cluster: Cluster, kind: str, size: int, stride: int) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """Per traffic class (in the order of the group's fabric dimensions), the bytes each GPU moves each way per
    byte of a ``kind`` buffer on each of the group's dimensions of that class (:func:`_level_bytes_per_byte`);
    they depend on the group alone, so they are kept in the cluster's ``model_memo``."""
    key = (_LEVELS_KEY, kind, size, stride)
    got = cluster.model_memo.get(key)
    if got is None:
        dims = cluster.group_dims(size, stride)
        by_cls: dict[str, list[float]] = {}
        for dim, per_byte in zip(dims, _level_bytes_per_byte(kind, dims) if dims else ()):
            by_cls.setdefault(_dim_class(cluster, dim), []).append(per_byte)
        got = cluster.model_memo[key] = tuple((cls, tuple(per)) for cls, per in by_cls.items())
    return got  # type: ignore[return-value]


_LEVELS_KEY = "floor-group-levels"
"""The first item of :func:`_group_levels`' keys in a cluster's ``model_memo``."""


def _dim_class(cluster: Cluster, dim: FabricDim) -> str:
    """The traffic class of a fabric dimension: ``scale-up`` for the NVLink domain, ``scale-out`` beyond."""
    up = cluster.scale_up
    return "scale-up" if up is not None and dim.name == up.name else "scale-out"


def _dims_bytes(cluster: Cluster, kind: str, nbytes: float, dims: tuple[FabricDim, ...]) -> dict[str, float]:
    """Bytes one GPU moves each way per traffic class in a ``kind`` collective of ``nbytes`` on ``dims``: per
    dimension, the bandwidth term of the collective (:func:`_level_bytes_per_byte`) in that dimension's class."""
    moved: dict[str, float] = {}
    for dim, per_byte in zip(dims, _level_bytes_per_byte(kind, dims) if dims else ()):
        cls = _dim_class(cluster, dim)
        moved[cls] = moved.get(cls, 0.0) + nbytes * per_byte
    return moved


_PROBE_BYTES = 1e9
"""Buffer at which :func:`_level_bytes_per_byte` reads the closed forms (they are linear in the bytes)."""


@lru_cache(maxsize=4096)
def _level_bytes_per_byte(kind: str, dims: tuple[FabricDim, ...]) -> tuple[float, ...]:
    """Bytes each GPU moves each way through each of ``dims`` per byte of a ``kind`` buffer: the collective's
    time less its time with that dimension twice as fast, doubled (its bandwidth term), times the dimension's
    bandwidth. Memoized: a search asks a handful of (kind, dimensions) pairs."""
    n = _PROBE_BYTES
    base = collective_time(kind, n, dims)
    out = []
    for i, dim in enumerate(dims):
        faster = (*dims[:i], dataclasses.replace(dim, bytes_per_s=2 * dim.bytes_per_s), *dims[i + 1:])
        out.append(2 * (base - collective_time(kind, n, faster)) * dim.bytes_per_s / n)
    return tuple(out)




def _after_compute(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                   own: dict[tuple[str, str, int], Flow], dp: dict[tuple[str, str, int], Flow],
                   zero3: Zero3Traffic | None, *, last: bool = False) -> tuple[Ends, Ends, Ends] | None:
    """Without offload, the ends (from the reduction's start) of the last backward pass's layer communication
    ``own`` alone, of the reduction's flows ``dp`` alone, and of both: the pass communicates after its compute
    (:func:`_compute_before_comm_s`) up to its closed-form end, beside what the reduction moves meanwhile
    (:func:`_reduction_between`; ZeRO-3's once-per-iteration collectives spread evenly over their time); None
    when the reduction moves nothing then; ``last``: the last stage's pass (the logits' backward first)."""
    crossed = _resources_by_class(cluster)
    if not any(crossed.get(a, set()) & crossed.get(b, set()) for a, _way, _n in own.values()
               for b, _to, _m in dp.values()):
        return None  # on resources of their own
    table = _table(cluster, execution.gpus)
    start = _compute_before_comm_s(execution, costs, last=last)
    alone = {key: start + end for key, end in _drain_ends(table, own).items()}
    until = max(costs.dp_hidden_s, max(alone.values(), default=start))  # its latencies and ring steps in it
    if zero3 is None:
        during = _reduction_between(cluster, traffic, costs.dp_full_s, start, until)
    else:
        share = max(0.0, min(costs.dp_full_s, until) - start) / costs.dp_full_s
        during = {cls: got * share for cls, _way, got in dp.values()}
    left = {key: (cls, way, during[cls]) for key, (cls, way, _got) in dp.items() if during.get(cls, 0.0) > 0}
    if not left:
        return None
    apart = {**{key: start for key in dp}, **{key: start + end for key, end in _drain_ends(table, left).items()}}
    ends = {**apart, **{key: start + end for key, end in _drain_ends(table, {**own, **left}).items()}}
    return alone, apart, ends


def _tp_beside(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
               dp: dict[tuple[str, str, int], Flow]) -> tuple[float, float] | None:
    """Without offload, the TP calls of the last backward chunk beside its GEMMs (``tp_comm_overlap``): the engine
    runs their latencies, then the calls, from the pass's start, when the overlapped reduction starts too, so
    they drain beside what the reduction moves meanwhile, its phases as early as they run (a hierarchical one's
    in-node reduce-scatter first). How much later the reduction's flows end for them, and how much longer the
    chunk is (the calls' end past the GEMMs less the closed form's); None where no resource carries both."""
    e, c = execution, costs
    per_byte, call_s = _tp_call(e, cluster, traffic, timed=True)
    calls = c.layers_per_stage / e.virtual_stages * (2 + 2 * c.recomputed_share)
    own = _flows({"scale-up": (calls * per_byte,) * 2}, "tp")
    crossed = _resources_by_class(cluster)
    if not own or not any(crossed.get("scale-up", set()) & crossed.get(cls, set()) for cls, _w, _n in dp.values()):
        return None
    table = _table(cluster, e.gpus)
    drained = max(_drain_ends(table, own).values())
    alone = max(calls * call_s, drained)  # the closed form's calls: their latencies, then their bytes
    start = (alone - drained) * max(0.0, calls - 1) / calls  # the engine runs a pass's calls of a kind as one
    during = _reduction_between(cluster, traffic, 0.0, start, alone, early=True)
    left = {key: (cls, way, during[cls]) for key, (cls, way, _got) in dp.items() if during.get(cls, 0.0) > 0}
    if not left:
        return None
    apart = _drain_ends(table, left)
    ends = _drain_ends(table, {**own, **left})
    hide = c.layers_per_stage / e.virtual_stages * c.layer_tp_hide_bwd_s
    tp_end = start + max(ends[key] for key in own)
    slow_dp = max(0.0, *(ends[key] - apart[key] for key in left))
    return slow_dp, max(0.0, tp_end - hide) - max(0.0, alone - hide)


def _resources_by_class(cluster: Cluster) -> dict[str, set[tuple[str, ...]]]:
    """The finite resources each traffic class's paths cross, the GPU's own HBM left out (as in the drain),
    kept in ``cluster``'s ``model_memo``."""
    got = cluster.model_memo.get(_CROSSED_KEY)
    if got is not None:
        return got  # type: ignore[return-value]
    crossed: dict[str, set[tuple[str, ...]]] = {}
    for path in cluster.paths:
        crossed.setdefault(path.traffic, set()).update(
            res.resource for res in path.resources if res.resource[0] != "hbm" and res.load_s_per_byte() > 0)
    cluster.model_memo[_CROSSED_KEY] = crossed
    return crossed


_CROSSED_KEY = ("floor-crossed",)
"""The key of :func:`_resources_by_class`' answer in a cluster's ``model_memo``."""


def _reduction_between(cluster: Cluster, traffic: RankTraffic, end_s: float, begin_s: float, until_s: float,
                       *, early: bool = False) -> dict[str, float]:
    """Bytes per class the reduction's all-reduces move each way from ``begin_s`` to ``until_s`` of a reduction
    that ends at ``end_s``, its phases as late as they can run (``early``: as early, from 0): per reduction group
    one after another, a hierarchical one's reduce-scatter inward, all-reduce on the outermost dimension and
    all-gather back (NOTE [collective flow phases]), each phase its bytes over its dimension's bandwidth."""
    phases: list[tuple[str, float, float]] = []  # (class, bytes, seconds), in the order they run
    for nbytes, size, stride in traffic.gradient_groups:
        dims = cluster.group_dims(size, stride)
        if not dims:
            continue
        moved = [nbytes * per_byte for per_byte in _level_bytes_per_byte("all-reduce", dims)]
        inward = [(_dim_class(cluster, d), b / 2, b / 2 / d.bytes_per_s) for d, b in zip(dims[:-1], moved[:-1])]
        outer = (_dim_class(cluster, dims[-1]), moved[-1], moved[-1] / dims[-1].bytes_per_s)
        phases += [*inward, outer, *reversed(inward)]
    if early:
        end_s = sum(seconds for _cls, _b, seconds in phases)
    between: dict[str, float] = {}
    for cls, nbytes, seconds in reversed(phases):
        overlap = min(end_s, until_s) - max(end_s - seconds, begin_s)
        if overlap > 0:
            between[cls] = between.get(cls, 0.0) + nbytes * overlap / seconds
        end_s -= seconds
    return between


def _compute_before_comm_s(execution: Execution, costs: StageCosts, *, last: bool = False) -> float:
    """How long the last backward pass of a stage's chunk computes before its communication starts (the engine
    runs a pass's CP ring steps, CP and EP collectives and TP collectives after its compute, the ring's attention
    beside its sends); the first stage's (that hides the reduction), or with ``last`` the last stage's."""
    e, c = execution, costs
    layer_s = c.layer_bwd_s + c.layer_recompute_s - _ring_attention_s(e, c)
    logits = c.last_bwd_s if (e.pp == 1 or last) and e.virtual_stages == 1 else 0.0  # its chunk has the loss
    return max(0.0, c.layers_per_stage / e.virtual_stages * layer_s + logits)


def _ring_attention_s(execution: Execution, costs: StageCosts) -> float:
    """The attention one layer's backward runs beside its CP ring's sends (the engine moves it out of the
    layer's compute into the ring steps); 0 without a ring."""
    e = execution
    steps = (e.cp - 1) * (3 if e.recomputes_attention else 2) if e.cp_comm == "p2p" else 0
    return steps * costs.layer_attention_fwd_s / e.cp


def _shared(ends: dict[tuple[str, str, int], float], apart: dict[tuple[str, str, int], float]) -> bool:
    """Whether some flow of a drain ends later than drained ``apart`` (beyond the steps' rounding): the
    reduction shares a resource with the backward's flows."""
    return any(end - apart[key] > _DRAINED * end for key, end in ends.items())


@slot_init
@dataclass(frozen=True, slots=True)
class LinkFloors:
    """What :func:`mcdla.sim.llm.llm_step` keeps: ``stage_s``, the least time of one micro-batch on a stage
    (:func:`link_floor_s`); ``dp_exposed_s``, the least exposed time of a reduction overlapped with the last
    backward; ``last_backward_s``, what a stage's reduction beside its last backward pass adds to that pass (each
    of the ``p - 1`` stages after the first is on the iteration's critical path there); both 0 when the reduction
    is not overlapped, and ``stage_s`` when nothing is offloaded."""

    stage_s: float
    dp_exposed_s: float
    last_backward_s: float = 0.0


def link_floors(execution: Execution, cluster: Cluster, costs: StageCosts, traffic: RankTraffic,
                zero3: Zero3Traffic | None = None) -> LinkFloors:
    """The floors of NOTE [link floor]; without offload only the overlapped reduction's, 0 where it shares no
    resource with the last backward's layer communication; ``zero3``: a ZeRO-3 execution's collectives."""
    e = execution
    offloads = (e.offload_activations or e.offload_weights) and cluster.offload is not None
    if not offloads and not (e.dp_overlap and e.dp * e.cp > 1):
        return LinkFloors(stage_s=0.0, dp_exposed_s=0.0)
    phase_s = _phase_s(e, costs)
    flows = _phase_flows(e, cluster, costs, traffic, zero3) if offloads else {}
    # each phase's drain once: the backward's is also the pass's own flows beside the reduction below
    table = _table(cluster, e.gpus)
    drained: dict[str, Ends] = {}
    stage = 0.0
    if offloads:
        floors = []  # the forward's and the backward's, summed as sum() sums
        head = _single_stage_head_s(e, costs)
        for phase, seconds in phase_s.items():
            ends = drained[phase] = _drain_ends(table, flows[phase])
            floors.append(_phase_floor_s(table, seconds, flows[phase], ends, zero3=zero3 is not None,
                                         head_s=head[phase]))
        stage = sum(floors)
    dp_exposed = last_backward = 0.0
    if e.dp_overlap and e.dp * e.cp > 1:
        dp = _reduction_flows(e, cluster, traffic, zero3)
        beside: tuple[float, float] | None = None  # TP calls beside the GEMMs and the reduction (no offload)
        if offloads:  # the pass's flows and the reduction's start together
            own = flows["backward"]
            alone, apart = drained["backward"], _reduction_alone(cluster, table, traffic, dp, zero3)
            ends = _drain_ends(table, {**own, **dp})
        else:
            # TP calls beside the GEMMs hide behind them, their slowdown too (the closed form exposes the excess)
            overlapped = costs.layer_tp_hide_bwd_s > 0
            own = _flows(_class_bytes(e, cluster, costs, traffic, sends=False, tp=not overlapped)["backward"])
            timed = _after_compute(e, cluster, costs, traffic, own, dp, zero3) if own else None
            gathers = None
            if zero3 is not None and dp:
                from mcdla.sim.llm_floor_zero3 import zero3_beside  # it drains on this module's path tables

                gathers = zero3_beside(e, cluster, costs, own, dp, zero3)
            beside = _tp_beside(e, cluster, costs, traffic, dp) if overlapped and zero3 is None else None
            # the last stage's pass starts its communication after the logits' backward, later beside the reduction
            tail = None
            if e.pp > 1 and e.virtual_stages == 1 and zero3 is None and own:
                got = _after_compute(e, cluster, costs, traffic, own, dp, zero3, last=True)
                tail = max(0.0, *(got[2][key] - got[0][key] for key in own)) if got is not None else 0.0
            if timed is None or not _shared(timed[2], {**timed[0], **timed[1]}):
                if (beside is not None and (beside[0] > 0 or beside[1] > 0)) or tail:
                    zeros = dict.fromkeys((*own, *dp), 0.0)  # those parts alone
                    timed = zeros, zeros, zeros
                elif gathers is None:  # the closed form prices each class on its link
                    return LinkFloors(stage_s=0.0, dp_exposed_s=0.0)
                else:
                    return LinkFloors(stage_s=0.0, dp_exposed_s=gathers[0], last_backward_s=gathers[1])
            alone, apart, ends = timed
        # the pass as the stage's floor has it (without offload the closed form's)
        bwd = max(phase_s["backward"], (max(alone.values()) if alone else 0.0) if offloads else 0.0)
        # the reduction's collectives run one after another, each its phases in turn (its closed-form time), beside
        # the whole pass (its exposed copies too): what the pass's flows slow them is exposed beyond that
        slow_dp = max(0.0, *[ends[key] - apart[key] for key in dp]) + (beside[0] if beside else 0.0)
        hidden = costs.dp_hidden_s + costs.offload_bwd_s + bwd - phase_s["backward"]
        # the drain beyond the pass (without offload the hiding pass, the logits' and loss's backward in it)
        dp_exposed = max(0.0, (max(ends.values()) if ends else 0.0) - (phase_s["backward"] if offloads else hidden),
                         costs.dp_full_s + slow_dp - hidden) + costs.dp_tail_s  # then what waits for the pass
        # the pass's own flows beside the reduction: its communication is on its critical path (the closed form
        # exposes it after the compute), so its slowdown adds to the pass; its copies add what exceeds the pass
        slowed = [ends[key] - (bwd if key[1] == "offload" else alone[key]) for key in own]
        last_backward = max(0.0, max(slowed) if slowed else 0.0) / e.virtual_stages + (beside[1] if beside else 0.0)
        if not offloads:  # the first stage ends with the later of its reduction and its own slowed pass
            dp_exposed = max(dp_exposed, costs.dp_exposed_s + last_backward)
            if tail is not None:  # the p - 1 stages after the first: p - 2 middle ones and the last
                last_backward += (tail + (beside[1] if beside else 0.0) - last_backward) / (e.pp - 1)
            if gathers is not None:
                dp_exposed, last_backward = max(dp_exposed, gathers[0]), max(last_backward, gathers[1])
    return LinkFloors(stage_s=stage, dp_exposed_s=dp_exposed, last_backward_s=last_backward)
