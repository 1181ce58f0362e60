"""Which shared resources each traffic class of a generated node crosses, and the offload bandwidth they allow.

A generated system (:class:`~mcdla.hardware.cluster.Cluster`) is a node template copied ``nodes`` times. Its GPUs
are symmetric, so one GPU's paths describe them all: for each traffic class (``offload`` to the GPU's pool,
``scale-up`` into the NVLink domain, ``scale-out`` onto the GPU's network rail) the sequence of
:class:`PathResource` s it crosses, each with its capacity, whether the two directions share it, how many GPUs of
the node send the same class through it, and what fraction of one GPU's traffic of that class it carries. An
engine places flows on these (the names are the resources of :meth:`Cluster.expand`, for GPU 0 of node 0, with
the ``n0.`` prefix dropped); :func:`offload_link` turns the offload path into the planners' :class:`PoolLink`.
:func:`node_paths` reads the paths off a switched node's template without routing; :func:`graph_paths` takes them
from the routes of a listed graph (a node wired without a scale-up switch, an explicit graph file).

NOTE [direction sharing]
Links (PCIe, NVLink-C2C, NVLink ports, CXL, memory-node links, network rails) are full duplex: an offload and a
prefetch each have the link's bandwidth. A memory's DRAM and the GPU's own HBM are not: reads and writes share
one bus, so when both directions run at once they split it. :func:`offload_link` reports ``shared_direction``
when running both directions together takes more than half-way from the time of one to the time of both one
after the other (the rule of :func:`mcdla.sim.pool_link`): on Grace-backed presets (C2C 450 GB/s each way
against LPDDR5X shared by reads and writes) the DRAM binds and the directions share; behind PCIe they do not.

NOTE [symmetric closed form]
Every GPU of the node offloads at once, each interleaving its pages evenly over its ``q`` pool memories (the
event engine's and the planners' convention). A resource crossed by ``g`` GPUs, each sending the fraction ``f``
of its traffic through it, of capacity ``C``, lets each GPU move at most ``C / (g f)`` bytes/s; the GPU's
bandwidth is the least of these (the max-min share of equal flows on a symmetric node), twice the load on the
resources that are not duplex when both directions run. No routing: O(resources of one GPU), whatever the node
size (tested equal to the routed max-min computation, :func:`mcdla.sim.pool_link`, on the expanded presets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from mcdla.errors import HardwareError
from mcdla.hardware.model import Device, System
from mcdla.hardware.pool_link import PoolLink

__all__ = ["TRAFFIC_CLASSES", "PathResource", "TrafficPath", "graph_paths", "node_paths", "offload_link",
           "routed_offload_link"]

TRAFFIC_CLASSES = ("offload", "scale-up", "scale-out")
"""``offload``: a GPU's copies to and from its pool memories; ``scale-up``: its collectives and sends inside the
NVLink domain; ``scale-out``: those across nodes, on its network rail."""

Traffic = Literal["offload", "scale-up", "scale-out"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PathResource:
    """One shared resource on a GPU's path.

    Attributes:
        resource: its name in :meth:`Cluster.expand` (``("link", a, b)`` for the a->b direction, ``("dram",
            memory)``, ``("hbm", gpu)``), as :class:`~mcdla.hardware.topology.Topology` names resources.
        bytes_per_s: capacity: per direction for a link, both directions together otherwise (``duplex``).
        duplex: True for a link (each direction has ``bytes_per_s``), False for DRAM and HBM (NOTE
            [direction sharing]).
        sharers: GPUs of one node whose traffic of this class crosses it.
        fraction: share of one GPU's traffic of this class that crosses it (``1 / q`` for one of ``q``
            interleaved pool memories).
        source: where the capacity comes from.
    """

    resource: tuple[str, ...]
    bytes_per_s: float
    duplex: bool
    sharers: int
    fraction: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        name = "/".join(self.resource)
        if not (self.bytes_per_s > 0):
            raise HardwareError(f"path resource {name!r}.bytes_per_s: got {self.bytes_per_s!r}; must be > 0")
        if isinstance(self.sharers, bool) or not isinstance(self.sharers, int) or self.sharers < 1:
            raise HardwareError(f"path resource {name!r}.sharers: got {self.sharers!r}; must be an integer >= 1")
        if not 0 < self.fraction <= 1:
            raise HardwareError(f"path resource {name!r}.fraction: got {self.fraction!r}; must be in (0, 1]")

    def load_s_per_byte(self, *, both_directions: bool = False) -> float:
        """Seconds this resource needs per byte each GPU moves (one direction, or both at once)."""
        if math.isinf(self.bytes_per_s):
            return 0.0
        twice = 2.0 if both_directions and not self.duplex else 1.0
        return twice * self.sharers * self.fraction / self.bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficPath:
    """What one GPU's traffic of one class crosses (module docstring).

    Attributes:
        traffic: one of :data:`TRAFFIC_CLASSES`.
        resources: the shared resources, in path order from the GPU.
        latency_s: one-way latency of the path (the longest route for interleaved offloads).
    """

    traffic: Traffic
    resources: tuple[PathResource, ...]
    latency_s: float

    def bytes_per_s(self, *, both_directions: bool = False) -> float:
        """Each GPU's bandwidth when every sharer sends at once (NOTE [symmetric closed form])."""
        worst = max((r.load_s_per_byte(both_directions=both_directions) for r in self.resources), default=0.0)
        return math.inf if worst == 0.0 else 1.0 / worst


def offload_link(path: TrafficPath, *, pool_bytes: float, source: str) -> PoolLink:
    """The planners' :class:`PoolLink` of an offload path: the bandwidth each way with every GPU offloading,
    ``shared_direction`` by NOTE [direction sharing], and ``pool_bytes`` (the GPU's share of its pool)."""
    if path.traffic != "offload":
        raise HardwareError(f"offload_link: got a {path.traffic!r} path; must be the offload path")
    one = path.bytes_per_s()
    both = path.bytes_per_s(both_directions=True)
    # equal sizes each way: apart = 1/one, serial = 2/one, together = 1/both (NOTE [direction sharing])
    shared = math.isfinite(one) and 1.0 / both > 1.5 / one
    return PoolLink(offload_bytes_per_s=one, prefetch_bytes_per_s=one, latency_s=path.latency_s,
                    shared_direction=shared, pool_bytes=pool_bytes, source=source)


def routed_offload_link(system: System, device: str | None = None) -> PoolLink:
    """The same offload link for an explicit system (the 2018 presets, an expanded node), from its routes: every
    device with a pool offloads at once, pages interleaved evenly over its pool; a resource's load is the summed
    fraction of each device's traffic its routes put on it, each way (offload routes device -> memory, prefetch
    routes memory -> device), and the device's bandwidth is the least capacity / load over its own routes (NOTE
    [symmetric closed form]; equal to the max-min drain of :func:`mcdla.sim.pool_link` when the devices that share
    a resource are symmetric, which tests check on the presets). One-line HardwareError for an unknown device or
    one without a pool."""
    from mcdla.hardware.topology import Topology

    topo = Topology(system)
    name = device if device is not None else system.devices[0].name
    system.device(name)
    pool = system.pool_of(name)
    if not pool:
        raise HardwareError(f"system {system.name!r}: device {name!r} has no pool memory to offload to")
    off: dict[tuple[str, ...], float] = {}
    pre: dict[tuple[str, ...], float] = {}
    users: dict[str, int] = {}
    for dev in system.devices:
        mems = system.pools.get(dev.name, ())
        for mem in mems:
            users[mem] = users.get(mem, 0) + 1
            for load, route in ((off, topo.route(dev.name, mem)), (pre, topo.route(mem, dev.name))):
                for res in (("hbm", dev.name), *route.resources):
                    load[res] = load.get(res, 0.0) + 1.0 / len(mems)
    capacity = dict(topo.resources)
    capacity.update({("hbm", d.name): d.hbm_bytes_per_s for d in system.devices})

    def shared(res: tuple[str, ...]) -> bool:
        return res[0] != "link"  # DRAM and HBM: both directions on one bus (NOTE [direction sharing])

    def seconds_per_byte(routes: list[tuple[str, ...]], *, both: bool, load: dict[tuple[str, ...], float]) -> float:
        worst = 0.0
        for res in routes:
            cap = capacity[res]
            if math.isinf(cap):
                continue
            total = load.get(res, 0.0)
            if both:  # the other direction's traffic on this resource: the same bus, or this link direction
                total += (pre if load is off else off).get(res, 0.0)
            worst = max(worst, total / cap)
        return worst

    own_off = sorted({("hbm", name), *(r for m in pool for r in topo.route(name, m).resources)})
    own_pre = sorted({("hbm", name), *(r for m in pool for r in topo.route(m, name).resources)})
    one_off = seconds_per_byte(own_off, both=False, load=off)
    one_pre = seconds_per_byte(own_pre, both=False, load=pre)
    both = max(seconds_per_byte(own_off, both=True, load=off), seconds_per_byte(own_pre, both=True, load=pre))
    rate = lambda t: math.inf if t == 0.0 else 1.0 / t  # noqa: E731 - seconds per byte to bytes/s
    apart, serial = max(one_off, one_pre), one_off + one_pre
    return PoolLink(offload_bytes_per_s=rate(one_off), prefetch_bytes_per_s=rate(one_pre),
                    latency_s=max(topo.route(name, m).latency_s for m in pool),
                    shared_direction=serial > apart and both > (apart + serial) / 2,
                    pool_bytes=sum(system.memory(m).capacity_bytes / users[m] for m in pool),
                    source=f"{system.name}: {name} with every device offloading at once, pages interleaved over "
                           f"{'+'.join(pool)} (closed form over routes, mcdla.hardware.traffic)")


def _link(figures: dict[str, Any]) -> tuple[float, float, str]:
    """(bytes/s per direction, latency s, source) of a link template of a node file."""
    from mcdla.hardware.io import _LinkSpec

    spec = _LinkSpec.model_validate({"a": "x", "b": "y", **figures})
    return spec.bandwidth, spec.latency, spec.source


def _memory(figures: dict[str, Any]) -> tuple[float, float, str]:
    """(capacity bytes, DRAM bytes/s, source) of a memory template of a node file."""
    from mcdla.hardware.io import _MemorySpec

    spec = _MemorySpec.model_validate({"name": "m", **figures})
    return spec.capacity, spec.dram_bandwidth, spec.source


def node_paths(node: Any, scale_out: Any, device: Device, *, in_use: int | None = None,
               ) -> tuple[tuple[TrafficPath, ...], float]:
    """GPU 0's :class:`TrafficPath` s of a validated node spec (``mcdla.hardware.cluster``'s file spec) and its
    share of its pool memories (bytes; 0 without a pool), as :meth:`Cluster.expand` wires the node (NOTE
    [generated names] there: GPU i on socket ``i * sockets // gpus``, pools per ``node.pool``).

    ``in_use``: only GPUs ``0 .. in_use - 1`` of the node send (a job smaller than one node; ranks fill the GPUs
    in order), so a resource of the pool is shared by those of its GPUs alone: a socket's, a PCIe switch's and
    the memory-nodes' (each GPU's group of sharers is GPUs ``0 ..`` its size, so the count is the lesser of the
    two). The scale-up and scale-out resources are the GPU's own either way."""
    k = node.gpus
    used = k if in_use is None else max(1, min(in_use, k))
    paths: list[TrafficPath] = []
    up = node.scale_up
    port = None
    if up is not None:
        port = PathResource(resource=("link", "gpu0", "nvswitch"), bytes_per_s=up.bandwidth, duplex=True, sharers=1,
                            source=up.source)
        paths.append(TrafficPath(traffic="scale-up", resources=(port,), latency_s=up.latency))
    gpu_link = None
    uplink: PathResource | None = None  # the PCIe switch's link to the socket, shared by its GPUs
    if node.sockets is not None:
        bw, lat, src = _link(node.sockets.gpu_link)
        switch = node.sockets.pcie_switch
        gpu_link = (PathResource(resource=("link", "gpu0", "pcie0" if switch else "cpu0"), bytes_per_s=bw, duplex=True,
                                 sharers=1, source=src), lat * 2 if switch else lat)
        if switch is not None:
            uplink = PathResource(resource=("link", "pcie0", "cpu0"), bytes_per_s=bw, duplex=True,
                                  sharers=min(switch.shared_by, used), source=src)
    if scale_out is not None:
        rail = PathResource(resource=("link", "gpu0", scale_out.name), bytes_per_s=scale_out.bandwidth, duplex=True,
                            sharers=1, source=scale_out.source)
        via = (gpu_link[0],) if scale_out.via_gpu_link and gpu_link is not None else ()
        paths.append(TrafficPath(traffic="scale-out", resources=(*via, rail), latency_s=scale_out.latency))

    groups = node.pool if node.pool is not None else [
        g for g in ("sockets", "expanders", "memory_nodes") if getattr(node, g) is not None]
    on_socket = sum(1 for i in range(used) if i * node.sockets.count // k == 0) if node.sockets is not None else 0
    # pool memories of GPU 0: (resources beyond the GPU's first hop, capacity, GPUs sharing the memory, latency)
    targets: list[tuple[list[PathResource], float, int, float]] = []
    if "sockets" in groups:
        cap, dram, src = _memory(node.sockets.memory)
        targets.append(([PathResource(resource=("dram", "host0"), bytes_per_s=dram, duplex=False, sharers=on_socket,
                                      source=src)], cap, on_socket, gpu_link[1] if gpu_link else 0.0))
    if "expanders" in groups:
        cap, dram, msrc = _memory(node.expanders.memory)
        bw, lat, lsrc = _link(node.expanders.link)
        for e in range(node.expanders.per_socket):
            name = f"cxl0_{e}"
            targets.append(([PathResource(resource=("link", "cpu0", name), bytes_per_s=bw, duplex=True,
                                          sharers=on_socket, source=lsrc),
                             PathResource(resource=("dram", name), bytes_per_s=dram, duplex=False, sharers=on_socket,
                                          source=msrc)], cap, on_socket, (gpu_link[1] if gpu_link else 0.0) + lat))
    behind_port = 0
    if "memory_nodes" in groups:
        cap, dram, msrc = _memory(node.memory_nodes.memory)
        bw, lat, lsrc = _link(node.memory_nodes.link)
        behind_port = node.memory_nodes.count
        for m in range(node.memory_nodes.count):
            name = f"mem{m}"
            targets.append(([PathResource(resource=("link", "nvswitch", name), bytes_per_s=bw, duplex=True,
                                          sharers=used, source=lsrc),
                             PathResource(resource=("dram", name), bytes_per_s=dram, duplex=False, sharers=used,
                                          source=msrc)], cap, used, up.latency / 2 + lat))
    if not targets:
        return tuple(paths), 0.0
    q = len(targets)
    first: list[PathResource] = [PathResource(resource=("hbm", "gpu0"), bytes_per_s=device.hbm_bytes_per_s,
                                              duplex=False, sharers=1, source=device.source)]
    behind_link = q - behind_port
    if behind_link:
        assert gpu_link is not None  # sockets and expanders hang off the socket the GPU's link reaches
        first += [PathResource(resource=r.resource, bytes_per_s=r.bytes_per_s, duplex=True, sharers=r.sharers,
                               fraction=behind_link / q, source=r.source)
                  for r in (gpu_link[0], *((uplink,) if uplink is not None else ()))]
    if behind_port:
        assert port is not None
        first.append(PathResource(resource=port.resource, bytes_per_s=port.bytes_per_s, duplex=True, sharers=1,
                                  fraction=behind_port / q, source=port.source))
    rest = [PathResource(resource=r.resource, bytes_per_s=r.bytes_per_s, duplex=r.duplex, sharers=r.sharers,
                         fraction=1 / q, source=r.source) for res, _cap, _users, _lat in targets for r in res]
    latency = max(lat for _res, _cap, _users, lat in targets)
    paths.insert(0, TrafficPath(traffic="offload", resources=(*first, *rest), latency_s=latency))
    return tuple(paths), sum(cap / users for _res, cap, users, _lat in targets)


def graph_paths(system: System, *, in_use: int | None = None) -> tuple[tuple[TrafficPath, ...], float]:
    """The first device's :class:`TrafficPath` s on a listed graph (a node without a scale-up switch,
    :mod:`mcdla.hardware.direct_topology`, or an explicit system file) and its share of its pool memories (bytes;
    0 without a pool), from the graph's routes: ``scale-up`` is its hop on each collective ring (a collective's
    data split evenly over the rings), ``offload`` its routes to its pool memories (pages interleaved evenly).

    A resource's ``sharers`` are the devices whose hops or routes cross it, each taken to send the first
    device's share: exact on the symmetric 2018 graphs (tests check the offload bandwidth against
    :func:`routed_offload_link`), an estimate on an asymmetric file. ``in_use``: only the first ``in_use``
    devices offload (a job smaller than the node), so only their routes share the pool's resources; the rings
    stay the whole node's."""
    from mcdla.hardware.topology import Topology

    topo = Topology(system)
    first = system.devices[0]
    capacity = {**topo.resources, **{("hbm", d.name): d.hbm_bytes_per_s for d in system.devices}}

    def resource(res: tuple[str, ...], users: set[str], count: int, of: int) -> PathResource:
        source = topo.link(res[1], res[2]).source if res[0] == "link" else (
            first.source if res[0] == "hbm" else system.memory(res[1]).source)
        return PathResource(resource=res, bytes_per_s=capacity[res], duplex=res[0] == "link", sharers=len(users),
                            fraction=count / of, source=source)

    paths: list[TrafficPath] = []
    if system.rings and len(system.devices) > 1:
        users: dict[tuple[str, ...], set[str]] = {}
        mine: dict[tuple[str, ...], int] = {}
        latency = 0.0
        for r in range(len(system.rings)):
            for dev, _next, route in topo.ring_hops(r):
                for res in route.resources:
                    users.setdefault(res, set()).add(dev)
                    if dev == first.name:
                        mine[res] = mine.get(res, 0) + 1
                if dev == first.name:
                    latency = max(latency, route.latency_s)
        paths.append(TrafficPath(traffic="scale-up", latency_s=latency, resources=tuple(
            resource(res, users[res], n, len(system.rings)) for res, n in mine.items())))
    pool = system.pools.get(first.name, ())
    if not pool:
        return tuple(paths), 0.0
    users = {}
    holders: dict[str, int] = {}
    for dev in system.devices[:in_use]:
        for mem in system.pools.get(dev.name, ()):
            holders[mem] = holders.get(mem, 0) + 1
            for res in (("hbm", dev.name), *topo.route(dev.name, mem).resources):
                users.setdefault(res, set()).add(dev.name)
    mine = {("hbm", first.name): len(pool)}
    for mem in pool:
        for res in topo.route(first.name, mem).resources:
            mine[res] = mine.get(res, 0) + 1
    paths.insert(0, TrafficPath(traffic="offload", latency_s=max(topo.route(first.name, m).latency_s for m in pool),
                                resources=tuple(resource(res, users[res], n, len(pool)) for res, n in mine.items())))
    return tuple(paths), sum(system.memory(m).capacity_bytes / holders[m] for m in pool)
