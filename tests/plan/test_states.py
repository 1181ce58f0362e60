"""The state planner (NOTE [state greedy]): greedy order, its device bytes against the engine and brute force,
and ``make_plan(..., states=True)``."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import PlanError
from mcdla.hardware.pool_link import PoolLink
from mcdla.plan import make_plan
from mcdla.plan.states import OPTIMIZER_STEP, WEIGHTS_STEP, StateStep, state_decisions, state_device_bytes, state_steps
from mcdla.sim import evaluate_plan
from mcdla.sim.engine import Engine
from mcdla.sim.fabric import Fabric
from mcdla.sim.program import build_program
from mcdla.sim.single import default_device
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Plan

from .conftest import MB

LINK = PoolLink.symmetric(16e9)


def _workload(param_mb: list[int], saved_mb: int = 0, r: float = 2.0) -> Workload:
    layers = tuple(Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=1e11, bwd_flops=2e11, param_bytes=p * MB,
                         saved_bytes=saved_mb * MB, output_bytes=0) for i, p in enumerate(param_mb))
    return Workload(name="toy", batch=1, layers=layers, optimizer_bytes_per_param_byte=r)


def _choices(n: int):
    """Every per-layer choice: nothing, optimizer+gradients, weights, or both."""
    options = ((), (OPTIMIZER_STEP,), (WEIGHTS_STEP,), (OPTIMIZER_STEP, WEIGHTS_STEP))
    for combo in itertools.product(options, repeat=n):
        yield tuple(StateStep(i, what) for i, whats in enumerate(combo) for what in whats)


def _plan(wl: Workload, steps, prefetch: int = 1) -> Plan:
    return Plan(workload=wl.name, batch=1, budget_bytes=math.inf, decisions=(), layer_names=wl.layer_names,
                state=state_decisions(wl, steps, prefetch=prefetch))


def _engine_peak(wl: Workload, plan: Plan, link: PoolLink, prefetch: int) -> float:
    """Peak device bytes of the engine running ``plan`` with weights fetched ``prefetch`` layers ahead."""
    device = default_device()
    assert all(sd.prefetch == prefetch for sd in plan.state)
    program = build_program(wl, plan, device, model_parallel=False, n_devices=1, bucket_bytes=1e9)
    engine = Engine(Fabric.from_pool_link(device, link), [program], unlimited_virtualization=False, record=False)
    engine.run()
    assert engine.completed
    return max(d.peak for d in engine.devices)


def test_greedy_order_is_optimizer_state_first_then_weights_largest_first() -> None:
    """Every layer's optimizer+gradients step precedes any weights step; each class goes largest first."""
    steps = state_steps(_workload([1, 3, 0, 2]))
    assert steps == (StateStep(1, OPTIMIZER_STEP), StateStep(3, OPTIMIZER_STEP), StateStep(0, OPTIMIZER_STEP),
                     StateStep(1, WEIGHTS_STEP), StateStep(3, WEIGHTS_STEP), StateStep(0, WEIGHTS_STEP))


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(0, 2))
def test_device_bytes_bound_the_engine_peak(param_mb: list[int], prefetch: int) -> None:
    """For every choice (brute force), the engine's peak device bytes on a link fast enough for each gradient to
    leave within the next backward never exceed ``state_device_bytes``."""
    wl = _workload(param_mb)
    fast = PoolLink.symmetric(1e15)
    for steps in _choices(len(param_mb)):
        peak = _engine_peak(wl, _plan(wl, steps, prefetch), fast, prefetch)
        assert peak <= state_device_bytes(wl, steps, prefetch) * (1 + 1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(0, 2))
def test_offloading_everything_is_the_fewest_device_bytes(param_mb: list[int], prefetch: int) -> None:
    """Brute force over every choice: none needs fewer device bytes than the greedy's full prefix, so the greedy
    finds a state plan whenever any fits."""
    wl = _workload(param_mb)
    best = min(state_device_bytes(wl, steps, prefetch) for steps in _choices(len(param_mb)))
    assert state_device_bytes(wl, state_steps(wl), prefetch) <= best * (1 + 1e-12)


def test_make_plan_with_states_fits_a_budget_below_the_static_bytes() -> None:
    """A budget below the weights+gradients+state bytes: the plan offloads state and the engine runs it within."""
    wl = _workload([100, 100, 100, 100], saved_mb=50)
    budget = 0.6 * wl.static_bytes
    with pytest.raises(PlanError):
        make_plan(wl, budget, LINK)
    plan = make_plan(wl, budget, LINK, states=True)
    assert plan.state and plan.budget_bytes == budget
    result = evaluate_plan(wl, plan, LINK)
    assert result.feasible and result.peak_device_bytes <= budget * (1 + 1e-9)


def test_make_plan_with_states_moves_nothing_when_the_budget_allows() -> None:
    """At an unlimited budget ``states=True`` offloads no state."""
    wl = _workload([100, 100], saved_mb=50)
    assert make_plan(wl, math.inf, LINK, states=True).state == ()


def test_make_plan_with_states_takes_the_shortest_greedy_prefix() -> None:
    """One step fewer than the plan's would not fit the budget (by the engine)."""
    wl = _workload([100, 100, 100, 100], saved_mb=0)
    budget = 0.6 * wl.static_bytes
    plan = make_plan(wl, budget, LINK, states=True)
    k = sum(sd.offloads("optimizer_state") + sd.offloads("weights") for sd in plan.state)
    shorter = _plan(wl, state_steps(wl)[:k - 1])
    assert evaluate_plan(wl, shorter, LINK, budget_bytes=budget).peak_device_bytes > budget or not (
        evaluate_plan(wl, shorter, LINK, budget_bytes=budget).feasible)


def test_infeasible_even_with_every_state_offloaded_is_one_line() -> None:
    """A budget below what the state needs with everything offloaded raises a one-line PlanError."""
    wl = _workload([100, 100])
    with pytest.raises(PlanError, match="every state offloaded") as info:
        make_plan(wl, 1.0, LINK, states=True)
    assert "\n" not in str(info.value)


def test_bad_state_prefetch_is_one_line() -> None:
    """A negative state_prefetch raises PlanError naming the option."""
    with pytest.raises(PlanError, match="state_prefetch: got -1"):
        make_plan(_workload([1]), math.inf, LINK, states=True, state_prefetch=-1)
