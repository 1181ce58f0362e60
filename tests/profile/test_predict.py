"""mcdla.profile.predict: measured times in the engine, per-storage latency, budgets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.hardware import PoolLink
from mcdla.profile.predict import per_storage_link, time_device, timed_view
from mcdla.sim import roofline_s
from mcdla.workload.model import Layer, LayerKind, Workload


def _workload(saved: list[float], times: list[tuple[float, float]]) -> Workload:
    layers = [
        Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=1e9, bwd_flops=2e9, fwd_bytes_moved=1e6, saved_bytes=s,
              param_bytes=4e3, output_bytes=1e3, fwd_time_s=f, bwd_time_s=b)
        for i, (s, (f, b)) in enumerate(zip(saved, times))
    ]
    return Workload(name="w", batch=1, layers=tuple(layers), precision="fp32")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0)), min_size=1, max_size=6))
def test_engine_roofline_returns_the_measured_times(times: list[tuple[float, float]]) -> None:
    """On the timing device, every layer's roofline time is its measured forward / backward time."""
    w = timed_view(_workload([1e6] * len(times), times), saved_only=False)
    dev = time_device("fp32")
    for layer, (f, b) in zip(w.layers, times):
        assert roofline_s(layer.fwd_flops, layer.fwd_bytes_moved, dev, "fp32") == pytest.approx(f, rel=1e-12)
        assert roofline_s(layer.bwd_flops, layer.bwd_bytes_moved, dev, "fp32") == pytest.approx(b, rel=1e-12)


def test_saved_only_view_keeps_only_saved_bytes() -> None:
    """The prediction view has no weights, outputs or workspace, so device bytes are saved bytes."""
    w = timed_view(_workload([5e6, 7e6], [(1e-3, 2e-3)] * 2), saved_only=True)
    assert w.static_bytes == 0 and all(l.output_bytes == 0 and l.workspace_bytes == 0 for l in w.layers)
    assert w.saved_bytes == 12e6


def test_per_storage_latency_is_folded_into_bandwidth() -> None:
    """Ten storages in two layers: two latencies plus all bytes at the folded bandwidth take exactly as long
    as ten latencies plus all bytes at the probed bandwidth."""
    link = PoolLink(offload_bytes_per_s=2e9, prefetch_bytes_per_s=4e9, latency_s=1e-4)
    w = _workload([3e6, 5e6, 0.0], [(1e-3, 1e-3)] * 3)
    folded = per_storage_link(link, w, {"l0": 4, "l1": 6, "l2": 0})
    total = 8e6
    for probed_bw, new_bw in ((2e9, folded.offload_bytes_per_s), (4e9, folded.prefetch_bytes_per_s)):
        assert 2 * 1e-4 + total / new_bw == pytest.approx(10 * 1e-4 + total / probed_bw, rel=1e-12)
    assert folded.latency_s == link.latency_s


def test_one_storage_per_layer_leaves_the_link_alone() -> None:
    """With one storage per saving layer there is nothing to fold."""
    link = PoolLink.symmetric(1e9, latency_s=1e-4)
    assert per_storage_link(link, _workload([1e6, 2e6], [(1e-3, 1e-3)] * 2), {"l0": 1, "l1": 1}) == link


def test_copies_are_charged_to_the_writer_forward_and_the_prefetching_backward() -> None:
    """An offloaded layer's forward pays saved_bytes x cost for its write; the backward named by prefetch_at
    pays it for the read; nothing else changes."""
    from mcdla.profile.predict import charge_copies
    from mcdla.workload.plan import Action, Decision, Plan

    w = _workload([4e6, 2e6, 1e6], [(1e-3, 2e-3)] * 3)
    plan = Plan(workload="w", batch=1, budget_bytes=1e9, layer_names=w.layer_names,
                decisions=(Decision(layer="l0", action=Action.OFFLOAD, prefetch_at="l1"),
                           Decision(layer="l2", action=Action.OFFLOAD)))
    charged = charge_copies(w, plan, 1e-9)
    f = {l.name: l.fwd_time_s for l in charged.layers}
    b = {l.name: l.bwd_time_s for l in charged.layers}
    assert f == pytest.approx({"l0": 1e-3 + 4e-3, "l1": 1e-3, "l2": 1e-3 + 1e-3})
    assert b == pytest.approx({"l0": 2e-3, "l1": 2e-3 + 4e-3, "l2": 2e-3 + 1e-3})
    assert charge_copies(w, plan, 0.0) is w


def test_run_plan_budget_is_the_budget_less_static_bytes() -> None:
    """executable_plan gives the runtime and the engine the saved-bytes share of the plan's budget: the
    budget less weights, gradients and optimizer state (NOTE [what is predicted]); unlimited stays so, and a
    budget below the static bytes is a one-line PlanError."""
    import math

    from mcdla.errors import PlanError
    from mcdla.profile.predict import executable_plan
    from mcdla.workload.plan import Plan

    w = _workload([4e6, 2e6], [(1e-3, 1e-3)] * 2)
    static = 2 * 4e3 * 3  # two layers of 4 kB parameters: weights, gradients, one optimizer state (momentum)
    assert w.static_bytes == pytest.approx(static)
    for budget, share in ((1e7, 1e7 - static), (math.inf, math.inf)):
        plan = Plan.from_actions(workload="w", batch=1, layer_names=w.layer_names, actions={"l0": "offload"},
                                 budget_bytes=budget)
        run, _ = executable_plan(plan, w, w.layer_names)
        assert run.saved_cap_bytes == pytest.approx(share)
        assert run.budget_bytes == budget  # the device budget stays (NOTE [plan budgets])
    tight = Plan.from_actions(workload="w", batch=1, layer_names=w.layer_names, actions={}, budget_bytes=static)
    with pytest.raises(PlanError, match="static bytes") as info:
        executable_plan(tight, w, w.layer_names)
    assert "\n" not in str(info.value)


def test_prediction_stalls_under_the_run_plan_budget() -> None:
    """Two layers of S bytes, both offloaded over a link that needs T = S / bandwidth > f (a forward): with a
    cap of 1.5 S the second forward waits for the first offload (predicted wait >= T - f, peak <= 1.5 S);
    with no cap both are resident at once."""
    import math

    from mcdla.profile.predict import predict
    from mcdla.workload.plan import Plan

    s, f, bw = 8e6, 1e-3, 2e9  # T = 4 ms
    w = _workload([s, s], [(f, f)] * 2)
    link = PoolLink.symmetric(bw)

    def run(cap: float):  # noqa: ANN202
        plan = Plan.from_actions(workload="w", batch=1, layer_names=w.layer_names,
                                 actions={"l0": "offload", "l1": "offload"}, budget_bytes=cap)
        return predict(w, plan, link)

    capped, free = run(1.5 * s), run(math.inf)
    assert capped.peak_saved_bytes <= 1.5 * s and free.peak_saved_bytes == pytest.approx(2 * s)
    assert capped.wait_s >= s / bw - f - 1e-12
    assert capped.step_s >= free.step_s
