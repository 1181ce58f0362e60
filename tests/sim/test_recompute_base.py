"""NOTE [recompute base]: a layer that stashes nothing cannot be the checkpoint of a recomputation."""

import dataclasses
import math

import pytest

from mcdla.hardware.pool_link import PoolLink
from mcdla.sim import evaluate_plan
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action

from .conftest import device, plan_of


def _conv_relu_conv() -> Workload:
    def layer(name, kind, flops, saved):
        return Layer(name=name, kind=kind, fwd_flops=flops, bwd_flops=2 * flops, param_bytes=1e6,
                     output_bytes=50e6, saved_bytes=saved)
    return Workload(name="crc", batch=8, layers=(
        layer("conv1", LayerKind.CONV, 4e11, 50e6),
        layer("relu1", LayerKind.ELEMENTWISE, 1e9, 0.0),  # its output is counted as conv2's saved input
        layer("conv2", LayerKind.CONV, 2e11, 50e6),
    ))


def test_recomputing_past_a_zero_byte_layer_reruns_the_layer_that_holds_an_input() -> None:
    """Recomputing conv2's input re-runs conv1 and relu1 (relu1 holds nothing), not relu1 alone."""
    w = _conv_relu_conv()
    dev = device()
    link = PoolLink.symmetric(math.inf)
    keep = evaluate_plan(w, plan_of(w), link, device=dev, budget_bytes=math.inf)
    rec = evaluate_plan(w, plan_of(w, {"conv2": Action.RECOMPUTE}), link, device=dev, budget_bytes=math.inf)
    rate = dev.flops_per_s("fp16") * dev.compute_efficiency
    expected_extra = (4e11 + 1e9) / rate  # F_conv1 + F_relu1, roofline is compute-bound here
    assert rec.recompute_s == pytest.approx(expected_extra, rel=1e-9)
    assert rec.iteration_time_s == pytest.approx(keep.iteration_time_s + expected_extra, rel=1e-9)


def test_a_layer_that_stashes_something_is_a_checkpoint() -> None:
    """When relu1 does stash its input, recomputing conv2's input re-runs relu1 only."""
    w = _conv_relu_conv()
    w = w.with_layers([w.layers[0], dataclasses.replace(w.layers[1], saved_bytes=50e6), w.layers[2]])
    dev = device()
    rec = evaluate_plan(w, plan_of(w, {"conv2": Action.RECOMPUTE}), PoolLink.symmetric(math.inf), device=dev,
                        budget_bytes=math.inf)
    assert rec.recompute_s == pytest.approx(1e9 / (dev.flops_per_s("fp16") * dev.compute_efficiency), rel=1e-9)
