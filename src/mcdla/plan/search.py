"""Local search over offload sets, judged by the engine (the improvement step of ``lp`` and ``tflms``).

NOTE [local search]
From a feasible offload set, try to drop one offloaded layer, add one kept layer, or swap an offloaded layer for
a kept one (all pairs for short chains, neighbouring offloadable layers otherwise), in that order, with the
prefetch triggers a given rule assigns to each set. The first move the engine scores strictly better is taken
and the scan restarts; the search stops at a local optimum or after ``max_evals`` engine runs. Deterministic:
moves are tried in index order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from mcdla.plan.problem import Problem

__all__ = ["improve_offload_set"]

_ALL_PAIRS_UP_TO = 16


def _moves(current: Sequence[int], offloadable: Sequence[int]) -> Iterator[tuple[int, ...]]:
    chosen = set(current)
    kept = [j for j in offloadable if j not in chosen]
    for i in current:
        yield tuple(sorted(chosen - {i}))
    for j in kept:
        yield tuple(sorted(chosen | {j}))
    if len(offloadable) <= _ALL_PAIRS_UP_TO:
        pairs = [(i, j) for i in current for j in kept]
    else:
        pos = {layer: k for k, layer in enumerate(offloadable)}
        pairs = []
        for i in current:
            for step in (-2, -1, 1, 2):
                k = pos[i] + step
                if 0 <= k < len(offloadable) and offloadable[k] not in chosen:
                    pairs.append((i, offloadable[k]))
    for i, j in pairs:
        yield tuple(sorted((chosen - {i}) | {j}))


def improve_offload_set(
    problem: Problem,
    start: Sequence[int],
    triggers: Callable[[list[int]], dict[int, int]],
    *,
    max_evals: int = 300,
) -> tuple[tuple[int, ...], float]:
    """Best offload set reachable from ``start`` by NOTE [local search], and its engine makespan (seconds)."""
    offloadable = problem.chain.offloadable
    current = tuple(sorted(start))
    value = problem.score(problem.offload_plan(triggers(list(current))))
    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for candidate in _moves(current, offloadable):
            if evals >= max_evals:
                break
            evals += 1
            v = problem.score(problem.offload_plan(triggers(list(candidate))))
            if v < value * (1 - 1e-12):
                current, value, improved = candidate, v, True
                break
    return current, value
