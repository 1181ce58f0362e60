"""``lp``: a fluid relaxation of offloading, solved with HiGHS, rounded to whole tensors and repaired.

NOTE [fluid relaxation]
Steps ``s = 0..2L-1`` are the compute operations in order (``F_0..F_{L-1}, B_{L-1}..B_0``); ``T_s`` is the
time from the start of operation ``s`` to the start of the next (its compute time plus any wait). Transfers
are fluid: ``O_s`` and ``P_s`` are the bytes offloaded and prefetched by the end of step ``s``, each stream
moving at most its bandwidth times ``T_s``; ``x_i`` in [0, 1] is the fraction of ``S_i`` offloaded.

    minimise   sum_s T_s
    subject to T_s >= u_s                                        (compute)
               O_s - O_{s-1} <= bw_d2h T_s,  O_s <= sum_{j <= min(s, L-1)} S_j x_j   (only produced bytes leave)
               P_s - P_{s-1} <= bw_h2d T_s,  P_s <= O_s,  P_s = 0 before the end of forward
               P_{B_i - 1} >= sum_{j >= i} S_j x_j           (B_i's tensor and all later-needed ones are back)
               W + sum_{j <= i} S_j - O_{F_i - 1} + trF_i <= M   (memory at F_i start)
               W + sum_{j <= i} S_j - (O - P)_{B_i - 1} + trB_i <= M   (memory at B_i start)

and, on a half-duplex link with equal rates, one shared budget ``dO + dP <= bw T``. Every engine schedule of
every plan maps onto a feasible point (``O``, ``P`` = the bytes its transfers have moved; the engine holds a
tensor whole while the relaxation frees and allocates it byte by byte, and latency is dropped), so the LP value
is a lower bound on the engine makespan of *any* plan: ``lp value <= milp <= rounded lp`` (the rounding stays in
the canonical space, NOTE [canonical triggers] in ``space.py``).

NOTE [rounding and repair]
A second LP keeps ``sum T`` within 1e-6 of the optimum and minimises the offloaded bytes (earlier layers
preferred), which makes ``x`` nearly integral. Layers are ranked by ``x`` (then by index); candidate plans
offload the top ``n`` for every ``n`` near the LP's fractional mass, with prefetch triggers read off the LP's
prefetch progress or a fixed look-ahead. The engine scores every candidate; if none is feasible, the repair
adds the next-ranked layers until one is (then tries look-aheads again). The best-scoring plan wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from mcdla.errors import PlanError
from mcdla.plan.chain import Chain
from mcdla.plan.problem import Problem
from mcdla.plan.search import improve_offload_set
from mcdla.plan.space import lookahead_triggers, vdnn_sets
from mcdla.workload.plan import Plan

__all__ = ["FluidSolution", "solve_fluid", "round_candidates", "lp_triggers", "fluid_bound", "plan_lp", "seed_plans"]

_LOOKAHEADS = (1, 2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class FluidSolution:
    """The fluid LP's optimum: its value (a lower bound, seconds), offload fractions, prefetch progress."""

    value_s: float
    fractions: tuple[float, ...]
    prefetched_bytes: tuple[float, ...]


class _Rows:
    """Sparse constraint rows ``sum a_v x_v <= ub`` built one at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: dict[int, float], ub: float) -> None:
        r = len(self.ub)
        for col, val in terms.items():
            if val != 0.0:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(val)
        self.ub.append(ub)

    def matrix(self, nvars: int):
        return coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.ub), nvars)).tocsr()


def solve_fluid(
    chain: Chain, bw_d2h: float, bw_h2d: float, budget_bytes: float, *, shared: bool = False
) -> FluidSolution | None:
    """Solve the fluid LP (NOTE [fluid relaxation]); None when even fluid offloading cannot meet the budget.

    ``bw_d2h``, ``bw_h2d``: link rates (bytes/s, ``math.inf`` allowed); ``budget_bytes``: device capacity.
    """
    n = len(chain)
    steps = 2 * n
    u = list(chain.fwd_s) + [chain.bwd_s[n - 1 - k] for k in range(n)]
    t_unit = max(chain.lower_bound_s, 1e-30) / steps
    b_unit = max(sum(chain.saved_bytes), 1.0)
    cap = (budget_bytes - chain.static_bytes) / b_unit if math.isfinite(budget_bytes) else math.inf
    S = [s / b_unit for s in chain.saved_bytes]
    prefix = np.cumsum(S)
    rate_o = bw_d2h * t_unit / b_unit
    rate_p = bw_h2d * t_unit / b_unit
    # variable layout: T[0:steps], O[steps:2steps], P[2steps:3steps], X[3steps:3steps+n] (cumulative S x)
    iT, iO, iP, iX = 0, steps, 2 * steps, 3 * steps
    nv = 3 * steps + n
    bounds = [(u[s] / t_unit, None) for s in range(steps)]
    bounds += [(0.0, None)] * steps
    bounds += [(0.0, 0.0) if s < n - 1 else (0.0, None) for s in range(steps)]
    bounds += [(0.0, None)] * n
    rows = _Rows()
    for i in range(n):  # X_i - X_{i-1} in [0, S_i]
        terms = {iX + i: 1.0}
        if i:
            terms[iX + i - 1] = -1.0
        rows.add(terms, S[i])
        rows.add({k: -v for k, v in terms.items()}, 0.0)
    for s in range(steps):
        o_prev = {iO + s - 1: -1.0} if s else {}
        p_prev = {iP + s - 1: -1.0} if s else {}
        if math.isfinite(rate_o):
            rows.add({iO + s: 1.0, **o_prev, iT + s: -rate_o}, 0.0)
        rows.add({iO + s: 1.0, iX + min(s, n - 1): -1.0}, 0.0)
        if s == n - 1 and math.isfinite(rate_p):
            rows.add({iP + s: 1.0, iT + s: -rate_p}, -rate_p * u[s] / t_unit)
        elif s >= n and math.isfinite(rate_p):
            rows.add({iP + s: 1.0, **p_prev, iT + s: -rate_p}, 0.0)
        rows.add({iP + s: 1.0, iO + s: -1.0}, 0.0)
        if shared and math.isfinite(rate_o) and rate_o == rate_p and s >= n - 1:
            rows.add({iO + s: 1.0, **o_prev, iP + s: 1.0, **p_prev, iT + s: -rate_o}, 0.0)
    for i in range(n):
        if math.isfinite(cap):
            need_f = prefix[i] + chain.fwd_transient_bytes[i] / b_unit - cap
            if i == 0:
                if need_f > 1e-12:
                    return None
            else:
                rows.add({iO + i - 1: -1.0}, -need_f)
            sigma = 2 * n - 1 - i
            need_b = prefix[i] + chain.bwd_transient_bytes[i] / b_unit - cap
            rows.add({iP + sigma - 1: 1.0, iO + sigma - 1: -1.0}, -need_b)
        sigma = 2 * n - 1 - i
        # P_{sigma-1} >= X_{L-1} - X_{i-1}
        cover = {iX + n - 1: 1.0, iP + sigma - 1: -1.0}
        if i:
            cover[iX + i - 1] = -1.0
        rows.add(cover, 0.0)
    A = rows.matrix(nv)
    ub = np.array(rows.ub)
    c = np.zeros(nv)
    c[iT:iT + steps] = 1.0
    first = linprog(c, A_ub=A, b_ub=ub, bounds=bounds, method="highs")
    if first.status == 2:
        return None
    if first.status != 0:
        raise PlanError(f"lp: HiGHS stopped with status {first.status} ({first.message})")
    value = float(first.fun)
    # Second pass: same makespan, fewest offloaded bytes, earlier layers preferred.
    rows.add({iT + s: 1.0 for s in range(steps)}, value * (1 + 1e-6) + 1e-9)
    A2 = rows.matrix(nv)
    ub2 = np.array(rows.ub)
    c2 = np.zeros(nv)
    for i in range(n):  # minimise sum_i w_i S_i x_i with X cumulative: S_i x_i = X_i - X_{i-1}
        w = 1.0 + 1e-3 * i / n
        c2[iX + i] += w
        if i + 1 < n:
            c2[iX + i] -= 1.0 + 1e-3 * (i + 1) / n
    second = linprog(c2, A_ub=A2, b_ub=ub2, bounds=bounds, method="highs")
    sol = second.x if second.status == 0 else first.x
    xs = sol[iX:iX + n]
    fractions = []
    for i in range(n):
        taken = xs[i] - (xs[i - 1] if i else 0.0)
        fractions.append(0.0 if S[i] <= 0 else float(min(1.0, max(0.0, taken / S[i]))))
    return FluidSolution(
        value_s=value * t_unit,
        fractions=tuple(fractions),
        prefetched_bytes=tuple(float(p) * b_unit for p in sol[iP:iP + steps]),
    )


def lp_triggers(chain: Chain, offloaded: list[int], solution: FluidSolution) -> dict[int, int]:
    """Triggers read off the LP's prefetch progress: each tensor is issued when the fluid prefetch reaches it.

    Tensors are prefetched in descending index order; tensor ``j`` starts when the prefetched bytes pass the
    bytes of the offloaded tensors above it. The result is clamped to the allowed range and made monotone.
    """
    n = len(chain)
    P = solution.prefetched_bytes
    out: dict[int, int] = {}
    above = 0.0
    bound = n
    for j in sorted(offloaded, reverse=True):
        start_step = next((s for s in range(n - 1, 2 * n) if P[s] > above * (1 + 1e-9) + 1e-6), 2 * n - 1)
        k = 2 * n - 1 - start_step if start_step >= n else n
        if j == n - 1:
            k = n
        else:
            k = max(j + 1, min(k, n - 1))
        k = min(k, bound)
        out[j] = k
        bound = k
        above += chain.saved_bytes[j]
    return out


def round_candidates(chain: Chain, solution: FluidSolution) -> list[list[int]]:
    """Offload sets to try, from the LP fractions: the top ``n`` of the ranking for ``n`` around its mass."""
    ranked = sorted(
        (i for i in chain.offloadable), key=lambda i: (-round(solution.fractions[i], 6), i)
    )
    whole = sum(1 for i in ranked if solution.fractions[i] >= 1 - 1e-6)
    some = sum(1 for i in ranked if solution.fractions[i] > 1e-6)
    sizes = {whole, some, min(len(ranked), some + 1), min(len(ranked), some + 2)}
    if some > whole:
        for q in (0.25, 0.5, 0.75):
            sizes.add(whole + round(q * (some - whole)))
    return [sorted(ranked[:m]) for m in sorted(sizes)]


def fluid_bound(problem: Problem) -> FluidSolution | None:
    """The fluid LP of ``problem`` (its link rates, duplex mode and budget)."""
    link = problem.link
    return solve_fluid(problem.chain, link.offload_bytes_per_s, link.prefetch_bytes_per_s, problem.budget_bytes,
                       shared=link.shared_direction)


def _schemes(problem: Problem, solution: FluidSolution) -> list[Callable[[list[int]], dict[int, int]]]:
    """Trigger rules tried for every offload set: the LP's own prefetch progress, then fixed look-aheads."""
    n = len(problem.chain)
    rules: list[Callable[[list[int]], dict[int, int]]] = [
        lambda offloaded: lp_triggers(problem.chain, offloaded, solution)
    ]
    rules += [lambda offloaded, d=d: lookahead_triggers(n, offloaded, d) for d in _LOOKAHEADS]
    return rules


def _best_of(problem: Problem, offloaded: list[int], rules) -> tuple[Plan | None, float, int]:
    best, value, which = None, math.inf, 0
    for k, rule in enumerate(rules):
        plan = problem.offload_plan(rule(offloaded))
        v = problem.score(plan)
        if v < value:
            best, value, which = plan, v, k
    return best, value, which


def plan_lp(
    problem: Problem, solution: FluidSolution | None = None, *, max_evals: int | None = None
) -> Plan | None:
    """NOTE [rounding and repair]; None if nothing fits the budget.

    ``solution``: the fluid LP of ``problem`` if already solved; ``max_evals``: engine runs of the local search
    (default: 300, fewer for long chains so that a 1,000-layer chain plans in seconds; a count, not a clock, so
    that the result is deterministic).
    """
    solution = solution if solution is not None else fluid_bound(problem)
    if solution is None:
        return None
    chain = problem.chain
    rules = _schemes(problem, solution)
    best, value, rule = problem.offload_plan({}), problem.score(problem.offload_plan({})), 1
    best_set: list[int] = []
    for offloaded in round_candidates(chain, solution) + vdnn_sets(chain):
        plan, v, k = _best_of(problem, offloaded, rules)
        if v < value:
            best, value, rule, best_set = plan, v, k, offloaded
    if not math.isfinite(value):
        ranked = sorted(chain.offloadable, key=lambda i: (-round(solution.fractions[i], 6), i))
        m, step = max(len(round_candidates(chain, solution)[-1]), 1), 1
        while m < len(ranked) and not math.isfinite(value):
            m = min(len(ranked), m + step)
            step *= 2
            best_set = sorted(ranked[:m])
            best, value, rule = _best_of(problem, best_set, rules)
        if not math.isfinite(value):
            return None
    if value <= solution.value_s * (1 + 1e-9):
        return best  # meets the lower bound: nothing to improve
    budget_evals = max_evals if max_evals is not None else max(40, min(300, 40_000 // len(chain)))
    improved, v = improve_offload_set(problem, best_set, rules[rule], max_evals=budget_evals)
    if v < value:
        best, value, _ = _best_of(problem, list(improved), rules)
    return best


def seed_plans(problem: Problem, fluid: FluidSolution) -> tuple[list[Plan], Plan | None]:
    """The exact planners' first incumbents: vDNN's two plans (prefetch one layer ahead) and ``lp``'s plan,
    which is also returned alone (None when rounding finds none within the budget)."""
    n = len(problem.chain)
    seeds = [problem.offload_plan(lookahead_triggers(n, subset, 1)) for subset in vdnn_sets(problem.chain)]
    lp_plan = plan_lp(problem, fluid)
    return (seeds if lp_plan is None else [*seeds, lp_plan]), lp_plan
