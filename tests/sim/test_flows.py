"""Max-min fair sharing (mcdla.sim.flows) and the event queue (mcdla.sim.events)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import SimError
from mcdla.sim.events import EventQueue
from mcdla.sim.flows import FlowNetwork, max_min_rates


def test_two_flows_on_one_link_each_get_half() -> None:
    """Two flows crossing one 10 GB/s link get 5 GB/s each."""
    assert max_min_rates([10e9], [[0], [0]]) == [5e9, 5e9]


def test_unconstrained_flow_is_infinite() -> None:
    """A flow over unlimited resources only has no rate limit."""
    assert max_min_rates([math.inf, 4.0], [[0], [0, 1]]) == [math.inf, 4.0]


def test_classic_max_min_example() -> None:
    """The textbook case: a long flow over two links shares each with a short one (caps 1 and 2)."""
    # flows: A over links 0 and 1, B over link 0, C over link 1; A and B split link 0; C takes what A leaves.
    assert max_min_rates([1.0, 2.0], [[0, 1], [0], [1]]) == pytest.approx([0.5, 0.5, 1.5])


@st.composite
def _networks(draw: st.DrawFn) -> tuple[list[float], list[list[int]]]:
    n_res = draw(st.integers(1, 5))
    caps = [draw(st.sampled_from([1.0, 2.0, 3.0, 10.0, 25.0])) for _ in range(n_res)]
    flows = [draw(st.lists(st.integers(0, n_res - 1), min_size=1, max_size=3)) for _ in range(draw(st.integers(1, 7)))]
    return caps, flows


@settings(max_examples=200, deadline=None)
@given(_networks())
def test_rates_are_max_min_fair(net: tuple[list[float], list[list[int]]]) -> None:
    """Rates are feasible and every flow has a saturated bottleneck on which no flow is faster (the definition)."""
    caps, flows = net
    rates = max_min_rates(caps, flows)
    load = [0.0] * len(caps)
    for flow, rate in zip(flows, rates):
        for r in flow:
            load[r] += rate
    assert all(l <= c * (1 + 1e-9) for l, c in zip(load, caps))
    for flow, rate in zip(flows, rates):
        bottlenecks = [r for r in flow if load[r] >= caps[r] * (1 - 1e-9)
                       and all(other <= rate * (1 + 1e-9) for f, other in zip(flows, rates) if r in f)]
        assert bottlenecks, (flow, rate)


def test_network_rates_change_when_a_flow_joins() -> None:
    """A 10-unit flow alone at rate 1 shares with a 2-unit flow from t=4: the small one ends at 8, the big at 12."""
    net = FlowNetwork([1.0], [(0,)])
    net.add(0.0, 0, 10.0, "big")
    net.recompute(0.0)
    assert net.next_time == 10.0
    net.add(4.0, 0, 2.0, "small")
    net.recompute(4.0)
    assert net.next_time == pytest.approx(8.0)
    assert net.pop_finished(8.0) == ["small"]
    net.recompute(8.0)
    assert net.next_time == pytest.approx(12.0)
    assert net.pop_finished(12.0) == ["big"]


def test_network_memoises_configurations() -> None:
    """The same multiset of routes is solved once however often it recurs."""
    net = FlowNetwork([1.0, 1.0], [(0,), (1,), (0, 1)])
    for k in range(5):
        net.add(float(k), 0, 0.1, k)
        net.add(float(k), 2, 0.1, k)
        net.recompute(float(k))
        net.pop_finished(float(k) + 0.5)
        net.recompute(float(k) + 0.5)
    assert net.solves == 1 and net.recomputes == 5


def test_event_queue_is_deterministic() -> None:
    """Simultaneous events run by priority, then in insertion order."""
    queue, seen = EventQueue(), []
    for name, prio in (("a", 1), ("b", 0), ("c", 1), ("d", 0)):
        queue.push(1.0, lambda arg, t: seen.append(arg), name, priority=prio)
    queue.push(0.5, lambda arg, t: seen.append(arg), "first")
    assert queue.run_until(1.0) == 5
    assert seen == ["first", "b", "d", "a", "c"]


def test_event_queue_rejects_bad_times() -> None:
    """A negative or infinite event time is a one-line SimError."""
    with pytest.raises(SimError, match="event time: got -1.0"):
        EventQueue().push(-1.0, lambda arg, t: None)
