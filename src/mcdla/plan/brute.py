"""``brute``: exhaustive search scored by the engine, the oracle the exact planners are tested against.

Spaces: ``"offload"`` (default), every canonical offload plan (NOTE [canonical triggers]), the space of ``milp``;
``"recompute"``, every keep/recompute assignment (layer 0 kept), the space of ``rotor``. The first plan of least
engine makespan wins (enumeration order: fewer decisions first within a layer). Refuses spaces larger than
``max_plans``.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from mcdla.errors import PlanError
from mcdla.plan.problem import Problem
from mcdla.plan.space import count_offload_plans, enumerate_offload_plans
from mcdla.workload.plan import Action, Plan

__all__ = ["Space", "plan_brute", "MAX_PLANS"]

Space = Literal["offload", "recompute"]
#: Largest number of plans brute force will score.
MAX_PLANS = 200_000


def plan_brute(problem: Problem, *, space: Space = "offload", max_plans: int = MAX_PLANS) -> Plan | None:
    """The best plan of ``space`` by engine makespan; None if no plan of the space fits the budget."""
    chain = problem.chain
    n = len(chain)
    if space == "offload":
        count = count_offload_plans(chain.offloadable, n)
        plans = (problem.offload_plan(t) for t in enumerate_offload_plans(chain.offloadable, n))
    elif space == "recompute":
        count = 2 ** (n - 1)
        plans = (
            problem.plan((Action.KEEP,) + tuple(Action.RECOMPUTE if r else Action.KEEP for r in bits))
            for bits in itertools.product((False, True), repeat=n - 1)
        )
    else:
        raise PlanError(f"brute space: got {space!r}; must be 'offload' or 'recompute'")
    if count > max_plans:
        raise PlanError(f"brute: {chain.workload!r} has {count} plans in the {space} space; at most {max_plans} "
                        "are searched (use milp, rotor or lp)")
    best, value = None, math.inf
    for plan in plans:
        v = problem.score(plan)
        if v < value:
            best, value = plan, v
    return best
