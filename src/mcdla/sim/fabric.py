"""The simulator's compiled view of a system: resources, routes, pools and rings as small integers.

A :class:`Fabric` is built once per simulation, either from a :class:`~mcdla.hardware.model.System` (through
:class:`~mcdla.hardware.topology.Topology`, which validates connectivity and routes) or, for the planners'
single-device view, straight from a :class:`~mcdla.hardware.pool_link.PoolLink`.

NOTE [fabric units]
Solver resources carry a capacity in *work units per second* and every route a *scale* (work units per byte).
For a system both are plain bytes/s and 1.0. The only exception is a half-duplex pool link whose two directions
have different speeds (``shared_direction`` with offload != prefetch bandwidth): one resource of capacity 1
(channel-seconds per second) that an offload of ``n`` bytes loads with ``n / offload_bytes_per_s`` and a
prefetch with ``n / prefetch_bytes_per_s``, so the two directions time-share the channel. Resources of
infinite capacity never bind and are left out of the solver (a route crossing none of them is instant).

NOTE [HBM in transfers]
An offload reads the device's HBM and a prefetch writes it, so every pool route also crosses the resource
``("hbm", device)`` of capacity ``hbm_bytes_per_s`` (:func:`mcdla.sim.ir_compile.copy_route`, which places the
copies of the IR executor too): a device's offloads and prefetches share its memory
bandwidth max-min fairly with each other (and with nothing else: compute keeps its roofline time, and ring
collectives do not cross it). On today's presets the links bind long before HBM (12.8 GB/s PCIe or 150 GB/s
of memory-node links against 900 GB/s), so this matters only for devices whose links rival their HBM. The one
exception is the planners' half-duplex pool link with different offload and prefetch speeds, whose channel is
counted in time units (NOTE [fabric units]): there HBM is left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from mcdla.errors import HardwareError, SimError
from mcdla.hardware.model import Device, MemoryKind, System
from mcdla.hardware.pool_link import PoolLink
from mcdla.hardware.cluster import ALGORITHMS
from mcdla.hardware.topology import Resource, Route, Topology
from mcdla.sim.collective_models import Collective
from mcdla.sim.collective_phases import Endpoint, Reducer, lower
from mcdla.sim.ir_compile import copy_route, reducer_switch

__all__ = ["Fabric", "POOL_MEMORY"]

POOL_MEMORY = "pool"
"""Name of the pool memory of a single-device system (:func:`mcdla.sim.one_device_system`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """Integer-indexed resources and routes of a system (see NOTE [fabric units]).

    Attributes:
        name: the system's name.
        devices: the devices, in rank order.
        memory_names, memory_kinds, memory_capacity_bytes: the pool memories.
        capacities: capacity of each solver resource (work units/s, finite).
        routes: solver resource ids of each route id.
        route_scale: work units per byte of each route.
        route_latency_s: latency of each route (s).
        route_links: reporting-link ids each route crosses; route_drams: memory ids whose DRAM it uses.
        link_names: ``"a->b"`` of each reporting link; link_bytes_per_s: its bandwidth (may be inf).
        offload_routes, prefetch_routes: per device, ``(memory id, route id)`` for each pool memory
            (empty when the device has no pool).
        rings: per ring, the route id of one pipelined ring step: every hop of the ring (device -> next device
            along the ring) concatenated, so a link two hops share counts twice; its latency is the largest hop
            latency (NOTE [ring collectives] in :mod:`mcdla.sim.collectives`).
        ring_groups: per ring, its device ids in ring order (the communicator group of its collectives).
        collective_algorithm: how collectives run: ``"ring"`` over :attr:`rings`, or ``"tree"`` /
            ``"in-network"`` as one collective of every device in rank order (NOTE [ring collectives] in
            :mod:`mcdla.sim.collectives`).
        flow_routes: for a tree or in-network algorithm, the route id of each flow its phases start (and of each
            latency pair), by the flow's two ends as :func:`~mcdla.sim.collective_phases.lower` gives them (a
            device id, or the :class:`~mcdla.sim.collective_phases.Reducer` of an in-network group).
    """

    name: str
    devices: tuple[Device, ...]
    memory_names: tuple[str, ...]
    memory_kinds: tuple[str, ...]
    memory_capacity_bytes: tuple[float, ...]
    capacities: tuple[float, ...]
    routes: tuple[tuple[int, ...], ...]
    route_scale: tuple[float, ...]
    route_latency_s: tuple[float, ...]
    route_links: tuple[tuple[int, ...], ...]
    route_drams: tuple[tuple[int, ...], ...]
    link_names: tuple[str, ...]
    link_bytes_per_s: tuple[float, ...]
    offload_routes: tuple[tuple[tuple[int, int], ...], ...]
    prefetch_routes: tuple[tuple[tuple[int, int], ...], ...]
    rings: tuple[int, ...]
    ring_groups: tuple[tuple[int, ...], ...] = ()
    collective_algorithm: str = "ring"
    flow_routes: Mapping[tuple[Endpoint, Endpoint], int] = field(default_factory=dict)

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_system(cls, system: System, *, collective_algorithm: str = "ring") -> Fabric:
        """Compile ``system`` with its collectives run by ``collective_algorithm`` (ring, tree or in-network).

        Raises HardwareError (one line) for a disconnected topology or a missing route, SimError for an unknown
        algorithm or an in-network collective with no switch to reduce in.
        """
        if collective_algorithm not in ALGORITHMS:
            raise SimError(f"collective_algorithm: got {collective_algorithm!r}; must be one of {', '.join(ALGORITHMS)}")
        topo = Topology(system)
        builder = _Builder(system.name)
        for mem in system.memories:
            builder.memory(mem.name, mem.kind.value, mem.capacity_bytes)
        for link in system.links:
            builder.link(link.a, link.b, link.bytes_per_s)
            builder.link(link.b, link.a, link.bytes_per_s)
        for mem in system.memories:
            builder.resource(("dram", mem.name), mem.dram_bytes_per_s)
        offload, prefetch = [], []
        for device in system.devices:
            dev = device.name
            pool = system.pools.get(dev, ())
            hbm = ("hbm", dev)
            if pool:
                builder.resource(hbm, device.hbm_bytes_per_s)  # NOTE [HBM in transfers]
            offload.append(tuple((builder.memory_index[m], builder.raw_route(*copy_route(topo, dev, m, prefetch=False)))
                                 for m in pool))
            prefetch.append(tuple((builder.memory_index[m], builder.raw_route(*copy_route(topo, dev, m, prefetch=True)))
                                  for m in pool))
        rings, groups = [], []
        index = {name: i for i, name in enumerate(system.device_names)}
        for r in range(len(system.rings)):
            hops = list(topo.ring_hops(r))
            resources = tuple(res for _dev, _nxt, route in hops for res in route.resources)
            rings.append(builder.raw_route(resources, max(route.latency_s for _dev, _nxt, route in hops)))
            groups.append(tuple(index[dev] for dev, _nxt, _route in hops))
        flow_routes = {}
        if collective_algorithm != "ring" and len(system.devices) > 1:
            flow_routes = _flow_routes(builder, topo, collective_algorithm)
        fabric = builder.build(system.devices, tuple(offload), tuple(prefetch), tuple(rings), tuple(groups))
        return dataclasses.replace(fabric, collective_algorithm=collective_algorithm, flow_routes=flow_routes)

    @classmethod
    def from_pool_link(cls, device: Device, link: PoolLink) -> Fabric:
        """The one-device fabric whose pool is reached through ``link`` (the planners' view)."""
        if device.name == POOL_MEMORY:
            raise HardwareError(f"device.name: got {device.name!r}; the single-device pool memory uses that name")
        builder = _Builder(f"one-device-{device.name}")
        dev, pool = device.name, POOL_MEMORY
        builder.memory(pool, MemoryKind.HOST.value, link.pool_bytes)
        off, pre = link.offload_bytes_per_s, link.prefetch_bytes_per_s
        hbm: tuple[Resource, ...] = ()
        if not link.shared_direction or off == pre:  # NOTE [HBM in transfers]
            hbm = (("hbm", dev),)
            builder.resource(hbm[0], device.hbm_bytes_per_s)
        if not link.shared_direction:
            builder.link(dev, pool, off)
            builder.link(pool, dev, pre)
            builder.resource(("dram", pool), math.inf)
            scales = (1.0, 1.0)
        else:
            builder.link(dev, pool, math.inf)
            builder.link(pool, dev, math.inf)
            if off == pre:
                builder.resource(("dram", pool), off)
                scales = (1.0, 1.0)
            else:  # NOTE [fabric units]: one channel, time-shared
                builder.resource(("dram", pool), 1.0)
                scales = (1.0 / off, 1.0 / pre)
        routes = (hbm + (("link", dev, pool), ("dram", pool)), hbm + (("link", pool, dev), ("dram", pool)))
        off_route = builder.raw_route(routes[0], link.latency_s, scales[0])
        pre_route = builder.raw_route(routes[1], link.latency_s, scales[1])
        return builder.build((device,), (((0, off_route),),), (((0, pre_route),),), ())


def _flow_routes(builder: _Builder, topo: Topology, algorithm: str) -> dict[tuple[Endpoint, Endpoint], int]:
    """Route ids of every flow (and latency pair) of the collectives the 2018 programs launch (all-reduce,
    all-gather over every device in rank order) under ``algorithm``, by the flow's ends as lowered."""
    names = topo.system.device_names

    def node(end: Endpoint) -> str:
        if isinstance(end, Reducer):
            return reducer_switch(topo, tuple(names[m] for m in end.members))
        return names[end]

    group = tuple(range(len(names)))
    ends: set[tuple[Endpoint, Endpoint]] = set()
    for kind in ("all-reduce", "all-gather"):
        for phase in lower(Collective(kind=kind, nbytes=1.0, group=group, algorithm=algorithm)):
            ends.update((f.src, f.dst) for f in phase.flows)
            ends.update(phase.hop_pairs)
    return {(a, b): builder.route(topo.route(node(a), node(b))) for a, b in ends}


class _Builder:
    """Assigns integer ids while a fabric is compiled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.memory_index: dict[str, int] = {}
        self.memory_kinds: list[str] = []
        self.memory_caps: list[float] = []
        self.solver_index: dict[Resource, int] = {}
        self.capacities: list[float] = []
        self.link_index: dict[Resource, int] = {}
        self.link_names: list[str] = []
        self.link_caps: list[float] = []
        self.route_index: dict[tuple[tuple[Resource, ...], float], int] = {}
        self.routes: list[tuple[int, ...]] = []
        self.scales: list[float] = []
        self.latencies: list[float] = []
        self.route_links: list[tuple[int, ...]] = []
        self.route_drams: list[tuple[int, ...]] = []

    def memory(self, name: str, kind: str, capacity_bytes: float) -> None:
        self.memory_index[name] = len(self.memory_kinds)
        self.memory_kinds.append(kind)
        self.memory_caps.append(capacity_bytes)

    def resource(self, res: Resource, capacity: float) -> None:
        if math.isfinite(capacity):
            self.solver_index[res] = len(self.capacities)
            self.capacities.append(capacity)

    def link(self, a: str, b: str, bytes_per_s: float) -> None:
        res = ("link", a, b)
        self.resource(res, bytes_per_s)
        self.link_index[res] = len(self.link_names)
        self.link_names.append(f"{a}->{b}")
        self.link_caps.append(bytes_per_s)

    def raw_route(self, resources: tuple[Resource, ...], latency_s: float, scale: float = 1.0) -> int:
        key = (resources, latency_s, scale)
        rid = self.route_index.get(key)  # type: ignore[arg-type]
        if rid is not None:
            return rid
        rid = len(self.routes)
        self.route_index[key] = rid  # type: ignore[index]
        self.routes.append(tuple(self.solver_index[r] for r in resources if r in self.solver_index))
        self.scales.append(scale)
        self.latencies.append(latency_s)
        self.route_links.append(tuple(self.link_index[r] for r in resources if r[0] == "link"))
        self.route_drams.append(tuple(self.memory_index[r[1]] for r in resources if r[0] == "dram"))
        return rid

    def route(self, route: Route) -> int:
        return self.raw_route(route.resources, route.latency_s)

    def build(self, devices, offload, prefetch, rings, ring_groups=()) -> Fabric:  # type: ignore[no-untyped-def]
        return Fabric(
            name=self.name,
            devices=tuple(devices),
            memory_names=tuple(self.memory_index),
            memory_kinds=tuple(self.memory_kinds),
            memory_capacity_bytes=tuple(self.memory_caps),
            capacities=tuple(self.capacities),
            routes=tuple(self.routes),
            route_scale=tuple(self.scales),
            route_latency_s=tuple(self.latencies),
            route_links=tuple(self.route_links),
            route_drams=tuple(self.route_drams),
            link_names=tuple(self.link_names),
            link_bytes_per_s=tuple(self.link_caps),
            offload_routes=offload,
            prefetch_routes=prefetch,
            rings=rings,
            ring_groups=ring_groups,
        )
