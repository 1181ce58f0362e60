"""Cuts of the event MILP that restate the fluid relaxation (``lp.py``) on its event times (see ``_milp_model``)."""

from __future__ import annotations

import math

__all__ = ["add_term", "fluid_rows"]


def add_term(terms: dict[int, float], col: int, val: float) -> None:
    """Add ``val`` to the coefficient of column ``col`` in a row being built."""
    terms[col] = terms.get(col, 0.0) + val


def fluid_rows(m, n, cand, x, s, b, S, W, C, trF, trB, pre, uF, uB, rate_o, rate_p, shared) -> list[int]:
    """Add the fluid relaxation (``lp.py``) as valid cuts; returns the columns of ``O`` (bytes offloaded by the
    end of each step). It holds for every engine schedule, so adding it keeps the MILP a relaxation while lifting
    its LP bound to at least the fluid bound. Arguments are the model's columns and scaled data."""
    steps = 2 * n
    start = [s[i] for i in range(n)] + [b[n - 1 - k] for k in range(n)]
    O = [m.var(f"O{t}") for t in range(steps)]
    P = [m.var(f"P{t}") for t in range(steps)]
    is_cand = set(cand)
    for t in range(steps):
        # duration of step t = start[t+1] - start[t]; the last step lasts uB_0
        last = t + 1 == steps
        nxt = {} if last else {start[t + 1]: 1.0}
        here = 0.0 if last else 1.0
        dur_const = uB[0] if last else 0.0
        if math.isfinite(rate_o):
            row = {O[t]: 1.0, **({O[t - 1]: -1.0} if t else {}), start[t]: rate_o * here}
            for col, v in nxt.items():
                add_term(row, col, -rate_o * v)
            m.le(row, rate_o * dur_const)
        produced = {x[j]: -S[j] for j in range(min(t, n - 1) + 1) if j in is_cand}
        m.le({O[t]: 1.0, **produced}, 0.0)
        m.le({P[t]: 1.0, O[t]: -1.0}, 0.0)
        if t < n - 1:
            m.row({P[t]: 1.0}, lo=0.0, hi=0.0)
        elif math.isfinite(rate_p):
            row = {P[t]: 1.0, **({P[t - 1]: -1.0} if t >= n else {})}
            if t == n - 1:  # only after F_{L-1} ends
                add_term(row, start[t], rate_p)
                add_term(row, start[t + 1], -rate_p)
                m.le(row, -rate_p * uF[n - 1])
            else:
                add_term(row, start[t], rate_p * here)
                for col, v in nxt.items():
                    add_term(row, col, -rate_p * v)
                m.le(row, rate_p * dur_const)
        if shared and math.isfinite(rate_o) and rate_o == rate_p and t >= n - 1:
            row = {O[t]: 1.0, P[t]: 1.0, start[t]: rate_o * here}
            if t:
                add_term(row, O[t - 1], -1.0)
                add_term(row, P[t - 1], -1.0)
            for col, v in nxt.items():
                add_term(row, col, -rate_o * v)
            m.le(row, rate_o * dur_const)
    for i in range(n):
        sigma = steps - 1 - i
        cover = {P[sigma - 1]: -1.0, **{x[j]: S[j] for j in range(i, n) if j in is_cand}}
        m.le(cover, 0.0)
        if math.isfinite(C):
            if i:
                m.le({O[i - 1]: -1.0}, C - W - pre[i] - trF[i])
            m.le({P[sigma - 1]: 1.0, O[sigma - 1]: -1.0}, C - W - pre[i] - trB[i])
    return O
