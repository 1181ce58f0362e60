"""The result of simulating one training iteration, and its Chrome-trace export.

NOTE [breakdown]
The breakdown is read off the *critical device*: the device whose compute stream finishes last (the lowest
rank on a tie). Its compute stream is either busy or waiting, so

    iteration_time_s = compute_s + recompute_s + exposed_virtualization_s + exposed_communication_s

``compute_s`` sums its forward and backward operations, ``recompute_s`` its re-run forwards. A wait before an
operation that depends on a collective (model parallel) is communication up to the time that collective
ended; every other wait (data not yet prefetched, memory not yet freed by an offload) is virtualization. The
time from the critical device's last operation to the end of the last collective (the gradient all-reduce tail
of data parallelism) is communication.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcdla.errors import SimError

__all__ = ["SimResult", "STREAMS", "Span"]

STREAMS = ("compute", "offload (D2H)", "prefetch (H2D)", "collectives")
"""Thread names of a device in the trace, by stream id."""

Span = tuple[int, int, str, str, float, float]
"""``(device index or -1 for a collective, stream id, name, category, start_s, end_s)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """One simulated iteration. Times in s, sizes in bytes; see NOTE [breakdown] for how times add up.

    Attributes:
        system, workload, planner, parallel: what was simulated.
        devices: device names in rank order.
        feasible: False when the iteration deadlocked on memory; then ``iteration_time_s`` is inf,
            ``infeasible_reason`` says where and ``needed_bytes`` is the smallest capacity that would have let the
            blocked operation start at that point. When feasible, ``needed_bytes`` is the peak device
            occupancy: the smallest capacity that yields exactly this schedule.
        iteration_time_s, compute_s, recompute_s, exposed_virtualization_s, exposed_communication_s: see above.
        critical_device: the device the breakdown is read from.
        peak_device_bytes: highest device occupancy of any device.
        peak_bytes_by_tier: ``"device"``: as ``peak_device_bytes``; ``"host"`` / ``"memory-node"``: peak of the
            total bytes resident in all pool memories of that kind.
        peak_bytes_by_node, capacity_bytes_by_node: per device and per pool memory.
        memory_timeline: ``(time_s, bytes)`` steps: ``"device"`` (device 0, always), ``"host"``, ``"memory-node"``
            (totals of the tier; empty lists unless ``record_timeline``); with ``record_timeline`` also one entry
            per device and memory name.
        offloaded_bytes, prefetched_bytes: summed over devices.
        collective_bytes: summed size of all collectives, each counted once (a 100 MB all-reduce adds 100 MB).
        link_bytes, link_utilization: per directed link ``"a->b"``: bytes carried, and bytes / (bandwidth x
            iteration time) (0 for unlimited links).
        dram_bytes: bytes read or written per pool memory's DRAM.
        spans: recorded operations (only with ``record_timeline``); use :meth:`trace_events`.
        span_args: the details of each span, in the same order (a compute span's layer, phase, FLOPs and bytes
            moved; an offload's or prefetch's layer, tensor, bytes and pool memories; a collective's bytes and
            kind): the ``args`` of the trace's events.
        stats: engine counters (events, rate solves) for benchmarks.
    """

    system: str
    workload: str
    planner: str
    parallel: str
    devices: tuple[str, ...]
    feasible: bool
    infeasible_reason: str
    needed_bytes: float
    iteration_time_s: float
    compute_s: float
    recompute_s: float
    exposed_virtualization_s: float
    exposed_communication_s: float
    critical_device: str
    peak_device_bytes: float
    peak_bytes_by_tier: dict[str, float]
    peak_bytes_by_node: dict[str, float]
    capacity_bytes_by_node: dict[str, float]
    memory_timeline: dict[str, list[tuple[float, float]]]
    offloaded_bytes: float
    prefetched_bytes: float
    collective_bytes: float
    link_bytes: dict[str, float]
    link_utilization: dict[str, float]
    dram_bytes: dict[str, float]
    recorded: bool = False
    spans: tuple[Span, ...] = field(default=(), repr=False)
    span_args: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    stats: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def breakdown(self) -> dict[str, float]:
        """The four parts of the iteration time (s), keyed like the fields."""
        return {
            "compute_s": self.compute_s,
            "recompute_s": self.recompute_s,
            "exposed_virtualization_s": self.exposed_virtualization_s,
            "exposed_communication_s": self.exposed_communication_s,
        }

    # -- Chrome trace -------------------------------------------------------------------------------------------
    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome trace events: one process per device (threads = streams) and per pool memory, ``X`` events for
        operations, transfers and collectives (their ``args`` from :attr:`span_args`), a flow (``s`` / ``f``)
        from each offload to the prefetch of the same tensor, ``C`` counters for memory. Times in microseconds."""
        if not self.recorded:
            raise SimError("trace: the result has no timeline; simulate with record_timeline=True")
        events: list[dict[str, Any]] = []
        n = len(self.devices)
        for pid, name in enumerate(self.devices):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            for tid, stream in enumerate(STREAMS):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
        args = self.span_args if len(self.span_args) == len(self.spans) else ({},) * len(self.spans)
        for (dev, tid, name, cat, start, end), details in zip(self.spans, args):
            for pid in range(n) if dev < 0 else (dev,):
                events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                               "ts": start * 1e6, "dur": (end - start) * 1e6, "args": dict(details)})
        events.extend(_offload_flows(self.spans, args))
        pools = [node for node in self.capacity_bytes_by_node if node not in self.devices]
        for offset, node in enumerate(pools):
            events.append({"ph": "M", "name": "process_name", "pid": n + offset, "tid": 0, "args": {"name": node}})
        for pid, node in enumerate((*self.devices, *pools)):
            for t, value in self.memory_timeline.get(node, ()):
                events.append({"ph": "C", "name": "memory", "pid": pid, "tid": 0, "ts": t * 1e6,
                               "args": {"bytes": value}})
        return events

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a Chrome/Perfetto JSON object (``json.dump`` it; open it in ui.perfetto.dev)."""
        return {
            "traceEvents": self.trace_events(),
            "displayTimeUnit": "ms",
            "otherData": {
                "system": self.system,
                "workload": self.workload,
                "planner": self.planner,
                "parallel": self.parallel,
                "iteration_time_s": self.iteration_time_s if math.isfinite(self.iteration_time_s) else None,
                "feasible": self.feasible,
                "infeasible_reason": self.infeasible_reason,
            },
        }

    def save_chrome_trace(self, path: str | Path) -> None:
        """Write :meth:`to_chrome_trace` to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_chrome_trace()))


def _offload_flows(spans: tuple[Span, ...], args: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """Flow events (Chrome's ``s`` / ``f``, drawn as arrows by Perfetto) from each offload to the prefetch that
    brings the same tensor back to the same device.

    Each flow starts in the middle of its offload slice and ends in the middle of its prefetch slice (``bp: "e"``
    binds the end to the enclosing slice, not the next one); ids count from 1 in the order of the offloads.
    """
    open_flows: dict[tuple[int, str], int] = {}  # (device, layer) -> id of the flow its offload started
    ids = itertools.count(1)
    flows: list[dict[str, Any]] = []
    for (dev, tid, name, cat, start, end), details in zip(spans, args):
        if cat not in ("offload", "prefetch"):
            continue
        key = (dev, str(details.get("layer", name.partition(" ")[2])))
        flow = {"name": "offload to prefetch", "cat": "virtualization", "pid": dev, "tid": tid,
                "ts": (start + end) / 2 * 1e6}
        if cat == "offload":
            open_flows[key] = next(ids)
            flows.append({"ph": "s", "id": open_flows[key], **flow})
        elif key in open_flows:
            flows.append({"ph": "f", "bp": "e", "id": open_flows.pop(key), **flow})
    return flows
