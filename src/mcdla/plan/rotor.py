"""``rotor``: recomputation only, a dynamic program over checkpoints on a memory grid (NOTE [checkpoint DP]).

Exact over keep/recompute plans (up to the grid's merging of states; exact when the grid separates every
reachable kept-bytes value): the makespan of such a plan is the compute floor plus its re-runs, and the DP
minimises exactly that subject to the engine's memory conditions.
"""

from __future__ import annotations

import math

from mcdla.plan._chain_dp import solve_checkpoints
from mcdla.plan.problem import Problem
from mcdla.workload.plan import Plan

__all__ = ["DEFAULT_SLOTS", "grid_unit", "plan_rotor"]

#: Number of memory-grid slots the budget (less the static bytes) is divided into by default.
DEFAULT_SLOTS = 2048


def grid_unit(problem: Problem, unit_bytes: float | None) -> float:
    """The memory grid of ``problem``: ``unit_bytes`` if given, else ``(budget - static) / DEFAULT_SLOTS``."""
    if unit_bytes is not None:
        return float(unit_bytes)
    room = problem.budget_bytes - problem.chain.static_bytes
    return room / DEFAULT_SLOTS if math.isfinite(room) and room > 0 else math.inf


def plan_rotor(problem: Problem, *, unit_bytes: float | None = None) -> Plan | None:
    """Cheapest keep/recompute plan within the budget; None when even recomputing everything does not fit."""
    result = solve_checkpoints(problem.chain, problem.budget_bytes, unit_bytes=grid_unit(problem, unit_bytes))
    if result is None:
        return None
    return problem.plan(result.actions)
