"""One virtualized step: the pack and unpack hooks, offloads, fetches, release and cleanup.

NOTE [step lifecycle]
    A step starts when the virtualizer's context is entered and finishes when the context has exited, every
    record is released (all handles gone: backward ran, or the graph was dropped) and no transfer is in
    flight. Finishing snapshots the report and stops the step's I/O threads. A step whose context exits
    with an exception is aborted instead: in-flight transfers are awaited, every block is freed, threads are
    joined and cached host buffers trimmed, and any later unpack of its tensors raises OffloadError.

NOTE [windows]
    At most ``window`` offloads are in flight; pack waits for the oldest beyond that, so between forward and
    backward the resident managed bytes stay within what the policy keeps plus ``window`` storages. Under a
    plan with a finite budget, pack also waits for room under it (NOTE [plan budget] in ``_policy``). In
    backward the prefetcher (``_prefetch.py``) keeps at most ``window`` storages fetching or fetched and
    unused; a tensor that is not back when needed is fetched on demand and the wait is reported. An offload
    still running when its tensor is needed is not waited for: the bytes still held are used instead.

NOTE [bytes final]
    A pack hook may run before the bytes it is handed are final. Autograd saves an op's inputs before its
    kernel runs, and an op may write an input it saved without bumping any version counter:
    ``rrelu_with_noise`` saves its ``noise`` buffer, then the kernel fills it (``F.rrelu`` in
    training returned gradients of uninitialised memory; even ``torch.autograd.graph.save_on_cpu``, which
    copies in the hook, gets it wrong). So no copy of a storage starts while the op that saved it can still
    be running. Autograd numbers the nodes it creates (``_get_sequence_nr``, per thread, 50 ns), and every
    save happens while its op's node is the newest; a storage packed when the counter read ``s`` is final
    once the counter has moved past ``s`` (a later op that records a node has started), when the context
    exits, or when backward begins. Offloads chosen in a pack wait in ``_deferred`` until then: the first
    pack of the next op starts them, one op later than before. Not every save waits: a tensor an earlier op
    produced (its ``grad_fn`` is numbered before the saving op's node: a Linear's input, say) is final
    already and starts at once (``_made_earlier``), as vDNN and the engine assume. That is asked only of a
    storage that leaves at its own pack (offloaded at once, or evicted by its own admission), not of every
    save; one the same op evicts with a later save waits for the next op like the others (exact either way).
    With ``model=`` a module's forward pre- and post-hooks start the others too: a hook runs between ops, so
    every op numbered below the counter has returned (without them a storage also waited across every op
    that saves nothing). On CUDA the same rule orders the copy after the kernel that writes the bytes, since the
    copy's event is recorded when it starts.

NOTE [backward twice]
    ``backward(retain_graph=True)`` and double backward (gradient penalties: WGAN-GP, R1) unpack a saved
    tensor more than once. After the last unpack of a storage the record keeps its bytes (the source, or
    what was fetched) referenced until its handles die, as autograd keeps a saved tensor until its node
    releases it; no bytes move again. Without ``retain_graph`` a node releases its saved tensors right
    after running, so the handles die, and the bytes go, when the node's unpacked views would anyway; with
    it they stay until the graph is dropped, which is what PyTorch without hooks keeps too. The runtime
    stops counting them as resident at the last unpack (they are "returned", NOTE [memory honesty]).

NOTE [hot path]
    Every saved tensor runs the pack hook, the unpack hook and its handle's death, so their common case (a
    storage the policy keeps, or one already offloaded and fetched ahead) does as little as it can in
    Python, where each attribute read or call costs 30-100 ns: the step's own ``pack`` and ``unpack`` are
    the hooks (the virtualizer sets them at each entry; autograd keeps the pair a tensor was packed with),
    one section under the step lock in each, whose release is a bare release when nothing was posted; no
    closure, list or dict made per tensor; a record and a handle with ``__slots__`` that compute only what
    every record needs (NOTE [cheap records] in ``_records``; the first handle counted by its record from
    the start); timeline samples in flat arrays (NOTE [cheap samples] in ``report``); a handle's death run
    at once from its ``__del__`` through ``_InboxLock.call`` (a posted closure only while the lock is taken
    or a collection runs), and, for the last handle of a consumed record of a step
    that moved nothing, only removes the record from the step's maps (the record and its bytes then die
    with the handle); the hooks release the bare lock and look at the inbox only when something was
    posted; the unpack checks (abort, failure, second unpack, in-place change, read from the
    alias's version counter) tested together before the call that explains a failure; states compared by
    identity with module constants; a storage handed back to autograd counted without a weak reference
    when only its record holds it (NOTE [memory honesty] in ``_liveness``). The general machinery (offloads
    that became final, waits for a window or a plan's budget, fetches, the prefetcher before any offload)
    runs only when its condition holds. What remains per tensor is measured in ``docs/runtime.md``.

NOTE [kept fast path]
    Under ``budget=`` (no plan), a step whose virtualizer's last finished step kept every storage under the
    budget (nothing evicted, not aborted) saves the storages that fit as tuples ``(tensor, version, id,
    layer)``: no record, no handle, no handle death. Such a storage never moves, so the tuple only has to
    keep the bytes and the guarantees: the unpack checks the tensor's version counter (autograd does not
    for hooks' tensors) and the step's abort, failure and owner process, and returns the tensor; a second
    unpack (``retain_graph``, double backward) works the same. The tensor is the saved one itself when an
    earlier op made it (no cycle through the saving node, as in ``_made_earlier``), else a ``detach`` (the
    saving node's own output: holding it would tie the graph into a reference cycle). Each save keeps its
    own tensor and version, so aliases with their own counters are checked each against its own. Bytes are
    counted once per storage (``_kept_seen``: its id and a weak reference, so a freed and reused id never
    matches) as resident and kept until the step finishes, including bytes autograd frees before then
    (conservative: the kept bytes never exceed the budget). The timeline is sampled when the step leaves
    the path and when it finishes, not at every save. A storage that does not fit ends the path for the
    step: it and every later one get records, and eviction chooses among those (the tuples' storages cannot
    leave), so in such a step the storages kept first stay and the later ones are offloaded; the next step
    uses records throughout and the one after that may use the path again. A step with only tuples
    finishes when its context exits, even if its graph is backpropagated later.

NOTE [forked children]
    A step belongs to the process that entered it. A child made by ``os.fork`` during a step shares its
    records, blocks and handles but not its I/O threads: settling there waited forever for transfers no
    thread of the child runs, and aborting or releasing there freed the parent's blocks. So in any other
    process the step does nothing on exit, abort, settle or a handle's death, a save is left unmanaged,
    and an unpack raises OffloadError naming the owner process; the parent's step runs on untouched. The
    virtualizer's ``os.register_at_fork`` hook marks its live steps ``foreign`` in the child (an attribute,
    not an ``os.getpid()`` system call on every hook).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from typing import Any

import torch

from mcdla.errors import McdlaError, OffloadError, RuntimeTierError
from mcdla.runtime._liveness import _MIN_CHECKED_BYTES, _Lingering, untouched_bytes
from mcdla.runtime._modules import _Attribution
from mcdla.runtime._policy import _KEEP, _Config, _Policy, fits, freeing_offload, plan_cap_bytes
from mcdla.runtime._prefetch import _Prefetcher
from mcdla.runtime._records import _Handle, _Record, _State, managed_storage, storage_bytes
from mcdla.runtime._sync import _InboxLock
from mcdla.runtime._transfer import _Mover, profiled
from mcdla.runtime.pool import Pool
from mcdla.runtime.report import StepReport, _ReportBuilder
from mcdla.runtime.tiers_host import HostBufferPool

__all__: list[str] = []

_weakref = weakref.ref

# NOTE [bytes final]: autograd's node counter (private, present in the pinned torch). Without it every
# offload waits for the end of forward or the start of backward: still exact, with less memory freed early.
_get_sequence_nr = getattr(torch._C._autograd, "_get_sequence_nr", lambda: 0)


def _made_earlier(t: torch.Tensor, seq: int) -> bool:
    """Whether ``t`` is the output of an op that returned before the op saving it began (NOTE [bytes final]).

    The saving op's node holds number ``seq - 1`` (the counter ``seq`` is the next one), so a ``grad_fn``
    numbered below that is an earlier op's. The saving op cannot write such a tensor behind autograd's back:
    it is part of the graph, and an op that writes a tensor that requires grad is an in-place op, which
    bumps the version counter (a later save then makes a new record) and gives it a new ``grad_fn``.
    """
    fn = t.grad_fn
    return seq > 0 and fn is not None and fn._sequence_nr() < seq - 1

_LIVE = frozenset({_State.RESIDENT, _State.OFFLOADING, _State.OFFLOADED, _State.FETCHING, _State.READY})
# the states as module constants: ``rec.state is _RESIDENT`` skips the enum class's attribute lookup (NOTE [hot path])
_RESIDENT, _READY, _CONSUMED, _OFFLOADING = _State.RESIDENT, _State.READY, _State.CONSUMED, _State.OFFLOADING
_RELEASED = _State.RELEASED
_NONE: tuple[_Record, ...] = ()  # no records: what the hooks' common case returns, without a new list
_NO_MODULE = ("", None)  # (layer, decision) without ``model=``


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _as_tier_error(exc: BaseException, what: str) -> BaseException:
    return exc if isinstance(exc, McdlaError) else RuntimeTierError(f"{what} failed in an I/O thread: {_one_line(exc)}")


class _Step:
    """State and hooks of one step (NOTEs above and in ``_policy``, ``_prefetch``, ``_sync``)."""

    def __init__(self, *, index: int, pool: Pool, config: _Config, attribution: _Attribution,
                 host_buffers: HostBufferPool, on_finish: Callable[[_Step], None], kept_fast: bool = False) -> None:
        self.index = index
        self.pid = os.getpid()  # NOTE [forked children]
        self.foreign = False  # set in a forked child, by the virtualizer's fork hook (NOTE [forked children])
        self.pool = pool
        self.cfg = config
        self._min_bytes = config.min_bytes
        self.attr = attribution
        self.host_buffers = host_buffers
        self.report = _ReportBuilder(index)
        self.mover = _Mover(pool, self.report, host_buffers)
        self.policy = _Policy(config)
        self._cap = plan_cap_bytes(attribution.plan) if config.planned else None  # NOTE [plan budget]
        self.prefetch = _Prefetcher(config.window)
        self._on_finish = on_finish
        self._lock = _InboxLock(self._internal_error)
        self._next_id = 0  # the next record's id
        self._records: dict[int, _Record] = {}  # record id -> live record
        self._by_storage: dict[tuple[Any, ...], _Record] = {}  # (device, storage data_ptr, id(view root)) -> record
        self._deferred: list[_Record] = []  # offloads chosen whose bytes may not be final yet (NOTE [bytes final])
        self._offloading: deque[_Record] = deque()  # offloads in flight, oldest first
        self._inflight: dict[Future, tuple[_Record, str]] = {}  # transfer -> (record, "offload"/"fetch")
        self._resident = 0  # bytes of managed storages held on the device
        self._exited = False
        self._moved = False  # an offload has started: only then can the prefetcher have work (NOTE [hot path])
        self._finished = False
        self._aborted = False
        self._failure: BaseException | None = None
        self._failure_raised = False
        self._param_ptrs = attribution.param_storage_ptrs()
        self.final_report: StepReport | None = None
        self.lingering = _Lingering()  # NOTE [memory honesty] in ``_liveness``
        self._node_seq, self._node_count, self._node_bytes = -1, 0, 0  # the newest saving node's storages
        self._attributed = attribution.active
        # NOTE [kept fast path]: kept storages as tuples, while the budget has room (the virtualizer decides)
        self._kept_fast = kept_fast and config.budget_bytes is not None and not config.planned
        self._kept_seen: dict[int, weakref.ref] = {}  # id(storage) -> the storage, of the tuples' storages
        self._kept_bytes = 0  # their bytes: resident and kept until the step finishes
        self.overflowed = False  # a storage did not fit under the budget (the next step keeps with records)

    # -- failures and accounting (under the lock) ------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc

    def _internal_error(self, exc: Exception) -> None:
        self._fail(exc if isinstance(exc, McdlaError) else RuntimeTierError(f"runtime: {_one_line(exc)}"))

    def _raise_failure(self) -> None:
        assert self._failure is not None
        self._failure_raised = True
        raise self._failure

    def _set_resident(self, rec: _Record, resident: bool) -> None:
        if rec.counted_resident != resident:
            rec.counted_resident = resident
            self._resident += rec.nbytes if resident else -rec.nbytes

    def _sample(self) -> None:
        resident = self._resident
        lingering = self.lingering  # NOTE [memory honesty] in ``_liveness``
        self.report.sample(resident, resident + lingering.bytes + lingering.held)

    @property
    def resident_saved_bytes(self) -> int:
        """Bytes of managed saved storages held on the device now."""
        return self._resident

    @property
    def alive_saved_bytes(self) -> int:
        """Bytes of managed saved storages alive now, whoever holds them (NOTE [memory honesty])."""
        lingering = self.lingering
        return self._resident + lingering.bytes + lingering.held

    @property
    def live_records(self) -> int:
        return len(self._records)

    @property
    def tracker_entries(self) -> int:
        """Entries in every per-record structure of this step (0 once it has finished cleanly)."""
        with self._lock:
            return (len(self._records) + len(self._by_storage) + len(self.policy) + len(self._offloading)
                    + len(self._deferred) + len(self._kept_seen)
                    + len(self._inflight) + self.prefetch.entries())

    # -- pack ------------------------------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> Any:
        """The pack hook: a handle for a managed storage, else the tensor itself (detached).

        A new storage that would bring the resident bytes over a plan's budget first waits, outside the
        lock, for offloads in flight (NOTE [plan budget] in ``_policy``). The common case (no offload
        becomes final, no wait) takes the lock once (NOTE [hot path]).
        """
        if self._failure is not None:
            self._raise_failure()
        if self._exited or self.foreign:  # a stray save on another thread's stack after exit; NOTE [forked children]
            return t.detach()
        root = t._base
        storage = managed_storage(t, root, self._min_bytes, self._param_ptrs)
        report = self.report
        seq = _get_sequence_nr()
        if storage is None:
            with self._lock:
                report.saved_count += 1
                report.saved_bytes += t.numel() * t.element_size()  # not ``t.nbytes``: a sparse tensor has none
                final = self._take_final(seq) if self._deferred else _NONE
            for r in final:
                self._start_offload(r)
            return t.detach()
        layer, decided = self.attr.current() if self._attributed else _NO_MODULE
        if self._kept_fast:  # NOTE [kept fast path]: a tuple, no record, no handle
            lock = self._lock
            raw = lock.raw
            raw.acquire()
            try:
                ref = self._kept_seen.get(id(storage))
                if ref is not None and ref() is storage:
                    report.saved_count += 1
                    report.saved_bytes += t.nbytes
                    rid = self._next_id
                    self._next_id = rid + 1
                    fn = t.grad_fn  # an earlier op's output is held as itself: no cycle (NOTE [kept fast path])
                    return (t if fn is None or fn._sequence_nr() < seq - 1 else t.detach(), t._version, rid, layer)
                policy = self.policy
                nbytes = storage.nbytes()
                if policy.kept_bytes + nbytes <= policy.budget and not self._deferred:
                    report.saved_count += 1
                    report.saved_bytes += t.nbytes
                    rid = self._next_id
                    self._next_id = rid + 1
                    self._kept_seen[id(storage)] = _weakref(storage)
                    policy.kept_bytes += nbytes
                    self._kept_bytes += nbytes
                    resident = self._resident = self._resident + nbytes
                    report.managed_count += 1
                    report.managed_bytes += nbytes
                    if self._node_seq == seq:  # ``_count_node``, inline (NOTE [hot path])
                        count = self._node_count = self._node_count + 1
                        self._node_bytes += nbytes
                        if count > report.node_saved_max_count:
                            report.node_saved_max_count, report.node_saved_max_bytes = count, self._node_bytes
                    else:
                        self._node_seq, self._node_count, self._node_bytes = seq, 1, nbytes
                        if report.node_saved_max_count == 0:
                            report.node_saved_max_count, report.node_saved_max_bytes = 1, nbytes
                    if nbytes >= _MIN_CHECKED_BYTES:
                        report.untouched_bytes += untouched_bytes(storage)
                    fn = t.grad_fn  # an earlier op's output is held as itself: no cycle (NOTE [kept fast path])
                    return (t if fn is None or fn._sequence_nr() < seq - 1 else t.detach(), t._version, rid, layer)
                self._kept_fast = False  # the budget is full: records from here on (NOTE [kept fast path])
                self.overflowed = True
                self._sample()  # the kept bytes so far, not sampled at each save
            finally:
                raw.release()
                if lock.inbox:
                    lock.run_posted()
        if root is None:
            root = t
        key = id(root)  # NOTE [one version counter] in ``_records``: a record belongs to one view root
        got = None
        lock = self._lock
        raw = lock.raw
        raw.acquire()  # ``with lock:`` without the frames of ``__enter__``, ``__exit__`` and ``release`` (NOTE [hot path])
        try:
            report.saved_count += 1
            report.saved_bytes += t.nbytes
            final = self._take_final(seq) if self._deferred else _NONE
            if self.prefetch.in_backward:
                self.prefetch.new_forward_phase()
            if not final:
                got = self._admit_or_block(t, storage, key, root, layer, decided, seq)
        finally:
            raw.release()
            if lock.inbox:
                lock.run_posted()
        if got is None or got[0] is None:  # earlier offloads to start, or a wait for room under a plan
            for r in final:
                self._start_offload(r)
            while True:
                with self._lock:
                    got = self._admit_or_block(t, storage, key, root, layer, decided, seq)
                if got[0] is not None:
                    break
                blocker = got[1]
                self._wait_offload(blocker[1], "budget", blocker[0])
        handle, evict = got
        for r in evict:
            self._start_offload(r)
        return handle

    def _admit_or_block(self, t: torch.Tensor, storage: Any, key: int, root: torch.Tensor, layer: str,
                        decided: Any, seq: int) -> tuple[Any, Any]:
        """(handle, offloads to start now) for ``t``, sharing a live record of the same root when its bytes
        are unchanged; else (None, the offload to wait for) when a new record would exceed a plan's budget
        (under the lock)."""
        if self._failure is not None:  # e.g. the offload just waited for failed
            self._raise_failure()
        version = t._version
        size = t.size()
        rec = self._by_storage.get(key)
        if rec is not None and rec.state in _LIVE and rec.same_storage(storage, root, version):
            return _Handle(rec, t.dtype, size, t.stride(), t.storage_offset(), False), _NONE
        nbytes = storage.nbytes()
        if self._cap is not None and not fits(self._resident, nbytes, self._cap):
            blocker = freeing_offload(self._offloading)
            if blocker is not None:
                return None, blocker
        policy = self.policy
        place = policy.fixed or policy.place(decided)
        dtype = t.dtype
        rid = self._next_id
        self._next_id = rid + 1
        rec = _Record(rid, key, self, storage, t.detach(), nbytes, root, version, dtype, size, layer, place, seq)
        self._records[rid] = self._by_storage[key] = rec
        resident = self._resident = self._resident + nbytes
        report = self.report
        report.managed_count += 1
        report.managed_bytes += nbytes
        self._count_node(seq, nbytes)
        if nbytes >= _MIN_CHECKED_BYTES:  # smaller ones are not checked (``untouched_bytes``)
            report.untouched_bytes += untouched_bytes(storage)
        # ``policy.admit``, inline for a budget the kept bytes still fit in (NOTE [hot path])
        if place is _KEEP and policy.budget is not None and policy.kept_bytes + nbytes <= policy.budget:
            policy.kept[rid] = rec
            policy.kept_bytes += nbytes
            evict = _NONE
        else:
            evict = policy.admit(rec)
        handle = _Handle(rec, dtype, size, None, 0, True)
        lingering = self.lingering
        report.sample(resident, resident + lingering.bytes + lingering.held)  # ``_sample``, inline (NOTE [hot path])
        if evict:
            self.overflowed = True
            if rec in evict and _made_earlier(t, seq):  # NOTE [bytes final]: asked only of a storage leaving now
                rec.saved_seq = -1
            self._deferred.extend(r for r in evict if r.saved_seq >= seq)
            evict = [r for r in evict if r.saved_seq < seq]
        return handle, evict

    def _count_node(self, seq: int, nbytes: int) -> None:
        """Count a new managed storage saved by autograd's node ``seq - 1``, for ``StepReport.not_freed``: the
        most storages (and their bytes) the newest saving node holds (under the lock)."""
        report = self.report
        if self._node_seq == seq:
            count = self._node_count = self._node_count + 1
            self._node_bytes += nbytes
            if count > report.node_saved_max_count:
                report.node_saved_max_count, report.node_saved_max_bytes = count, self._node_bytes
        else:
            self._node_seq, self._node_count, self._node_bytes = seq, 1, nbytes
            if report.node_saved_max_count == 0:
                report.node_saved_max_count, report.node_saved_max_bytes = 1, nbytes

    def _take_final(self, seq: int | None, *, returned: bool = False) -> list[_Record]:
        """Deferred offloads whose bytes are final by autograd's counter ``seq`` (None: all of them);
        ``returned``: the op numbered ``seq`` has returned too (a module boundary)."""
        if not self._deferred:
            return []
        if seq is None:
            final, self._deferred = self._deferred, []
        else:
            last = seq if returned else seq - 1
            final = [r for r in self._deferred if r.saved_seq <= last]
            self._deferred = [r for r in self._deferred if r.saved_seq > last]
        return final

    def module_boundary(self) -> None:
        """A module's forward starts or returns (a hook, NOTE [bytes final]): every op so far has returned."""
        if not self._deferred or self._failure is not None:
            return
        seq = _get_sequence_nr()
        with self._lock:
            final = self._take_final(seq, returned=True)
        for r in final:
            self._start_offload(r)

    def _start_deferred(self) -> None:
        """Start every deferred offload (outside the lock): forward is over (NOTE [bytes final])."""
        with self._lock:
            final = self._take_final(None)
        for r in final:
            self._start_offload(r)

    def _wait_offload(self, fut: Future, reason: str, rec: _Record) -> None:
        """Hold the compute side (outside the lock) until the offload ``fut`` of ``rec`` completes; apply it."""
        t0 = time.perf_counter()
        with profiled(f"mcdla::wait {reason}"):  # NOTE [profiler ranges] in ``_transfer``
            wait_all([fut])
        t1 = time.perf_counter()
        self.report.wait("pack", reason, tensor=rec.label, layer=rec.layer, nbytes=rec.nbytes,  # type: ignore[arg-type]
                         start=t0, end=t1)
        with self._lock:
            self._completed(fut)

    # -- offload ---------------------------------------------------------------------------------------
    def _start_offload(self, rec: _Record) -> None:
        """Offload ``rec``, first waiting (outside the lock) while ``window`` offloads are in flight."""
        while True:
            with self._lock:
                if rec.state is not _State.RESIDENT:
                    return
                if self._failure is not None:  # an offload waited for above failed (and may have filled its tier)
                    self._raise_failure()
                if len(self._offloading) < self.cfg.window:
                    self._begin_offload(rec)
                    return
                oldest = self._offloading[0]
                fut = oldest.offload_future
            if fut is not None:
                self._wait_offload(fut, "window", oldest)

    def _begin_offload(self, rec: _Record) -> None:
        self._moved = True
        index, reserved = self.pool.reserve(rec.nbytes, start=rec.start_tier, label=rec.label)
        rec.state = _State.OFFLOADING
        try:
            fut = self.mover.offload(rec, storage_bytes(rec.source), index=index, reserved_bytes=reserved)
        except BaseException:
            rec.state = _State.RESIDENT
            self.pool.tiers[index].unreserve(reserved)
            raise
        rec.offload_future = fut
        self._offloading.append(rec)
        self.prefetch.watch(rec)
        self._watch(fut, rec, "offload")

    def _watch(self, fut: Future, rec: _Record, kind: str) -> None:
        self._inflight[fut] = (rec, kind)
        fut.add_done_callback(lambda f: self._lock.post(lambda: self._completed(f)))

    def _completed(self, fut: Future) -> None:
        """Apply a finished transfer, once (under the lock)."""
        entry = self._inflight.pop(fut, None)
        if entry is not None:
            rec, kind = entry
            (self._offload_done if kind == "offload" else self._fetch_done)(rec, fut)

    def settle(self) -> None:
        """Wait (outside the lock) for every transfer in flight and apply it; a finished backward finishes."""
        if self.foreign:
            return
        with self._lock:
            futures = list(self._inflight)
        wait_all(futures)
        with self._lock:
            for fut in futures:
                self._completed(fut)

    def _offload_done(self, rec: _Record, fut: Future) -> None:
        rec.offload_future = None
        with contextlib.suppress(ValueError):
            self._offloading.remove(rec)
        exc = fut.exception()
        if exc is not None:
            rec.error = _as_tier_error(exc, f"{rec.label}: offload")
            self._fail(rec.error)
            if rec.state is _State.OFFLOADING:
                rec.state = _State.FAILED
        else:
            block = fut.result()
            rec.tier_name = block.tier.name
            if rec.state is _State.OFFLOADING and not (self.prefetch.in_backward and rec.pending > 0):
                self.lingering.let_go(rec.source, rec.nbytes, "offloaded")
                rec.drop_source()
                rec.block, rec.state = block, _State.OFFLOADED
                self._set_resident(rec, False)
            else:  # the bytes were needed (or dropped) before the copy finished: the copy is not needed
                if rec.state is _State.OFFLOADING:
                    rec.state = _State.RESIDENT
                self.report.warn(block.tier.free(block))  # NOTE [freeing never fails] in ``pool``
        if self._cap is not None and self.prefetch.in_backward:
            self._top_up()  # room freed: a fetch held back by the plan's budget may start
        self._sample()
        self._maybe_finish()

    # -- unpack ----------------------------------------------------------------------------------------
    def unpack(self, h: Any) -> torch.Tensor:
        """The unpack hook: the saved tensor back on its device, bit for bit (a tensor pack left alone: itself)."""
        if type(h) is not _Handle:
            if type(h) is tuple:  # NOTE [kept fast path]
                alias = h[0]
                if alias._version != h[1] or self._aborted or self._failure is not None or self.foreign:
                    self._check_kept(h)
                if self._deferred:  # backward began inside the context: forward's last saves are final
                    self._start_deferred()
                return alias
            return h
        rec = h.record
        if self.foreign:
            raise OffloadError(f"{rec.label}: saved by process {self.pid}; a forked child cannot use the parent's "
                               "saved tensors (run backward in the parent)")
        if self._deferred:  # backward began inside the context: forward's last saves are final
            self._start_deferred()
        prefetch = self.prefetch
        lock = self._lock
        raw = lock.raw
        raw.acquire()  # as in ``pack``
        try:
            alias = rec.alias  # ``current_version``, inline for the common case (NOTE [hot path])
            if (self._aborted or self._failure is not None or h.unpacked
                    or (alias._version if alias is not None else rec.current_version()) != rec.version):
                self._check_unpack(h)  # raises, except for a second unpack whose bytes are still held
            if not prefetch.in_backward:
                prefetch.begin_backward()
            state = rec.state
            if state is _RESIDENT and rec.pending == 1 and h.first and alias is not None and not h.unpacked:
                # the common case: a kept storage's only handle, unpacked once (``_consume``, inline)
                h.unpacked = True
                rec.pending = 0
                self._drop_bytes(rec)
                if self._moved and prefetch.may_fetch():
                    self._top_up()
                return alias
            if state is _OFFLOADING:  # the copy is still running: use the bytes still held
                rec.state = state = _READY
            if state is _RESIDENT or state is _READY or state is _CONSUMED:  # NOTE [backward twice]
                view = rec.alias if h.first and rec.alias is not None else self._view(h, rec.bytes_now())
                if not h.unpacked:  # ``_consume``, inline: the common case of NOTE [hot path]
                    h.unpacked = True
                    rec.pending -= 1
                    if rec.pending == 0:
                        self._drop_bytes(rec)
                if self._moved and prefetch.may_fetch():
                    self._top_up()
                return view
            if state is _State.OFFLOADED:
                fut = self._issue_fetch(rec, ahead=False)
            elif state is _State.FETCHING:
                fut = rec.fetch_future
            else:
                raise rec.error or OffloadError(f"{rec.label}: unpacked after the runtime released it")
            self._top_up()
        finally:
            raw.release()
            if lock.inbox:
                lock.run_posted()
        t0 = time.perf_counter()
        with profiled("mcdla::wait fetch"):
            wait_all([fut])
        self.report.wait("unpack", "fetch", tensor=rec.label, layer=rec.layer, nbytes=rec.nbytes, start=t0,
                         end=time.perf_counter())
        with self._lock:
            self._completed(fut)
            if rec.state is _State.FAILED:
                self._failure_raised = True
                raise rec.error  # type: ignore[misc]
            view = self._view(h, rec.bytes_now())
            self._consume(h)
            self._top_up()
            return view

    def _check_unpack(self, h: _Handle) -> None:
        rec = h.record
        if self._aborted:
            raise OffloadError(f"{rec.label}: its step was aborted ({self.report.error}); the graph cannot be used")
        if self._failure is not None:
            self._raise_failure()
        if h.unpacked and rec.bytes_now() is None:  # NOTE [backward twice]: not expected to happen
            where = f"tier {rec.tier_name!r}" if rec.tier_name else "the device"
            raise OffloadError(
                f"{rec.label}: unpacked again (it came from {where}) after the runtime let go of its bytes; "
                "save the tensors of a graph that is backpropagated twice under keep_resident()"
            )
        if (version := rec.current_version()) != rec.version:
            raise OffloadError(
                f"{rec.label}: modified in place after it was saved (version {rec.version} -> {version}); "
                "the gradient would be wrong"
            )

    def _check_kept(self, h: tuple[torch.Tensor, int, int, str]) -> None:
        """``_check_unpack`` for a kept tensor's tuple (NOTE [kept fast path]): raises, naming the tensor."""
        alias, version, rid, layer = h
        where = f"module {layer!r}" if layer else "no module"
        label = (f"saved tensor #{rid} ({where}, {str(alias.dtype).removeprefix('torch.')}"
                 f"[{'x'.join(str(s) for s in alias.shape)}])")
        if self.foreign:
            raise OffloadError(f"{label}: saved by process {self.pid}; a forked child cannot use the parent's "
                               "saved tensors (run backward in the parent)")
        if self._aborted:
            raise OffloadError(f"{label}: its step was aborted ({self.report.error}); the graph cannot be used")
        if self._failure is not None:
            self._raise_failure()
        if alias._version != version:
            raise OffloadError(f"{label}: modified in place after it was saved (version {version} -> "
                               f"{alias._version}); the gradient would be wrong")

    def _view(self, h: _Handle, storage: Any) -> torch.Tensor:
        """``h``'s tensor as a view of ``storage`` (``rec.bytes_now()``: the source, else the restored bytes)."""
        rec = h.record
        assert storage is not None, rec.label
        if rec.event is not None and rec.source is None:  # CUDA: bytes copied on the H2D side stream
            data = rec.restored
            assert data is not None, rec.label
            stream = torch.cuda.current_stream(data.device)
            stream.wait_event(rec.event)
            data.record_stream(stream)
        return h.view_of(storage)

    def _issue_fetch(self, rec: _Record, *, ahead: bool) -> Future:
        block, rec.block = rec.block, None
        assert block is not None, rec.label
        if rec.storage_alive():  # the offload freed nothing (NOTE [memory honesty] in ``_liveness``)
            self.report.unfreed_count += 1
            self.report.unfreed_bytes += rec.nbytes
        rec.state = _State.FETCHING
        self._set_resident(rec, True)
        self.prefetch.take(rec)
        self.report.note_fetch(ahead=ahead, window_used=self.prefetch.in_window)
        try:
            fut = self.mover.fetch(rec, block)
        except BaseException as exc:  # noqa: BLE001 - delivered like a failed transfer
            fut = Future()
            fut.set_exception(exc)
        rec.fetch_future = fut
        self._watch(fut, rec, "fetch")
        self._sample()
        return fut

    def _fetch_done(self, rec: _Record, fut: Future) -> None:
        rec.fetch_future = None
        exc = fut.exception()
        if exc is not None:
            rec.error = _as_tier_error(exc, f"{rec.label}: fetch from tier {rec.tier_name!r}")
            self._fail(rec.error)
            if rec.state is _State.FETCHING:
                rec.state = _State.FAILED
                self._set_resident(rec, False)
                self.prefetch.give_back(rec)
        elif rec.state is _State.FETCHING:
            rec.restored, rec.event = fut.result()
            rec.state = _State.READY
        self._sample()
        self._maybe_finish()

    def _top_up(self) -> None:
        """Fetch ahead while the window has room and, under a plan's budget, the next one fits."""
        while (rec := self.prefetch.next(self._fits)) is not None:
            self._issue_fetch(rec, ahead=True)

    def _fits(self, rec: _Record) -> bool:
        """Whether fetching ``rec`` ahead leaves room under the cap for what backward needs before it."""
        if self._cap is None:
            return True  # no cap: skip counting what backward needs first
        return fits(self._resident, rec.nbytes + self.prefetch.bytes_needed_before(rec), self._cap)

    def request_prefetch(self, module: str) -> None:
        """A plan's ``prefetch_at`` module began its backward: fetch the tensors that wait for it."""
        with self._lock:
            if not self._finished:
                self.prefetch.request(module)
                self._top_up()

    # -- use and release -------------------------------------------------------------------------------
    def _consume(self, h: _Handle) -> None:
        if h.unpacked:
            return
        h.unpacked = True
        rec = h.record
        rec.pending -= 1
        if rec.pending == 0:
            self._drop_bytes(rec)

    def _drop_bytes(self, rec: _Record) -> None:
        """Every live handle was unpacked: autograd holds what it needs; the runtime stops counting the bytes
        as its own but keeps them referenced until the handles die (NOTE [backward twice])."""
        state = rec.state
        if state is _RESIDENT or state is _READY:
            rec.state = _CONSUMED
            source, nbytes = rec.source, rec.nbytes
            lingering = self.lingering
            # autograd holds it until used; counted while held by the record and the alias, if only by them
            if source is None or rec.alias is None or not lingering.hold(source, nbytes, 2):
                lingering.let_go(rec.bytes_now(), nbytes, "returned")
            else:
                rec.held = True
            resident = self._resident
            if rec.counted_resident:  # ``_set_resident(rec, False)``, inline (NOTE [hot path])
                rec.counted_resident = False
                resident = self._resident = resident - nbytes
            if rec.counted_window:
                self.prefetch.give_back(rec)
            policy = self.policy  # ``policy.forget``, inline
            if policy.kept.pop(rec.id, None) is not None:
                policy.kept_bytes -= nbytes
            self.report.sample(resident, resident + lingering.bytes + lingering.held)

    def _on_handle_dead(self, rec: _Record, unpacked: bool) -> None:
        """A handle of ``rec`` died (``_Handle.__del__``, under the lock; never in a forked child)."""
        live = rec.handles_live = rec.handles_live - 1
        if not unpacked:
            rec.pending -= 1
        if live == 0:
            if rec.state is _CONSUMED and not self._moved:
                # the common case, ``_release`` inline: nothing but the step's maps and the handles refer to a
                # record of a step that moved nothing, so the record and what it holds die with this handle
                rec.state = _RELEASED
                self._records.pop(rec.id, None)
                if self._by_storage.get(rec.key) is rec:
                    del self._by_storage[rec.key]
                if rec.held:  # its own two references are the source and the alias (``_drop_bytes``)
                    rec.held = False
                    self.lingering.unhold(rec.source, rec.nbytes, 2)
                if self._exited:
                    self._maybe_finish()
            else:
                self._release(rec)
        elif rec.pending == 0:
            self._drop_bytes(rec)

    def _release(self, rec: _Record) -> None:
        """Every handle of ``rec`` died: drop what it holds and forget it. Resident bytes only go down here
        and the lingering ones do not go up, so the timeline is sampled only when they changed."""
        state = rec.state
        if state is _RELEASED:
            return
        rec.state = _RELEASED
        changed = rec.counted_resident
        if changed:
            rec.counted_resident = False
            self._resident -= rec.nbytes
        if rec.counted_window:
            self.prefetch.give_back(rec)
        if state is not _CONSUMED:  # a consumed record was forgotten when its last handle was unpacked
            self.policy.forget(rec)
        block = self._drop_tensors(rec)
        self._records.pop(rec.id, None)
        if self._by_storage.get(rec.key) is rec:
            del self._by_storage[rec.key]
        if block is not None:
            self.report.warn(block.tier.free(block))
        if changed:
            self._sample()
        if self._exited:
            self._maybe_finish()

    # -- end of step -----------------------------------------------------------------------------------
    def _maybe_finish(self) -> None:
        if self._exited and not self._finished and not self._records and not self._inflight:
            self._finish()

    def _finish(self) -> None:
        self._finished = True
        if self._kept_bytes:  # NOTE [kept fast path]: counted until now
            self._sample()  # their peak: sampled here, not at each save
            self._resident -= self._kept_bytes
            self._kept_bytes = 0
            self._kept_seen.clear()
            self._sample()
        if self._failure is not None and not self.report.aborted:
            # a transfer failed after backward used every tensor (a CUDA fetch tail, say): nothing is left
            # to free, but the step failed and its report says so (exit then raises the failure)
            self.report.aborted, self.report.error = True, _one_line(self._failure)
        self.prefetch.clear()
        self.policy.clear()
        self.mover.shutdown(wait=False)
        self.final_report = self.report.snapshot(complete=True)
        self._on_finish(self)  # the virtualizer forgets the step, then writes its trace (never skips cleanup)

    def exit(self) -> None:
        """The context exited normally; finish if backward is over, and raise a failure not yet seen."""
        if self.foreign:
            return
        if self._failure is None:
            self._start_deferred()
        with self._lock:
            self._exited = True
            self._maybe_finish()
            settle = not self._records and bool(self._inflight)
        if settle:  # backward is over; only trailing transfers remain: finish the step now
            self.settle()
        with self._lock:
            unseen = self._failure is not None and not self._failure_raised
        if unseen:
            self.abort(self._failure)  # type: ignore[arg-type]
            self._raise_failure()

    def abort(self, exc: BaseException) -> None:
        """Drop everything this step holds: await transfers, free blocks, join threads, trim host buffers."""
        if self.foreign:
            return
        with self._lock:
            if self._finished:
                return
            self._aborted = self._exited = True
            self.report.aborted, self.report.error = True, _one_line(exc)
            try:
                for rec in self._records.values():
                    self._abort_record(rec, exc)
            finally:
                self._records.clear()
                self._by_storage.clear()
                self._deferred.clear()
                self.policy.clear()
                self.prefetch.clear()
        try:
            self.settle()  # completions of transfers still running free their blocks
        finally:  # NOTE [freeing never fails] in ``pool``: threads, buffers and the finish happen regardless
            try:
                self.mover.shutdown(wait=True)
                self.host_buffers.trim()
            finally:
                with self._lock:
                    if not self._finished:
                        self._finish()

    def _drop_tensors(self, rec: _Record) -> Any:
        """Drop ``rec``'s references to its tensors (the source released from the lingering budget it held)
        and return its block for the caller to free (under the lock)."""
        block, rec.block = rec.block, None
        source = rec.source
        rec.source = rec.alias = rec.restored = rec.event = None
        if rec.held:
            rec.held = False
            self.lingering.unhold(source, rec.nbytes, 1)
        return block

    def _abort_record(self, rec: _Record, exc: BaseException) -> None:
        """Free what ``rec`` holds and fail it (under the lock); never raises for its block."""
        block = self._drop_tensors(rec)
        rec.state = _State.FAILED
        rec.error = OffloadError(f"{rec.label}: its step was aborted ({_one_line(exc)})")
        self._set_resident(rec, False)
        self.prefetch.give_back(rec)
        if block is not None:
            self.report.warn(block.tier.free(block))  # NOTE [freeing never fails] in ``pool``
