"""A plan's per-module weight prefetch depth (``StateDecision.prefetch``) drives the simulator and the runtime
alike: the simulated peak of resident offloaded weights and ``offload_parameters(plan=...)``'s measured peak both
equal the window computed by hand from the model's parameter sizes."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
from torch import nn

from mcdla.errors import ConfigError
from mcdla.hardware.pool_link import PoolLink
from mcdla.profile.predict import predict_states
from mcdla.runtime import offload_parameters
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Plan, StateDecision

SIZES = [(24, 40), (40, 56), (56, 16), (16, 8)]  # distinct layer sizes: a wrong window shows
NAMES = [str(2 * i) for i in range(len(SIZES))]  # the Linears' names in the Sequential (ReLUs between)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for n_in, n_out in SIZES:
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _layer_bytes() -> list[int]:
    return [4 * (n_in * n_out + n_out) for n_in, n_out in SIZES]


def _workload() -> Workload:
    layers = tuple(Layer(name=name, kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=1e-3, bwd_time_s=2e-3,
                         param_bytes=float(b), saved_bytes=0, output_bytes=0)
                   for name, b in zip(NAMES, _layer_bytes()))
    return Workload(name="mlp", batch=1, layers=layers, optimizer_bytes_per_param_byte=2.0)


def _plan(depths: list[int]) -> Plan:
    return Plan(workload="mlp", batch=1, budget_bytes=math.inf, decisions=(), layer_names=tuple(NAMES),
                state=tuple(StateDecision(layer=n, weights="offload", prefetch=k) for n, k in zip(NAMES, depths)))


def _measured_peak(plan: Plan) -> int:
    """The runtime's peak over the second step (the first learns the forward order)."""
    model = _model()
    x = torch.randn(4, SIZES[0][0])
    with offload_parameters(model, pool="host", plan=plan) as params:
        model(x).square().mean().backward()
        params.reset_report()
        model(x).square().mean().backward()
        return params.peak_resident_bytes


def _uniform_window(k: int) -> int:
    sizes = _layer_bytes()
    return max(sum(sizes[i:i + k + 1]) for i in range(len(sizes)))


@pytest.mark.parametrize(("depths", "want"), [
    ([0] * 4, _uniform_window(0)),
    ([1] * 4, _uniform_window(1)),
    ([2] * 4, _uniform_window(2)),
    # the first layer fetches the next two, the others nothing ahead: layers 0-2 together, by hand
    ([2, 0, 0, 0], sum(_layer_bytes()[:3])),
])
def test_simulated_and_measured_peak_equal_the_hand_window(depths: list[int], want: int) -> None:
    """Each plan depth: the simulator's peak offloaded-weight bytes and the runtime's both equal ``want``."""
    plan = _plan(depths)
    predicted = predict_states(_workload(), plan, PoolLink.symmetric(1e9)).peak_weight_bytes
    assert predicted == pytest.approx(want, rel=1e-12)
    assert _measured_peak(plan) == want


def test_prefetch_with_a_plan_is_refused() -> None:
    """The depth has one source: prefetch= together with plan= raises one-line ConfigError naming prefetch."""
    with pytest.raises(ConfigError, match=r"offload_parameters\.prefetch: got 2 with plan="):
        offload_parameters(_model(), pool="host", prefetch=2, plan=_plan([1] * 4))


def test_plan_file_round_trip_keeps_the_depth(tmp_path) -> None:
    """Saved and loaded, a plan keeps each entry's depth."""
    plan = _plan([2, 0, 1, 3])
    plan.save(tmp_path / "p.json")
    assert [sd.prefetch for sd in Plan.load(tmp_path / "p.json").state] == [2, 0, 1, 3]


def test_prediction_parts_by_hand() -> None:
    """The prediction's parts on the hand workload (every weight and optimizer state offloaded): compute is the
    layers' forward + backward times, updates the parameter bytes times the rate, copies two fetches per layer,
    a gradient out and the new weight written into the pool (latency each), and the serial bound their sum."""
    link = PoolLink(offload_bytes_per_s=2e9, prefetch_bytes_per_s=1e9, latency_s=1e-5, source="test")
    wl = _workload()
    plan = Plan(workload="mlp", batch=1, budget_bytes=math.inf, decisions=(), layer_names=tuple(NAMES),
                state=tuple(StateDecision(layer=n, weights="offload", gradients="offload", optimizer_state="offload")
                            for n in NAMES))
    rate = 1e-9
    got = predict_states(wl, plan, link, update_s_per_param_byte=rate)
    sizes = _layer_bytes()
    assert got.compute_s == pytest.approx(len(sizes) * 3e-3)
    assert got.update_s == pytest.approx(sum(sizes) * rate)
    assert got.fetch_s == pytest.approx(sum(2 * (1e-5 + b / 1e9) for b in sizes))
    assert got.gradient_out_s == pytest.approx(sum(1e-5 + b / 2e9 for b in sizes))
    assert got.copy_in_s == pytest.approx(sum(1e-5 + b / 2e9 for b in sizes))  # written into the pool
    assert got.serial_step_s == pytest.approx(got.compute_s + got.update_s + got.copy_s)


def test_kept_state_updates_and_their_gather_add_to_the_step_by_hand() -> None:
    """Weights offloaded, optimizer state kept on the device for the first layer only: step() updates it at the
    device rate after the engine's step, gathering every offloaded weight (one fetch each) and writing the
    updated one back; nothing is added when the kept layers' weights stay on the device."""
    link = PoolLink(offload_bytes_per_s=2e9, prefetch_bytes_per_s=1e9, latency_s=1e-5, source="test")
    wl = _workload()
    sizes = _layer_bytes()
    first, rest = NAMES[0], NAMES[1:]
    all_off = {"weights": "offload", "gradients": "offload", "optimizer_state": "offload"}
    state = (StateDecision(layer=first, weights="offload"),
             *(StateDecision(layer=n, **all_off) for n in rest))
    plan = Plan(workload="mlp", batch=1, budget_bytes=math.inf, decisions=(), layer_names=tuple(NAMES), state=state)
    device_rate = 2e-9
    base = predict_states(wl, plan, link, update_s_per_param_byte=1e-9)
    got = predict_states(wl, plan, link, update_s_per_param_byte=1e-9, device_update_s_per_param_byte=device_rate)
    gather = sum(1e-5 + b / 1e9 for b in sizes) + (1e-5 + sizes[0] / 2e9)
    assert base.kept_update_s == pytest.approx(gather)  # no device rate given: the gather alone
    assert got.kept_update_s == pytest.approx(gather + sizes[0] * device_rate)
    assert got.step_s - base.step_s == pytest.approx(sizes[0] * device_rate)
    kept_weights = (StateDecision(layer=first), *state[1:])
    plain = dataclasses.replace(plan, state=kept_weights)
    assert predict_states(wl, plain, link, device_update_s_per_param_byte=device_rate).kept_update_s == \
        pytest.approx(sizes[0] * device_rate)


def test_fetch_seconds_are_the_workers_within_the_step() -> None:
    """fetch_s: the worker's reading time of a step is positive, at most the step's wall time, and reset."""
    model = _model()
    x = torch.randn(4, SIZES[0][0])
    with offload_parameters(model, pool="host") as params:
        params.reset_report()
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        wall = time.perf_counter() - t0
        assert 0 < params.fetch_s <= wall
        params.reset_report()
        assert params.fetch_s == 0.0
