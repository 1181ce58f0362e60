"""Planners: what to offload, prefetch or recompute under a device-memory budget (``docs/planners.md``).

``make_plan(workload, budget, link, planner=...)`` returns a :class:`~mcdla.workload.plan.Plan`;
``evaluate(workload, plan, link)`` asks the engine (:func:`mcdla.sim.evaluate_plan`) what it costs. Planners
never report their own makespan.
"""

from mcdla.plan.api import PLANNERS, make_plan, run_planner, smallest_budget
from mcdla.plan.evaluate import Evaluation, evaluate
from mcdla.plan.policies import POLICIES, policy_plan
from mcdla.plan.problem import Problem, make_problem

__all__ = [
    "PLANNERS", "make_plan", "run_planner", "smallest_budget", "Evaluation", "evaluate", "POLICIES", "policy_plan",
    "Problem", "make_problem",
]
