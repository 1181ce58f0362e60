"""The simulation engine: one training iteration on every device of a system (``docs/timing-model.md``).

NOTE [event loop]
Time advances to the earliest of the next queued event and the next flow to drain. At that instant the engine
(1) completes the drained flows, (2) runs every event due, including those they schedule at the same instant,
(3) settles memory requests (NOTE [memory grants] in :mod:`mcdla.sim.device`) and repeats (2)-(3) until the
instant is quiet, then (4) recomputes flow rates once if any flow started or ended. Batching an instant this
way makes the result independent of the order of simultaneous events and costs one rate solve per instant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from mcdla.errors import SimError
from mcdla.hardware.model import System
from mcdla.sim.collectives import CollectiveRunner
from mcdla.sim.device import DeviceState
from mcdla.sim.events import EventQueue
from mcdla.sim.fabric import Fabric
from mcdla.sim.flows import FlowNetwork, Transfer
from mcdla.sim.program import Op, Program, build_program
from mcdla.sim.report import assemble
from mcdla.sim.result import SimResult
from mcdla.workload.model import Workload
from mcdla.workload.plan import Plan

__all__ = ["simulate", "simulate_fabric", "Engine"]

Parallel = Literal["data", "model"]


class Engine:
    """The state of one simulation: event queue, flow network, devices, pool memories and collectives."""

    def __init__(self, fabric: Fabric, programs: list[Program], *, unlimited_virtualization: bool,
                 record: bool) -> None:
        self.fabric = fabric
        self.queue = EventQueue()
        self.net = FlowNetwork(fabric.capacities, fabric.routes)
        self.spans: list[Any] | None = [] if record else None
        self.span_args: list[dict[str, Any]] = []
        self.record = record
        self.unlimited = unlimited_virtualization
        self.layer_names = programs[0].layer_names
        self.to_settle: list[DeviceState] = []
        self.devices = [
            DeviceState(self, i, d.name, d.hbm_bytes, programs[i], record or i == 0)  # device 0: always (profile)
            for i, d in enumerate(fabric.devices)
        ]
        self.programs = programs
        n_mem = len(fabric.memory_names)
        self.mem_used = [0.0] * n_mem
        self.mem_peak = [0.0] * n_mem
        self.mem_limit = [c * (1.0 + 1e-9) for c in fabric.memory_capacity_bytes]
        self.mem_waiters: list[deque[DeviceState]] = [deque() for _ in range(n_mem)]
        self.mem_timeline: list[list[tuple[float, float]]] | None = [[] for _ in range(n_mem)] if record else None
        self.tier_used = {"host": 0.0, "memory-node": 0.0}
        self.tier_peak = {"host": 0.0, "memory-node": 0.0}
        # Pool timelines only when recording: without it the engine keeps the tiers' peaks, not their steps.
        self.tier_timeline: dict[str, list[tuple[float, float]]] | None = (
            {"host": [], "memory-node": []} if record else None)
        self.collectives = CollectiveRunner(self)
        self.coll_done = self.collectives.done
        self.coll_done_t = self.collectives.done_s
        self.route_bytes = [0.0] * len(fabric.routes)
        self.offloaded_bytes = 0.0
        self.prefetched_bytes = 0.0
        self.finished = 0
        self.end_s = 0.0
        self.events = 0

    def record_span(self, span: tuple[int, int, str, str, float, float], **args: Any) -> None:
        """Keep one operation for the trace (only when recording) with its details (``Span`` and its args)."""
        if self.spans is not None:
            self.spans.append(span)
            self.span_args.append(args)

    def pool_names(self, device_index: int) -> str:
        """The pool memories a device's offloads are spread over, as one string (a span's ``tier``)."""
        names = self.fabric.memory_names
        return ",".join(names[mem] for mem, _route in self.fabric.offload_routes[device_index])

    # -- transfers ---------------------------------------------------------------------------------------------
    def transfer(self, parts: list[tuple[int, float]], handler: Callable[[Any, float], None], arg: Any,
                 now: float, latency_s: float | None = None) -> None:
        """Start one flow per ``(route id, bytes)``; ``handler(arg, t)`` runs when all have drained plus
        ``latency_s`` (default: the largest latency of the routes)."""
        fabric = self.fabric
        latency = max(fabric.route_latency_s[route] for route, _ in parts) if latency_s is None else latency_s
        t = Transfer(latency, handler, arg)
        routes, scale, route_bytes, net = fabric.routes, fabric.route_scale, self.route_bytes, self.net
        for route, nbytes in parts:
            route_bytes[route] += nbytes
            size = nbytes * scale[route]
            if size > 0.0 and routes[route]:
                net.add(now, route, size, t)
                t.pending += 1
        if t.pending == 0:
            self.queue.push(now + latency, handler, arg)

    def start_offload(self, device: DeviceState, layer: int, now: float) -> None:
        if self.unlimited:
            self.queue.push(now, device.end_offload, layer)
            return
        parts = self.fabric.offload_routes[device.index]
        share = device.saved[layer] / len(parts)
        self.transfer([(route, share) for _mem, route in parts], device.end_offload, layer, now)

    def start_prefetch(self, device: DeviceState, layer: int, now: float) -> None:
        if self.unlimited:
            self.queue.push(now, device.end_prefetch, layer)
            return
        parts = self.fabric.prefetch_routes[device.index]
        share = device.saved[layer] / len(parts)
        self.transfer([(route, share) for _mem, route in parts], device.end_prefetch, layer, now)

    # -- pool memories ----------------------------------------------------------------------------------------
    def _mem_change(self, mem: int, delta: float, now: float) -> None:
        used = self.mem_used[mem] + delta
        used = used if used > 0.0 else 0.0
        self.mem_used[mem] = used
        if used > self.mem_peak[mem]:
            self.mem_peak[mem] = used
        kind = self.fabric.memory_kinds[mem]
        total = self.tier_used[kind] + delta
        total = total if total > 0.0 else 0.0
        self.tier_used[kind] = total
        if total > self.tier_peak[kind]:
            self.tier_peak[kind] = total
        if self.mem_timeline is not None:
            self.mem_timeline[mem].append((now, used))
        if self.tier_timeline is not None:
            self.tier_timeline[kind].append((now, total))

    def pool_reserve(self, device: DeviceState, layer: int, now: float) -> bool:
        """Reserve the pool space of an offload; False (and queue ``device``) when a pool memory is full."""
        parts = self.fabric.offload_routes[device.index]
        share = device.saved[layer] / len(parts)
        for mem, _route in parts:
            if self.mem_used[mem] + share > self.mem_limit[mem]:
                if device not in self.mem_waiters[mem]:
                    self.mem_waiters[mem].append(device)
                return False
        for mem, _route in parts:
            self._mem_change(mem, share, now)
        return True

    def pool_hold_state(self, device: DeviceState, nbytes: float, now: float) -> None:
        """Count ``nbytes`` (negative: release) of ``device``'s weights, gradients or optimizer state in its pool
        memories, spread like its offloads (NOTE [state in the program]); state never waits for room."""
        parts = self.fabric.offload_routes[device.index]
        if not parts:
            raise SimError(f"device {device.name!r} has no pool memory; the plan moves weights or optimizer state")
        for mem, _route in parts:
            self._mem_change(mem, nbytes / len(parts), now)

    def pool_release(self, device: DeviceState, layer: int, now: float) -> None:
        """Free the pool space of a prefetched tensor and retry offloads waiting for it."""
        parts = self.fabric.prefetch_routes[device.index]
        share = device.saved[layer] / len(parts)
        for mem, _route in parts:
            self._mem_change(mem, -share, now)
            waiters = self.mem_waiters[mem]
            for _ in range(len(waiters)):
                waiters.popleft().try_d2h(now)

    # -- collectives and completion ---------------------------------------------------------------------------
    def arrive(self, device: DeviceState, op: Op, now: float) -> int:
        return self.collectives.arrive(device, op, now)

    def device_finished(self, device: DeviceState, now: float) -> None:
        self.finished += 1

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Run the iteration to its end or to a deadlock (NOTE [event loop])."""
        queue, net, to_settle = self.queue, self.net, self.to_settle
        for device in self.devices:
            static = self.programs[device.index].static_bytes
            if static > device.limit:
                return
            device.alloc(static, 0.0)
            if self.programs[device.index].pool_state_bytes > 0.0 and not self.unlimited:
                self.pool_hold_state(device, self.programs[device.index].pool_state_bytes, 0.0)
        for device in self.devices:
            device.try_compute(0.0)
        now = 0.0
        self._settle(now)
        while True:
            if net.dirty:
                net.recompute(now)
            t_queue = queue.peek_time()
            t_net = net.next_time
            now = t_queue if t_queue < t_net else t_net
            if now == math.inf:
                break
            for transfer in net.pop_finished(now):
                transfer.pending -= 1
                if transfer.pending == 0:
                    queue.push(now + transfer.latency_s, transfer.handler, transfer.arg)
            while True:
                self.events += queue.run_until(now)
                if not to_settle:
                    break
                self._settle(now)
        self.end_s = max(max((d.prev_end for d in self.devices), default=0.0), self.collectives.last_end_s)

    def _settle(self, now: float) -> None:
        to_settle = self.to_settle
        while to_settle:
            batch = to_settle[:]
            to_settle.clear()
            for device in batch:
                device.settle(now)

    @property
    def completed(self) -> bool:
        return self.finished == len(self.devices) and self.collectives.all_done


def _programs(fabric: Fabric, workload: Workload, plan: Plan, parallel: str, bucket_bytes: float) -> list[Program]:
    cache: dict[tuple[Any, ...], Program] = {}
    programs = []
    n = len(fabric.devices)
    for device in fabric.devices:
        key = (tuple(sorted(device.peak_flops_per_s.items())), device.hbm_bytes_per_s, device.compute_efficiency,
               device.memory_efficiency)
        if key not in cache:
            cache[key] = build_program(workload, plan, device, model_parallel=parallel == "model", n_devices=n,
                                       bucket_bytes=bucket_bytes)
        programs.append(cache[key])
    return programs


def simulate_fabric(fabric: Fabric, workload: Workload, plan: Plan, *, parallel: Parallel = "data",
                    bucket_bytes: float = 25 * 2**20, unlimited_virtualization_bandwidth: bool = False,
                    record_timeline: bool = False) -> SimResult:
    """:func:`simulate` on an already compiled fabric (the single-device path builds one without a System)."""
    if parallel not in ("data", "model"):
        raise SimError(f"parallel: got {parallel!r}; must be 'data' or 'model'")
    if not bucket_bytes > 0 or math.isinf(bucket_bytes):
        raise SimError(f"bucket_bytes: got {bucket_bytes!r}; must be finite and > 0")
    programs = _programs(fabric, workload, plan, parallel, bucket_bytes)
    if any(programs[0].offloaded):
        for i, parts in enumerate(fabric.offload_routes):
            if not parts:
                raise SimError(f"system {fabric.name!r}: device {fabric.devices[i].name!r} has no pool memory to "
                               "offload to; the plan offloads")
    if (len(fabric.devices) > 1 and not fabric.rings and fabric.collective_algorithm == "ring"
            and any(op.coll_bytes > 0 for op in programs[0].ops)):
        raise SimError(f"system {fabric.name!r}: {len(fabric.devices)} devices but no rings; "
                       f"{parallel}-parallel collectives need at least one ring")
    engine = Engine(fabric, programs, unlimited_virtualization=unlimited_virtualization_bandwidth,
                    record=record_timeline)
    engine.run()
    return assemble(engine, workload=workload.name, planner=plan.planner, parallel=parallel)


def simulate(system: System, workload: Workload, plan: Plan, *, parallel: Parallel = "data",
             bucket_bytes: float = 25 * 2**20, unlimited_virtualization_bandwidth: bool = False,
             record_timeline: bool = False, collective_algorithm: str = "ring") -> SimResult:
    """Simulate one training iteration of ``workload`` under ``plan`` on every device of ``system``.

    Args:
        system: the hardware; each device's capacity is its ``hbm_bytes``.
        workload: what one device processes (data parallel: one replica's batch; model parallel: the whole
            batch, every layer split over the devices).
        plan: keep / offload / recompute per saved tensor (``docs/timing-model.md``); must name this workload's
            layers (PlanError otherwise).
        parallel: ``"data"`` (bucketed ring all-reduce of gradients, overlapped with backward) or ``"model"``.
        bucket_bytes: gradient bucket size of the data-parallel all-reduce (bytes).
        unlimited_virtualization_bandwidth: offloads and prefetches take no time (the oracle's bound).
        record_timeline: keep every operation and memory step for :meth:`SimResult.to_chrome_trace`.
        collective_algorithm: ``"ring"`` (over the system's rings), ``"tree"`` or ``"in-network"`` (one collective
            of every device, NOTE [ring collectives] in :mod:`mcdla.sim.collectives`).

    Returns:
        a SimResult; ``feasible`` is False (never an exception) when the iteration deadlocks on memory.

    Raises:
        HardwareError: a disconnected topology or a device with no route to its pool.
        PlanError: a plan for other layers, recomputing layer 0, a prefetch trigger that is not a later layer.
        SimError: any other impossible request (bad argument, offloads without a pool, ring collectives without
            rings, in-network collectives without a switch).
    """
    return simulate_fabric(Fabric.from_system(system, collective_algorithm=collective_algorithm), workload, plan, parallel=parallel, bucket_bytes=bucket_bytes,
                           unlimited_virtualization_bandwidth=unlimited_virtualization_bandwidth,
                           record_timeline=record_timeline)
