"""The chain planners read agrees with the engine: compute times, memory accounting, plan encoding."""

from __future__ import annotations

import math

from hypothesis import given, settings

from mcdla.hardware.pool_link import PoolLink
from mcdla.plan.chain import build_chain, build_plan, triggers_of
from mcdla.plan.space import lookahead_triggers
from mcdla.sim import evaluate_plan
from mcdla.workload.plan import Action, Plan

from .conftest import workloads

_FAST = PoolLink.symmetric(1e12)


@settings(max_examples=25, deadline=None)
@given(workloads(max_layers=8))
def test_lower_bound_is_the_engine_compute_time(workload) -> None:
    """Sum of the chain's forward and backward times equals the engine's compute time of a keep-all run."""
    chain = build_chain(workload)
    plan = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names, actions={})
    result = evaluate_plan(workload, plan, _FAST, budget_bytes=math.inf)
    assert math.isclose(chain.lower_bound_s, result.compute_s, rel_tol=1e-12)
    assert math.isclose(chain.lower_bound_s, result.iteration_time_s, rel_tol=1e-12)


@settings(max_examples=25, deadline=None)
@given(workloads(max_layers=8))
def test_no_offload_peak_is_the_engine_peak(workload) -> None:
    """The closed-form no-offload peak equals the engine's peak device bytes for the keep-all plan."""
    chain = build_chain(workload)
    plan = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names, actions={})
    result = evaluate_plan(workload, plan, _FAST, budget_bytes=math.inf)
    assert math.isclose(chain.no_offload_peak_bytes(), result.peak_device_bytes, rel_tol=1e-12)


@settings(max_examples=25, deadline=None)
@given(workloads(max_layers=8))
def test_trigger_indices_round_trip_through_a_plan(workload) -> None:
    """Triggers written into a plan by build_plan are read back unchanged by triggers_of."""
    chain = build_chain(workload)
    triggers = lookahead_triggers(len(chain), list(chain.offloadable), 2)
    plan = build_plan(chain, {i: Action.OFFLOAD for i in triggers}, triggers, budget_bytes=1e12, planner="t")
    assert triggers_of(chain, plan) == triggers
    assert set(plan.layers_with(Action.OFFLOAD)) == {chain.names[i] for i in triggers}
