"""Turn a finished (or deadlocked) engine into a :class:`~mcdla.sim.result.SimResult`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mcdla.sim.result import SimResult
from mcdla.units import format_bytes

if TYPE_CHECKING:
    from mcdla.sim.engine import Engine

__all__ = ["assemble"]


def _diagnose(engine: Engine) -> tuple[str, float]:
    """Why the iteration could not proceed, and the capacity that would have let the blocked operation run."""
    for device in engine.devices:
        static = engine.programs[device.index].static_bytes
        if static > device.limit:
            return (f"device {device.name} needs {format_bytes(static)} for its static bytes (weights, gradients, "
                    f"optimizer state) but only {format_bytes(device.capacity)} fit", static)
    fabric = engine.fabric
    for mem, waiters in enumerate(engine.mem_waiters):
        for device in waiters:
            layer = device.d2h[0]
            share = device.saved[layer] / len(fabric.offload_routes[device.index])
            need = engine.mem_used[mem] + share
            return (f"memory {fabric.memory_names[mem]} needs {format_bytes(need)} for the offload of layer "
                    f"{engine.layer_names[layer]} from device {device.name} but only "
                    f"{format_bytes(fabric.memory_capacity_bytes[mem])} fit", need)
    worst: tuple[float, str, str] | None = None
    for device in engine.devices:
        blocked = device.blocked_requests()
        if blocked:
            need, what = min(blocked)
            if worst is None or need > worst[0]:
                worst = (need, what, device.name)
    if worst is not None:
        need, what, name = worst
        cap = engine.devices[[d.name for d in engine.devices].index(name)].capacity
        return f"device {name} needs {format_bytes(need)} at {what} but only {format_bytes(cap)} fit", need
    stuck = [d.name for d in engine.devices if not d.finished]
    return f"the iteration deadlocked with devices {stuck} unfinished and no memory request pending", math.nan


def assemble(engine: Engine, *, workload: str, planner: str, parallel: str) -> SimResult:
    """Collect results; the breakdown follows NOTE [breakdown] in :mod:`mcdla.sim.result`."""
    fabric = engine.fabric
    devices = engine.devices
    feasible = engine.completed
    reason, needed = ("", max(d.peak for d in devices)) if feasible else _diagnose(engine)
    end = engine.end_s if feasible else math.inf
    critical = max(devices, key=lambda d: (d.prev_end, -d.index))
    tail = max(0.0, engine.collectives.last_end_s - critical.prev_end) if feasible else 0.0

    link_bytes = [0.0] * len(fabric.link_names)
    dram_bytes = [0.0] * len(fabric.memory_names)
    for route, nbytes in enumerate(engine.route_bytes):
        if nbytes:
            for link in fabric.route_links[route]:
                link_bytes[link] += nbytes
            for mem in fabric.route_drams[route]:
                dram_bytes[mem] += nbytes
    utilization = {}
    for name, nbytes, cap in zip(fabric.link_names, link_bytes, fabric.link_bytes_per_s):
        ok = feasible and end > 0 and math.isfinite(cap)
        utilization[name] = nbytes / (cap * end) if ok else 0.0

    node_peak = {d.name: d.peak for d in devices}
    node_cap = {d.name: d.capacity for d in devices}
    for mem, name in enumerate(fabric.memory_names):
        node_peak[name] = engine.mem_peak[mem]
        node_cap[name] = fabric.memory_capacity_bytes[mem]
    tiers = engine.tier_timeline or {}
    timeline: dict[str, list[tuple[float, float]]] = {  # host / memory-node: empty unless recorded
        "device": list(devices[0].timeline or ()),
        "host": tiers.get("host", []),
        "memory-node": tiers.get("memory-node", []),
    }
    if engine.record:
        for d in devices:
            timeline[d.name] = d.timeline or []
        for mem, name in enumerate(fabric.memory_names):
            timeline[name] = engine.mem_timeline[mem] if engine.mem_timeline is not None else []
    peak_device = max(d.peak for d in devices)
    return SimResult(
        system=fabric.name,
        workload=workload,
        planner=planner,
        parallel=parallel,
        devices=tuple(d.name for d in devices),
        feasible=feasible,
        infeasible_reason=reason,
        needed_bytes=needed,
        iteration_time_s=end,
        compute_s=critical.compute_s,
        recompute_s=critical.recompute_s,
        exposed_virtualization_s=critical.virt_s,
        exposed_communication_s=critical.comm_s + tail,
        critical_device=critical.name,
        peak_device_bytes=peak_device,
        peak_bytes_by_tier={"device": peak_device, "host": engine.tier_peak["host"],
                            "memory-node": engine.tier_peak["memory-node"]},
        peak_bytes_by_node=node_peak,
        capacity_bytes_by_node=node_cap,
        memory_timeline=timeline,
        offloaded_bytes=engine.offloaded_bytes,
        prefetched_bytes=engine.prefetched_bytes,
        collective_bytes=engine.collectives.total_bytes,
        link_bytes=dict(zip(fabric.link_names, link_bytes)),
        link_utilization=utilization,
        dram_bytes=dict(zip(fabric.memory_names, dram_bytes)),
        recorded=engine.record,
        spans=tuple(engine.spans) if engine.spans is not None else (),
        span_args=tuple(engine.span_args),
        stats={"events": engine.events, "rate_recomputes": engine.net.recomputes, "rate_solves": engine.net.solves},
    )
