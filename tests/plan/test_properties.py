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


@pytest.mark.examples(5, 15)
@pytest.mark.parametrize("planner", PLANNERS)
def test_plans_fit_the_budget_and_respect_the_floor(planner, examples) -> None:
    """A returned plan runs within the budget at every engine event, no faster than compute plus recompute."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0))
    def check(workload, link, fraction) -> None:
        budget = peak(workload) * fraction
        plan = _plan_or_none(workload, budget, link, planner)
        if plan is None:
            return
        result = evaluate(workload, plan, link)
        assert result.violations == ()
        assert result.peak_device_bytes <= budget * (1 + 1e-9)
        assert result.makespan_s >= (result.lower_bound_s + result.recompute_s) * (1 - 1e-12)

    check()


@pytest.mark.examples(4, 10)
@pytest.mark.parametrize("planner", sorted(set(PLANNERS) - _BUDGET_OBLIVIOUS))
def test_unlimited_budget_means_no_offload_and_the_floor(planner, examples) -> None:
    """With an unlimited budget nothing is offloaded or recomputed and the makespan is the compute floor."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=5), link=links())
    def check(workload, link) -> None:
        plan = make_plan(workload, math.inf, link, planner)
        result = evaluate(workload, plan, link)
        assert result.offloaded_bytes == 0 and result.recomputed_bytes == 0
        assert same(result.makespan_s, result.lower_bound_s, rel=1e-12)

    check()


@pytest.mark.examples(3, 8)
@pytest.mark.parametrize("planner", PLANNERS)
def test_planners_are_deterministic(planner, examples) -> None:
    """The same inputs give the same plan."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0))
    def check(workload, link, fraction) -> None:
        budget = peak(workload) * fraction
        assert _plan_or_none(workload, budget, link, planner) == _plan_or_none(workload, budget, link, planner)

    check()


@pytest.mark.examples(4, 12)
@pytest.mark.parametrize("planner", _EXACT)
def test_exact_planners_do_not_slow_down_with_more_budget(planner, examples) -> None:
    """For exact planners a larger budget never gives a larger makespan."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=5), link=links(), low=st.floats(0.3, 1.0), high=st.floats(0.3, 1.0))
    def check(workload, link, low, high) -> None:
        low, high = sorted((low, high))
        small = _makespan(workload, peak(workload) * low, link, planner)
        large = _makespan(workload, peak(workload) * high, link, planner)
        assert large <= small * (1 + 1e-7)

    check()


@pytest.mark.examples(4, 12)
@pytest.mark.parametrize("planner", ("milp", "brute"))
def test_exact_planners_do_not_slow_down_with_more_bandwidth(planner, examples) -> None:
    """For exact planners a faster link never gives a larger makespan."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=5), link=links(), fraction=st.floats(0.3, 1.0),
           factor=st.sampled_from((1.5, 2.0, 4.0)))
    def check(workload, link, fraction, factor) -> None:
        faster = dataclasses.replace(link, offload_bytes_per_s=link.offload_bytes_per_s * factor,
                                     prefetch_bytes_per_s=link.prefetch_bytes_per_s * factor)
        budget = peak(workload) * fraction
        assert _makespan(workload, budget, faster, planner) <= _makespan(workload, budget, link, planner) * (1 + 1e-7)

    check()


@pytest.mark.examples(5, 15)
@pytest.mark.parametrize("planners, scored", [(("lp", "milp"), ("vdnn-all", "vdnn-conv", "vdnn-dyn")),
                                              (("pofo",), ("rotor", "lp"))], ids=["lp-milp-vs-vdnn", "pofo-vs-rotor-lp"])
def test_a_planner_is_never_worse_than_the_plans_it_scores(planners, scored, examples) -> None:
    """lp and milp try vDNN's plans among their candidates, and pofo scores rotor's and lp's: none of them loses
    to a plan it scores."""
    @settings(max_examples=examples, deadline=None)
    @given(workload=workloads(max_layers=6), link=links(), fraction=st.floats(0.3, 1.0))
    def check(workload, link, fraction) -> None:
        budget = peak(workload) * fraction
        best_scored = min(_makespan(workload, budget, link, p) for p in scored)
        for planner in planners:
            assert _makespan(workload, budget, link, planner) <= best_scored * (1 + 1e-9)

    check()
