"""The simulator's weights, gradients and optimizer state (NOTE [state in the program]): closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import PlanError, SimError
from mcdla.hardware.pool_link import PoolLink
from mcdla.sim import evaluate_plan
from mcdla.sim.program import build_program
from mcdla.sim.single import default_device
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Plan, StateDecision

P = 1e9  # parameter bytes per layer
F_S, B_S = 1.0, 2.0  # measured forward / backward time per layer (s)
R = 2.0  # optimizer bytes per parameter byte (Adam's two moments)


def _workload(n: int) -> Workload:
    layers = tuple(Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=F_S, bwd_time_s=B_S,
                         param_bytes=P, saved_bytes=0, output_bytes=0) for i in range(n))
    return Workload(name="toy", batch=1, layers=layers, optimizer_bytes_per_param_byte=R)


def _plan(wl: Workload, **placements: dict[str, str]) -> Plan:
    state = tuple(StateDecision(layer=name, **where) for name, where in placements.items())
    return Plan(workload=wl.name, batch=1, budget_bytes=math.inf, decisions=(), layer_names=wl.layer_names,
                state=state)


ALL = {"weights": "offload", "gradients": "offload", "optimizer_state": "offload"}


def test_one_layer_offloaded_weights_are_fetched_on_demand_in_forward_and_backward() -> None:
    """One layer with offloaded weights: each fetch (P / bandwidth) is exposed before F and before B."""
    wl = _workload(1)
    bandwidth = 4e9
    r = evaluate_plan(wl, _plan(wl, l0={"weights": "offload"}), PoolLink.symmetric(bandwidth))
    fetch = P / bandwidth
    assert r.iteration_time_s == pytest.approx(fetch + F_S + fetch + B_S)
    assert r.exposed_virtualization_s == pytest.approx(2 * fetch)
    assert r.peak_device_bytes == pytest.approx(P * (1 + R) + P)  # gradient + state resident, weights while used


def test_two_layers_fast_link_hides_the_prefetch_and_exposes_the_first_fetches() -> None:
    """Two layers, everything offloaded, fetch shorter than a layer: the first fetch of each pass, the last
    gradient's copy out and step()'s two writes of the new weights into the pool are exposed; the device holds at
    most two layers' weights plus a gradient."""
    wl = _workload(2)
    bandwidth = 2e9
    fetch = P / bandwidth  # 0.5 s < F_S < B_S
    r = evaluate_plan(wl, _plan(wl, l0=ALL, l1=ALL), PoolLink.symmetric(bandwidth))
    # forward: fetch l0 | F0 (fetch l1 under it) | F1; backward: fetch l1 | B1 (fetch l0 under it) | B0 | copy out
    # | step(): write l1 | write l0
    assert r.iteration_time_s == pytest.approx(fetch + 2 * F_S + fetch + 2 * B_S + fetch + 2 * fetch)
    assert r.exposed_virtualization_s == pytest.approx(5 * fetch)
    assert r.peak_device_bytes == pytest.approx(3 * P)  # B1: its weights, its gradient, l0's prefetched weights


def test_two_layers_slow_link_exposes_every_fetch() -> None:
    """Two layers, everything offloaded, fetch (3 s) longer than any layer: the event times by hand."""
    wl = _workload(2)
    bandwidth = P / 3.0
    r = evaluate_plan(wl, _plan(wl, l0=ALL, l1=ALL), PoolLink.symmetric(bandwidth))
    # fetch l0 0-3, F0 3-4, fetch l1 3-6, F1 6-7; fetch l1 7-10, B1 10-12, fetch l0 10-13, B0 13-15;
    # gradient l1 out 12-15, gradient l0 out 15-18 (the offload route is idle until then); step(): new weights
    # written into the pool 18-21 (l1), 21-24 (l0)
    assert r.iteration_time_s == pytest.approx(24.0)
    assert r.compute_s == pytest.approx(2 * F_S + 2 * B_S)


def test_prefetch_depth_zero_fetches_every_layer_on_demand() -> None:
    """Prefetch 0: with weights offloaded, every layer's fetch is exposed (2 layers x 2 passes)."""
    wl = _workload(2)
    plan = _plan(wl, l0={"weights": "offload", "prefetch": 0}, l1={"weights": "offload", "prefetch": 0})
    program = build_program(wl, plan, default_device(), model_parallel=False, n_devices=1, bucket_bytes=1e9)
    assert [op.start_fetch for op in program.ops] == [(), (), (), ()]
    assert [len(op.reach_fetch) for op in program.ops] == [1, 1, 1, 1]
    assert program.static_bytes == pytest.approx(2 * P * (1 + R))


def test_prefetch_depth_zero_exposes_every_fetch_in_the_engine() -> None:
    """Prefetch 0, two layers' weights offloaded: four fetches on the critical path."""
    wl = _workload(2)
    bandwidth = 2e9
    plan = _plan(wl, l0={"weights": "offload", "prefetch": 0}, l1={"weights": "offload", "prefetch": 0})
    r = evaluate_plan(wl, plan, PoolLink.symmetric(bandwidth))
    assert r.iteration_time_s == pytest.approx(4 * P / bandwidth + 2 * F_S + 2 * B_S)


def test_optimizer_offload_copies_gradients_out_and_parameters_back() -> None:
    """Optimizer state offloaded, weights and gradients kept: each gradient leaves after its backward (l1's under
    B0, l0's exposed), and step() copies both new values back one after another: three moves exposed; the
    device holds weights + gradients."""
    wl = _workload(2)
    bandwidth = 4e9
    where = {"optimizer_state": "offload"}
    r = evaluate_plan(wl, _plan(wl, l0=where, l1=where), PoolLink.symmetric(bandwidth))
    move = P / bandwidth
    assert r.iteration_time_s == pytest.approx(2 * F_S + 2 * B_S + 3 * move)
    assert r.peak_device_bytes == pytest.approx(2 * 2 * P)


def test_gradients_without_optimizer_state_are_refused() -> None:
    """A plan offloading a gradient but not its optimizer state raises one-line PlanError naming the field."""
    wl = _workload(1)
    with pytest.raises(PlanError, match=r"l0'\.gradients"):
        evaluate_plan(wl, _plan(wl, l0={"gradients": "offload"}), PoolLink.symmetric(1e9))


def test_state_for_an_unknown_layer_is_refused() -> None:
    """A state entry naming no layer of the workload raises PlanError."""
    wl = _workload(1)
    plan = Plan(workload="toy", batch=1, budget_bytes=math.inf, decisions=(), state=(StateDecision(layer="x"),))
    with pytest.raises(PlanError, match="'x'"):
        evaluate_plan(wl, plan, PoolLink.symmetric(1e9))


def test_cpu_updates_run_one_at_a_time_after_each_gradient_leaves() -> None:
    """Optimizer state offloaded with a CPU update of 3 s per layer (longer than a backward): the second
    update waits for the first; by hand: out 4-4.25, update 4.25-7.25; B0 ends 6, out 6-6.25, update
    7.25-10.25; step() copies l1's value in 10.25-10.5, l0's 10.5-10.75."""
    wl = _workload(2)
    where = {"optimizer_state": "offload"}
    r = evaluate_plan(wl, _plan(wl, l0=where, l1=where), PoolLink.symmetric(4e9), update_s_per_param_byte=3.0 / P)
    assert r.iteration_time_s == pytest.approx(10.75)
    assert r.exposed_virtualization_s == pytest.approx(10.75 - 2 * F_S - 2 * B_S)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.booleans(), st.booleans()), min_size=1, max_size=4),
       st.sampled_from((0.5e9, 2e9, 8e9)), st.integers(0, 2))
def test_the_step_covers_compute_and_every_byte_on_the_prefetch_route(layers, bandwidth, prefetch) -> None:
    """Any placement: the step is at least the compute, and at least every byte crossing the prefetch route
    (two fetches per offloaded weight, one parameter back per update of a device-resident weight) at its rate."""
    wl = Workload(name="toy", batch=1, optimizer_bytes_per_param_byte=R, layers=tuple(
        Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=F_S, bwd_time_s=B_S,
              param_bytes=p * 1e8, saved_bytes=0, output_bytes=0) for i, (p, _, _) in enumerate(layers)))
    where = {f"l{i}": {"weights": "offload" if w else "device", "optimizer_state": "offload" if o else "device",
                       "prefetch": prefetch} for i, (_, w, o) in enumerate(layers)}
    r = evaluate_plan(wl, _plan(wl, **where), PoolLink.symmetric(bandwidth))
    h2d = sum(p * 1e8 * (2 * w + (o and not w)) for p, w, o in layers)
    assert r.iteration_time_s >= len(layers) * (F_S + B_S) * (1 - 1e-12)
    assert r.iteration_time_s >= h2d / bandwidth * (1 - 1e-12)


def test_host_peak_counts_weights_and_optimizer_state_held_in_the_pool() -> None:
    """Two layers, everything offloaded, instant updates: the pool holds both layers' weights (P each) and
    optimizer state (R * P each) throughout, plus P per layer from its gradient's copy out (l1's at 4.5 s, l0's at
    6.5 s) until step() wrote its new weights (from 7.5 s): peak 2P(1 + R) + 2P, by hand; the pool's timeline
    starts at 2P(1 + R) and ends there."""
    wl = _workload(2)
    plan = _plan(wl, l0=ALL, l1=ALL)
    r = evaluate_plan(wl, plan, PoolLink.symmetric(4e9))
    assert r.peak_bytes_by_tier["host"] == pytest.approx(2 * P * (1 + R) + 2 * P)
    from mcdla.sim import one_device_system, simulate

    timed = simulate(one_device_system(default_device(), PoolLink.symmetric(4e9), math.inf), wl, plan,
                     record_timeline=True)
    assert timed.memory_timeline["host"][0] == (0.0, pytest.approx(2 * P * (1 + R)))
    assert max(b for _, b in timed.memory_timeline["host"]) == pytest.approx(2 * P * (1 + R) + 2 * P)
    assert timed.memory_timeline["host"][-1][1] == pytest.approx(2 * P * (1 + R))


def test_host_peak_counts_gradients_waiting_for_slow_updates() -> None:
    """Optimizer state offloaded (weights kept) with 3 s CPU updates: l1's gradient is held 4-7.25 s, l0's from
    6 s (NOTE [state in the program]), so both overlap: peak 2 R P + 2P, by hand."""
    wl = _workload(2)
    where = {"optimizer_state": "offload"}
    r = evaluate_plan(wl, _plan(wl, l0=where, l1=where), PoolLink.symmetric(4e9), update_s_per_param_byte=3.0 / P)
    assert r.peak_bytes_by_tier["host"] == pytest.approx(2 * R * P + 2 * P)


def test_host_peak_without_state_is_the_activations_alone() -> None:
    """A plan without state entries offloading one layer's saved bytes: the pool peak is those bytes only."""
    layers = tuple(Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=F_S,
                         bwd_time_s=B_S, param_bytes=P, saved_bytes=3e8, output_bytes=0) for i in range(2))
    wl = Workload(name="toy", batch=1, layers=layers, optimizer_bytes_per_param_byte=R)
    plan = Plan.from_actions(workload="toy", batch=1, layer_names=wl.layer_names, actions={"l0": "offload"})
    r = evaluate_plan(wl, plan, PoolLink.symmetric(4e9))
    assert r.peak_bytes_by_tier["host"] == pytest.approx(3e8)


def test_cpu_sharing_stretches_the_backward_and_the_update_they_overlap() -> None:
    """NOTE [CPU sharing] with (compute, update) stretches (2, 1.5), the two-layer case above by hand: B0 runs
    4-4.25 alone; l1's update starts 4.25 and both share the CPU: B0's 1.75 s left take 3.5 s (ends 7.75), by
    then the update has done 3.5 / 1.5 = 2.333 s of its 3 and finishes the rest alone 7.75-8.4167; l0's
    gradient is out 7.75-8.0, its update runs alone 8.4167-11.4167; step() copies in 11.4167-11.9167."""
    wl = _workload(2)
    where = {"optimizer_state": "offload"}
    r = evaluate_plan(wl, _plan(wl, l0=where, l1=where), PoolLink.symmetric(4e9), update_s_per_param_byte=3.0 / P,
                      cpu_sharing=(2.0, 1.5))
    done_in_overlap = 3.5 / 1.5
    end = 7.75 + (3.0 - done_in_overlap) + 3.0 + 2 * 0.25
    assert r.iteration_time_s == pytest.approx(end)
    assert r.compute_s == pytest.approx(2 * F_S + 2 * B_S)  # the stretch is exposed, not compute
    assert r.exposed_virtualization_s == pytest.approx(end - 2 * F_S - 2 * B_S)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.floats(0.1, 4.0), st.floats(1.0, 3.0), st.floats(1.0, 3.0))
def test_cpu_sharing_lies_between_a_spare_core_and_one_core(layers, update_s, c, u) -> None:
    """Any stretches: the step is at least the one with a spare core for the updates (1, 1); and when sharing
    gets at least one core's work done (1/c + 1/u >= 1), at most the serial sum (compute, every move, every
    update one after another), which a slower sharing can exceed."""
    wl = _workload(layers)
    plan = _plan(wl, **{f"l{i}": {"optimizer_state": "offload"} for i in range(layers)})
    link = PoolLink.symmetric(4e9)
    spare = evaluate_plan(wl, plan, link, update_s_per_param_byte=update_s / P).iteration_time_s
    shared = evaluate_plan(wl, plan, link, update_s_per_param_byte=update_s / P, cpu_sharing=(c, u)).iteration_time_s
    serial = layers * (F_S + B_S) + layers * (update_s + 2 * P / 4e9)
    assert shared >= spare - 1e-9
    if 1 / c + 1 / u >= 1:
        assert shared <= serial + 1e-9


def test_cpu_sharing_below_one_is_refused() -> None:
    """A stretch below 1 (a CPU faster with company) raises SimError naming the entry."""
    wl = _workload(1)
    with pytest.raises(SimError, match=r"cpu_sharing\[1\]"):
        evaluate_plan(wl, _plan(wl, l0={"optimizer_state": "offload"}), PoolLink.symmetric(1e9),
                      update_s_per_param_byte=1.0 / P, cpu_sharing=(1.0, 0.5))


def test_cpu_sharing_stretches_compute_beside_a_weight_fetch() -> None:
    """NOTE [CPU sharing], compute stretch 2, weights of two layers offloaded (prefetch 1, fetch 0.25 s), no
    optimizer offload; by hand: l0 on demand 0-0.25; F0 from 0.25 beside l1's fetch (0.25-0.5) does 0.125 s of
    work there and ends 1.375; F1 1.375-2.375; l1 on demand for backward 2.375-2.625; B1 beside l0's fetch
    (2.625-2.875) ends 2.625 + 0.25 + 1.875 = 4.75; B0 4.75-6.75. Without sharing: 6.5."""
    wl = _workload(2)
    weights = {"weights": "offload"}
    plan = _plan(wl, l0=weights, l1=weights)
    link = PoolLink.symmetric(4e9)
    assert evaluate_plan(wl, plan, link).iteration_time_s == pytest.approx(6.5)
    r = evaluate_plan(wl, plan, link, cpu_sharing=(2.0, 1.0))
    assert r.iteration_time_s == pytest.approx(6.75)
    assert r.compute_s == pytest.approx(2 * F_S + 2 * B_S)
