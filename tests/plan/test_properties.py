"""Invariants every planner keeps, checked through the engine on random chains (hypothesis)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import PlanError
from mcdla.plan import PLANNERS, evaluate, make_plan

from .conftest import links, peak, same, workloads

_OPTIONS = {"milp": {"time_limit_s": 30.0}}
#: The fixed vDNN policies offload whatever the budget (that is what they are); every other planner adapts.
_BUDGET_OBLIVIOUS = {"vdnn-all", "vdnn-conv"}
_EXACT = ("milp", "brute", "rotor")


def _plan_or_none(workload, budget, link, planner):
    try:
        return make_plan(workload, budget, link, planner, **_OPTIONS.get(planner, {}))
    except PlanError:
        return None


def _makespan(workload, budget, link, planner) -> float:
    plan = _plan_or_none(workload, budget, link, planner)
    return evaluate(workload, plan, link).makespan_s if plan is not None else math.inf


@pytest.mark.parametrize("planner", PLANNERS)
@settings(max_examples=15, deadline=None)
@given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0))
def test_plans_fit_the_budget_and_respect_the_floor(planner, workload, link, fraction) -> None:
    """A returned plan runs within the budget at every engine event, no faster than compute plus recompute."""
    budget = peak(workload) * fraction
    plan = _plan_or_none(workload, budget, link, planner)
    if plan is None:
        return
    result = evaluate(workload, plan, link)
    assert result.violations == ()
    assert result.peak_device_bytes <= budget * (1 + 1e-9)
    assert result.makespan_s >= (result.lower_bound_s + result.recompute_s) * (1 - 1e-12)


@pytest.mark.parametrize("planner", sorted(set(PLANNERS) - _BUDGET_OBLIVIOUS))
@settings(max_examples=10, deadline=None)
@given(workload=workloads(max_layers=5), link=links())
def test_unlimited_budget_means_no_offload_and_the_floor(planner, workload, link) -> None:
    """With an unlimited budget nothing is offloaded or recomputed and the makespan is the compute floor."""
    plan = make_plan(workload, math.inf, link, planner)
    result = evaluate(workload, plan, link)
    assert result.offloaded_bytes == 0 and result.recomputed_bytes == 0
    assert same(result.makespan_s, result.lower_bound_s, rel=1e-12)


@pytest.mark.parametrize("planner", PLANNERS)
@settings(max_examples=8, deadline=None)
@given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0))
def test_planners_are_deterministic(planner, workload, link, fraction) -> None:
    """The same inputs give the same plan."""
    budget = peak(workload) * fraction
    assert _plan_or_none(workload, budget, link, planner) == _plan_or_none(workload, budget, link, planner)


@pytest.mark.parametrize("planner", _EXACT)
@settings(max_examples=12, deadline=None)
@given(workload=workloads(max_layers=5), link=links(), low=st.floats(0.3, 1.0), high=st.floats(0.3, 1.0))
def test_exact_planners_do_not_slow_down_with_more_budget(planner, workload, link, low, high) -> None:
    """For exact planners a larger budget never gives a larger makespan."""
    low, high = sorted((low, high))
    small = _makespan(workload, peak(workload) * low, link, planner)
    large = _makespan(workload, peak(workload) * high, link, planner)
    assert large <= small * (1 + 1e-7)


@pytest.mark.parametrize("planner", ("milp", "brute"))
@settings(max_examples=12, deadline=None)
@given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0),
       factor=st.sampled_from((1.5, 2.0, 4.0)))
def test_exact_planners_do_not_slow_down_with_more_bandwidth(planner, workload, link, fraction, factor) -> None:
    """For exact planners a faster link never gives a larger makespan."""
    faster = dataclasses.replace(link, offload_bytes_per_s=link.offload_bytes_per_s * factor,
                                 prefetch_bytes_per_s=link.prefetch_bytes_per_s * factor)
    budget = peak(workload) * fraction
    assert _makespan(workload, budget, faster, planner) <= _makespan(workload, budget, link, planner) * (1 + 1e-7)


@settings(max_examples=15, deadline=None)
@given(workload=workloads(max_layers=6), link=links(), fraction=st.floats(0.3, 1.0))
def test_lp_and_milp_are_never_worse_than_vdnn(workload, link, fraction) -> None:
    """lp and milp try vDNN's plans among their candidates, so they never lose to vdnn-all, -conv or -dyn."""
    budget = peak(workload) * fraction
    vdnn = min(_makespan(workload, budget, link, p) for p in ("vdnn-all", "vdnn-conv", "vdnn-dyn"))
    for planner in ("lp", "milp"):
        assert _makespan(workload, budget, link, planner) <= vdnn * (1 + 1e-9)


@settings(max_examples=15, deadline=None)
@given(workload=workloads(max_layers=6), link=links(), fraction=st.floats(0.3, 1.0))
def test_pofo_is_never_worse_than_rotor_or_lp(workload, link, fraction) -> None:
    """pofo scores rotor's and lp's plans among its candidates, so it never loses to either."""
    budget = peak(workload) * fraction
    others = min(_makespan(workload, budget, link, p) for p in ("rotor", "lp"))
    assert _makespan(workload, budget, link, "pofo") <= others * (1 + 1e-9)
