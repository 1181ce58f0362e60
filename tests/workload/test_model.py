"""The workload model validates its data and scales with the batch."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import WorkloadError
from mcdla.workload.model import Layer, LayerKind, Workload


def _layer(name="l0", **over):
    base = dict(name=name, kind="conv", fwd_flops=10.0, bwd_flops=20.0, fwd_bytes_moved=8.0, bwd_bytes_moved=16.0,
                param_bytes=4.0, output_bytes=6.0, saved_bytes=5.0, workspace_bytes=1.0)
    base.update(over)
    return Layer(**base)


def test_kind_string_becomes_enum() -> None:
    """A kind given as a string is stored as LayerKind."""
    assert _layer().kind is LayerKind.CONV


@pytest.mark.parametrize(("field", "value"), [("fwd_flops", -1.0), ("saved_bytes", math.inf), ("output_bytes", "x")])
def test_bad_layer_numbers_are_named(field, value) -> None:
    """A negative, infinite or non-numeric quantity names the layer and the field."""
    with pytest.raises(WorkloadError, match=rf"layer 'l0'\.{field}: got"):
        _layer(**{field: value})


def test_unknown_kind_lists_allowed() -> None:
    """An unknown kind lists the allowed kinds."""
    with pytest.raises(WorkloadError, match="must be one of conv, fc"):
        _layer(kind="convolution")


def test_duplicate_and_forward_references_rejected() -> None:
    """Layer names are unique and inputs name earlier layers only."""
    with pytest.raises(WorkloadError, match="duplicate 'l0'"):
        Workload(name="w", batch=1, layers=[_layer(), _layer()])
    with pytest.raises(WorkloadError, match="must name an earlier layer"):
        Workload(name="w", batch=1, layers=[_layer("a", inputs=("b",)), _layer("b")])


def test_footprint_is_static_plus_saved_plus_largest_transient() -> None:
    """footprint = params x (2 + optimizer factor) + all saved bytes + the largest 2 x output + workspace."""
    layers = [_layer("a"), _layer("b", output_bytes=50.0, workspace_bytes=3.0)]
    w = Workload(name="w", batch=2, layers=layers, optimizer_bytes_per_param_byte=2.0)
    assert w.footprint_bytes() == pytest.approx(8 * 4.0 + 10.0 + 103.0)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64))
def test_with_batch_scales_activations_not_params(b0, b1) -> None:
    """with_batch scales FLOPs and activation bytes by b1/b0 and leaves parameters alone."""
    w = Workload(name="w", batch=b0, layers=[_layer()])
    s = w.with_batch(b1)
    factor = b1 / b0
    assert s.fwd_flops == pytest.approx(w.fwd_flops * factor)
    assert s.saved_bytes == pytest.approx(w.saved_bytes * factor)
    assert s.param_bytes == w.param_bytes
    assert s.batch == b1


def test_bad_batch() -> None:
    """A zero batch is rejected with the value."""
    with pytest.raises(WorkloadError, match="batch: got 0"):
        Workload(name="w", batch=1, layers=[_layer()]).with_batch(0)
