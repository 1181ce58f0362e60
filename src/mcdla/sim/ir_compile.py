"""Compilation of rank programs (:mod:`mcdla.sim.ir`) onto a system: routes, resources, folds and reducers.

Every flow the programs can start (a copy, a send, each flow of each collective phase of
:mod:`mcdla.sim.collective_phases`) gets a route id whose resources are the finite links and memories of its
:class:`~mcdla.hardware.topology.Topology` route, repeated where a folded rank's mirrors load them too
(NOTE [folded ranks] in :mod:`mcdla.sim.ir`). An in-network level reduces in the switch on its members' route
that is nearest to all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from mcdla.errors import SimError
from mcdla.hardware.model import System
from mcdla.hardware.topology import Resource, Topology
from mcdla.sim.collective_models import Collective
from mcdla.sim.collective_phases import Reducer, lower
from mcdla.sim.ir import CollectiveOp, Offload, Op, Prefetch, RankProgram, Send

__all__ = ["CompiledPrograms", "Parts", "copy_route", "reducer_switch"]

Parts = tuple[tuple[int, float], ...]
"""A transfer: ``(route id, bytes)`` of each of its flows."""


def copy_route(topo: Topology, device: str, memory: str, *, prefetch: bool) -> tuple[tuple[Resource, ...], float]:
    """Resources and latency (s) of an offload (``device`` -> ``memory``) or a prefetch (``memory`` -> ``device``):
    the device's HBM, which the copy reads or writes (resource ``("hbm", device)``, NOTE [HBM in transfers] in
    :mod:`mcdla.sim.fabric`), then the topology route. Both engines place a copy this way."""
    route = topo.route(memory, device) if prefetch else topo.route(device, memory)
    return (("hbm", device), *route.resources), route.latency_s


def reducer_switch(topo: Topology, devs: tuple[str, ...]) -> str:
    """The switch that reduces and multicasts for devices ``devs`` in an in-network collective: on the route
    between the first two, the one nearest (fewest links) to the farthest of them (both engines place a
    :class:`~mcdla.sim.collective_phases.Reducer` here)."""
    system = topo.system
    switches = {s.name for s in system.switches}
    route = topo.route(devs[0], devs[1])
    path = [devs[0]] + [res[2] for res in route.resources if res[0] == "link"]
    best: tuple[int, str] | None = None
    for node in path:
        if node in switches:
            hops = max(len(topo.route(node, d).resources) for d in devs)
            if best is None or hops < best[0]:
                best = (hops, node)
    if best is None:
        raise SimError(f"in-network collective on devices {devs}: the route {devs[0]} -> {devs[1]} crosses no "
                       f"switch of system {system.name!r} to reduce in; use algorithm 'ring' or 'tree'")
    return best[1]


class CompiledPrograms:
    """Routes, resources and transfers of one set of rank programs on one system, as integers (what both runs
    of :func:`mcdla.sim.ir_engine.execute` share).

    Attributes:
        capacities, classes: capacity (bytes/s) and link class of each finite resource id.
        routes, latency, alone_rate: resource ids (repeats count, NOTE [folded ranks]), latency (s) and the rate
            of a lone flow (bytes/s) of each route id.
        copy_parts: per ``(rank, op index)`` of an offload, prefetch or send, its flow and latency.
        collective_parts: per collective, its phases' flows and latencies (NOTE [phase latency] in
            :mod:`mcdla.sim.ir_engine`).
    """

    def __init__(self, system: System, programs: dict[int, RankProgram], devices: Mapping[int, str] | None,
                 topo: Topology | None = None, mirrors: Mapping[int, Sequence[str]] | None = None) -> None:
        self.system = system
        self.topo = Topology(system) if topo is None else topo
        self.programs = programs
        names = system.device_names
        if devices is None:
            for rank in programs:
                if rank >= len(names):
                    raise SimError(f"rank {rank}: system {system.name!r} has {len(names)} devices; give devices= to "
                                   "place ranks beyond them")
            self.device = {rank: names[rank] for rank in programs}
        else:
            self.device = {}
            for rank in programs:
                if rank not in devices or devices[rank] not in names:
                    raise SimError(f"devices[{rank}]: got {devices.get(rank)!r}; must name a device of system "
                                   f"{system.name!r}")
                self.device[rank] = devices[rank]
        self.mirror: dict[int, tuple[str, ...]] = {}
        for rank, devs in (mirrors or {}).items():
            prog = programs.get(rank)
            devs = tuple(devs)
            if prog is None or len(devs) != prog.fold - 1 or any(d not in names for d in devs):
                fold = prog.fold if prog else None
                raise SimError(f"mirrors[{rank}]: got {devs!r}; must name {fold - 1 if fold else 'the'} devices of "
                               f"system {system.name!r} for a rank of fold {fold}")
            self.mirror[rank] = devs
        used = [*self.device.values(), *(d for devs in self.mirror.values() for d in devs)]
        if len(set(used)) != len(used):
            raise SimError("devices and mirrors: got a device twice; each rank and mirror must have its own")
        self.devices_by_name = {d.name: d for d in system.devices}
        self.memories = {m.name for m in system.memories}
        self.resource_id: dict[Resource, int] = {}
        self.capacities: list[float] = []
        self.classes: list[str] = []
        for res, cap in self.topo.resources.items():
            if math.isfinite(cap):
                self.resource_id[res] = len(self.capacities)
                self.capacities.append(cap)
                self.classes.append("dram" if res[0] == "dram" else self.topo.link(res[1], res[2]).kind.value)
        self.routes: list[tuple[int, ...]] = []
        self.latency: list[float] = []
        self.alone_rate: list[float] = []
        self._route_index: dict[tuple[tuple[tuple[str, str], ...], int, bool], int] = {}
        self._reducer: dict[tuple[str, ...], str] = {}
        self.collective_parts: dict[Collective, tuple[tuple[Parts, float], ...]] = {}
        self.copy_parts: dict[tuple[int, int], tuple[Parts, float]] = {}
        for rank, prog in programs.items():
            for index, op in enumerate(prog.ops):
                self._compile(rank, index, op, prog.fold)

    def _path(self, pair: tuple[str, str], copy: bool) -> tuple[tuple[Resource, ...], float]:
        """Resources and latency of the flow from ``pair[0]`` to ``pair[1]``; a ``copy`` (an offload or a
        prefetch) also crosses its device's HBM (:func:`copy_route`)."""
        if not copy:
            route = self.topo.route(*pair)
            return route.resources, route.latency_s
        src, dst = pair
        resources, latency = (copy_route(self.topo, dst, src, prefetch=True) if src in self.memories
                              else copy_route(self.topo, src, dst, prefetch=False))
        for res in resources:
            if res[0] == "hbm" and res not in self.resource_id:
                capacity = self.devices_by_name[res[1]].hbm_bytes_per_s
                if math.isfinite(capacity):
                    self.resource_id[res] = len(self.capacities)
                    self.capacities.append(capacity)
                    self.classes.append("hbm")
        return resources, latency

    def route(self, pairs: tuple[tuple[str, str], ...], fold: int, *, copy: bool = False) -> int:
        """Route id of the flow between ``pairs[0]`` (source node, destination node), loaded as ``fold`` flows:
        on ``pairs`` (its own and each mirror's ends) each resource counts as often as their routes cross it;
        with only its own ends, every resource but its end devices' ports (and HBM) counts ``fold`` times
        (NOTE [folded ranks] in :mod:`mcdla.sim.ir`). ``copy``: an offload or prefetch (:meth:`_path`)."""
        key = (pairs, fold, copy)
        rid = self._route_index.get(key)
        if rid is not None:
            return rid
        resources, latency = self._path(pairs[0], copy)
        counts: dict[int, int] = {}
        if len(pairs) == 1:
            ends = {n for n in pairs[0] if n in self.devices_by_name}
            for res in resources:
                if res in self.resource_id:
                    private = res[0] == "hbm" or (res[0] == "link" and (res[1] in ends or res[2] in ends))
                    counts[self.resource_id[res]] = counts.get(self.resource_id[res], 0) + (1 if private else fold)
        else:
            own = {self.resource_id[res] for res in resources if res in self.resource_id}
            for pair in pairs:
                for res in self._path(pair, copy)[0]:
                    rid_res = self.resource_id.get(res)
                    if rid_res in own:
                        counts[rid_res] = counts.get(rid_res, 0) + 1
        ids = tuple(r for r, c in counts.items() for _ in range(c))
        rid = len(self.routes)
        self._route_index[key] = rid
        self.routes.append(ids)
        self.latency.append(latency)
        self.alone_rate.append(min((self.capacities[r] / c for r, c in counts.items()), default=math.inf))
        return rid

    def reducer(self, devs: tuple[str, ...]) -> str:
        """The switch that reduces for devices ``devs`` (:func:`reducer_switch`)."""
        name = self._reducer.get(devs)
        if name is None:
            name = self._reducer[devs] = reducer_switch(self.topo, devs)
        return name

    def _copies(self, rank: int) -> int:
        """How many ends each flow of ``rank`` is placed at: its own, plus one per mirror."""
        return 1 + len(self.mirror.get(rank, ()))

    def _dev(self, rank: int, j: int, by: int) -> str:
        """Device of ``rank`` in copy ``j`` (0: itself, else its mirror j-1), for a flow of rank ``by``."""
        if j == 0:
            return self.device[rank]
        if rank not in self.mirror:
            raise SimError(f"mirrors: rank {by} has mirrors, rank {rank} (its peer) none; ranks that exchange data "
                           "must both have them or both not")
        return self.mirror[rank][j - 1]

    def _node(self, end: int | Reducer, j: int, by: int) -> str:
        if isinstance(end, Reducer):
            return self.reducer(tuple(self._dev(m, j, by) for m in end.members))
        return self._dev(end, j, by)

    def _memory(self, rank: int, memory: str, j: int) -> str:
        """The memory copy ``j`` of ``rank`` uses: the same place in the mirror's pool, or a memory of no pool."""
        pool = self.system.pools.get(self.device[rank], ())
        if j == 0 or memory not in pool:
            return memory
        mirror_pool = self.system.pools.get(self.mirror[rank][j - 1], ())
        if len(mirror_pool) != len(pool):
            raise SimError(f"mirrors[{rank}]: device {self.mirror[rank][j - 1]!r} has {len(mirror_pool)} pool memories, "
                           f"{self.device[rank]!r} {len(pool)}; a mirror must have the same pool")
        return mirror_pool[pool.index(memory)]

    def _compile(self, rank: int, index: int, op: Op, fold: int) -> None:
        copies = range(self._copies(rank))
        if isinstance(op, (Offload, Prefetch)):
            if op.memory not in self.memories:
                raise SimError(f"rank {rank} op {op.name!r}.memory: got {op.memory!r}; must be a memory of system "
                               f"{self.system.name!r} ({', '.join(sorted(self.memories)) or 'none'})")
            pairs = tuple((self._dev(rank, j, rank), self._memory(rank, op.memory, j)) for j in copies)
            if isinstance(op, Prefetch):
                pairs = tuple((b, a) for a, b in pairs)
            rid = self.route(pairs, fold, copy=True)
            self.copy_parts[(rank, index)] = (((rid, op.nbytes),), self.latency[rid])
        elif isinstance(op, Send):
            rid = self.route(tuple((self._dev(rank, j, rank), self._dev(op.peer, j, rank)) for j in copies), fold)
            self.copy_parts[(rank, index)] = (((rid, op.nbytes),), self.latency[rid])
        elif isinstance(op, CollectiveOp) and op.collective not in self.collective_parts:
            phases = []
            for ph in lower(op.collective):
                parts = tuple((self.route(tuple((self._node(f.src, j, rank), self._node(f.dst, j, rank))
                                                for j in copies), fold), f.nbytes) for f in ph.flows)
                if ph.hop_pairs:
                    hop = max(self.topo.route(self.device[a], self.device[b]).latency_s for a, b in ph.hop_pairs)
                else:
                    hop = max(self.latency[rid] for rid, _ in parts)
                phases.append((parts, ph.hops * hop))
            self.collective_parts[op.collective] = tuple(phases)
