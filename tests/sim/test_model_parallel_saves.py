"""NOTE [model-parallel saved bytes]: what each model-parallel device saves, against hand-computed bytes."""

from __future__ import annotations

import pytest

from mcdla.hardware import load_system
from mcdla.sim import simulate
from mcdla.workload.model import Layer, LayerKind, Workload

from .conftest import offload_all

_MB = 1e6


def _layer(name: str, kind: LayerKind, *, saved: float, output: float) -> Layer:
    return Layer(name=name, kind=kind, fwd_flops=1e9, bwd_flops=2e9, param_bytes=1 * _MB, output_bytes=output,
                 saved_bytes=saved)


def _cnn() -> Workload:
    """conv -> batch-norm -> ReLU -> max-pool -> fc -> loss, saved bytes as the zoo attributes them."""
    return Workload(name="tiny-cnn", batch=8, layers=(
        _layer("conv", LayerKind.CONV, saved=64 * _MB, output=128 * _MB),          # its input image
        _layer("bn", LayerKind.NORM, saved=128 * _MB + 4096, output=128 * _MB),    # conv output + statistics
        _layer("relu", LayerKind.ELEMENTWISE, saved=0.0, output=128 * _MB),        # counted by the pool
        _layer("pool", LayerKind.POOL, saved=128 * _MB, output=32 * _MB),          # its input (y: by fc)
        _layer("fc", LayerKind.FC, saved=32 * _MB, output=1 * _MB),                # the pooled map
        _layer("loss", LayerKind.LOSS, saved=1 * _MB, output=0.0),
    ))


def _lstm_chunk(steps: int, hidden_bytes: float) -> Workload:
    """One LSTM chunk of ``steps`` steps: 7 N x H tensors saved per step; outputs: every h plus the final c."""
    return Workload(name="tiny-lstm", batch=8, layers=(
        _layer("ih", LayerKind.FC, saved=steps * hidden_bytes, output=4 * steps * hidden_bytes),
        _layer("steps.0", LayerKind.RNN_CELL, saved=7 * steps * hidden_bytes, output=(steps + 1) * hidden_bytes),
    ))


def _offloaded_per_device(workload: Workload, parallel: str) -> float:
    system = load_system("mc-dla")
    result = simulate(system, workload, offload_all(workload), parallel=parallel)
    assert result.feasible
    return result.offloaded_bytes / len(system.devices)


def test_model_parallel_devices_save_split_layer_inputs_whole_and_element_wise_slices() -> None:
    """conv and fc keep their whole input on each of the 8 devices; batch-norm, pool and loss keep an eighth."""
    whole = 64 * _MB + 32 * _MB
    sliced = (128 * _MB + 4096) + 128 * _MB + 1 * _MB
    assert _offloaded_per_device(_cnn(), "model") == pytest.approx(whole + sliced / 8, rel=1e-12)


def test_model_parallel_recurrent_chunk_keeps_its_hidden_states_whole() -> None:
    """An LSTM chunk split by hidden units keeps h whole (bounded by its outputs) and 1/8 of c and gates."""
    steps, hidden = 5, 2 * _MB
    expected = steps * hidden + (steps + 1) * hidden + (7 * steps - (steps + 1)) * hidden / 8
    assert _offloaded_per_device(_lstm_chunk(steps, hidden), "model") == pytest.approx(expected, rel=1e-12)


def test_data_parallel_devices_save_everything() -> None:
    """Data-parallel replicas each save every layer's tensors in full."""
    workload = _cnn()
    assert _offloaded_per_device(workload, "data") == pytest.approx(workload.saved_bytes, rel=1e-12)
