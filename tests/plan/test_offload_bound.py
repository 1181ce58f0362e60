"""The two-phase bound of milp's search (NOTE [two-phase bound]) against the engine, plan by plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.plan._offload_bound import Relaxation
from mcdla.plan.space import enumerate_offload_plans, is_canonical

from .conftest import links, peak, problem, workloads

fractions = st.floats(0.3, 1.0)


def _plans(p):
    for triggers in enumerate_offload_plans(p.chain.offloadable, len(p.chain)):
        yield triggers, p.score(p.offload_plan(triggers))


@pytest.mark.examples(12, 40)
def test_bound_is_below_every_canonical_plan(examples) -> None:
    """Every canonical plan's engine makespan is at least the bound of its offload set (infinite: no plan fits)."""
    settings(max_examples=examples, deadline=None)(given(workloads(max_layers=5), links(), fractions)(
        _bound_is_below_every_canonical_plan))()


def _bound_is_below_every_canonical_plan(workload, link, fraction) -> None:
    p = problem(workload, link, peak(workload) * fraction)
    relax = Relaxation(p)
    for triggers, value in _plans(p):
        found = relax.schedules(frozenset(triggers))
        if found is None:
            assert math.isinf(value)
        else:
            assert found[0] <= value * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=5), links(), fractions)
def test_node_bound_is_below_every_completion(workload, link, fraction) -> None:
    """At every node (layers 0..i decided) the bound is at most the engine makespan of each plan extending it."""
    p = problem(workload, link, peak(workload) * fraction)
    relax = Relaxation(p)
    n = len(p.chain)
    for triggers, value in _plans(p):
        fwd = bwd = (0.0, 0.0, (), 0.0)
        for i in range(n - 1):
            f, b = relax.step(fwd, i, i in triggers, 0), relax.step(bwd, i, i in triggers, 1)
            if f is None or b is None:
                assert math.isinf(value)
                break
            fwd, bwd = f[0], b[0]
            assert relax.node_bound(fwd, bwd, i) <= value * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=6), links(), fractions)
def test_triggers_are_canonical(workload, link, fraction) -> None:
    """The triggers read off an offload set's reverse schedule cover exactly that set and are canonical."""
    p = problem(workload, link, peak(workload) * fraction)
    relax = Relaxation(p)
    for offloaded in {frozenset(t) for t in enumerate_offload_plans(p.chain.offloadable, len(p.chain))}:
        found = relax.triggers(offloaded)
        if found is not None:
            assert set(found[1]) == offloaded and is_canonical(found[1], len(p.chain))
