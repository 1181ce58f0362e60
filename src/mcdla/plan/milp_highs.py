"""``milp-highs``: the offload planner for chains as an event MILP solved with HiGHS, checked by the engine.

``milp`` (``milp.py``) searches the same canonical plan space by branch and bound with a much stronger bound
and is the one to use; this formulation is kept as its independent second implementation (tests check that
both reach the same optimum on small chains) and for readers who want the problem as a MILP. On a 50-layer
chain at half its no-offload peak it stops at its time limit about 5 % from proof.

NOTE [event MILP by bound and check]
The event MILP (``_milp_model.py``) is a relaxation of the engine over the canonical plan space (NOTE
[canonical triggers] in ``space.py``): its optimum is a lower bound on the best engine makespan. Each round
solves it, rebuilds plans from the solution (its triggers as chosen, and the same tensors with each trigger
moved to the latest backward start that still precedes the MILP's prefetch start, which is how the engine
would issue it), and scores them with the engine. The best engine makespan seen is an upper bound. When the
upper bound meets the MILP's dual bound, the incumbent is optimal over the canonical space; otherwise the
MILP's assignment is excluded by a no-good cut and the next round starts. The MILP is capped by the incumbent's
makespan, so an infeasible MILP also proves the incumbent optimal. The loop stops after ``max_rounds`` or
``time_limit_s``; the plan's notes then say the remaining gap.

Seeds: no offload, vDNN's two plans and ``lp``'s plan (as is, and with its look-aheads cut to the window), all
scored by the engine; the best gives the cap. (``lp``'s plan may lie outside the window; if it wins, the result
is still at least as good as every plan of the windowed space, which is what "optimal" then means.) Before the main solve a *probe* solves the MILP capped at the fluid lower bound
(``lp.py``): capping shrinks every time window and big-M, so when the bound is reachable (often: loose budgets,
fast links) the probe finds such a plan far faster than the uncapped search, and it is then proven optimal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from mcdla.plan._milp_model import EventModel, build_event_model
from mcdla.plan.chain import triggers_of
from mcdla.plan.lp import fluid_bound, seed_plans
from mcdla.plan.problem import Problem
from mcdla.plan.space import is_canonical, trigger_range
from mcdla.workload.plan import Plan

__all__ = ["plan_milp_highs", "DEFAULT_WINDOW"]

#: Prefetch look-ahead window (backward operations) of the MILP for chains longer than it; shorter chains
#: get every trigger.
DEFAULT_WINDOW = 6
_REL_TOL = 1e-7
#: Share of the time limit given to the probe "can the fluid lower bound be reached?" (a MILP capped at it).
_PROBE_SHARE = 0.25


def _rebuild(problem: Problem, model: EventModel, sol: np.ndarray, window: int | None):
    n = len(problem.chain)
    x_val = {i: int(round(sol[c])) for i, c in model.x.items()}
    y_val = {key: int(round(sol[c])) for key, c in model.y.items()}
    chosen = {i: k for (i, k), v in y_val.items() if v and x_val.get(i)}
    t_of = {k: sol[col] + (model.eof_offset if k == n else 0.0) for k, col in model.trigger_time.items()}
    latest: dict[int, int] = {}
    for j, k_chosen in chosen.items():
        start = sol[model.ps[j]]
        tol = 1e-7 * (1.0 + abs(start))
        fits = [k for k in trigger_range(j, n, window) if k <= k_chosen and t_of[k] <= start + tol]
        latest[j] = min(fits) if fits else k_chosen
    plans = [problem.offload_plan(chosen)]
    if latest != chosen and is_canonical(latest, n, window):
        plans.insert(0, problem.offload_plan(latest))
    return plans, x_val, y_val


@contextlib.contextmanager
def _native_stdout_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null meanwhile: HiGHS prints a debug line to it even with ``disp=False``,
    which would corrupt output such as ``mcdla plan --json``."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            try:
                yield
            finally:
                os.dup2(saved, fd)
    finally:
        os.close(saved)


def _solve(model: EventModel, time_limit_s: float):
    A, lo, hi = model.arrays()
    with _native_stdout_silenced():
        return milp(model.c, constraints=LinearConstraint(A, lo, hi), integrality=model.integrality,
                    bounds=Bounds(model.lower, model.upper),
                    options={"time_limit": max(time_limit_s, 0.01), "mip_rel_gap": 1e-9, "disp": False})


def _clamped(triggers: dict[int, int], n: int, window: int | None) -> dict[int, int]:
    """``triggers`` with every look-ahead cut to ``window`` (still monotone: a minimum of two monotone maps)."""
    if window is None:
        return dict(triggers)
    return {i: (k if k == n else min(k, i + window)) for i, k in triggers.items()}


def plan_milp_highs(
    problem: Problem,
    *,
    window: int | None = None,
    max_rounds: int = 30,
    time_limit_s: float = 60.0,
    max_binaries: int = 20_000,
) -> Plan | None:
    """Best canonical offload plan (exact when the notes say so); None when no canonical plan fits the budget.

    ``window``: prefetch look-ahead bound (None: all triggers for chains up to :data:`DEFAULT_WINDOW` + 1
    layers, :data:`DEFAULT_WINDOW` beyond). ``time_limit_s`` bounds the whole loop (seconds); a model with more
    than ``max_binaries`` binaries is not solved (the seed is returned, and the notes say so).
    """
    chain = problem.chain
    n = len(chain)
    if window is None and n > DEFAULT_WINDOW + 1:
        window = DEFAULT_WINDOW
    started = time.perf_counter()
    best_plan, best = problem.scorer.best([problem.offload_plan({})])
    bound = chain.lower_bound_s
    if best_plan is None:
        fluid = fluid_bound(problem)
        if fluid is None:
            return None
        bound = fluid.value_s
        seeds, lp_plan = seed_plans(problem, fluid)
        if lp_plan is not None:
            seeds.append(problem.offload_plan(_clamped(triggers_of(chain, lp_plan), n, window)))
        best_plan, best = problem.scorer.best(seeds)
    if best <= bound * (1 + _REL_TOL):
        return _noted(problem, best_plan, True, 0, window, best, bound)
    probe = build_event_model(chain, problem.times, problem.budget_bytes, bound * (1 + 1e-6), window)
    if probe is not None and int(probe.integrality.sum()) <= max_binaries:
        res = _solve(probe, _PROBE_SHARE * time_limit_s)
        if res.x is not None:
            cand, value = problem.scorer.best(_rebuild(problem, probe, res.x, window)[0])
            if value < best:
                best_plan, best = cand, value
            if best <= bound * (1 + _REL_TOL):
                return _noted(problem, best_plan, True, 0, window, best, bound)
    horizon = best * (1 + 1e-3) if math.isfinite(best) else (
        chain.lower_bound_s + sum(problem.times.offload_s) + sum(problem.times.prefetch_s)
    )
    if not math.isfinite(horizon):
        return best_plan
    model = build_event_model(chain, problem.times, problem.budget_bytes, horizon, window)
    if model is None:
        return best_plan
    if int(model.integrality.sum()) > max_binaries:
        plan = _noted(problem, best_plan, False, 0, window, best, bound)
        return None if plan is None else dataclasses.replace(
            plan, notes=f"{plan.notes}; MILP not solved: {int(model.integrality.sum())} binaries > {max_binaries}, "
                        "the seed (best of lp and vDNN) is returned")
    rounds = 0
    proven = False
    while rounds < max_rounds:
        left = time_limit_s - (time.perf_counter() - started)
        if left <= 0:
            break
        rounds += 1
        res = _solve(model, left)
        if res.status == 2:  # nothing below the cap: the incumbent is optimal
            proven, bound = best_plan is not None, best
            break
        dual = getattr(res, "mip_dual_bound", None)
        if dual is not None and np.isfinite(dual):
            # the MILP bounds the plans not cut yet; cut plans all scored >= best
            bound = max(bound, min(best, (dual + model.objective_offset) * model.t_unit))
        if res.x is None:
            break
        plans, x_val, y_val = _rebuild(problem, model, res.x, window)
        cand, value = problem.scorer.best(plans)
        if value < best:
            best_plan, best = cand, value
        if best <= bound * (1 + _REL_TOL) + 1e-15:
            proven = True
            break
        model.no_good(x_val, y_val)
    return _noted(problem, best_plan, proven, rounds, window, best, bound)


def _noted(problem: Problem, plan: Plan | None, proven: bool, rounds: int, window: int | None, best: float,
           bound: float) -> Plan | None:
    if plan is None:
        return None
    gap = "0" if proven else (f"{best / bound - 1:.2e}" if bound > 0 and math.isfinite(bound) else "unknown")
    note = (f"milp-highs: {'optimal' if proven else 'not proven optimal'} over canonical plans (window={window}); "
            f"rounds={rounds}; gap={gap}")
    return dataclasses.replace(plan, notes=note, planner=problem.planner)
