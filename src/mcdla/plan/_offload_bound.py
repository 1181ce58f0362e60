"""The search of ``milp``: branch and bound over offload sets with a two-phase lower bound (see ``milp.py``).

NOTE [two-phase bound]
In a canonical plan (NOTE [canonical triggers] in ``space.py``) every prefetch starts after the last offload has
completed and after the end of forward, so an iteration is a *forward phase* (``F_0..F_{L-1}`` and the offload
stream) followed by a *backward phase* (``B_{L-1}..B_0`` and the prefetch stream), and the offload set ``X``
fixes the forward phase completely. Both phases are bounded here by schedules that are easy to compute exactly:

- Forward (real time): ``F_i`` starts when ``F_{i-1}`` has ended and the offloads completed so far free enough
  bytes for ``W + sum_{j<=i} S_j + trF_i <= budget``; offloads run one at a time in index order from the start of
  their ``F``. This is the engine's own forward. It gives the end of forward ``E`` and the completion ``oc_j`` of
  every offload.
- Backward, in reverse time (from the end of the iteration): ``B_0`` runs first, each tensor's prefetch becomes
  an "un-prefetch" that starts after its ``B`` and frees its bytes when it ends, in ascending index order, and
  ``B_k`` may (reverse-)start once ``W + sum_{j<=k} S_j + trB_k``, less the bytes of the layers below ``k`` whose
  un-prefetch has ended, fits. In real time those are the bytes on the device at the end of ``B_k`` (tensors below
  ``k`` are resident unless they are in the pool, i.e. not yet prefetched), and the engine allocated them in
  pieces that each fit, so every engine schedule, reversed, obeys these rules; the schedule that runs each
  operation as early as they allow is therefore no later, event by event, than any of them, whatever the
  triggers. Real prefetches of layers below ``L-1`` start no earlier than ``B_{L-1}`` (their triggers are
  backwards), which the reverse schedule keeps too.

With ``D`` = the reverse schedule's length, ``U`` = its last un-prefetch end and ``rev_k`` = its end of ``B_k``:
every canonical plan offloading ``X`` takes at least ``max(E + D, oc_last + U, max_k t_k + rev_k)``, where
``t_k >= E`` is the first time the forward's offloads of layers below ``k`` have freed enough for ``B_k``
(offloads still running hold their bytes when the backward starts). The triggers read off the reverse schedule
(each prefetch issued at the latest backward start not after its reverse-schedule start) usually meet this bound
in the engine; ``milp.py`` checks.

Both phases advance one layer at a time in index order, so a partial offload set ``X ∩ [0, i]`` fixes both
schedules up to layer ``i``. A node of the search tree bounds its completions by (a) each phase's remaining
compute, with the memory waits that the prefix's pending transfers and a fluid transfer of the remaining layers
at the link rate impose, and (b) the transfer streams: the bytes the remaining layers must still offload to fit
(``max_j need_j - offloaded so far``) pass both streams, after what is queued on them. All quantities in
seconds and bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from mcdla.plan.problem import Problem
from mcdla.workload.plan import Plan

__all__ = ["Relaxation", "SearchResult", "search_offload_sets"]

#: A phase's state after a layer: (compute end, stream free, pending transfers ((end, bytes), ...), bytes sent).
_State = tuple[float, float, tuple[tuple[float, float], ...], float]
_START: _State = (0.0, 0.0, (), 0.0)
#: Memory slack: the engine grants a request when ``used + bytes <= capacity * (1 + 1e-9)``; the bound allows a
#: little more so that it stays below the engine under float rounding.
_FIT_SLACK = 2e-9
_REL_PRUNE = 1e-9


class Relaxation:
    """The two-phase bound of one problem (NOTE [two-phase bound]); per-layer data in seconds and bytes."""

    def __init__(self, problem: Problem) -> None:
        chain, times = problem.chain, problem.times
        self.n = n = len(chain)
        self.u = (chain.fwd_s, chain.bwd_s)
        self.transfer = (times.offload_s, times.prefetch_s)
        self.rate = (times.offload_rate_bytes_per_s, times.prefetch_rate_bytes_per_s)
        self.saved = chain.saved_bytes
        budget = problem.budget_bytes
        finite = math.isfinite(budget)
        self.tol = _FIT_SLACK * budget if finite else 0.0
        prefix, acc = [], 0.0
        for s in chain.saved_bytes:
            acc += s
            prefix.append(acc)
        base = [chain.static_bytes + prefix[i] - budget if finite else -math.inf for i in range(n)]
        self.need = (
            [base[i] + chain.fwd_transient_bytes[i] for i in range(n)],
            [base[i] + chain.bwd_transient_bytes[i] for i in range(n)],
        )
        self.rest = tuple([math.fsum(u[i + 1:]) for i in range(n)] for u in self.u)
        self.from_ = tuple([math.fsum(u[i:]) for i in range(n)] for u in self.u)
        most = [-math.inf] * n
        for i in range(n - 2, -1, -1):
            most[i] = max(most[i + 1], self.need[0][i + 1], self.need[1][i + 1])
        self.most_need_after = most
        self.candidates = frozenset(
            i for i in chain.offloadable
            if math.isfinite(times.offload_s[i]) and math.isfinite(times.prefetch_s[i])
        )

    def step(self, state: _State, i: int, offload: bool, phase: int) -> tuple[_State, float] | None:
        """Advance ``phase`` (0 forward, 1 reverse backward) by layer ``i``: the new state and the operation's
        start; None when it can never fit."""
        t, free, pend, sent = state
        need = self.need[phase][i] - self.tol
        start = t
        waiting = math.fsum(b for _, b in pend)
        k = 0
        while k < len(pend) and (pend[k][0] <= start or sent - waiting < need):
            if pend[k][0] > start:
                start = pend[k][0]
            waiting -= pend[k][1]
            k += 1
        if sent - waiting < need:
            return None
        u = self.u[phase][i]
        if phase and i == self.n - 1 and free - u > start:
            start = free - u  # prefetches below L-1 are issued by backwards, so they start after B_{L-1} does
            while k < len(pend) and pend[k][0] <= start:
                k += 1
        end = start + u
        pend = pend[k:]
        if offload:
            free = max(start if phase == 0 else end, free) + self.transfer[phase][i]
            pend = pend + ((max(free, end), self.saved[i]),)
            sent += self.saved[i]
        return (end, free, pend, sent), start

    def _tail(self, state: _State, i: int, phase: int) -> float:
        """A lower bound on the end of ``phase``'s compute given its state after layer ``i``: the remaining layers
        wait for the pending transfers and for a fluid transfer of their own bytes from when the stream frees
        (every pending transfer ends by then)."""
        t, free, pend, sent = state
        u, need_l, start_to_end = self.u[phase], self.need[phase], self.from_[phase]
        rate, tol, saved = self.rate[phase], self.tol, self.saved
        fluid = math.isfinite(rate)
        best = t + self.rest[phase][i]
        earliest = t
        k, m = 0, len(pend)
        waiting = math.fsum(b for _, b in pend)
        avail = 0.0
        for j in range(i + 1, self.n):
            while k < m and pend[k][0] <= earliest:
                waiting -= pend[k][1]
                k += 1
            need = need_l[j] - tol
            at = earliest
            while k < m and sent - waiting < need:
                at = pend[k][0]
                waiting -= pend[k][1]
                k += 1
            if k == m:
                waiting = 0.0
                if sent < need:
                    if sent + avail < need:
                        return math.inf
                    late = free + (need - sent) / rate if fluid else free
                    if late > at:
                        at = late
            if at + start_to_end[j] > best:
                best = at + start_to_end[j]
            earliest = at + u[j]
            avail += saved[j]
        return best

    def node_bound(self, fwd: _State, bwd: _State, i: int) -> float:
        """Lower bound on every completion of a node whose layers ``0..i`` are decided (seconds)."""
        compute = self._tail(fwd, i, 0) + max(self._tail(bwd, i, 1), bwd[1])
        more = max(0.0, self.most_need_after[i] - self.tol - fwd[3])
        streams = fwd[1] + bwd[1]
        for rate in self.rate:
            if math.isfinite(rate):
                streams += more / rate
        return max(compute, streams)

    def schedules(self, offloaded: frozenset[int]):
        """Both phases for offload set ``offloaded``: (bound, reverse B starts, un-prefetch ends), or None."""
        fwd = bwd = _START
        rev_start = [0.0] * self.n
        unpf_end: dict[int, float] = {}
        completions: list[tuple[float, int]] = []
        for i in range(self.n):
            x = i in offloaded
            step = self.step(fwd, i, x, 0)
            back = self.step(bwd, i, x, 1)
            if step is None or back is None:
                return None
            fwd = step[0]
            bwd, rev_start[i] = back
            if x:
                completions.append((fwd[1], i))
                unpf_end[i] = bwd[1]
        end_fwd, last_offload = fwd[0], fwd[1]
        value = max(end_fwd + max(bwd[0], bwd[1]), last_offload + bwd[1])
        for k in range(self.n):
            need, at, freed = self.need[1][k] - self.tol, end_fwd, 0.0
            for oc, j in completions:
                if j >= k or freed >= need:
                    break
                freed += self.saved[j]
                at = max(at, oc)
            value = max(value, at + rev_start[k] + self.u[1][k])
        return value, rev_start, unpf_end

    def triggers(self, offloaded: frozenset[int]) -> tuple[float, dict[int, int]] | None:
        """The bound of ``offloaded`` and the triggers read off its reverse schedule (NOTE [trigger index])."""
        found = self.schedules(offloaded)
        if found is None:
            return None
        value, rev_start, unpf_end = found
        n, ub = self.n, self.u[1]
        out: dict[int, int] = {}
        for j in sorted(offloaded):
            if j == n - 1:
                out[j] = n
                continue
            eps = 1e-12 * max(1.0, unpf_end[j])
            out[j] = next((m for m in range(j + 1, n) if rev_start[m] + ub[m] >= unpf_end[j] - eps), n - 1)
        return value, out


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What the search found: the best plan and its engine makespan (s), a lower bound on every canonical plan
    (s), whether the tree was exhausted, and counts of nodes and engine-checked leaves."""

    plan: Plan | None
    value_s: float
    bound_s: float
    finished: bool
    nodes: int
    leaves: int


def search_offload_sets(problem: Problem, relax: Relaxation, plan: Plan | None, value_s: float,
                        deadline: float) -> SearchResult:
    """Depth-first branch and bound over offload sets (layer 0 first, *keep* before *offload*), from the incumbent
    ``plan`` of engine makespan ``value_s``, until the tree is exhausted or ``time.perf_counter()`` passes
    ``deadline``. A leaf below the incumbent is checked with the engine (its triggers from
    :meth:`Relaxation.triggers`); one the engine does not confirm stays open and caps the bound."""
    n = relax.n
    best_plan, best = plan, value_s
    open_bound = math.inf
    nodes = leaves = 0
    # entries: (bound, layer decided, forward state, backward state, offloaded layers as nested pairs)
    stack: list[tuple[float, int, _State, _State, tuple | None]] = [(-math.inf, -1, _START, _START, None)]
    finished = True
    while stack:
        bound, i, fwd, bwd, chosen = stack.pop()
        if bound >= best * (1 - _REL_PRUNE):
            continue
        nodes += 1
        if nodes % 64 == 0 and time.perf_counter() > deadline:
            stack.append((bound, i, fwd, bwd, chosen))
            finished = False
            break
        if i == n - 1:
            offloaded = _members(chosen)
            leaves += 1
            found = relax.triggers(offloaded)
            if found is None or found[0] >= best * (1 - _REL_PRUNE):
                continue
            cand = problem.offload_plan(found[1])
            v = problem.score(cand)
            if v < best:
                best_plan, best = cand, v
            if v > found[0] * (1 + _REL_PRUNE):
                open_bound = min(open_bound, found[0])
            continue
        j = i + 1
        children = []
        for x in ((False, True) if j in relax.candidates else (False,)):
            f = relax.step(fwd, j, x, 0)
            b = relax.step(bwd, j, x, 1)
            if f is None or b is None:
                continue
            child = (f[0], b[0])
            if j < n - 1:
                cb = relax.node_bound(child[0], child[1], j)
            else:  # the leaf's bound without the junction term (that needs the whole schedule)
                cb = max(child[0][0] + max(child[1][0], child[1][1]), child[0][1] + child[1][1])
            if cb < best * (1 - _REL_PRUNE):
                children.append((cb, j, child[0], child[1], (j, chosen) if x else chosen))
        stack.extend(reversed(children))
    frontier = min((entry[0] for entry in stack), default=math.inf)
    return SearchResult(plan=best_plan, value_s=best, bound_s=min(best, open_bound, frontier), finished=finished,
                        nodes=nodes, leaves=leaves)


def _members(chosen: tuple | None) -> frozenset[int]:
    out = []
    while chosen is not None:
        out.append(chosen[0])
        chosen = chosen[1]
    return frozenset(out)
