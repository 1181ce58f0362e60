"""``validate_states``: predicted against measured for weights and optimizer state offloaded on a real CPU run."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from mcdla.errors import ConfigError
from mcdla.profile.resolve import ResolvedModel
from mcdla.report._state_rounds import _Rounds
from mcdla.report.validate_states import _scaled_compute, adam_state_per_param_byte, validate_states
from mcdla.runtime import offload_parameters
from mcdla.workload.model import Layer, LayerKind, Workload

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


def test_cpu_sharing_is_the_median_of_each_rounds_stretches() -> None:
    """The (compute, update) stretches are medians over rounds of the same round's ratios, by hand; a ratio
    below 1 (noise) counts as 1, and a round whose background updates never finished one step is skipped."""
    rounds = _Rounds(plain_fb=[1.0, 2.0, 4.0], shared_fb=[1.5, 2.2, 2.0], alone_update=[1.0, 1.0, 2.0],
                     shared_update=[3.0, 0.0, 2.5])
    # compute ratios 1.5, 1.1, 0.5 -> median 1.1; update ratios 3.0, (skipped), 1.25 -> median 2.125
    assert rounds.cpu_sharing() == pytest.approx((1.1, 2.125))
    calm = _Rounds(plain_fb=[2.0], shared_fb=[1.0], alone_update=[2.0], shared_update=[1.0])
    assert calm.cpu_sharing() == (1.0, 1.0)


def test_scaled_compute_keeps_the_split_and_takes_the_total() -> None:
    """Layer times scaled to a measured total: they sum to it and keep their proportions."""
    wl = Workload(name="w", batch=1, layers=tuple(
        Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=f, bwd_time_s=b)
        for i, (f, b) in enumerate(((1.0, 2.0), (3.0, 4.0)))))
    got = _scaled_compute(wl, 5.0)
    assert [t for l in got.layers for t in (l.fwd_time_s, l.bwd_time_s)] == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_scaled_compute_adds_the_offloader_cost_to_each_pass_of_the_hooked_layers() -> None:
    """With a cost per unit and pass: each hooked layer's forward and backward gain it, by hand; the others
    keep their scaled times; the total grows by 2 x cost x hooked layers."""
    wl = Workload(name="w", batch=1, layers=tuple(
        Layer(name=f"l{i}", kind=LayerKind.FC, fwd_flops=0, bwd_flops=0, fwd_time_s=f, bwd_time_s=b)
        for i, (f, b) in enumerate(((1.0, 2.0), (3.0, 4.0)))))
    got = _scaled_compute(wl, 5.0, 0.25, frozenset({"l1"}))
    assert [t for l in got.layers for t in (l.fwd_time_s, l.bwd_time_s)] == pytest.approx([0.5, 1.0, 1.75, 2.25])


def test_offloader_cost_per_unit_pass_is_the_fastest_rounds_difference_less_its_waits() -> None:
    """(fastest offloaded fb - fastest plain fb - smallest wait) over 2 passes x units, by hand; noise below 0
    counts as 0, and no offloaded unit costs nothing."""
    rounds = _Rounds(plain_fb=[1.0, 1.1, 2.0], offloader_fb=[1.6, 1.5, 3.0], offloader_wait=[0.1, 0.3, 0.2])
    # 1.5 - 1.0 - 0.1 = 0.4, over 2 passes x 2 units
    assert rounds.offloader_s_per_unit_pass(2) == pytest.approx(0.1)
    assert rounds.offloader_s_per_unit_pass(0) == 0.0
    faster = _Rounds(plain_fb=[2.0], offloader_fb=[1.0], offloader_wait=[0.0])
    assert faster.offloader_s_per_unit_pass(1) == 0.0


def test_offloader_waits_are_the_compute_threads_seconds_in_fetches() -> None:
    """``wait_s`` counts the seconds the forward + backward spent waiting for fetches: none for a unit
    already resident, and at most the whole forward + backward, measured around it; a fetch slowed on purpose
    (the worker sleeps first) is waited for about as long as it sleeps."""
    model = _mlp(2).model
    x = torch.randn(16, WIDTH)
    holder = offload_parameters(model, "host", prefetch=0)
    try:
        read = holder._read_unit

        def slow(*args: object) -> object:
            time.sleep(0.05)
            return read(*args)

        holder._read_unit = slow  # type: ignore[method-assign]
        holder.reset_report()
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        elapsed = time.perf_counter() - t0
        # prefetch 0: every one of 2 units x 2 passes is fetched on demand and waited for (>= 50 ms each)
        assert holder.fetches_on_demand == 4
        assert 4 * 0.05 <= holder.wait_s <= elapsed
    finally:
        holder.close()


def test_fastest_keeps_each_parts_least_disturbed_round() -> None:
    """Each list becomes its smallest value, by hand; a 0 (background updates that finished no step) is
    passed over for the smallest positive one, and an all-zero or empty list keeps what it has."""
    rounds = _Rounds(plain_fb=[3.0, 1.0, 2.0], shared_update=[0.0, 2.0, 1.5], offloader_wait=[0.0, 0.0],
                     run_step=[5.0, 4.0])
    got = rounds.fastest()
    assert (got.plain_fb, got.shared_update, got.offloader_wait, got.run_step) == ([1.0], [1.5], [0.0], [4.0])
    assert got.alone_update == []
