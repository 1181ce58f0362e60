"""The profiler measures the torch zoo as the analytical zoo predicts: FLOPs and saved bytes within 1%."""

from __future__ import annotations

import pytest

from mcdla.profile import models, profile
from mcdla.workload import zoo


@pytest.mark.parametrize("name", zoo.names())
def test_profile_matches_the_analytical_zoo(name: str) -> None:
    """Per layer, profiled forward/backward FLOPs and saved bytes are within 1% of the analytical model's,
    for the same layer names in the same order (the loss is not a zoo layer)."""
    scale = zoo.small_scale(name)
    batch = scale.pop("batch", None)
    model, inputs, loss_fn = models.build(name, batch=batch, **scale)
    measured = profile(model, inputs, loss_fn, warmup_steps=0, measured_steps=1, name=name,
                       shared_storage_owner="last")  # the zoo's rule
    analytical = zoo.build(name, batch=batch, precision="fp32", **scale)
    assert [n for n in measured.layer_names if n != "(loss)"] == list(analytical.layer_names)
    for want in analytical.layers:
        got = measured.layers[measured.index_of(want.name)]
        for field in ("fwd_flops", "bwd_flops", "saved_bytes", "param_bytes"):
            a, b = getattr(got, field), getattr(want, field)
            assert a == pytest.approx(b, rel=0.01, abs=1.0), f"{name} {want.name}.{field}: profiled {a}, zoo {b}"
