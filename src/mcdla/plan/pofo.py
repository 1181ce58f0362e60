"""``pofo``: recomputation and offloading combined, a checkpoint DP in the style of POFO (NeurIPS 2021).

NOTE [pofo estimate]
The DP of NOTE [checkpoint DP] lets each checkpoint be offloaded instead of kept: it then holds no device memory
between its forward and the backward segment above it, and costs an estimate of its exposed transfer time,
``lambda * (max(0, d_c - uF_c) + max(0, h_c - uB_t))``: the offload ``d_c`` hidden behind ``F_c`` only, the
prefetch ``h_c`` (issued when ``B_t``, the backward just before its first use, starts) hidden behind that
backward only. The
estimate ignores queueing on the copy streams, so the DP is solved for ``lambda`` in :data:`LAMBDAS` and every
resulting plan, together with ``rotor``'s (no offload) and ``lp``'s (no recomputation), is scored by the engine;
the best wins (``rotor``'s on a tie). So ``pofo`` is never worse than ``rotor`` or ``lp``, and:

- with (almost) zero bandwidth every offload costs more than any recomputation, the DP never offloads, and the
  result is ``rotor``'s plan;
- with ample bandwidth (no latency) offloads cost nothing, and when the budget holds every checkpoint's
  forward and backward working set the DP offloads instead of recomputing: the makespan is the compute floor.

Two checks skip the DPs where their answer is known (each DP takes seconds on a few hundred layers, and the
search for the smallest feasible budget runs ``pofo`` a dozen times): a budget below the static bytes (the
parameters and optimizer state every plan keeps) is infeasible at once, and when ``rotor``'s plan already
reaches the compute floor (``Chain.lower_bound_s``, a bound no plan beats) it is the answer.
"""

from __future__ import annotations

import math

from mcdla.plan._chain_dp import solve_checkpoints
from mcdla.plan.lp import plan_lp
from mcdla.plan.problem import Problem
from mcdla.plan.rotor import grid_unit, plan_rotor
from mcdla.workload.plan import Plan

__all__ = ["LAMBDAS", "plan_pofo"]

#: Weights of the estimated exposed transfer time tried by the DP.
LAMBDAS = (1.0, 0.5)
#: Relative slack within which a makespan counts as the compute floor (summation order only).
_FLOOR_RTOL = 1e-12


def plan_pofo(problem: Problem, *, unit_bytes: float | None = None) -> Plan | None:
    """Best of rotor's plan, the offload-aware DP plans and lp's plan (NOTE [pofo estimate]); None if none fits."""
    chain, times = problem.chain, problem.times
    n = len(chain)
    unit = grid_unit(problem, unit_bytes)

    def exposed(c: int, trigger: int) -> float:
        hidden_b = chain.bwd_s[trigger] if trigger < n else 0.0
        return max(0.0, times.offload_s[c] - chain.fwd_s[c]) + max(0.0, times.prefetch_s[c] - hidden_b)

    if problem.budget_bytes < chain.static_bytes:
        return None
    candidates: list[Plan] = []
    rotor = plan_rotor(problem, unit_bytes=unit)
    if rotor is not None:
        if problem.score(rotor) <= chain.lower_bound_s * (1 + _FLOOR_RTOL):
            return rotor
        candidates.append(rotor)
    for lam in LAMBDAS:
        result = solve_checkpoints(chain, problem.budget_bytes, unit_bytes=unit,
                                   offload_penalty_s=lambda c, nxt, lam=lam: lam * exposed(c, nxt))
        if result is not None:
            candidates.append(problem.plan(result.actions, result.triggers))
    offload_only = plan_lp(problem)
    if offload_only is not None:
        candidates.append(offload_only)
    best, value = problem.scorer.best(candidates)
    return best if math.isfinite(value) else None
