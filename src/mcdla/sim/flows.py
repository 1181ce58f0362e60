"""Max-min fair sharing of bandwidth resources among flows, and the network of active flows.

NOTE [max-min by progressive filling]
A flow crosses a set of resources (directed link segments, a memory's DRAM); each resource ``r`` has a
capacity ``c_r``. Max-min fairness: no flow's rate can rise without lowering the rate of a flow that is no
faster. Progressive filling computes it: raise every unfrozen flow's rate together; when a resource saturates
(the summed rates through it reach ``c_r``), freeze every flow crossing it at the current level; repeat with the
rest. A flow that crosses a resource twice counts twice there. The allocation is unique, so flows on
identical routes always get identical rates: the solver works on *route classes* (route, count).

NOTE [memoised rates]
Rates depend only on the multiset of active routes, never on the bytes left, and a training iteration repeats
the same few configurations (every device offloading, a ring step, ...) hundreds of times. The network
therefore memoises the solution per multiset of route ids, and recomputes rates at most once per simulated
instant (the engine batches every event of one timestamp before asking).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

__all__ = ["max_min_rates", "progressive_filling", "FlowNetwork", "Transfer"]

_SATURATED = 1e-9  # a resource with less than this fraction of its capacity left counts as saturated


def progressive_filling(
    capacities: Sequence[float], routes: Mapping[Hashable, Sequence[int]], counts: Mapping[Hashable, int]
) -> dict[Hashable, float]:
    """Max-min fair rate of one flow of each route class.

    Args:
        capacities: capacity of each resource id (finite, > 0), e.g. bytes/s.
        routes: for each route class, the resource ids it crosses (non-empty; repeats count twice).
        counts: how many flows of each class are active (>= 1).

    Returns:
        rate per route class (same unit as the capacities).
    """
    load: dict[int, float] = {}
    for rid, n in counts.items():
        for res in routes[rid]:
            load[res] = load.get(res, 0) + n
    remaining = {res: capacities[res] for res in load}
    unfrozen = dict(counts)
    rates: dict[Hashable, float] = {}
    level = 0.0
    while unfrozen:
        step = math.inf
        for res, n in load.items():
            if n > 0:
                share = remaining[res] / n
                if share < step:
                    step = share
        assert step < math.inf, "every route crosses at least one finite resource"
        level += step
        saturated = set()
        for res, n in load.items():
            if n > 0:
                remaining[res] -= step * n
                if remaining[res] <= _SATURATED * capacities[res]:
                    saturated.add(res)
        frozen = [rid for rid in unfrozen if any(res in saturated for res in routes[rid])]
        for rid in frozen:
            n = unfrozen.pop(rid)
            rates[rid] = level
            for res in routes[rid]:
                load[res] -= n
    return rates


def max_min_rates(capacities: Sequence[float], flows: Sequence[Sequence[int]]) -> list[float]:
    """Max-min fair rates of ``flows`` (each a sequence of resource ids) over resources of ``capacities``.

    A flow that crosses no resource is unconstrained (rate ``math.inf``); ``math.inf`` capacities never bind.
    """
    routes: dict[int, tuple[int, ...]] = {}
    for i, flow in enumerate(flows):
        finite = tuple(r for r in flow if math.isfinite(capacities[r]))
        if finite:
            routes[i] = finite
    rates = progressive_filling(capacities, routes, {i: 1 for i in routes}) if routes else {}
    return [rates.get(i, math.inf) for i in range(len(flows))]


class Transfer:
    """A group of flows whose end runs ``handler(arg, t)``, ``latency_s`` after the last one drained (the flows'
    token in a :class:`FlowNetwork`; ``pending`` counts those in flight)."""

    __slots__ = ("pending", "latency_s", "handler", "arg")

    def __init__(self, latency_s: float, handler: Callable[[Any, float], None], arg: Any) -> None:
        self.pending = 0
        self.latency_s = latency_s
        self.handler = handler
        self.arg = arg


class _Flow:
    __slots__ = ("route", "remaining", "t0", "rate", "finish", "token")

    def __init__(self, route: int, size: float, now: float, token: Any) -> None:
        self.route = route
        self.remaining = size
        self.t0 = now
        self.rate = 0.0
        self.finish = math.inf
        self.token = token


class FlowNetwork:
    """The flows in flight over a fixed set of resources and routes, with their max-min fair rates.

    Sizes are in the unit the capacities are per second of (bytes for bytes/s). Call :meth:`add` and
    :meth:`pop_finished` freely at one instant, then :meth:`recompute` once before time advances;
    :attr:`next_time` is then the earliest time a flow drains.
    """

    __slots__ = ("_capacities", "_routes", "_flows", "_memo", "dirty", "next_time", "solves", "recomputes")

    def __init__(self, capacities: Sequence[float], routes: Sequence[Sequence[int]]) -> None:
        """``capacities``: finite capacity per resource id; ``routes``: resource ids of each route id."""
        self._capacities = tuple(float(c) for c in capacities)
        assert all(0 < c < math.inf for c in self._capacities), "only finite, positive resources enter the network"
        self._routes = tuple(tuple(r) for r in routes)
        self._flows: list[_Flow] = []
        self._memo: dict[tuple[int, ...], dict[Hashable, float]] = {}
        self.dirty = False
        self.next_time = math.inf
        self.solves = 0
        self.recomputes = 0

    def __len__(self) -> int:
        return len(self._flows)

    def add(self, now: float, route: int, size: float, token: Any) -> None:
        """Start a flow of ``size`` along route id ``route`` (which must cross a resource) at ``now`` (s)."""
        assert size > 0 and self._routes[route], "instant transfers never enter the network"
        self._flows.append(_Flow(route, size, now, token))
        self.dirty = True

    def pop_finished(self, now: float) -> list[Any]:
        """Remove the flows drained by ``now`` (s); returns their tokens in start order."""
        if self.next_time > now * (1.0 + 1e-12) + 1e-15:
            return []
        limit = now * (1.0 + 1e-12) + 1e-15
        done: list[Any] = []
        keep: list[_Flow] = []
        for flow in self._flows:
            if flow.finish <= limit:
                done.append(flow.token)
            else:
                keep.append(flow)
        if done:
            self._flows = keep
            self.dirty = True
        return done

    def active(self) -> list[tuple[int, float, Any]]:
        """``(route id, rate, token)`` of each flow in flight, at the rates of the last :meth:`recompute`."""
        return [(f.route, f.rate, f.token) for f in self._flows]

    def recompute(self, now: float) -> None:
        """Re-solve the rates of the active flows at ``now`` (s) and update :attr:`next_time`."""
        self.dirty = False
        flows = self._flows
        if not flows:
            self.next_time = math.inf
            return
        self.recomputes += 1
        key = tuple(sorted([f.route for f in flows]))
        rates = self._memo.get(key)
        if rates is None:
            counts: dict[Hashable, int] = {}
            for rid in key:
                counts[rid] = counts.get(rid, 0) + 1
            rates = progressive_filling(self._capacities, self._routes, counts)
            self._memo[key] = rates
            self.solves += 1
        next_time = math.inf
        for f in flows:
            rate = rates[f.route]
            if rate != f.rate:
                if f.rate > 0.0:
                    f.remaining = max(0.0, f.remaining - f.rate * (now - f.t0))
                f.t0 = now
                f.rate = rate
                f.finish = now + f.remaining / rate
            if f.finish < next_time:
                next_time = f.finish
        self.next_time = max(next_time, now)
