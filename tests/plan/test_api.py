"""The public API: make_plan, evaluate, errors, JSON round trip, and layer names a runtime can execute."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import PlanError
from mcdla.hardware import load_system
from mcdla.hardware.pool_link import PoolLink
from mcdla.plan import PLANNERS, POLICIES, Evaluation, evaluate, make_plan, policy_plan, smallest_budget
from mcdla.sim import evaluate_plan, pool_link
from mcdla.workload import zoo
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action, Plan

from .conftest import MB, peak

LINK = PoolLink.symmetric(16e9, latency_s=1e-6)


def _chain(n: int = 6) -> Workload:
    layers = tuple(Layer(name=f"encoder.layers.{i}", kind=LayerKind.CONV, fwd_flops=2e11, bwd_flops=4e11,
                         param_bytes=1e6, saved_bytes=(100 + 50 * (i % 3)) * MB, output_bytes=50 * MB,
                         workspace_bytes=10 * MB) for i in range(n))
    return Workload(name="toy", batch=8, layers=layers)


def test_planner_names() -> None:
    """PLANNERS lists the issue's planners."""
    assert set(PLANNERS) == {"none", "vdnn-all", "vdnn-conv", "vdnn-dyn", "tflms", "lp", "milp", "milp-highs", "brute",
                             "rotor", "pofo"}


def test_unknown_planner_is_one_line_listing_the_names() -> None:
    """An unknown planner name raises a one-line PlanError that lists every allowed name."""
    with pytest.raises(PlanError) as info:
        make_plan(_chain(), 1e12, LINK, "magic")
    message = str(info.value)
    assert "\n" not in message and "'magic'" in message
    assert all(name in message for name in PLANNERS)


def test_infeasible_budget_names_the_smallest_feasible_one() -> None:
    """A budget below what lp can meet raises one line naming the budget and the smallest feasible budget."""
    w = _chain()
    with pytest.raises(PlanError, match=r"^budget .* is infeasible for toy \(batch 8\) with planner lp; "
                                        r"the smallest feasible is [0-9.]+ [KMG]iB$"):
        make_plan(w, 100 * MB, LINK, "lp")


@pytest.mark.parametrize("planner", ("lp", "rotor", "pofo", "vdnn-all"))
def test_the_smallest_feasible_budget_is_feasible(planner) -> None:
    """make_plan succeeds at the budget smallest_budget reports, and fails 2 % below it."""
    w = _chain()
    smallest = smallest_budget(w, LINK, planner)
    assert math.isfinite(smallest) and smallest < peak(w)
    assert evaluate(w, make_plan(w, smallest, LINK, planner), LINK).violations == ()
    with pytest.raises(PlanError):
        make_plan(w, smallest * 0.98, LINK, planner)


def test_bad_budget_and_bad_options_are_plan_errors() -> None:
    """A non-positive budget or an option the planner does not take raise PlanError."""
    with pytest.raises(PlanError, match="budget"):
        make_plan(_chain(), 0, LINK, "lp")
    with pytest.raises(PlanError, match="options"):
        make_plan(_chain(), 1e12, LINK, "rotor", window=3)


def test_evaluate_matches_the_engine() -> None:
    """evaluate reports the engine's makespan and peak, the compute floor and the bytes by action."""
    w = _chain()
    plan = make_plan(w, peak(w) * 0.6, LINK, "pofo")
    result = evaluate(w, plan, LINK)
    direct = evaluate_plan(w, plan, LINK)
    assert isinstance(result, Evaluation)
    assert result.makespan_s == direct.iteration_time_s and result.peak_device_bytes == direct.peak_device_bytes
    assert result.lower_bound_s == pytest.approx(direct.compute_s)
    assert result.overhead == pytest.approx(result.makespan_s / result.lower_bound_s - 1)
    assert result.offloaded_bytes + result.recomputed_bytes + result.resident_bytes == pytest.approx(w.saved_bytes)
    by_action = {a: sum(l.saved_bytes for l in w.layers if plan.action(l.name) is a) for a in Action}
    assert result.offloaded_bytes == by_action[Action.OFFLOAD]
    assert result.recomputed_bytes == by_action[Action.RECOMPUTE]


def test_evaluate_reports_a_plan_that_cannot_run() -> None:
    """Judged under a budget it cannot run in, a plan gets an infinite makespan and a violation."""
    w = _chain()
    keep_all = make_plan(w, math.inf, LINK, "none")
    result = evaluate(w, keep_all, LINK, budget_bytes=peak(w) * 0.5)
    assert math.isinf(result.makespan_s) and len(result.violations) == 1


def test_evaluate_refuses_a_plan_for_another_model() -> None:
    """A plan naming layers the workload lacks raises PlanError."""
    plan = make_plan(_chain(), math.inf, LINK, "vdnn-all")
    other = zoo.build("alexnet", batch=8)
    with pytest.raises(PlanError, match="does not match"):
        evaluate(other, plan, LINK)


def test_plan_json_round_trip_keeps_workload_budget_and_decisions(tmp_path) -> None:
    """A plan saved and loaded is equal, with its workload, batch, budget and planner."""
    w = _chain()
    plan = make_plan(w, peak(w) * 0.7, LINK, "milp")
    plan.save(tmp_path / "p.json")
    loaded = Plan.load(tmp_path / "p.json")
    assert loaded == plan
    assert (loaded.workload, loaded.batch, loaded.planner) == ("toy", 8, "milp")
    assert loaded.budget_bytes == pytest.approx(peak(w) * 0.7)


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_every_planner_states_the_saved_cap_its_simulation_holds(planner) -> None:
    """Every plan carries the device budget it was made for and its saved cap, the budget less the static
    bytes (NOTE [plan budgets]); in the engine's run of the plan, device bytes less static bytes (saved tensors
    and transients) never exceed that cap."""
    w = _chain(4)
    try:
        budget = peak(w) * 0.8
        plan = make_plan(w, budget, LINK, planner)
    except PlanError:  # no offloading (none), or budget-oblivious (vdnn-*): at the no-offload peak every plan fits
        budget = peak(w)
        plan = make_plan(w, budget, LINK, planner)
    assert plan.budget_bytes == pytest.approx(budget)
    assert plan.saved_cap_bytes == pytest.approx(budget - w.static_bytes)
    result = evaluate_plan(w, plan, LINK)
    assert result.feasible
    assert result.peak_device_bytes - w.static_bytes <= plan.saved_cap_bytes * (1 + 1e-9)
    unlimited = make_plan(w, math.inf, LINK, planner)
    assert math.isinf(unlimited.saved_cap_bytes)
    assert math.isinf(Plan.from_dict(unlimited.to_dict()).saved_cap_bytes)


def test_plan_budgets_migration_and_checks() -> None:
    """A plan file without saved_cap_bytes (written before the field) loads with saved_cap_bytes =
    budget_bytes, what the runtime enforced before; a cap outside [0, budget] is a PlanError."""
    w = _chain(3)
    data = policy_plan(w, "all", budget_bytes=5e9).to_dict()
    assert data["saved_cap_bytes"] == pytest.approx(5e9 - w.static_bytes)
    del data["saved_cap_bytes"]
    old = Plan.from_dict(data)
    assert old.budget_bytes == old.saved_cap_bytes == 5e9
    assert Plan.from_dict({**data, "budget_bytes": None}).saved_cap_bytes == math.inf
    assert Plan.from_dict({**data, "saved_cap_bytes": 1e9}).saved_cap_bytes == 1e9
    for bad in (6e9, -1.0, math.nan):
        with pytest.raises(PlanError, match="saved_cap_bytes"):
            Plan.from_dict({**data, "saved_cap_bytes": bad})


def test_plans_name_layers_by_module_name() -> None:
    """A plan for a zoo workload names its layers by the workload's qualified module names."""
    w = zoo.build("vgg-e", batch=64)
    link = pool_link(load_system("dc-dla"))
    plan = make_plan(w, peak(w) * 0.6, link, "lp")
    assert plan.layer_names == w.layer_names
    assert {d.layer for d in plan.decisions} <= set(w.layer_names)
    assert all(d.prefetch_at is None or d.prefetch_at in w.layer_names for d in plan.decisions)
    assert any("." in d.layer for d in plan.decisions)


def test_fixed_policies_still_work() -> None:
    """policy_plan still builds the vDNN policies."""
    w = _chain()
    assert POLICIES == ("none", "all", "conv")
    assert len(policy_plan(w, "all").layers_with(Action.OFFLOAD)) == len(w)
