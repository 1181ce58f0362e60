"""The per-link floor's fair drain: a GPU's flows drained max-min fairly over its paths' resources, as the
contention-aware engine shares them (:mod:`mcdla.sim.llm_floor` drains each phase's flows here).

NOTE [fair drain]
The engine shares every link and memory max-min fairly among the flows in flight (NOTE [max-min by progressive
filling] in :mod:`mcdla.sim.flows`); a resource's busiest bytes over its capacity is not always when they are
through. A memory's bus carries both directions: on a DGX H100 socket four GPUs each send activations out and
fetch weights in through the 307.2 GB/s DDR5 behind their 51.2 GB/s-each-way x16s, so the eight flows get 38.4
GB/s each; once the weights are in, the activations go on at the x16's 51.2 GB/s and the DDR5 is no longer full.
The floor drains a GPU's flows the same way on its paths' resources (every GPU of the node in use alike; on a
node the job uses only part of, as the engine loads it, only the GPUs in use share the pool's resources: 8 GPUs
of an NVL72 rack with memory-nodes fetch over the 36 memory-nodes' links at their NVLink port's bandwidth, where
the whole rack gets a third of it, :meth:`Cluster.paths_for_gpus
<mcdla.hardware.cluster.Cluster.paths_for_gpus>`): progressive filling with a flow's weight on a resource its
seconds per byte there (``sharers fraction / capacity``), a copy as one engine flow per pool memory; when a flow
is through, the rest are refilled. At most one step per flow.
The fair rates depend on which flows are in flight, never on their bytes: each path table keeps them per set
of flows in flight (``_Drain``), so a search's evaluations fill each set once and their steps only divide and
subtract, the same floating-point operations as filling at every step.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from mcdla.hardware.cluster import Cluster
    from mcdla.hardware.traffic import TrafficPath

class _PathTable:
    """One ``Cluster.paths``' resources as the drain reads them, built once per path table (a search's
    evaluations share its cluster's): each distinct kind of path resource's loads as (traffic class, slot,
    seconds per byte), each slot's duplex flag, how many engine flows a copy is, and the drains already set up
    (:class:`_Drain`, per ordered tuple of flow keys)."""

    __slots__ = ("paths", "rows", "duplex", "copies", "drains", "ends")

    def __init__(self, paths: tuple[TrafficPath, ...]) -> None:
        loads: dict[tuple[str, ...], list[tuple[str, float]]] = {}
        is_duplex: dict[tuple[str, ...], bool] = {}
        for path in paths:
            for res in path.resources:
                if res.resource[0] == "hbm":  # the GPU's own memory: the compute's, priced by the cost model
                    continue
                loads.setdefault(res.resource, []).append((path.traffic, res.load_s_per_byte()))
                is_duplex[res.resource] = res.duplex
        # resources loaded alike (the 36 memory-nodes of a rack, each link and DRAM) are always as busy: keep one
        kinds = sorted({(is_duplex[r], tuple(sorted(load))) for r, load in loads.items()})
        self.paths = paths
        self.rows = tuple((traffic, i, per_byte) for i, (_d, load) in enumerate(kinds) for traffic, per_byte in load)
        self.duplex = tuple(d for d, _load in kinds)
        self.copies = _pool_memories(paths)
        self.drains: dict[tuple[tuple[str, str, int], ...], _Drain] = {}
        # the last few drains' answers by (their _Drain, bytes): an evaluation drains a few sets of flows, some twice
        # (a stage's backward alone, then beside the reduction), and an execution evaluated again drains them again
        self.ends: dict[tuple[_Drain, tuple[float, ...]], dict[tuple[str, str, int], float]] = {}

    def flow_load(self, cls: str, way: int) -> dict[tuple[int, int], float]:
        """A flow of class ``cls`` and way ``way``: its seconds per byte on each resource slot (a link's
        directions are two slots, a memory's bus one)."""
        load: dict[tuple[int, int], float] = {}
        for traffic, i, per_byte in self.rows:
            if traffic == cls and per_byte > 0:
                slot = (i, way if self.duplex[i] else 0)
                load[slot] = load.get(slot, 0.0) + per_byte
        return load

    def drain(self, keys: tuple[tuple[str, str, int], ...]) -> _Drain:
        """The drain of flows keyed ``keys`` (``(tag, class, way)``, in the order the flows come), memoised."""
        got = self.drains.get(keys)
        if got is None:
            got = self.drains[keys] = _Drain(self, keys)
        return got


def _table(cluster: Cluster, gpus: int) -> _PathTable:
    """The :class:`_PathTable` of a job of ``gpus`` GPUs on ``cluster``, kept in its ``model_memo``: its paths
    as the engine loads them (:meth:`Cluster.paths_for_gpus <mcdla.hardware.cluster.Cluster.paths_for_gpus>`: on
    a partly used node only the GPUs in use share the pool's resources), one table for every job that fills its
    nodes."""
    key = _TABLE_KEY if gpus >= cluster.gpus_per_node else (_TABLE_KEY[0], gpus)
    got = cluster.model_memo.get(key)
    if got is None:
        got = cluster.model_memo[key] = _PathTable(cluster.paths_for_gpus(gpus))
    return got  # type: ignore[return-value]


_TABLE_KEY = ("floor-path-table",)
"""The key of a cluster's :class:`_PathTable` in its ``model_memo`` for jobs that fill their nodes (a partly used
node's has the job's GPU count after the key's first item)."""


class _Drain:
    """The fair drain of one ordered set of flows on one path table, apart from their bytes: which flows cross a
    finite resource (``loaded``, their indices in order; ``idle``, the keys of the others, which end at once), and
    the max-min fair rates of each set of them still in flight (a bit mask over the indices), computed by
    :func:`_fair_rates` on the first ask. The rates depend on which flows are in flight, never on their bytes, so
    a search's evaluations compute each set's rates once and the drain's steps are the same floating-point
    operations as progressive filling at every step."""

    __slots__ = ("loaded", "mask", "idle", "_loads", "_counts", "memo")

    def __init__(self, table: _PathTable, keys: tuple[tuple[str, str, int], ...]) -> None:
        loads = [table.flow_load(cls, way) for _tag, cls, way in keys]
        self.loaded = tuple(i for i, load in enumerate(loads) if load)
        self.mask = sum(1 << i for i in self.loaded)
        self.idle = tuple(key for key, load in zip(keys, loads) if not load)
        self._loads = loads
        self._counts = [table.copies if cls == "offload" else 1 for _tag, cls, _way in keys]
        self.memo: dict[int, list[tuple[int, float]]] = {}

    def rates(self, live: int) -> list[tuple[int, float]]:
        """Each flow in flight and its fair rate (bytes/s), ``(index, rate)`` in the flows' order, while the flows
        of the bit mask ``live`` are in flight."""
        got = self.memo.get(live)
        if got is None:
            members = [i for i in self.loaded if live >> i & 1]
            fair = _fair_rates({i: self._loads[i] for i in members}, {i: self._counts[i] for i in members})
            got = self.memo[live] = [(i, fair[i]) for i in members]
        return got


Flow: TypeAlias = tuple[str, int, float]
"""A flow of the drain: its traffic class, its way (0 out of the GPU, 1 in) and its bytes."""


def _flows(moved: Mapping[str, Sequence[float]], tag: str = "") -> dict[tuple[str, str, int], Flow]:
    """One flow per class and way of ``moved`` (``(out, in)`` bytes per class), keyed ``(tag, class, way)``."""
    flows: dict[tuple[str, str, int], Flow] = {}
    for cls, (out, inward) in moved.items():
        if out > 0:
            flows[(tag, cls, 0)] = (cls, 0, out)
        if inward > 0:
            flows[(tag, cls, 1)] = (cls, 1, inward)
    return flows


def _drain_ends(table: _PathTable, flows: dict[tuple[str, str, int], Flow]) -> dict[tuple[str, str, int], float]:
    """When each of ``flows``, all started at once on one GPU's paths (``table``, :func:`_table`; every GPU of
    the node in use alike), is through under max-min fair sharing (NOTE [fair drain]); flows that cross no
    finite resource end at once. Each step runs every flow in flight at its fair rate until the first is through
    (the rates of each set in flight memoised by :class:`_Drain`, the last few drains' answers by their flows
    and bytes in the path table).

    A search runs this a few times per evaluation on a handful of flows, so its fixed costs count as much as its
    steps: the drain is found by the flows' keys once, the recent answers are keyed by that drain and the bytes,
    each flow's "through" threshold is computed once, and a step's length is found by a plain loop (a list and
    ``min`` cost more on a few flows)."""
    keys = tuple(flows)
    drain = table.drains.get(keys) or table.drain(keys)
    nbytes = tuple(map(_BYTES, flows.values()))
    memo_key = (drain, nbytes)
    recent = table.ends
    known = recent.get(memo_key)
    if known is not None:
        return dict(known)
    ends = dict.fromkeys(drain.idle, 0.0) if drain.idle else {}
    left = list(nbytes)
    through = list(map(_DRAINED.__mul__, nbytes))  # _DRAINED * b each
    live, memo = drain.mask, drain.memo
    now, inf = 0.0, _INF
    while live:
        rates = memo.get(live) or drain.rates(live)
        step = inf  # the first flow through: the least of its bytes left over its rate (a loop, not min())
        for i, rate in rates:
            until = left[i] / rate
            if until < step:
                step = until
        now += step
        for i, rate in rates:
            rest = left[i] = left[i] - rate * step
            if rest <= through[i]:
                ends[keys[i]] = now
                live ^= 1 << i
    if len(recent) >= _RECENT_DRAINS:
        del recent[next(iter(recent))]  # the oldest
    recent[memo_key] = ends.copy()
    return ends


_INF = float("inf")
_BYTES = operator.itemgetter(2)
"""A :data:`Flow`'s bytes."""

_RECENT_DRAINS = 8
"""Drains a path table remembers (:func:`_drain_ends`): the handful one evaluation asks, so that many fewer
retained answers than a search's evaluations cost nothing to keep."""


_DRAINED = 1e-9
"""Fraction of a flow's bytes below which it counts as through (the rounding of the drain's steps)."""


def _pool_memories(paths: tuple[TrafficPath, ...]) -> int:
    """How many flows one GPU's copy is: one per pool memory its pages are interleaved over (the memories on
    its offload path)."""
    offload = next((path for path in paths if path.traffic == "offload"), None)
    return max(1, sum(res.resource[0] == "dram" for res in offload.resources)) if offload is not None else 1


def _fair_rates(loads: dict[int, dict[tuple[int, int], float]], counts: dict[int, int]) -> dict[int, float]:
    """Max-min fair rates (bytes/s) of flows that load resources of one second per second at ``loads[flow][key]``
    seconds per byte, each ``counts[flow]`` engine flows of equal shares (a copy is one per pool memory):
    progressive filling (NOTE [max-min by progressive filling] in :mod:`mcdla.sim.flows`) of the engine flows,
    a flow's weight on a resource its seconds per byte there (every GPU of the node sends alike)."""
    room: dict[tuple[int, int], float] = {key: 1.0 for load in loads.values() for key in load}
    unfrozen, rates, level = dict(loads), {}, 0.0
    while unfrozen:
        weight: dict[tuple[int, int], float] = {}
        for flow, load in unfrozen.items():
            for key, per_byte in load.items():
                weight[key] = weight.get(key, 0.0) + per_byte * counts[flow]
        rise = min(room[key] / w for key, w in weight.items())
        level += rise
        for key, w in weight.items():
            room[key] -= rise * w
        full = {key for key in weight if room[key] <= _DRAINED}
        for flow in [f for f, load in unfrozen.items() if full.intersection(load)]:
            rates[flow] = level * counts[flow]
            del unfrozen[flow]
    return rates


Ends: TypeAlias = dict[tuple[str, str, int], float]
