"""``validate_states``: predicted against measured for weights and optimizer state offloaded on a real CPU run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mcdla.errors import ConfigError
from mcdla.profile.resolve import ResolvedModel
from mcdla.report.validate_states import adam_state_per_param_byte, validate_states

WIDTH = 384


def _mlp(depth: int = 3) -> ResolvedModel:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return ResolvedModel("tiny-mlp", nn.Sequential(*layers), torch.randn(16, WIDTH), lambda out: out.square().mean())


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_peak_weight_bytes_are_exact_and_the_step_within_a_loose_bound(prefetch: int) -> None:
    """The predicted peak resident weight bytes equal the runtime's report and the closed form (the running
    layer and ``prefetch`` ahead, of 3 equal layers); the predicted step is within 10x of the fastest measured
    one (the machine may be shared: the fastest is the least disturbed)."""
    result = validate_states(_mlp(), pool="host", prefetch=prefetch, steps=3, warmup=1, threads=1)
    layer_bytes = (WIDTH * WIDTH + WIDTH) * 4
    assert result.measured_peak_weight_bytes == min(prefetch + 1, 3) * layer_bytes
    assert result.predicted_peak_weight_bytes == result.measured_peak_weight_bytes
    assert result.offloaded_weight_layers == result.offloaded_optimizer_layers == 3
    assert 0.1 < result.predicted_step_s / min(result.measured_step_samples_s) < 10.0
    # the parts are measured in the run: the plain compute and the optimizer worker's updates took time
    assert result.measured_compute_s > 0 and result.measured_update_s > 0
    assert result.prefetch == (prefetch,)


def test_warmup_must_learn_the_order() -> None:
    """warmup=0 raises one-line ConfigError naming it (the first step learns the forward order)."""
    with pytest.raises(ConfigError, match="warmup: got 0"):
        validate_states(_mlp(), warmup=0)


def test_adam_state_per_param_byte_counts_fp32_masters_of_half_parameters() -> None:
    """fp32 parameters: two moments (2 bytes per byte); bf16: fp32 master + two fp32 moments (6 per byte)."""
    assert adam_state_per_param_byte(nn.Linear(8, 8)) == 2.0
    assert adam_state_per_param_byte(nn.Linear(8, 8).to(torch.bfloat16)) == 6.0
