"""What one virtualized step did: bytes moved per tier and per layer, waits, resident bytes, transfers.

A :class:`StepReport` is a frozen snapshot. The runtime fills a private builder while the step runs (from
the compute thread and the I/O threads) and snapshots it when the step ends, or on request while it runs.
``chrome_trace`` turns the transfers, the compute side's waits and the resident-bytes timeline into the
Chrome trace format (``chrome://tracing``, Perfetto).
"""

from __future__ import annotations

import json
import threading
from array import array
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from mcdla.units import format_bytes, format_seconds

__all__ = ["TransferSpan", "WaitSpan", "StepReport"]

_perf_counter = time.perf_counter
_MAX_TIMELINE_SAMPLES = 200_000  # per step; beyond it samples are dropped and counted
_MAX_WARNINGS = 100  # per step; beyond it warnings are counted


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSpan:
    """One real transfer: an offload (device -> tier) or a fetch (tier -> device).

    Attributes:
        kind: "offload" or "fetch".
        tier: tier name.
        tensor: the saved tensor's label (id, module, dtype and shape).
        layer: module the tensor was saved in ("" when not attributed).
        nbytes: bytes moved (uncompressed).
        start_s, end_s: seconds since the step began.
        thread: name of the thread that ran it.
    """

    kind: Literal["offload", "fetch"]
    tier: str
    tensor: str
    layer: str
    nbytes: int
    start_s: float
    end_s: float
    thread: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitSpan:
    """One wait of the compute side (the thread running forward or backward) for the runtime.

    Attributes:
        kind: "pack" (forward held back) or "unpack" (backward waited for a tensor to come back).
        reason: "budget" (pack: room under the plan's budget, NOTE [plan budget] in ``_policy``), "window"
            (pack: the in-flight offload window), "fetch" (unpack: the tensor's fetch).
        tensor: label of the saved tensor being packed or unpacked.
        layer: module it was saved in ("" when not attributed).
        nbytes: its storage's bytes.
        start_s, end_s: seconds since the step began.
    """

    kind: Literal["pack", "unpack"]
    reason: Literal["budget", "window", "fetch"]
    tensor: str
    layer: str
    nbytes: int
    start_s: float
    end_s: float


def _frozen(d: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(sorted(d.items())))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """The accounting of one step under :func:`mcdla.runtime.virtualize`.

    Attributes:
        step: index of the step within its virtualizer (0-based).
        complete: True once every saved tensor of the step has been released (backward done or graph freed).
        aborted: True when the step raised and the runtime cleaned up; ``error`` says why.
        saved_count, saved_bytes: tensors (and bytes) autograd saved through the hooks, all of them.
        managed_count, managed_bytes: distinct storages the runtime managed (the rest were parameters,
            buffers, under ``min_bytes``, or saved during backward).
        offloaded_bytes_by_tier, fetched_bytes_by_tier: bytes moved to and back from each tier.
        stored_bytes_by_tier: bytes each tier stored (after compression for ``compress(...)``).
        offloaded_bytes_by_layer: bytes offloaded per module (qualified name; "" when not attributed).
        unpack_wait_s: seconds the compute side waited in unpack for tensors to come back.
        pack_wait_s: seconds the compute side waited in pack for in-flight offloads to complete: for room
            under a plan's budget (NOTE [plan budget] in ``_policy``) or for the offload window to drain.
        fetches_ahead, fetches_on_demand: fetches started by the prefetcher, and by an unpack that found
            its tensor still in a tier (each of those waits for a whole transfer).
        peak_fetch_window: most storages fetching or fetched-and-unused at once (<= window, plus one
            on-demand fetch).
        peak_resident_saved_bytes: peak bytes of managed saved storages held in device memory (including
            those being offloaded and those fetched but not yet used).
        peak_alive_saved_bytes: peak bytes of managed saved storages alive in memory, whoever holds them:
            those the runtime holds plus those it let go of that something else still references (offloaded
            but still referenced, handed back to autograd and not yet freed). NOTE [memory honesty] in
            ``_liveness``.
        unfreed_count, unfreed_bytes: offloaded storages still alive when backward fetched them back: their
            offload freed nothing (the model's input or output, held by the caller), and the fetch made a
            second copy.
        node_saved_max_count, node_saved_max_bytes: the most managed storages (and their bytes) one
            autograd node saved (a ``torch.compile`` graph, CPU ``nn.LSTM``'s mkldnn layer): all of them
            were in memory before the pack hook saw the first.
        untouched_bytes: managed bytes whose pages were never written when saved (CPU; e.g. the mkldnn
            LSTM workspace): they took no RAM, yet were copied out, and their fetch makes them resident.
        timeline: (seconds since step start, resident managed saved bytes) at each pack, offload
            completion, fetch and release.
        transfers: every offload and fetch, with its timing.
        waits: every wait of the compute side (pack and unpack), with its timing and reason.
        warnings: one line per thing that went wrong without harming the step's data: a block that could
            not be removed (NOTE [freeing never fails] in ``pool``), a tier that refused a block and was
            spilled past (NOTE [unwritable tiers]); at most ``_MAX_WARNINGS``, then one line with the count.
    """

    step: int
    complete: bool
    aborted: bool = False
    error: str = ""
    saved_count: int = 0
    saved_bytes: int = 0
    managed_count: int = 0
    managed_bytes: int = 0
    offloaded_bytes_by_tier: Mapping[str, int] = field(default_factory=dict)
    fetched_bytes_by_tier: Mapping[str, int] = field(default_factory=dict)
    stored_bytes_by_tier: Mapping[str, int] = field(default_factory=dict)
    offloaded_bytes_by_layer: Mapping[str, int] = field(default_factory=dict)
    unpack_wait_s: float = 0.0
    pack_wait_s: float = 0.0
    fetches_ahead: int = 0
    fetches_on_demand: int = 0
    peak_fetch_window: int = 0
    peak_resident_saved_bytes: int = 0
    peak_alive_saved_bytes: int = 0
    unfreed_count: int = 0
    unfreed_bytes: int = 0
    node_saved_max_count: int = 0
    node_saved_max_bytes: int = 0
    untouched_bytes: int = 0
    timeline: tuple[tuple[float, int], ...] = ()
    timeline_dropped: int = 0
    transfers: tuple[TransferSpan, ...] = ()
    waits: tuple[WaitSpan, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def offloaded_bytes(self) -> int:
        return sum(self.offloaded_bytes_by_tier.values())

    @property
    def fetched_bytes(self) -> int:
        return sum(self.fetched_bytes_by_tier.values())

    @property
    def not_freed(self) -> tuple[str, ...]:
        """One line per reason why offloading freed less memory than it moved (NOTE [memory honesty])."""
        lines = []
        if self.unfreed_bytes:
            lines.append(
                f"{format_bytes(self.unfreed_bytes)} in {self.unfreed_count} offloaded storages stayed referenced "
                "outside autograd's saved tensors until backward fetched them (e.g. the model's input or output, "
                "held by the caller): offloading them freed nothing and the fetch made a second copy")
        if self.node_saved_max_count > 1:
            lines.append(
                f"{format_bytes(self.node_saved_max_bytes)} in {self.node_saved_max_count} storages were saved by "
                "one autograd node (a torch.compile graph, or a fused op such as CPU nn.LSTM's mkldnn layer): "
                "they were all in memory before the runtime saw them, and that node's backward unpacks them all "
                "at once, so offloading cannot lower the peak inside it")
        if self.untouched_bytes:
            lines.append(
                f"{format_bytes(self.untouched_bytes)} of the managed bytes were never written when saved (pages "
                "not in RAM, e.g. the CPU mkldnn LSTM workspace): offloading them freed nothing and their fetch "
                "makes them resident")
        return tuple(lines)

    def summary(self) -> str:
        """A few human-readable lines."""
        state = "aborted" if self.aborted else ("complete" if self.complete else "in progress")
        lines = [
            f"step {self.step} ({state}): {self.saved_count} saved tensors, {format_bytes(self.saved_bytes)}; "
            f"{self.managed_count} storages managed, {format_bytes(self.managed_bytes)}",
            f"  peak resident saved: {format_bytes(self.peak_resident_saved_bytes)} held by the runtime, "
            f"{format_bytes(self.peak_alive_saved_bytes)} alive in all; waited "
            f"{format_seconds(self.unpack_wait_s)} in unpack, {format_seconds(self.pack_wait_s)} in pack; "
            f"{self.fetches_ahead} fetches ahead, {self.fetches_on_demand} on demand",
        ]
        for tier in sorted(set(self.offloaded_bytes_by_tier) | set(self.fetched_bytes_by_tier)):
            lines.append(
                f"  {tier}: offloaded {format_bytes(self.offloaded_bytes_by_tier.get(tier, 0))} "
                f"(stored {format_bytes(self.stored_bytes_by_tier.get(tier, 0))}), "
                f"fetched {format_bytes(self.fetched_bytes_by_tier.get(tier, 0))}"
            )
        lines += [f"  not freed: {line}" for line in self.not_freed]
        lines += [f"  warning: {line}" for line in self.warnings]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The transfers (one track per tier and direction), the compute side's waits (one track) and the
        resident bytes as a Chrome trace."""
        events: list[dict[str, Any]] = []
        tids: dict[str, int] = {}
        for span in self.transfers:
            track = f"{span.kind} {span.tier}"
            tid = tids.setdefault(track, len(tids) + 1)
            events.append({
                "name": f"{span.kind} {span.tensor}", "cat": span.kind, "ph": "X", "pid": 1, "tid": tid,
                "ts": span.start_s * 1e6, "dur": max(0.0, span.end_s - span.start_s) * 1e6,
                "args": {"bytes": span.nbytes, "layer": span.layer, "thread": span.thread},
            })
        for wait in self.waits:
            tid = tids.setdefault("compute waits", len(tids) + 1)
            events.append({
                "name": f"{wait.kind} wait ({wait.reason}) {wait.tensor}", "cat": f"{wait.kind} wait", "ph": "X",
                "pid": 1, "tid": tid, "ts": wait.start_s * 1e6, "dur": max(0.0, wait.end_s - wait.start_s) * 1e6,
                "args": {"bytes": wait.nbytes, "layer": wait.layer, "reason": wait.reason},
            })
        for track, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}})
        for t_s, resident in self.timeline:
            events.append({"name": "resident saved bytes", "ph": "C", "pid": 1, "ts": t_s * 1e6,
                           "args": {"bytes": resident}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"step": self.step, "peak_resident_saved_bytes": self.peak_resident_saved_bytes,
                      "pack_wait_s": self.pack_wait_s, "unpack_wait_s": self.unpack_wait_s}}

    def save_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``; return the path."""
        p = Path(path)
        p.write_text(json.dumps(self.chrome_trace()))
        return p


def _paired(times_s: array, values: array) -> tuple[tuple[float, int], ...]:
    """The timeline as (seconds, bytes) pairs, from copies of both arrays (NOTE [cheap samples])."""
    times, vals = times_s[:], values[:]
    n = min(len(times), len(vals))
    return tuple(zip(times[:n], vals[:n], strict=True))


class _ReportBuilder:
    """Mutable, thread-safe accumulator behind a :class:`StepReport`."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.saved_count = 0
        self.saved_bytes = 0
        self.managed_count = 0
        self.managed_bytes = 0
        self.offloaded: dict[str, int] = defaultdict(int)
        self.fetched: dict[str, int] = defaultdict(int)
        self.stored: dict[str, int] = defaultdict(int)
        self.by_layer: dict[str, int] = defaultdict(int)
        self.unpack_wait_s = 0.0
        self.pack_wait_s = 0.0
        self.fetches_ahead = 0
        self.fetches_on_demand = 0
        self.peak_fetch_window = 0
        self.peak_resident = 0
        self.peak_alive = 0  # NOTE [memory honesty] in ``_liveness``: the step sets these under its lock
        self.unfreed_count = 0
        self.unfreed_bytes = 0
        self.node_saved_max_count = 0
        self.node_saved_max_bytes = 0
        self.untouched_bytes = 0
        # NOTE [cheap samples]: two flat arrays (no object per sample for the collector to track)
        self.timeline_s = array("d")
        self.timeline_bytes = array("q")
        self.timeline_dropped = 0
        self._sampled = -1  # resident bytes at the last sample
        self.transfers: list[TransferSpan] = []
        self.waits: list[WaitSpan] = []
        self.aborted = False
        self.error = ""
        self.warnings: list[str] = []
        self.warnings_dropped = 0

    def now_s(self) -> float:
        return time.perf_counter() - self.t0

    def sample(self, resident_bytes: int, alive_bytes: int) -> None:
        """Record the resident managed bytes now, and the peak of the alive ones (the caller holds its step's
        lock; NOTE [memory honesty] in ``_liveness``).

        NOTE [cheap samples]
            The step samples at every change of its resident bytes, twice per saved tensor, from its hooks.
            Only the step's lock-holder writes the timeline, so it takes no lock of its own, and the samples
            go into two flat arrays (time, bytes) that the garbage collector never traverses; a snapshot
            copies both (a C-level copy under the GIL, so a reader on another thread sees a consistent
            prefix) and pairs them. A call whose resident bytes equal the last sample's adds no sample.
        """
        if alive_bytes > self.peak_alive:
            self.peak_alive = alive_bytes
        if resident_bytes == self._sampled:
            return
        self._sampled = resident_bytes
        if resident_bytes > self.peak_resident:
            self.peak_resident = resident_bytes
        if len(self.timeline_bytes) < _MAX_TIMELINE_SAMPLES:
            self.timeline_s.append(_perf_counter() - self.t0)
            self.timeline_bytes.append(resident_bytes)
        else:
            self.timeline_dropped += 1

    def warn(self, line: str | None) -> None:
        """Record a warning (see ``StepReport.warnings``); None is nothing to record."""
        if line is None:
            return
        with self._lock:
            if len(self.warnings) < _MAX_WARNINGS:
                self.warnings.append(line)
            else:
                self.warnings_dropped += 1

    def note_fetch(self, *, ahead: bool, window_used: int) -> None:
        with self._lock:
            if ahead:
                self.fetches_ahead += 1
            else:
                self.fetches_on_demand += 1
            self.peak_fetch_window = max(self.peak_fetch_window, window_used)

    def wait(self, kind: Literal["pack", "unpack"], reason: Literal["budget", "window", "fetch"], *, tensor: str,
             layer: str, nbytes: int, start: float, end: float) -> None:
        """Record a wait of the compute side from ``start`` to ``end`` (``time.perf_counter()`` values)."""
        span = WaitSpan(kind=kind, reason=reason, tensor=tensor, layer=layer, nbytes=nbytes,
                        start_s=start - self.t0, end_s=end - self.t0)
        with self._lock:
            self.waits.append(span)
            if kind == "pack":
                self.pack_wait_s += end - start
            else:
                self.unpack_wait_s += end - start

    def transfer(self, span: TransferSpan, *, stored_bytes: int = 0) -> None:
        with self._lock:
            self.transfers.append(span)
            if span.kind == "offload":
                self.offloaded[span.tier] += span.nbytes
                self.stored[span.tier] += stored_bytes
                self.by_layer[span.layer] += span.nbytes
            else:
                self.fetched[span.tier] += span.nbytes

    def snapshot(self, *, complete: bool) -> StepReport:
        with self._lock:
            return StepReport(
                step=self.step, complete=complete, aborted=self.aborted, error=self.error,
                saved_count=self.saved_count, saved_bytes=self.saved_bytes,
                managed_count=self.managed_count, managed_bytes=self.managed_bytes,
                offloaded_bytes_by_tier=_frozen(self.offloaded), fetched_bytes_by_tier=_frozen(self.fetched),
                stored_bytes_by_tier=_frozen(self.stored), offloaded_bytes_by_layer=_frozen(self.by_layer),
                unpack_wait_s=self.unpack_wait_s, pack_wait_s=self.pack_wait_s,
                fetches_ahead=self.fetches_ahead, fetches_on_demand=self.fetches_on_demand,
                peak_fetch_window=self.peak_fetch_window,
                peak_resident_saved_bytes=self.peak_resident, peak_alive_saved_bytes=self.peak_alive,
                unfreed_count=self.unfreed_count, unfreed_bytes=self.unfreed_bytes,
                node_saved_max_count=self.node_saved_max_count, node_saved_max_bytes=self.node_saved_max_bytes,
                untouched_bytes=self.untouched_bytes, timeline=_paired(self.timeline_s, self.timeline_bytes),
                timeline_dropped=self.timeline_dropped, transfers=tuple(self.transfers),
                waits=tuple(self.waits),
                warnings=tuple(self.warnings) + ((f"{self.warnings_dropped} more warnings",)
                                                 if self.warnings_dropped else ()),
            )
