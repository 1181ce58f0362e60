"""``make_plan``: run a named planner on a workload, a budget and a link; one error when it cannot fit.

NOTE [infeasible budgets]
A planner that cannot meet the budget raises :class:`~mcdla.errors.PlanError` (one line) naming the budget,
the workload, the planner and the smallest budget it can meet, found by bisection between the static bytes and
the no-offload peak (where every plan fits) on the planner's own feasibility. ``milp`` and ``brute`` search the
space ``lp`` rounds into and are at least as good, so their smallest budget is ``lp``'s. We raise rather than
return a plan marked infeasible so that nothing downstream can run a plan that does not fit by mistake.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import MappingProxyType

from mcdla.errors import PlanError
from mcdla.hardware.model import Device
from mcdla.hardware.pool_link import PoolLink
from mcdla.plan.baselines import plan_none, plan_tflms, plan_vdnn_all, plan_vdnn_conv, plan_vdnn_dyn
from mcdla.plan.brute import plan_brute
from mcdla.plan.chain import Chain, build_chain
from mcdla.plan.lp import plan_lp
from mcdla.plan.milp import plan_milp
from mcdla.plan.milp_highs import plan_milp_highs
from mcdla.plan.pofo import plan_pofo
from mcdla.plan.problem import Problem, make_problem
from mcdla.plan.rotor import plan_rotor
from mcdla.plan.states import check_prefetch, state_decisions, state_device_bytes, state_steps
from mcdla.sim import evaluate_plan
from mcdla.units import format_bytes
from mcdla.workload.model import Workload
from mcdla.workload.plan import Plan

__all__ = ["PLANNERS", "make_plan", "run_planner", "smallest_budget"]

_Planner = Callable[..., Plan | None]

_REGISTRY: MappingProxyType[str, _Planner] = MappingProxyType({
    "none": plan_none,
    "vdnn-all": plan_vdnn_all,
    "vdnn-conv": plan_vdnn_conv,
    "vdnn-dyn": plan_vdnn_dyn,
    "tflms": plan_tflms,
    "lp": plan_lp,
    "milp": plan_milp,
    "milp-highs": plan_milp_highs,
    "brute": plan_brute,
    "rotor": plan_rotor,
    "pofo": plan_pofo,
})

#: Names of the planners, in the order the reports list them.
PLANNERS: tuple[str, ...] = tuple(_REGISTRY)

_PROXY = {"milp": "lp", "milp-highs": "lp", "brute": "lp"}


def _check_name(planner: str) -> _Planner:
    try:
        return _REGISTRY[planner]
    except (KeyError, TypeError):
        raise PlanError(f"planner: got {planner!r}; must be one of {', '.join(PLANNERS)}") from None


def _check_budget(budget_bytes: float) -> float:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) or not budget_bytes > 0:
        raise PlanError(f"budget: got {budget_bytes!r}; must be a number of bytes > 0 (math.inf for unlimited)")
    return float(budget_bytes)


def run_planner(problem: Problem, **options: object) -> Plan | None:
    """Run ``problem.planner`` on ``problem``; None when it cannot meet the budget (no search for a smaller one)."""
    fn = _check_name(problem.planner)
    try:
        return fn(problem, **options)
    except TypeError as exc:
        raise PlanError(f"planner {problem.planner!r}: bad options {sorted(options)} ({exc})") from None


def smallest_budget(workload: Workload, link: PoolLink, planner: str, *, device: Device | None = None,
                    chain: Chain | None = None, rel_tol: float = 1e-3) -> float:
    """The smallest budget (bytes, within ``rel_tol``) at which ``planner`` finds a plan (NOTE [infeasible budgets])."""
    name = _PROXY.get(planner, planner)
    fn = _check_name(name)
    chain = chain if chain is not None else build_chain(workload, device)
    hi = chain.no_offload_peak_bytes()
    lo = chain.static_bytes

    def fits(budget: float) -> bool:
        problem = make_problem(workload, link, budget, planner=name, device=device, chain=chain)
        return fn(problem) is not None

    if not fits(hi):
        return math.inf
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def make_plan(
    workload: Workload,
    budget: float,
    link: PoolLink,
    planner: str = "lp",
    *,
    device: Device | None = None,
    states: bool = False,
    state_prefetch: int = 1,
    **options: object,
) -> Plan:
    """A plan for ``workload`` within ``budget`` device bytes, offloading through ``link``.

    Args:
        budget: bound on total device bytes (static + saved + transient), ``math.inf`` for unlimited.
        link: offload and prefetch bandwidths to the pool (e.g. ``mcdla.sim.pool_link(system)``).
        planner: one of :data:`PLANNERS`.
        device: the device whose roofline times the layers (default: the engine's default device).
        states: also choose which layers' weights, gradients and optimizer state leave the device (NOTE [state
            greedy] in ``mcdla.plan.states``), as few as the activation planner needs to fit the budget.
        state_prefetch: with ``states``, the prefetch depth written into each state entry (offloaded-weight
            layers fetched ahead; the simulator and ``offload_parameters(plan=...)`` read it from there).
        options: planner-specific keywords (``time_limit_s`` for milp; ``unit_bytes`` for the DPs;
            ``space`` for brute; ``max_evals`` for lp).

    Raises PlanError (one line) for an unknown planner or a budget the planner cannot meet (NOTE [infeasible
    budgets]).
    """
    _check_name(planner)
    budget = _check_budget(budget)
    if states:
        return _plan_with_states(workload, budget, link, planner, device, check_prefetch(state_prefetch), options)
    problem: Problem = make_problem(workload, link, budget, planner=planner, device=device)
    plan = run_planner(problem, **options)
    if plan is not None:
        return plan
    smallest = smallest_budget(workload, link, planner, device=device, chain=problem.chain)
    what = f"{workload.name} (batch {workload.batch})"
    tail = "no budget up to the no-offload peak fits" if math.isinf(smallest) else (
        f"the smallest feasible is {format_bytes(smallest)}")
    raise PlanError(f"budget {format_bytes(budget)} is infeasible for {what} with planner {planner}; {tail}")


def _plan_with_states(workload: Workload, budget: float, link: PoolLink, planner: str, device: Device | None,
                      prefetch: int, options: dict[str, object]) -> Plan:
    """The shortest prefix of the state greedy (NOTE [state greedy]) after which ``planner`` fits the room left,
    with that planner's activation decisions.

    The activation planner sees the workload's full static bytes; a budget raised by the state bytes the prefix
    frees (less the weights window and gradient in flight it adds) is the same room for saved tensors.
    """
    chain = build_chain(workload, device)
    need = smallest_budget(workload, link, planner, device=device, chain=chain)
    steps = state_steps(workload)
    full = chain.static_bytes
    for k in range(len(steps) + 1):
        room = budget + full - state_device_bytes(workload, steps[:k], prefetch)
        if need > room * (1 + 1e-9) and k < len(steps):
            continue
        plan = run_planner(make_problem(workload, link, room, planner=planner, device=device, chain=chain),
                           **options)
        if plan is None:
            continue
        moved = state_decisions(workload, steps[:k], prefetch=prefetch)
        notes = "; ".join(x for x in (plan.notes, f"state: {k} greedy steps, prefetch {prefetch}" if k else "") if x)
        plan = dataclasses.replace(plan, budget_bytes=budget, saved_cap_bytes=min(plan.saved_cap_bytes, budget),
                                   state=moved, notes=notes)
        if k == 0 or evaluate_plan(workload, plan, link, device=device).feasible:
            return plan
    what = f"{workload.name} (batch {workload.batch})"
    floor = state_device_bytes(workload, steps, prefetch) + max(0.0, need - full)
    raise PlanError(f"budget {format_bytes(budget)} is infeasible for {what} with planner {planner} and every "
                    f"state offloaded; it needs about {format_bytes(floor)}")
