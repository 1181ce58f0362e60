"""The canonical offload plan space: enumeration, counting and the trigger rules."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.plan.chain import build_chain, triggers_of
from mcdla.plan.policies import policy_plan
from mcdla.plan.space import (count_offload_plans, enumerate_offload_plans, is_canonical, lookahead_triggers,
                              trigger_range, vdnn_sets)

from .conftest import workloads


def _all_canonical(candidates, n, window):
    """Every canonical trigger map over ``candidates``, by filtering all subsets x all trigger choices."""
    found = []
    for mask in itertools.product((False, True), repeat=len(candidates)):
        chosen = [c for c, m in zip(candidates, mask) if m]
        for ks in itertools.product(*(trigger_range(i, n, window) for i in chosen)):
            t = dict(zip(chosen, ks))
            if is_canonical(t, n, window):
                found.append(t)
    return found


space = st.integers(1, 6).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n - 1), unique=True).map(sorted),
                        st.one_of(st.none(), st.integers(1, 3))))


@settings(max_examples=60, deadline=None)
@given(space)
def test_enumeration_is_exactly_the_canonical_space(args) -> None:
    """enumerate_offload_plans yields each canonical trigger map once and nothing else."""
    n, candidates, window = args
    got = list(enumerate_offload_plans(candidates, n, window))
    want = _all_canonical(candidates, n, window)
    assert sorted(map(sorted, (t.items() for t in got))) == sorted(map(sorted, (t.items() for t in want)))
    assert len(got) == len({tuple(sorted(t.items())) for t in got})


@settings(max_examples=60, deadline=None)
@given(space)
def test_count_matches_enumeration(args) -> None:
    """count_offload_plans equals the number of plans enumerated."""
    n, candidates, window = args
    assert count_offload_plans(candidates, n, window) == sum(1 for _ in enumerate_offload_plans(candidates, n, window))


@settings(max_examples=60, deadline=None)
@given(space, st.integers(1, 5))
def test_lookahead_triggers_are_canonical(args, lookahead) -> None:
    """A fixed look-ahead gives monotone, in-range triggers."""
    n, candidates, _ = args
    assert is_canonical(lookahead_triggers(n, candidates, lookahead), n)


@settings(max_examples=30, deadline=None)
@given(workloads(max_layers=8))
def test_vdnn_sets_are_the_vdnn_policies(workload) -> None:
    """vdnn_sets with look-ahead 1 are exactly policy_plan's 'all' and 'conv' plans."""
    chain = build_chain(workload)
    every, conv = vdnn_sets(chain)
    n = len(chain)
    assert triggers_of(chain, policy_plan(workload, "all")) == lookahead_triggers(n, every, 1)
    assert triggers_of(chain, policy_plan(workload, "conv")) == lookahead_triggers(n, conv, 1)
