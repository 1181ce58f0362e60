"""The flow evaluator's side of a collective: its lowering to phases of concurrent flows.

:func:`lower` turns a :class:`~mcdla.sim.collective_models.Collective` into :class:`Phase` s that run one after
the other; each phase is a set of flows that start together, and it ends when the last of them has drained plus
``hops`` times the largest route latency among them. The executor (:mod:`mcdla.sim.ir_engine`) places each flow
on its route through the system, where it shares links max-min fairly with every other flow in flight. The
endpoints are ranks, or a :class:`Reducer`: the switch that reduces and multicasts for an in-network level.

NOTE [collective flow phases]
One phase per level of the hierarchy (per step of it for hierarchical all-reduce: reduce-scatter levels inward,
all-reduce on the outermost, all-gather back), every group of that level at once:

* ring: each member sends to the next one of the group's order; the ``s`` synchronized steps of a ring (2 (p-1)
  for an all-reduce, p-1 otherwise) are ONE flow of ``s`` chunks of n/p per member followed by ``s`` hop
  latencies, as in the 2018 engine (NOTE [ring collectives] in :mod:`mcdla.sim.collectives`).
* tree (all-reduce): every edge of the two trees of
  :func:`~mcdla.sim.collective_models.double_binary_tree` carries n/2 up and n/2 down, all at once (the
  pipelined reduce and broadcast), then ``2 depth`` hop latencies (the pipeline's fill, up and down).
* in-network: each member sends to the reducer what the switch needs (all-reduce n, reduce-scatter the
  (p-1)/p of others' shards, all-gather its n/p shard) while the reducer sends each member what it gets back
  (n, its n/p shard, the (p-1)/p it lacks): up and down are different link directions and run at once, then
  two hops, each the latency between two members (the dimension's GPU-to-GPU latency ``a``, to the reducing
  switch and back, as the closed form counts it).
* all-to-all: every member sends n/P to every member whose highest differing level is this one, one hop.
* broadcast: a pipelined chain from the group's root (ring), or root -> reducer -> members (in-network).
* p2p: one flow, one hop.

NOTE [why the phases equal the closed forms]
On an idle fabric where each rank has its own port of bandwidth ``B`` per direction into a level (a star per
level, as :func:`mcdla.sim.fabric_of_dims.dims_system` builds), every phase's flows have one size ``s`` and
cross resources of one capacity ``B``. Max-min fairness then finishes the phase at exactly ``K s / B``, ``K``
the most flows on one resource: each flow has a saturated bottleneck where it is the fastest, so its rate is at
least ``B / K`` at every moment (``K`` never grows), and the busiest resource needs ``K s / B`` to carry its
``K s`` bytes. ``K s`` is the busiest port's bytes: (p-1)/p n per step for the ring, ``k_max n/2`` for the
tree, n up and n down for in-network, and so on, which are the terms of NOTE [collective closed forms].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.sim.collective_models import Collective, double_binary_tree, tree_port_flows

__all__ = ["Reducer", "Endpoint", "Flow", "Phase", "lower"]


@dataclass(frozen=True, slots=True)
class Reducer:
    """The switch that reduces and multicasts for an in-network level of the ranks ``members``."""

    members: tuple[int, ...]


Endpoint = int | Reducer
"""A flow's end: a rank, or the reducing switch of a group."""


@dataclass(frozen=True, slots=True)
class Flow:
    """``nbytes`` from ``src`` to ``dst``."""

    src: Endpoint
    dst: Endpoint
    nbytes: float


@dataclass(frozen=True, slots=True)
class Phase:
    """Flows that start together; the phase ends ``hops`` hop latencies after the last drains.

    A hop is the largest route latency among the flows, or, when ``hop_pairs`` names rank pairs, among the
    routes between them. ``level`` is the hierarchy level it runs on (for reports).
    """

    flows: tuple[Flow, ...]
    hops: int
    level: int
    hop_pairs: tuple[tuple[int, int], ...] = ()


def _groups(levels: tuple[int, ...], level: int, *, rooted: bool = False) -> list[list[int]]:
    """Positions of each group of ``level`` (members differ only in that level's coordinate), in coordinate
    order; ``rooted``: only the groups whose lower coordinates are all 0 (a broadcast's carriers)."""
    inner, k, total = math.prod(levels[:level]), levels[level], math.prod(levels)
    return [[base + j * inner for j in range(k)] for base in range(total)
            if (base // inner) % k == 0 and not (rooted and base % inner)]


def _level(kind: str, n: float, members: list[int], alg: str, level: int) -> list[Phase]:
    """Phases of one group of one level (NOTE [collective flow phases])."""
    p = len(members)
    if p == 1 or n == 0.0:
        return []
    if alg == "in-network" and kind != "all-to-all":
        red = Reducer(tuple(members))
        if kind == "broadcast":
            flows = [Flow(members[0], red, n)] + [Flow(red, m, n) for m in members[1:]]
        else:
            up, down = {"all-reduce": (n, n), "reduce-scatter": ((p - 1) / p * n, n / p),
                        "all-gather": (n / p, (p - 1) / p * n)}[kind]
            flows = [Flow(m, red, up) for m in members] + [Flow(red, m, down) for m in members]
        return [Phase(tuple(flows), 2, level, ((members[0], members[1]),))]
    if kind == "broadcast":
        return [Phase(tuple(Flow(a, b, n) for a, b in zip(members, members[1:])), p - 1, level)]
    if alg == "tree" and kind == "all-reduce":
        flows = []
        for parent in double_binary_tree(p):
            for child, up in enumerate(parent):
                if up >= 0:
                    flows += [Flow(members[child], members[up], n / 2), Flow(members[up], members[child], n / 2)]
        return [Phase(tuple(flows), 2 * tree_port_flows(p)[1], level)]
    steps = 2 * (p - 1) if kind == "all-reduce" else p - 1
    chunk = steps * n / p
    return [Phase(tuple(Flow(members[j], members[(j + 1) % p], chunk) for j in range(p)), steps, level)]


def _merge(per_group: list[list[Phase]]) -> list[Phase]:
    """The phases of every group of a level run together: phase ``j`` of all groups is one phase."""
    merged = []
    for phases in zip(*per_group):
        assert len({ph.hops for ph in phases}) == 1, "groups of one level have the same structure"
        merged.append(Phase(tuple(f for ph in phases for f in ph.flows), phases[0].hops, phases[0].level,
                            tuple(pair for ph in phases for pair in ph.hop_pairs)))
    return merged


def _on_level(coll: Collective, kind: str, n: float, level: int, *, rooted: bool = False) -> list[Phase]:
    algs = coll.algorithm
    assert isinstance(algs, tuple)
    groups = _groups(coll.levels, level, rooted=rooted)
    return _merge([_level(kind, n, [coll.group[q] for q in g], algs[level], level) for g in groups])


def _all_to_all(coll: Collective) -> list[Phase]:
    levels, group, total = coll.levels, coll.group, coll.size
    share = coll.nbytes / total
    phases = []
    for i in range(len(levels)):
        inner, outer = math.prod(levels[:i]), math.prod(levels[: i + 1])
        flows = tuple(Flow(group[q], group[r], share) for q in range(total) for r in range(total)
                      if q // outer == r // outer and (q // inner) % levels[i] != (r // inner) % levels[i])
        if flows and share > 0:
            phases.append(Phase(flows, 1, i))
    return phases


def lower(coll: Collective) -> tuple[Phase, ...]:
    """The flow phases of ``coll``, in order (NOTE [collective flow phases]); none for a group of one or 0 bytes."""
    kind, n, levels = coll.kind, coll.nbytes, coll.levels
    if n == 0.0 or coll.size == 1:
        return ()
    if kind == "p2p":
        return (Phase((Flow(coll.group[0], coll.group[1], n),), 1, 0),)
    if kind == "all-to-all":
        return tuple(_all_to_all(coll))
    top = len(levels) - 1
    if kind == "broadcast":
        return tuple(ph for i in range(top, -1, -1) for ph in _on_level(coll, kind, n, i, rooted=True))
    phases: list[Phase] = []
    shard = n
    if kind in ("all-reduce", "reduce-scatter"):
        last = top if kind == "all-reduce" else top + 1
        for i in range(last):
            phases += _on_level(coll, "reduce-scatter", shard, i)
            shard /= levels[i]
        if kind == "reduce-scatter":
            return tuple(phases)
        phases += _on_level(coll, "all-reduce", shard, top)
        for i in range(top - 1, -1, -1):
            shard *= levels[i]
            phases += _on_level(coll, "all-gather", shard, i)
        return tuple(phases)
    shard = n / math.prod(levels[:-1])
    for i in range(top, -1, -1):
        phases += _on_level(coll, "all-gather", shard, i)
        if i > 0:
            shard *= levels[i - 1]
    return tuple(phases)
