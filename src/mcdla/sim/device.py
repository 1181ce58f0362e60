"""One device's state machine: a compute stream, a D2H (offload) and an H2D (prefetch) copy stream, and its
memory (``docs/timing-model.md``).

NOTE [memory grants]
An operation asks for its memory only once everything else it waits for is there (its stream is free, its
data has arrived, the collective it depends on is done), so no memory is held while waiting. A device has at
most two requests pending: the compute stream's head and the H2D stream's head (offloads need no device
memory). The engine settles requests after *all* events of a timestamp have run, so frees at that instant
count; requests are granted first-fit in the order they were made, the compute stream's first on a tie. A
request fits when ``used + bytes <= capacity * (1 + 1e-9)`` (the slack absorbs float rounding only).

NOTE [safe prefetch]
A prefetch of ``S_j`` holds its bytes until ``B_j`` ends, so granting it merely because it fits can take the
room an earlier backward needs and deadlock the device (``B_k`` waits for memory that only ``B_j``, after it,
would free), while the same plan on a slower link, where the grant came later, runs. So a prefetch is granted
only when it fits *and* the compute stream can still reach the operation that needs ``S_j`` with it held:
walking the operations from the running (or next) one to that operation, each one's memory request, plus the
prefetch of any data it needs that is not yet on the device, must fit once the offloads still to land (queued
or in flight, of layers whose forward is done) have freed their bytes, counting besides only the frees of
those operations themselves. This keeps a faster link or faster compute from turning a feasible plan
infeasible (``tests/sim/test_monotonic.py``). The rule only delays grants: when the walk fails, granting
would leave the first failing operation waiting for memory that stays held until after it has run.

NOTE [CPU sharing]
On a CPU the training "device" and the runtime's helper threads (the optimizer's worker, the parameter
offloader's fetch thread) share the same cores: while a CPU update or a weight fetch runs, compute can slow
down, and while compute runs, the update can. ``Program.cpu_sharing = (c, u)`` says by how much (measured, e.g.
by ``mcdla validate --states``): an operation's compute progresses at ``1 / c`` of its rate while an update or
a weight fetch runs, an update at ``1 / u`` of its rate while an operation computes (processor sharing of the
measured stretches; a fetch keeps its link time, which the probe measured with compute idle, and so hides
as before). Each change of who runs re-times the running one's end from the work it has left;
a compute operation's extra wall time is exposed virtualization (its ``duration_s`` stays compute). (1, 1),
the default, is a spare core for the updates: nothing is re-timed.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from mcdla.errors import SimError
from mcdla.sim.program import BACKWARD, FORWARD, Op, Program

if TYPE_CHECKING:
    from mcdla.sim.engine import Engine

__all__ = ["DeviceState"]

_FIT_SLACK = 1e-9
_PHASES = ("forward", "recompute", "backward")  # a compute span's phase, by Op.kind


class DeviceState:
    """Streams and memory of device ``index`` while the engine runs (times in s, sizes in bytes)."""

    __slots__ = (
        "engine", "index", "name", "capacity", "limit", "ops", "saved", "used", "peak", "timeline",
        "pc", "reached", "busy", "op_start", "prev_end", "wait_coll", "coll_count",
        "comp_req", "comp_req_t", "pf_req", "pf_req_t", "d2h", "d2h_busy", "h2d", "h2d_busy",
        "fwd_done", "off_done", "pf_issued", "pf_done", "compute_s", "recompute_s", "virt_s", "comm_s",
        "finished", "d2h_start", "d2h_layer", "h2d_start", "in_settle", "pf_live", "tables",
        "fetch_bytes", "fetch_layer", "wq", "w_busy", "w_start", "w_issued", "w_done", "cpu_q", "cpu_busy",
        "updates_left", "step_q", "step_busy", "step_start", "sharing", "comp_left", "comp_mark", "comp_gen",
        "upd_op", "upd_left", "upd_mark", "upd_gen",
    )

    def __init__(self, engine: Engine, index: int, name: str, capacity: float, program: Program,
                 record_memory: bool) -> None:
        self.engine = engine
        self.index = index
        self.name = name
        self.capacity = capacity
        self.limit = capacity * (1.0 + _FIT_SLACK)
        self.ops = program.ops
        self.saved = program.saved_bytes
        self.used = 0.0
        self.peak = 0.0
        self.timeline: list[tuple[float, float]] | None = [] if record_memory else None
        self.pc = 0
        self.reached = -1
        self.busy = False
        self.op_start = 0.0
        self.prev_end = 0.0
        self.wait_coll = -1
        self.coll_count = 0
        self.comp_req = -1.0
        self.comp_req_t = 0.0
        self.pf_req = -1.0
        self.pf_req_t = 0.0
        self.d2h: deque[int] = deque()
        self.d2h_busy = False
        self.d2h_start = 0.0
        self.d2h_layer = -1
        self.h2d: deque[int] = deque()
        self.h2d_busy = False
        self.h2d_start = 0.0
        n = len(program.saved_bytes)
        self.fwd_done = [False] * n
        self.off_done = [False] * n
        self.pf_issued = [False] * n
        self.pf_done = [False] * n
        self.compute_s = 0.0
        self.recompute_s = 0.0
        self.virt_s = 0.0
        self.comm_s = 0.0
        self.finished = False
        self.in_settle = False
        self.pf_live: list[int] = []  # layers whose prefetch has started (pruned by _prefetch_is_safe)
        self.tables: tuple[list[int], list[float], list[float]] | None = None
        self.fetch_bytes = program.fetch_bytes  # weight fetches (NOTE [state in the program])
        self.fetch_layer = program.fetch_layer
        self.wq: deque[int] = deque()
        self.w_busy = False
        self.w_start = 0.0
        self.w_issued = [False] * len(program.fetch_bytes)
        self.w_done = [False] * len(program.fetch_bytes)
        self.cpu_q: deque[Op] = deque()  # updates waiting for the CPU (one at a time)
        self.cpu_busy = False
        self.updates_left = sum(1 for op in self.ops if op.update_bytes > 0.0)
        self.step_q: deque[Op] = deque()  # updated values waiting for the optimizer's step() to copy them in
        self.step_busy = False
        self.step_start = 0.0
        # NOTE [CPU sharing]: None without contention; else the work left (s at full rate) of the running compute
        # operation and update, since when, and the generation that makes a re-timed end's old event stale
        self.sharing = None if program.cpu_sharing == (1.0, 1.0) else program.cpu_sharing
        self.comp_left = self.comp_mark = 0.0
        self.comp_gen = 0
        self.upd_op: Op | None = None
        self.upd_left = self.upd_mark = 0.0
        self.upd_gen = 0

    # -- memory --------------------------------------------------------------------------------------------
    def alloc(self, nbytes: float, now: float) -> None:
        self.used += nbytes
        if self.used > self.peak:
            self.peak = self.used
        if self.timeline is not None:
            self.timeline.append((now, self.used))

    def free(self, nbytes: float, now: float) -> None:
        used = self.used - nbytes
        assert used >= -1e-9 * max(self.peak, 1.0), f"device {self.name}: memory went negative ({used})"
        self.used = used if used > 0.0 else 0.0
        if self.timeline is not None:
            self.timeline.append((now, self.used))
        if (self.comp_req >= 0.0 or self.pf_req >= 0.0) and not self.in_settle:
            self.in_settle = True
            self.engine.to_settle.append(self)

    def _request(self) -> None:
        if not self.in_settle:
            self.in_settle = True
            self.engine.to_settle.append(self)

    def settle(self, now: float) -> None:
        """Grant pending memory requests that fit (NOTE [memory grants])."""
        self.in_settle = False
        if self.pf_req >= 0.0 and (self.comp_req < 0.0 or self.pf_req_t < self.comp_req_t):
            if self.used + self.pf_req <= self.limit and self._prefetch_is_safe():
                self._start_prefetch(now)
            if self.comp_req >= 0.0 and self.used + self.comp_req <= self.limit:
                self._start_compute(now)
        else:
            if self.comp_req >= 0.0 and self.used + self.comp_req <= self.limit:
                self._start_compute(now)
            if self.pf_req >= 0.0 and self.used + self.pf_req <= self.limit and self._prefetch_is_safe():
                self._start_prefetch(now)

    def _prefetch_is_safe(self) -> bool:
        """Whether granting the H2D head's request leaves the compute stream a way to the op that needs it
        (NOTE [safe prefetch]).

        The walk is done on static tables (:meth:`_walk_tables`) that assume every tensor an op needs is
        fetched just before it; tensors already on the device (prefetches started, and the head itself)
        are corrections from their first use on, so a check costs a few C-level ``max`` over slices.
        """
        first, prefix, need_at = self.tables or self._walk_tables()
        layer = self.h2d[0]
        start = self.pc
        used = self.used + self.pf_req
        saved = self.saved
        if self.d2h_busy or self.d2h:  # offloads still to land free their bytes without the compute stream
            fwd_done = self.fwd_done
            for off in self.d2h:
                if fwd_done[off]:
                    used -= saved[off]
            if self.d2h_busy and fwd_done[self.d2h_layer]:
                used -= saved[self.d2h_layer]
        if self.busy:  # the running op's bytes are in ``used``; it frees its own when it ends
            used -= self.ops[start].free_bytes
            start += 1
        target = first[layer]
        room = self.limit - used + prefix[start]
        if max(need_at[start:target + 1]) <= room:
            return True  # even counting the tensors already on the device twice
        live = [k for k in self.pf_live if first[k] >= start]
        self.pf_live = live
        fixes = sorted((first[k], saved[k]) for k in live if first[k] <= target)
        fixes.append((target, saved[layer]))
        pos = start
        for at, nbytes in fixes:
            if at > pos and max(need_at[pos:at]) > room:
                return False
            room += nbytes
            pos = at
        return max(need_at[pos:target + 1]) <= room

    def _walk_tables(self) -> tuple[list[int], list[float], list[float]]:
        """``first[l]``: the first op that needs layer ``l``'s data; ``prefix[m]``: net bytes allocated by ops
        ``0..m-1`` if every needed tensor is fetched just before its first use; ``need_at[m]``: ``prefix[m]``
        plus what op ``m`` allocates (and fetches) when it starts. Built on the first prefetch check."""
        if self.tables is None:
            saved = self.saved
            first = [-1] * len(saved)
            prefix = [0.0]
            need_at = []
            acc = 0.0
            for m, op in enumerate(self.ops):
                grow = op.alloc_bytes
                need = op.need_data
                if need >= 0 and first[need] < 0:
                    first[need] = m
                    grow += saved[need]
                need_at.append(acc + grow)
                acc += grow - op.free_bytes
                prefix.append(acc)
            self.tables = (first, prefix, need_at)
        return self.tables

    # -- compute stream --------------------------------------------------------------------------------------
    def try_compute(self, now: float) -> None:
        """Start (or ask memory for) the next compute operation if nothing else holds it back."""
        if self.busy or self.comp_req >= 0.0 or self.finished:
            return
        pc = self.pc
        op = self.ops[pc]
        if self.reached != pc:
            self.reached = pc
            for layer in op.reach_prefetch:
                self.issue_prefetch(layer, now)
            for fetch in op.reach_fetch:
                self.issue_fetch(fetch, now)
        if self.wait_coll >= 0 and not self.engine.coll_done[self.wait_coll]:
            return
        if op.need_data >= 0 and not self.pf_done[op.need_data]:
            return
        if op.need_fetch >= 0 and not self.w_done[op.need_fetch]:
            return
        self.comp_req = op.alloc_bytes
        self.comp_req_t = now
        self._request()

    def _start_compute(self, now: float) -> None:
        op = self.ops[self.pc]
        if self.sharing is not None:
            self._advance(now)  # the update ran at its own rate until now
        self.alloc(self.comp_req, now)
        self.comp_req = -1.0
        self.busy = True
        gap = now - self.prev_end
        if gap > 0.0:
            comm = 0.0
            if self.wait_coll >= 0:
                comm = min(gap, max(0.0, self.engine.coll_done_t[self.wait_coll] - self.prev_end))
            self.comm_s += comm
            self.virt_s += gap - comm
        self.wait_coll = -1
        self.op_start = now
        if op.offload >= 0:
            self.d2h.append(op.offload)
            self.try_d2h(now)
        for layer in op.start_prefetch:
            self.issue_prefetch(layer, now)
        for fetch in op.start_fetch:
            self.issue_fetch(fetch, now)
        if self.sharing is None:
            self.engine.queue.push(now + op.duration_s, self._end_compute, op)
            return
        self.comp_left = op.duration_s
        self._retime(now)

    # -- NOTE [CPU sharing] --------------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Take the work done since the last change off the running compute operation and update."""
        c, u = self.sharing  # type: ignore[misc]
        if self.busy:
            self.comp_left = max(0.0, self.comp_left - (now - self.comp_mark) / (c if self._helper_busy() else 1.0))
        if self.upd_op is not None:
            self.upd_left = max(0.0, self.upd_left - (now - self.upd_mark) / (u if self.busy else 1.0))
        self.comp_mark = self.upd_mark = now

    def _helper_busy(self) -> bool:
        """Whether one of the runtime's CPU threads runs beside compute: the optimizer's update or a weight fetch."""
        return self.upd_op is not None or self.w_busy

    def _retime(self, now: float) -> None:
        """Schedule the running compute operation's and update's ends at their present rates (stale ones ignored)."""
        c, u = self.sharing  # type: ignore[misc]
        queue = self.engine.queue
        if self.busy:
            self.comp_gen += 1
            queue.push(now + self.comp_left * (c if self._helper_busy() else 1.0), self._end_compute_shared,
                       (self.ops[self.pc], self.comp_gen))
        if self.upd_op is not None:
            self.upd_gen += 1
            queue.push(now + self.upd_left * (u if self.busy else 1.0), self._end_update_shared,
                       (self.upd_op, self.upd_gen))

    def _end_compute_shared(self, arg: tuple[Op, int], now: float) -> None:
        op, gen = arg
        if gen != self.comp_gen:
            return
        self._advance(now)
        self.virt_s += max(0.0, now - self.op_start - op.duration_s)
        self._end_compute(op, now)
        if self.upd_op is not None and not self.busy:  # the update runs alone until the next operation starts
            self._retime(now)

    def _end_update_shared(self, arg: tuple[Op, int], now: float) -> None:
        op, gen = arg
        if gen != self.upd_gen:
            return
        self._advance(now)
        self.upd_op = None
        if self.busy:
            self._retime(now)
        self._end_cpu_update(op, now)

    def _end_compute(self, op: Op, now: float) -> None:
        self.busy = False
        self.prev_end = now
        if op.kind == FORWARD:
            self.compute_s += op.duration_s
            self.fwd_done[op.layer] = True
        elif op.kind == BACKWARD:
            self.compute_s += op.duration_s
        else:
            self.recompute_s += op.duration_s
        engine = self.engine
        if engine.spans is not None:
            engine.record_span((self.index, 0, op.label, "compute", self.op_start, now),
                               layer=engine.layer_names[op.layer], phase=_PHASES[op.kind], flops=op.flops,
                               bytes_moved=op.bytes_moved)
        self.free(op.free_bytes, now)
        layer = op.offload
        if layer >= 0 and self.off_done[layer]:
            self.free(self.saved[layer], now)
        for pf in op.end_prefetch:
            self.issue_prefetch(pf, now)
        if op.update_bytes > 0.0:
            if not engine.unlimited:  # the gradient's host copy, until its update has run
                engine.pool_hold_state(self, op.update_bytes, now)
            self._state_transfer(op, True, op.update_bytes, self._end_gradient_out, now)
        if op.coll_bytes > 0.0:
            coll = engine.arrive(self, op, now)
            if op.coll_blocks:
                self.wait_coll = coll
        self.pc += 1
        if self.pc == len(self.ops):
            self.finished = True
            engine.device_finished(self, now)
            self._try_step(now)
        else:
            self.try_compute(now)

    # -- D2H: offloads ----------------------------------------------------------------------------------------
    def try_d2h(self, now: float) -> None:
        if self.d2h_busy or not self.d2h:
            return
        layer = self.d2h[0]
        if not self.engine.pool_reserve(self, layer, now):
            return
        self.d2h.popleft()
        self.d2h_busy = True
        self.d2h_start = now
        self.d2h_layer = layer
        self.engine.start_offload(self, layer, now)

    def end_offload(self, layer: int, now: float) -> None:
        self.d2h_busy = False
        self.off_done[layer] = True
        engine = self.engine
        engine.offloaded_bytes += self.saved[layer]
        if engine.spans is not None:
            name = engine.layer_names[layer]
            engine.record_span((self.index, 1, f"offload {name}", "offload", self.d2h_start, now),
                               layer=name, tensor=f"saved {name}", bytes=self.saved[layer],
                               tier=engine.pool_names(self.index))
        if self.fwd_done[layer]:
            self.free(self.saved[layer], now)
        self.try_d2h(now)
        self.try_h2d(now)

    # -- H2D: prefetches --------------------------------------------------------------------------------------
    def issue_prefetch(self, layer: int, now: float) -> None:
        if self.pf_issued[layer]:
            return
        self.pf_issued[layer] = True
        self.h2d.append(layer)
        self.try_h2d(now)

    def try_h2d(self, now: float) -> None:
        if self.h2d_busy or self.pf_req >= 0.0 or not self.h2d:
            return
        layer = self.h2d[0]
        if not self.off_done[layer]:
            return
        self.pf_req = self.saved[layer]
        self.pf_req_t = now
        self._request()

    def _start_prefetch(self, now: float) -> None:
        layer = self.h2d.popleft()
        self.pf_live.append(layer)
        self.alloc(self.pf_req, now)
        self.pf_req = -1.0
        self.h2d_busy = True
        self.h2d_start = now
        self.engine.start_prefetch(self, layer, now)

    def end_prefetch(self, layer: int, now: float) -> None:
        self.h2d_busy = False
        self.pf_done[layer] = True
        engine = self.engine
        engine.prefetched_bytes += self.saved[layer]
        engine.pool_release(self, layer, now)
        if engine.spans is not None:
            name = engine.layer_names[layer]
            engine.record_span((self.index, 2, f"prefetch {name}", "prefetch", self.h2d_start, now),
                               layer=name, tensor=f"saved {name}", bytes=self.saved[layer],
                               tier=engine.pool_names(self.index))
        self.try_h2d(now)
        self.try_compute(now)

    # -- weights and optimizer state (NOTE [state in the program]) ---------------------------------------------
    def _state_transfer(self, arg: object, out: bool, nbytes: float, handler, now: float) -> None:
        """Move ``nbytes`` of state over the offload (``out``) or prefetch route; ``handler(arg, t)`` when done."""
        engine = self.engine
        if engine.unlimited:
            engine.queue.push(now, handler, arg)
            return
        parts = (engine.fabric.offload_routes if out else engine.fabric.prefetch_routes)[self.index]
        if not parts:
            raise SimError(f"device {self.name!r} has no pool memory; the plan moves weights or optimizer state")
        share = nbytes / len(parts)
        engine.transfer([(route, share) for _mem, route in parts], handler, arg, now)

    def issue_fetch(self, fetch: int, now: float) -> None:
        if self.w_issued[fetch]:
            return
        self.w_issued[fetch] = True
        self.wq.append(fetch)
        self._try_fetch(now)

    def _try_fetch(self, now: float) -> None:
        if self.w_busy or not self.wq:
            return
        fetch = self.wq.popleft()
        if self.sharing is not None:
            self._advance(now)
        self.w_busy = True
        self.w_start = now
        if self.sharing is not None:
            self._retime(now)
        self._state_transfer(fetch, False, self.fetch_bytes[fetch], self._end_fetch, now)

    def _end_fetch(self, fetch: int, now: float) -> None:
        if self.sharing is not None:
            self._advance(now)
        self.w_busy = False
        if self.sharing is not None:
            self._retime(now)
        self.w_done[fetch] = True
        engine = self.engine
        if engine.spans is not None:
            name = engine.layer_names[self.fetch_layer[fetch]]
            engine.record_span((self.index, 2, f"fetch weights {name}", "prefetch", self.w_start, now),
                               layer=name, tensor=f"weights {name}", bytes=self.fetch_bytes[fetch],
                               tier=engine.pool_names(self.index))
        self._try_fetch(now)
        self.try_compute(now)

    def _end_gradient_out(self, op: Op, now: float) -> None:
        if op.update_frees:
            self.free(op.update_bytes, now)
        self.cpu_q.append(op)
        self._try_update(now)

    def _try_update(self, now: float) -> None:
        if self.cpu_busy or not self.cpu_q:
            return
        self.cpu_busy = True
        op = self.cpu_q.popleft()
        if self.sharing is None:
            self.engine.queue.push(now + op.update_s, self._end_cpu_update, op)
            return
        self._advance(now)
        self.upd_op, self.upd_left = op, op.update_s
        self._retime(now)

    def _end_cpu_update(self, op: Op, now: float) -> None:
        self.cpu_busy = False
        self.step_q.append(op)
        self.updates_left -= 1
        self._try_step(now)
        self._try_update(now)

    def _try_step(self, now: float) -> None:
        """The optimizer's ``step()``: once backward is over and every update has run, copy the new values in one
        after another, into the device's weights (prefetch route) or the pool's (offload route)."""
        if self.step_busy or not self.finished or self.updates_left > 0 or not self.step_q:
            return
        self.step_busy = True
        self.step_start = now
        op = self.step_q.popleft()
        self._state_transfer(op, not op.update_back, op.update_bytes, self._end_copy_in, now)

    def _end_copy_in(self, op: Op, now: float) -> None:
        self.step_busy = False
        engine = self.engine
        if not engine.unlimited:  # the gradient's host copy, then the new value: gone once copied in
            engine.pool_hold_state(self, -op.update_bytes, now)
        if engine.spans is not None:
            name = engine.layer_names[op.layer]
            back = op.update_back
            engine.record_span((self.index, 2 if back else 1, f"{'copy in' if back else 'write'} weights {name}",
                                "prefetch" if back else "offload", self.step_start, now), layer=name,
                               tensor=f"weights {name}", bytes=op.update_bytes, tier=engine.pool_names(self.index))
        self._end_update(op, now)
        self._try_step(now)

    def _end_update(self, op: Op, now: float) -> None:
        """An updated value is in place; it extends the iteration past the last operation (``step()`` waits)."""
        if self.finished and now > self.prev_end:
            self.virt_s += now - self.prev_end
            self.prev_end = now

    # -- diagnosis --------------------------------------------------------------------------------------------
    def blocked_requests(self) -> list[tuple[float, str]]:
        """``(bytes needed in all, what)`` for each memory request still pending (after a deadlock)."""
        out = []
        if self.comp_req >= 0.0 and not self.finished:
            op = self.ops[self.pc]
            phase = ("F", "R", "B")[op.kind]
            out.append((self.used + self.comp_req, f"layer {self.engine.layer_names[op.layer]} ({phase})"))
        if self.pf_req >= 0.0:
            out.append((self.used + self.pf_req, f"prefetch of layer {self.engine.layer_names[self.h2d[0]]}"))
        return out
