"""The published baselines as planners: no offload, vDNN's three policies and a TFLMS-style threshold policy.

NOTE [baselines]
- ``none``: keep everything.
- ``vdnn-all`` / ``vdnn-conv`` (Rhu et al., MICRO 2016): the fixed policies of :mod:`mcdla.plan.policies`
  (offload every saved tensor / those of convolutions, prefetch one layer ahead). They ignore the budget by
  design; the planner only checks that the engine can run them within it.
- ``vdnn-dyn``: vDNN's dynamic policy without its convolution-algorithm choice: the first of ``none``, ``conv``,
  ``all`` that the engine can run within the budget (vDNN tries them in that order because each is slower).
- ``tflms`` (Le et al., TFLMS v2): swap out every tensor whose producer-to-consumer distance in the schedule
  exceeds ``swapout_threshold`` and swap it in ``swapin_ahead`` backward operations early. In a chain the
  distance from ``F_i`` to ``B_i`` is ``2L - 1 - 2i``, so a threshold offloads a prefix of the layers. The
  auto-tuner, as TFLMS's, simulates configurations, here with the engine: thresholds at up to
  :data:`TFLMS_THRESHOLDS` quantiles of the distances times look-aheads 1 to 4; the fastest that fits wins
  (fewer swaps on a tie).
"""

from __future__ import annotations

import dataclasses
import math

from mcdla.plan.policies import policy_plan
from mcdla.plan.problem import Problem
from mcdla.plan.space import lookahead_triggers
from mcdla.workload.plan import Plan

__all__ = ["plan_none", "plan_vdnn_all", "plan_vdnn_conv", "plan_vdnn_dyn", "plan_tflms", "TFLMS_THRESHOLDS",
           "TFLMS_LOOKAHEADS"]

TFLMS_THRESHOLDS = 32
TFLMS_LOOKAHEADS = (1, 2, 3, 4)


def _policy(problem: Problem, policy: str) -> Plan:
    plan = policy_plan(problem.workload, policy, problem.budget_bytes)
    return dataclasses.replace(plan, planner=problem.planner)


def _if_feasible(problem: Problem, plan: Plan) -> Plan | None:
    return plan if math.isfinite(problem.score(plan)) else None


def plan_none(problem: Problem) -> Plan | None:
    """Keep every saved tensor; None when that does not fit the budget."""
    return _if_feasible(problem, problem.plan({}))


def plan_vdnn_all(problem: Problem) -> Plan | None:
    """vDNN_all; None when the engine cannot run it within the budget."""
    return _if_feasible(problem, _policy(problem, "all"))


def plan_vdnn_conv(problem: Problem) -> Plan | None:
    """vDNN_conv; None when the engine cannot run it within the budget."""
    return _if_feasible(problem, _policy(problem, "conv"))


def plan_vdnn_dyn(problem: Problem) -> Plan | None:
    """The first of none, conv, all that runs within the budget (NOTE [baselines])."""
    for policy in ("none", "conv", "all"):
        plan = _if_feasible(problem, _policy(problem, policy))
        if plan is not None:
            return plan
    return None


def plan_tflms(problem: Problem) -> Plan | None:
    """The auto-tuned threshold policy (NOTE [baselines]); None when no configuration fits."""
    chain = problem.chain
    n = len(chain)
    offloadable = chain.offloadable
    # Distances of the offloadable layers, descending = offloading more layers as the threshold drops.
    distances = sorted({2 * n - 1 - 2 * i for i in offloadable}, reverse=True)
    if len(distances) > TFLMS_THRESHOLDS:
        picks = {distances[round(q * (len(distances) - 1) / (TFLMS_THRESHOLDS - 1))] for q in range(TFLMS_THRESHOLDS)}
        distances = sorted(picks, reverse=True)
    thresholds = [math.inf] + [d - 1 for d in distances]
    best, value = None, math.inf
    for threshold in thresholds:
        swapped = [i for i in offloadable if 2 * n - 1 - 2 * i > threshold]
        for ahead in TFLMS_LOOKAHEADS if swapped else (1,):
            plan = problem.offload_plan(lookahead_triggers(n, swapped, ahead))
            v = problem.score(plan)
            if v < value:
                best, value = plan, v
    return best
