"""The baselines: vDNN's dynamic cascade and the TFLMS threshold policy."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.plan.baselines import plan_tflms, plan_vdnn_dyn
from mcdla.plan.chain import triggers_of
from mcdla.plan.policies import policy_plan

from .conftest import links, peak, problem, workloads


@settings(max_examples=25, deadline=None)
@given(workloads(max_layers=6), links(), st.floats(0.3, 1.0))
def test_vdnn_dyn_takes_the_first_policy_that_fits(workload, link, fraction) -> None:
    """vdnn-dyn's plan behaves like the first of none, conv, all that the engine can run in the budget."""
    p = problem(workload, link, peak(workload) * fraction)
    plan = plan_vdnn_dyn(p)
    scores = [p.score(policy_plan(workload, policy, p.budget_bytes)) for policy in ("none", "conv", "all")]
    first = next((s for s in scores if math.isfinite(s)), math.inf)
    assert (p.score(plan) if plan is not None else math.inf) == first


@settings(max_examples=25, deadline=None)
@given(workloads(max_layers=6), links(), st.floats(0.3, 1.0))
def test_tflms_offloads_a_prefix_with_one_lookahead(workload, link, fraction) -> None:
    """tflms offloads the layers farthest from their backward (a prefix) with one uniform look-ahead."""
    p = problem(workload, link, peak(workload) * fraction)
    plan = plan_tflms(p)
    if plan is None:
        return
    chain = p.chain
    triggers = triggers_of(chain, plan)
    offloaded = sorted(triggers)
    assert offloaded == [i for i in chain.offloadable if offloaded and i <= offloaded[-1]]
    n = len(chain)
    aheads = {min(k, n - 1) - i for i, k in triggers.items() if i < n - 1 and k < n - 1}
    assert len(aheads) <= 1
