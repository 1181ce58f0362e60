"""Routes through a system's topology, as sequences of shared resources.

A transfer between two nodes occupies every directed link segment on its route and, when it reads or writes
a pool memory, that memory's DRAM. The simulator shares each resource among the flows that use it, so the
resources are named here once: ``("link", a, b)`` for the a->b direction of a link, ``("dram", m)`` for
memory ``m``. Devices never forward traffic for others (a GPU is not a router); switches and memory-nodes do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from mcdla.errors import HardwareError
from mcdla.hardware.model import Link, System

__all__ = ["Resource", "Route", "Topology"]

Resource = tuple[str, ...]
"""A shared bandwidth resource: ``("link", a, b)`` (direction a->b) or ``("dram", memory)``."""


@dataclass(frozen=True, slots=True)
class Route:
    """The resources a transfer occupies, its summed latency (s) and its bottleneck bandwidth (bytes/s)."""

    src: str
    dst: str
    resources: tuple[Resource, ...]
    latency_s: float
    bottleneck_bytes_per_s: float


class Topology:
    """A system's graph with routing; building one validates connectivity and every device's pool routes."""

    def __init__(self, system: System) -> None:
        self.system = system
        graph = nx.Graph()
        for node in (*system.devices, *system.memories, *system.switches):
            graph.add_node(node.name)
        for link in system.links:
            graph.add_edge(link.a, link.b, link=link)
        self._graph = graph
        self._devices = frozenset(system.device_names)
        self._routes: dict[tuple[str, str], Route] = {}
        if graph.number_of_nodes() > 1 and not nx.is_connected(graph):
            parts = sorted((sorted(c) for c in nx.connected_components(graph)), key=len)
            raise HardwareError(
                f"system {system.name!r}: topology is disconnected; nodes {parts[0]} reach no other node"
            )
        self._capacity: dict[Resource, float] = {}
        for link in system.links:
            self._capacity[("link", link.a, link.b)] = link.bytes_per_s
            self._capacity[("link", link.b, link.a)] = link.bytes_per_s
        for mem in system.memories:
            self._capacity[("dram", mem.name)] = mem.dram_bytes_per_s
        for dev in system.device_names:
            for mem in system.pools.get(dev, ()):
                self.route(dev, mem)
        for r, ring in enumerate(system.rings):
            for a, b in zip(ring, ring[1:] + ring[:1]):
                if not graph.has_edge(a, b):
                    raise HardwareError(f"system {system.name!r}.rings[{r}]: {a} and {b} are neighbours but share no link")

    @property
    def graph(self) -> nx.Graph:
        return self._graph

    def capacity(self, resource: Resource) -> float:
        """Bandwidth of a resource in bytes/s."""
        return self._capacity[resource]

    @property
    def resources(self) -> dict[Resource, float]:
        return dict(self._capacity)

    def link(self, a: str, b: str) -> Link:
        try:
            return self._graph.edges[a, b]["link"]
        except KeyError:
            raise HardwareError(f"system {self.system.name!r}: no link between {a!r} and {b!r}") from None

    def route(self, src: str, dst: str) -> Route:
        """The route from ``src`` to ``dst``: fewest hops, then lowest latency, never through another device."""
        key = (src, dst)
        if key in self._routes:
            return self._routes[key]
        for node in (src, dst):
            if node not in self._graph:
                raise HardwareError(f"system {self.system.name!r}: no node {node!r}")
        allowed = self._graph.subgraph(n for n in self._graph if n not in self._devices or n in (src, dst))
        try:
            path = nx.shortest_path(
                allowed, src, dst, weight=lambda u, v, d: 1.0 + d["link"].latency_s
            )
        except nx.NetworkXNoPath:
            raise HardwareError(
                f"system {self.system.name!r}: no route from {src!r} to {dst!r} (devices do not forward traffic)"
            ) from None
        resources: list[Resource] = [("link", a, b) for a, b in zip(path, path[1:])]
        mem_names = {m.name for m in self.system.memories}
        for end in (src, dst):
            if end in mem_names:
                resources.append(("dram", end))
        latency = sum(self._graph.edges[a, b]["link"].latency_s for a, b in zip(path, path[1:]))
        bottleneck = min(self._capacity[r] for r in resources) if resources else float("inf")
        route = Route(src, dst, tuple(resources), latency, bottleneck)
        self._routes[key] = route
        return route

    def pool_routes(self, device: str) -> tuple[Route, ...]:
        """Routes from ``device`` to each memory of its pool (the offload direction)."""
        return tuple(self.route(device, m) for m in self.system.pool_of(device))

    def ring_hops(self, ring_index: int) -> Iterator[tuple[str, str, Route]]:
        """For each device on ring ``ring_index``: (device, next device, route along the ring between them)."""
        ring = self.system.rings[ring_index]
        devices = [n for n in ring if n in self._devices]
        positions = [ring.index(d) for d in devices]
        for i, (dev, pos) in enumerate(zip(devices, positions)):
            nxt_pos = positions[(i + 1) % len(devices)]
            segment = ring[pos : nxt_pos + 1] if nxt_pos > pos else ring[pos:] + ring[: nxt_pos + 1]
            resources = tuple(("link", a, b) for a, b in zip(segment, segment[1:]))
            latency = sum(self._graph.edges[a, b]["link"].latency_s for a, b in zip(segment, segment[1:]))
            bottleneck = min(self._capacity[r] for r in resources)
            yield dev, devices[(i + 1) % len(devices)], Route(dev, devices[(i + 1) % len(devices)], resources, latency, bottleneck)

    @cached_property
    def ring_count(self) -> int:
        return len(self.system.rings)
