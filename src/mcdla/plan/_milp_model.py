"""The event MILP of offloading on a chain (built here, solved and checked in ``milp.py``).

NOTE [event model]
Variables (times in units of ``t_unit``, bytes in units of ``b_unit``):

- ``x_i`` (binary): offload layer ``i``; ``y_ik`` (binary): its prefetch trigger is ``k`` (``sum_k y_ik = x_i``).
- ``s_i``, ``b_i``: start of ``F_i`` and ``B_i``; ``oc_i``: completion of the D2H stream up to layer ``i``
  (a zero-length pass-through for kept layers, so that FIFO order is one chain of inequalities);
  ``ps_i``: prefetch start (pass-through for kept layers, chained in descending index = issue order).
- Ordering binaries, all ``1`` meaning "the tensor is on the device at that event":
  ``z_ji``: offload ``j`` still running when ``F_i`` starts; ``zeta_jk``: still running when ``B_k`` starts;
  ``pi_jk``: prefetch ``j`` allocated before ``B_k`` allocates; ``nu_jk``: prefetch ``j`` starts before
  ``B_k`` ends (so ``S_k``, and ``B_k``'s transient if ``B_k`` has started, are still allocated).

Constraints restate ``docs/timing-model.md`` as necessary conditions: compute in order; each offload after its
``F_i`` starts and after the previous offload; each prefetch after its trigger, after its own offload and
after the previous prefetch; ``B_i`` after its prefetch; and memory within the budget at every allocation
(``F_i`` start, ``B_k`` start, prefetch start), counting exactly the tensors the ordering binaries say are
resident. The engine's schedule of any canonical plan satisfies all of them, with the binaries read off the
order of its events (ties either way), so the MILP optimum is a lower bound on the engine optimum over the
canonical space. It can be below it only where the MILP delays a prefetch or orders a tie in a way the engine
does not; ``milp.py`` checks every MILP plan with the engine and closes such gaps with no-good cuts.

Valid cuts: a tensor pending at an event keeps every tensor between it and the event resident, so an order
binary whose "resident" case alone exceeds the budget is fixed to 0; monotonicity of the order binaries in
``k``; at most one backward is running when a prefetch starts; the fluid relaxation of ``lp.py`` (valid for every
engine schedule) with the whole offloads completed by an event bounded by the bytes the stream moved by then.
Big-Ms come from per-variable time windows: earliest = no waits, latest = the cap on the makespan minus the
compute still to run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import coo_matrix

from mcdla.plan._milp_cuts import add_term as _add
from mcdla.plan._milp_cuts import fluid_rows as _fluid_rows
from mcdla.plan.chain import Chain, LinkTimes
from mcdla.plan.space import trigger_range

__all__ = ["EventModel", "build_event_model"]


@dataclass(slots=True)
class _Builder:
    names: list[str] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)

    def var(self, name: str, lo: float = 0.0, hi: float = math.inf, binary: bool = False) -> int:
        self.names.append(name)
        self.lower.append(lo)
        self.upper.append(1.0 if binary else hi)
        self.integer.append(1 if binary else 0)
        return len(self.names) - 1

    def row(self, terms: dict[int, float], lo: float = -math.inf, hi: float = math.inf) -> None:
        r = len(self.row_lo)
        for col, val in terms.items():
            if val != 0.0:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(val)
        self.row_lo.append(lo)
        self.row_hi.append(hi)

    def le(self, terms: dict[int, float], hi: float) -> None:
        self.row(terms, hi=hi)

    def big(self, a: int, b: int, const: float = 0.0) -> float:
        """A big-M for ``var[a] - var[b] + const``: its largest value over the variables' bounds (>= 0)."""
        return max(self.upper[a] - self.lower[b] + const, 0.0) * (1 + 1e-9) + 1e-9


@dataclass(slots=True, kw_only=True)
class EventModel:
    """A built MILP: arrays for :func:`scipy.optimize.milp` plus the indices needed to read a solution."""

    c: np.ndarray
    A: object
    row_lo: np.ndarray
    row_hi: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    t_unit: float
    x: dict[int, int]
    y: dict[tuple[int, int], int]
    ps: dict[int, int]
    trigger_time: dict[int, int]
    b: list[int]
    objective_offset: float
    eof_offset: float
    cuts: list[tuple[dict[int, float], float]] = field(default_factory=list)

    def no_good(self, x_val: dict[int, int], y_val: dict[tuple[int, int], int]) -> None:
        """Exclude one assignment of ``x`` and ``y`` (at least one of them must change)."""
        terms: dict[int, float] = {}
        ones = 0
        for key, col in list(self.x.items()):
            if x_val.get(key, 0):
                terms[col] = terms.get(col, 0.0) - 1.0
                ones += 1
            else:
                terms[col] = terms.get(col, 0.0) + 1.0
        for key, col in self.y.items():
            if y_val.get(key, 0):
                terms[col] = terms.get(col, 0.0) - 1.0
                ones += 1
            else:
                terms[col] = terms.get(col, 0.0) + 1.0
        self.cuts.append((terms, 1.0 - ones))

    def arrays(self):
        """``(A, lo, hi)`` with the no-good cuts appended."""
        if not self.cuts:
            return self.A, self.row_lo, self.row_hi
        nv = len(self.c)
        rows, cols, vals = [], [], []
        for r, (terms, _) in enumerate(self.cuts):
            for col, val in terms.items():
                rows.append(r)
                cols.append(col)
                vals.append(val)
        from scipy.sparse import vstack

        extra = coo_matrix((vals, (rows, cols)), shape=(len(self.cuts), nv)).tocsr()
        A = vstack([self.A, extra]).tocsr()
        lo = np.concatenate([self.row_lo, [rhs for _, rhs in self.cuts]])
        hi = np.concatenate([self.row_hi, [np.inf] * len(self.cuts)])
        return A, lo, hi


def build_event_model(
    chain: Chain, times: LinkTimes, budget_bytes: float, horizon_s: float, window: int | None = None
) -> EventModel | None:
    """The MILP of NOTE [event model] with every time at most ``horizon_s``; None if no plan can fit."""
    n = len(chain)
    t_unit = max(chain.lower_bound_s, 1e-30) / (2 * n)
    b_unit = max(max(chain.saved_bytes), 1.0)
    H = horizon_s / t_unit * (1 + 1e-9) + 1e-9
    uF = [v / t_unit for v in chain.fwd_s]
    uB = [v / t_unit for v in chain.bwd_s]
    d = [v / t_unit for v in times.offload_s]
    h = [v / t_unit for v in times.prefetch_s]
    S = [v / b_unit for v in chain.saved_bytes]
    W = chain.static_bytes / b_unit
    C = budget_bytes / b_unit if math.isfinite(budget_bytes) else math.inf
    trF = [v / b_unit for v in chain.fwd_transient_bytes]
    trB = [v / b_unit for v in chain.bwd_transient_bytes]
    pre = np.cumsum(S)
    cand = [i for i in chain.offloadable if math.isfinite(d[i]) and math.isfinite(h[i])]
    is_cand = set(cand)
    if math.isfinite(C) and W + S[0] + trF[0] > C * (1 + 1e-12):
        return None

    m = _Builder()
    # time windows: earliest (no waits) and latest (the cap H on the makespan, remaining compute after)
    sum_f, sum_b = sum(uF), sum(uB)
    lb_s = [sum(uF[:i]) for i in range(n)]
    ub_s = [H - sum_b - sum(uF[i:]) for i in range(n)]
    lb_b = [sum_f + sum(uB[k + 1:]) for k in range(n)]
    ub_b = [H - sum(uB[:k + 1]) for k in range(n)]
    if any(lo > hi for lo, hi in zip(lb_b, ub_b)):
        return None
    s = [m.var(f"s{i}", lb_s[i], ub_s[i]) for i in range(n)]
    b = [m.var(f"b{k}", lb_b[k], ub_b[k]) for k in range(n)]
    oc = [m.var(f"oc{i}", lb_s[i], ub_b[i]) for i in range(n)]
    x = {i: m.var(f"x{i}", binary=True) for i in cand}
    y = {(i, k): m.var(f"y{i}_{k}", binary=True) for i in cand for k in trigger_range(i, n, window)}
    ps = {i: m.var(f"ps{i}", sum_f, ub_b[i]) for i in cand}
    # trigger time of index k: b_k, or end of forward (s_{n-1} + uF_{n-1}) for k == n
    def trigger_terms(k: int) -> tuple[dict[int, float], float]:
        return ({b[k]: 1.0}, 0.0) if k < n else ({s[n - 1]: 1.0}, uF[n - 1])

    # compute order
    for i in range(1, n):
        m.row({s[i]: 1.0, s[i - 1]: -1.0}, lo=uF[i - 1])
    m.row({b[n - 1]: 1.0, s[n - 1]: -1.0}, lo=uF[n - 1])
    for i in range(n - 1):
        m.row({b[i]: 1.0, b[i + 1]: -1.0}, lo=uB[i + 1])
    # offload stream (pass-through chain)
    for i in range(n):
        xi = {x[i]: -d[i]} if i in is_cand else {}
        m.row({oc[i]: 1.0, s[i]: -1.0, **xi}, lo=0.0)
        if i:
            m.row({oc[i]: 1.0, oc[i - 1]: -1.0, **xi}, lo=0.0)
    # triggers: exactly one when offloaded; monotone via running minimum beta
    for i in cand:
        m.row({**{y[i, k]: 1.0 for k in trigger_range(i, n, window)}, x[i]: -1.0}, lo=0.0, hi=0.0)
    beta = {i: m.var(f"beta{i}", 0.0, n) for i in cand}
    for pos, i in enumerate(cand):
        tau = {y[i, k]: float(k) for k in trigger_range(i, n, window)}
        # beta_i <= tau_i + n (1 - x_i)  and  beta_i <= beta_next
        m.le({beta[i]: 1.0, **{c: -v for c, v in tau.items()}, x[i]: float(n)}, float(n))
        if pos + 1 < len(cand):
            nxt = cand[pos + 1]
            m.le({beta[i]: 1.0, beta[nxt]: -1.0}, 0.0)
            # tau_i <= beta_next + n (1 - x_i)
            m.le({**tau, beta[nxt]: -1.0, x[i]: float(n)}, float(n))
    # prefetch stream: descending index, pass-through for kept candidates
    desc = sorted(cand, reverse=True)
    for pos, i in enumerate(desc):
        for k in trigger_range(i, n, window):
            terms, const = trigger_terms(k)
            (col, _), = terms.items()
            M = m.big(col, ps[i], const)
            row = {ps[i]: 1.0, col: -1.0, y[i, k]: -M}
            m.row(row, lo=const - M)
        M = m.big(oc[i], ps[i])
        m.row({ps[i]: 1.0, oc[i]: -1.0, x[i]: -M}, lo=-M)
        if pos:
            j = desc[pos - 1]
            m.row({ps[i]: 1.0, ps[j]: -1.0, x[j]: -h[j]}, lo=0.0)
        m.row({b[i]: 1.0, ps[i]: -1.0, x[i]: -h[i]}, lo=0.0)
    rate_o = times.offload_rate_bytes_per_s * t_unit / b_unit
    rate_p = times.prefetch_rate_bytes_per_s * t_unit / b_unit
    O = _fluid_rows(m, n, cand, x, s, b, S, W, C, trF, trB, pre, uF, uB, rate_o, rate_p, times.shared_direction)
    if math.isfinite(C):
        _memory_rows(m, chain, n, cand, x, y, s, b, oc, ps, S, W, C, trF, trB, pre, uB, H, window, O)
    c = np.zeros(len(m.names))
    c[b[0]] = 1.0
    nv = len(m.names)
    A = coo_matrix((m.vals, (m.rows, m.cols)), shape=(len(m.row_lo), nv)).tocsr()
    return EventModel(
        c=c, A=A, row_lo=np.array(m.row_lo), row_hi=np.array(m.row_hi), lower=np.array(m.lower),
        upper=np.array(m.upper), integrality=np.array(m.integer), t_unit=t_unit, x=x, y=y, ps=ps,
        trigger_time={k: (b[k] if k < n else s[n - 1]) for k in range(n + 1)}, b=b,
        objective_offset=uB[0], eof_offset=uF[n - 1],
    )


def _memory_rows(m, chain, n, cand, x, y, s, b, oc, ps, S, W, C, trF, trB, pre, uB, H, window, O) -> None:
    is_cand = set(cand)
    eps = 1e-12 * max(C, 1.0)
    # F_i start: W + sum_{j<i} S_j (1 - x_j + z_ji) + S_i + trF_i <= C
    for i in range(1, n):
        if W + pre[i] + trF[i] <= C + eps:
            continue
        terms: dict[int, float] = {}
        rhs = C - W - S[i] - trF[i] - (pre[i - 1])
        for j in range(i):
            if j not in is_cand:
                continue
            _add(terms, x[j], -S[j])
            if W + (pre[i] - (pre[j - 1] if j else 0.0)) + trF[i] > C + eps:
                # z_ji = 1 would keep S_j..S_i resident, over budget: the offload must be done by s_i
                M = m.big(oc[j], s[i])
                m.le({oc[j]: 1.0, s[i]: -1.0, x[j]: M}, M)
                continue
            z = m.var(f"z{j}_{i}", binary=True)
            _add(terms, z, S[j])
            m.le({z: 1.0, x[j]: -1.0}, 0.0)
            M = m.big(oc[j], s[i])
            m.le({oc[j]: 1.0, s[i]: -1.0, z: -M, x[j]: M}, M)
        m.le(terms, rhs)
        # whole offloads completed by s_i cannot exceed the bytes the stream has moved by then
        m.le({**{c: -v for c, v in terms.items()}, O[i - 1]: -1.0}, 0.0)
    # B_k start: W + sum_{j<k} S_j (1 - x_j + pi_jk + zeta_jk) + S_k + trB_k <= C
    pis: dict[tuple[int, int], int] = {}
    for j in cand:
        for k in range(j + 1, n):
            if any(kk > k for kk in trigger_range(j, n, window)):
                p = m.var(f"pi{j}_{k}", binary=True)
                pis[j, k] = p
                m.le({p: 1.0, x[j]: -1.0}, 0.0)
                m.le({p: 1.0, **{y[j, kk]: -1.0 for kk in trigger_range(j, n, window) if kk > k}}, 0.0)
                # pi = 1 -> ps_j <= b_k ; pi = 0 -> ps_j >= b_k (when offloaded)
                M1, M0 = m.big(ps[j], b[k]), m.big(b[k], ps[j])
                m.le({ps[j]: 1.0, b[k]: -1.0, p: M1}, M1)
                m.le({b[k]: 1.0, ps[j]: -1.0, p: -M0, x[j]: M0}, M0)
                if (j, k - 1) in pis:
                    m.le({p: 1.0, pis[j, k - 1]: -1.0}, 0.0)
    for k in range(n):
        if W + pre[k] + trB[k] <= C + eps:
            continue
        terms = {}
        done = {x[j]: S[j] for j in cand}  # offloads completed by b_k: all but the pending ones
        rhs = C - W - S[k] - trB[k] - (pre[k - 1] if k else 0.0)
        for j in range(k):
            if j not in is_cand:
                continue
            _add(terms, x[j], -S[j])
            if (j, k) in pis:
                _add(terms, pis[j, k], S[j])
            if W + (pre[k] - (pre[j - 1] if j else 0.0)) + trB[k] > C + eps:
                M = m.big(oc[j], b[k])
                m.le({oc[j]: 1.0, b[k]: -1.0, x[j]: M}, M)
                continue
            zeta = m.var(f"zeta{j}_{k}", binary=True)
            _add(terms, zeta, S[j])
            _add(done, zeta, -S[j])
            m.le({zeta: 1.0, x[j]: -1.0}, 0.0)
            M = m.big(oc[j], b[k])
            m.le({oc[j]: 1.0, b[k]: -1.0, zeta: -M, x[j]: M}, M)
        m.le(terms, rhs)
        m.le({**done, O[2 * n - 2 - k]: -1.0}, 0.0)
    # prefetch j start: W + S_j + sum_{m<j} S_m (1 - x_m) + sum_{m>j} S_m nu_jm + sum_k trB_k (nu_jk - pi_jk) <= C
    for j in cand:
        later = [k for k in range(j + 1, n) if any(kk >= k for kk in trigger_range(j, n, window))]
        kept_below = {x[mm]: -S[mm] for mm in range(j) if mm in is_cand}
        base = W + S[j] + (pre[j - 1] if j else 0.0)
        worst = base + sum(S[k] for k in later) + max((trB[k] for k in later), default=0.0)
        if worst <= C + eps:
            continue
        nus = {}
        for k in later:
            v = m.var(f"nu{j}_{k}", binary=True)
            nus[k] = v
            m.le({v: 1.0, x[j]: -1.0}, 0.0)
            m.le({v: 1.0, **{y[j, kk]: -1.0 for kk in trigger_range(j, n, window) if kk >= k}}, 0.0)
            # nu = 1 -> ps_j <= b_k + uB_k ; nu = 0 -> ps_j >= b_k + uB_k
            M1, M0 = m.big(ps[j], b[k], -uB[k]), m.big(b[k], ps[j], uB[k])
            m.le({ps[j]: 1.0, b[k]: -1.0, v: M1}, M1 + uB[k])
            m.le({b[k]: 1.0, ps[j]: -1.0, v: -M0, x[j]: M0}, M0 - uB[k])
            if (j, k) in pis:
                m.le({pis[j, k]: 1.0, v: -1.0}, 0.0)
            if k - 1 in nus:
                m.le({v: 1.0, nus[k - 1]: -1.0}, 0.0)
        running: dict[int, float] = {}
        for k in later:
            _add(running, nus[k], 1.0)
            if (j, k) in pis:
                _add(running, pis[j, k], -1.0)
        if running:
            m.le(running, 1.0)
        big = worst - C
        terms = dict(kept_below)
        for k in later:
            _add(terms, nus[k], S[k] + trB[k])
            if (j, k) in pis:
                _add(terms, pis[j, k], -trB[k])
        _add(terms, x[j], big)
        m.le(terms, C - base + big)
