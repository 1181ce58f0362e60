"""``pofo`` skips its DPs where the answer is known: below the static bytes, and when rotor reaches the floor."""

import pytest

import mcdla.plan.pofo as pofo
from mcdla.hardware import load_system
from mcdla.plan.api import make_problem
from mcdla.sim import pool_link
from mcdla.workload import zoo


@pytest.fixture
def problem_at():
    system = load_system("mc-dla")
    w = zoo.build("vgg-e", batch=64)

    def at(budget):
        return make_problem(w, pool_link(system), budget, planner="pofo", device=system.devices[0])

    return at


def _forbid(monkeypatch, *names):
    for name in names:
        monkeypatch.setattr(pofo, name, lambda *a, name=name, **k: pytest.fail(f"{name} was called"))


def test_a_budget_below_the_static_bytes_is_infeasible_without_planning(problem_at, monkeypatch):
    """Below the parameters and optimizer state no plan fits: None, with neither rotor, the DPs nor lp run."""
    probe = problem_at(1.0)
    _forbid(monkeypatch, "plan_rotor", "solve_checkpoints", "plan_lp")
    assert pofo.plan_pofo(problem_at(probe.chain.static_bytes * (1 - 1e-9))) is None


def test_at_the_no_offload_peak_rotor_reaches_the_floor_and_no_dp_runs(problem_at, monkeypatch):
    """With every tensor kept, rotor's plan costs the compute floor (sum of forwards and backwards), which no
    plan beats: it is returned without running the DPs or lp."""
    probe = problem_at(1.0)
    problem = problem_at(probe.chain.no_offload_peak_bytes())
    _forbid(monkeypatch, "solve_checkpoints", "plan_lp")
    plan = pofo.plan_pofo(problem)
    floor = sum(probe.chain.fwd_s) + sum(probe.chain.bwd_s)
    assert plan is not None and problem.score(plan) == pytest.approx(floor, rel=1e-12)
