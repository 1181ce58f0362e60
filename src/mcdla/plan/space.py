"""The offload plan space the exact planners search, and the trigger rules every offload planner follows.

NOTE [canonical triggers]
A plan offloads a set of layers and gives each a prefetch trigger ``k`` (``B_k`` starts; ``k == L``: end of
forward, last layer only; see NOTE [trigger index] in ``chain.py``). The *canonical* space, searched by
``milp`` and ``brute`` and produced by ``lp`` and the baselines, asks triggers to be monotone: for offloaded
``i < j``, ``k_i <= k_j``, i.e. a tensor needed later is never issued before one needed earlier. Then the
prefetch stream, which runs prefetches in issue order, runs them in the order the backward needs them
(descending layer index; prefetches issued by the same ``B_k`` are queued in that order too), and every
prefetch starts after the last offload has completed, so the two copy streams are never busy at once.
Non-monotone plans make a prefetch wait behind one needed later; they stay valid plans (the engine runs
anything), they are just not searched. An optional *window* bounds the look-ahead: ``k_i <= i + window``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from mcdla.plan.chain import Chain
from mcdla.workload.model import LayerKind

__all__ = [
    "trigger_range", "is_canonical", "lookahead_triggers", "vdnn_sets", "enumerate_offload_plans", "count_offload_plans",
]


def trigger_range(i: int, n: int, window: int | None = None) -> range:
    """Trigger indices allowed for layer ``i`` of an ``n``-layer chain, earliest time last."""
    if i == n - 1:
        return range(n, n + 1)
    hi = n - 1 if window is None else min(n - 1, i + window)
    return range(i + 1, hi + 1)


def is_canonical(triggers: Mapping[int, int], n: int, window: int | None = None) -> bool:
    """True when every trigger is allowed for its layer and triggers are monotone in the layer index."""
    last = -1
    for i in sorted(triggers):
        k = triggers[i]
        if k not in trigger_range(i, n, window) or k < last:
            return False
        last = k
    return True


def lookahead_triggers(n: int, offloaded: Sequence[int], lookahead: int) -> dict[int, int]:
    """Issue each prefetch ``lookahead`` backward operations early: ``k_i = min(i + lookahead, L - 1)``.

    ``lookahead == 1`` is vDNN's default (``B_{i+1}``); the result is canonical for every ``lookahead >= 1``.
    """
    out = {}
    for i in offloaded:
        out[i] = n if i == n - 1 else min(i + lookahead, n - 1)
    return out


def vdnn_sets(chain: Chain) -> list[list[int]]:
    """The offload sets of vDNN_all (every layer that saves bytes) and vDNN_conv (those that are convolutions).

    With :func:`lookahead_triggers` at look-ahead 1 they are exactly the plans of :func:`mcdla.plan.policy_plan`,
    so planners that try them are never worse than vDNN.
    """
    every = list(chain.offloadable)
    conv = [i for i in every if chain.kinds[i] is LayerKind.CONV]
    return [every, conv]


def enumerate_offload_plans(
    candidates: Sequence[int], n: int, window: int | None = None
) -> Iterator[dict[int, int]]:
    """Every canonical plan over ``candidates`` (the offloadable layers): ``{layer: trigger}`` per plan.

    The empty dict (offload nothing) comes first. Layers are decided from the last to the first, so that the
    monotone bound (a lower layer's trigger may not exceed a higher offloaded layer's) is known when needed.
    """
    order = sorted(candidates, reverse=True)

    def rec(pos: int, bound: int, chosen: dict[int, int]) -> Iterator[dict[int, int]]:
        if pos == len(order):
            yield dict(chosen)
            return
        i = order[pos]
        yield from rec(pos + 1, bound, chosen)
        for k in trigger_range(i, n, window):
            if k <= bound:
                chosen[i] = k
                yield from rec(pos + 1, k, chosen)
                del chosen[i]

    yield from rec(0, n, {})


def count_offload_plans(candidates: Sequence[int], n: int, window: int | None = None) -> int:
    """How many plans :func:`enumerate_offload_plans` yields (for sizing brute-force searches)."""
    order = sorted(candidates, reverse=True)
    # ways[bound] = number of completions given the current monotone bound.
    ways = {k: 1 for k in range(n + 1)}
    for i in reversed(order):
        allowed = trigger_range(i, n, window)
        ways = {b: ways[b] + sum(ways[k] for k in allowed if k <= b) for b in range(n + 1)}
    return ways[n]
