"""The per-device pool bandwidth as planners should see it, derived from a system with the engine's flows.

NOTE [pool link]
``pool_link(system, device)`` drains one transfer of the same size from the device to its pool (every pool
memory gets an equal share, as offloads do) through the max-min flow network and reads the bandwidth off the
time it took: uncontended, only ``device`` transfers; contended, every device that has a pool transfers at
once (dc-dla: two GPUs share a PCIe switch uplink, 8 GB/s each). Offload and prefetch directions are drained
separately. ``shared_direction`` is True when running both directions at once (under the same contention) is
closer to the time of doing them one after the other than to the time of the slower one alone — e.g. when a
pool memory's DRAM, not the links, is the bottleneck. ``latency_s`` is the largest latency of the routes;
``pool_bytes`` the device's share of its pool memories (each memory's capacity divided among the devices
whose pool includes it when contended, whole otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mcdla.hardware.model import System
from mcdla.hardware.pool_link import PoolLink
from mcdla.sim.fabric import Fabric
from mcdla.sim.flows import FlowNetwork

__all__ = ["pool_link"]

_PROBE_BYTES = 1e9  # the transfer size used to measure (any size gives the same bandwidth)


def _drain_s(fabric: Fabric, transfers: Sequence[Sequence[int]], targets: Sequence[int]) -> float:
    """Time until every transfer in ``targets`` has drained, all ``transfers`` (route ids each) starting at 0."""
    net = FlowNetwork(fabric.capacities, fabric.routes)
    pending = [0] * len(transfers)
    finish = [0.0] * len(transfers)
    for k, routes in enumerate(transfers):
        for route in routes:
            size = _PROBE_BYTES / len(routes) * fabric.route_scale[route]
            if size > 0 and fabric.routes[route]:
                net.add(0.0, route, size, k)
                pending[k] += 1
    now = 0.0
    while any(pending[k] for k in targets):
        net.recompute(now)
        now = net.next_time
        for k in net.pop_finished(now):
            pending[k] -= 1
            if pending[k] == 0:
                finish[k] = now
    return max(finish[k] for k in targets)


def _rate(seconds: float) -> float:
    return _PROBE_BYTES / seconds if seconds > 0 else math.inf


def pool_link(system: System, device: str | None = None, *, contended: bool = True) -> PoolLink:
    """The bandwidth between ``device`` (default: the first) and its pool, as a :class:`PoolLink`.

    Args:
        contended: True: the device's max-min fair share when every device with a pool offloads (or prefetches)
            at once; False: the device alone (its route's bottleneck).

    Raises HardwareError (one line) for an unknown device, a device without a pool or a bad topology.
    """
    fabric = Fabric.from_system(system)
    name = device if device is not None else system.devices[0].name
    system.device(name)
    pool = system.pool_of(name)
    index = fabric.device_names.index(name)
    members = [i for i, parts in enumerate(fabric.offload_routes) if parts] if contended else [index]
    target = members.index(index)
    offload = [[route for _mem, route in fabric.offload_routes[i]] for i in members]
    prefetch = [[route for _mem, route in fabric.prefetch_routes[i]] for i in members]
    off_s = _drain_s(fabric, offload, [target])
    pre_s = _drain_s(fabric, prefetch, [target])
    both_s = _drain_s(fabric, offload + prefetch, [target, len(members) + target])
    apart_s, serial_s = max(off_s, pre_s), off_s + pre_s
    shared = serial_s > apart_s and both_s > (apart_s + serial_s) / 2
    latency = max(fabric.route_latency_s[route] for _mem, route in fabric.offload_routes[index])
    share_bytes = 0.0
    for mem_name in pool:
        users = sum(mem_name in system.pools.get(d, ()) for d in system.device_names) if contended else 1
        share_bytes += system.memory(mem_name).capacity_bytes / users
    how = "contended: max-min share with every device using its pool at once" if contended else "uncontended"
    return PoolLink(
        offload_bytes_per_s=_rate(off_s),
        prefetch_bytes_per_s=_rate(pre_s),
        latency_s=latency,
        shared_direction=shared,
        pool_bytes=share_bytes,
        source=f"mcdla.sim.pool_link({system.name}, {name}): to {'+'.join(pool)}; {how}",
    )
