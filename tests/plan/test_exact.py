"""Optimality: milp equals brute force, the LP brackets milp, rotor equals exhaustive search, pofo's limits."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mcdla.hardware.pool_link import PoolLink
from mcdla.plan.brute import plan_brute
from mcdla.plan.lp import fluid_bound, plan_lp
from mcdla.plan.milp import plan_milp
from mcdla.plan.milp_highs import plan_milp_highs
from mcdla.plan.pofo import plan_pofo
from mcdla.plan.rotor import plan_rotor
from mcdla.workload.model import Layer, LayerKind, Workload

from .conftest import links, peak, problem, same, workloads

fractions = st.floats(0.35, 1.0)


def _value(p, plan) -> float:
    return p.score(plan) if plan is not None else math.inf


#: The exact chain planner and its independent second implementation (the event MILP solved by HiGHS).
EXACT = pytest.mark.parametrize("solver, note", [(plan_milp, "milp: optimal"), (plan_milp_highs, "milp-highs: optimal")],
                                ids=["milp", "milp-highs"])


def _equals_brute(solver, note, workload, link, fraction) -> None:
    budget = peak(workload) * fraction
    brute = problem(workload, link, budget)
    exact = problem(workload, link, budget)
    plan = solver(exact)
    assert same(_value(exact, plan), _value(brute, plan_brute(brute)))
    if plan is not None:
        assert plan.notes.startswith(note)


@EXACT
@pytest.mark.examples(12, 40)
def test_milp_equals_brute_force(solver, note, examples) -> None:
    """On chains of up to 5 layers the exact planner's engine makespan equals the best canonical plan's."""
    settings(max_examples=examples, deadline=None)(given(workloads(max_layers=5), links(), fractions)(
        lambda workload, link, fraction: _equals_brute(solver, note, workload, link, fraction)))()


@EXACT
@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(workloads(min_layers=6, max_layers=7), links(), fractions)
def test_milp_equals_brute_force_up_to_7_layers(solver, note, workload, link, fraction) -> None:
    """On chains of 6 and 7 layers the exact planner's engine makespan equals the best canonical plan's."""
    _equals_brute(solver, note, workload, link, fraction)


def _cnn_chain(n: int) -> Workload:
    """A CNN-like chain whose first layers save large tensors that take far longer to move than to compute."""
    layers = []
    for i in range(n):
        stage = 4 * i // n
        saved = 256e6 / 2**stage * (1 + (i * 7919) % 5) / 3
        layers.append(Layer(
            name=f"layer{i}", kind=LayerKind.CONV, fwd_flops=1e11 * (1 + stage) * (1 + i % 3),
            bwd_flops=2e11 * (1 + stage) * (1 + i % 3), fwd_bytes_moved=3 * saved, bwd_bytes_moved=6 * saved,
            param_bytes=1e6 * 2**stage, output_bytes=saved / 2, saved_bytes=saved if i % 4 != 3 else 0.0,
            workspace_bytes=16e6))
    return Workload(name="cnn-50", batch=64, layers=tuple(layers))


@pytest.mark.parametrize("fraction", (0.3, 0.5))
def test_milp_proves_a_50_layer_chain_optimal(fraction) -> None:
    """On a 50-layer chain at 30-50 % of its peak over 8 GB/s milp proves optimality (fluid bound <= it <= lp)."""
    workload = _cnn_chain(50)
    p = problem(workload, PoolLink.symmetric(8e9), peak(workload) * fraction)
    plan = plan_milp(p, time_limit_s=120.0)
    assert plan is not None and plan.notes.startswith("milp: optimal")
    value = p.score(plan)
    assert fluid_bound(p).value_s <= value * (1 + 1e-9)
    assert value <= p.score(plan_lp(p)) * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=5), links(), fractions)
def test_lp_value_below_milp_below_rounded_lp(workload, link, fraction) -> None:
    """fluid LP value <= milp's makespan <= the makespan of lp's rounded plan."""
    budget = peak(workload) * fraction
    p = problem(workload, link, budget)
    milp_value = _value(p, plan_milp(p))
    fluid = fluid_bound(p)
    rounded = _value(p, plan_lp(p, fluid))
    if fluid is None:
        assert math.isinf(milp_value)
        return
    assert fluid.value_s <= milp_value * (1 + 1e-7)
    assert milp_value <= rounded * (1 + 1e-7)


@settings(max_examples=40, deadline=None)
@given(workloads(max_layers=6), links(), st.floats(0.5, 1.0))
def test_rotor_equals_exhaustive_recomputation(workload, link, fraction) -> None:
    """On chains of up to 6 layers rotor's makespan equals the best keep/recompute plan's."""
    budget = peak(workload) * fraction
    a, b = problem(workload, link, budget), problem(workload, link, budget)
    assert same(_value(a, plan_rotor(a, unit_bytes=1.0)), _value(b, plan_brute(b, space="recompute")))


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=6), st.floats(0.5, 1.0))
def test_pofo_with_zero_bandwidth_equals_rotor(workload, fraction) -> None:
    """With a 1 byte/s link no offload pays off: where rotor fits, pofo's makespan equals rotor's."""
    budget = peak(workload) * fraction
    crawl = PoolLink.symmetric(1.0)
    a, b = problem(workload, crawl, budget), problem(workload, crawl, budget)
    rotor = _value(b, plan_rotor(b))
    assume(math.isfinite(rotor))
    assert same(_value(a, plan_pofo(a)), rotor)


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=6))
def test_pofo_with_ample_bandwidth_reaches_the_lower_bound(workload) -> None:
    """With an unlimited link and room for each layer's working set, pofo reaches the compute floor."""
    p = problem(workload, PoolLink.symmetric(math.inf), math.inf)
    c = p.chain
    need = max(c.static_bytes + c.saved_bytes[i]
               + max(c.fwd_transient_bytes[i], c.bwd_transient_bytes[i] + (c.saved_bytes[i - 1] if i else 0.0))
               for i in range(len(c)))
    tight = problem(workload, PoolLink.symmetric(math.inf), need)
    assert same(_value(tight, plan_pofo(tight)), c.lower_bound_s, rel=1e-9)
