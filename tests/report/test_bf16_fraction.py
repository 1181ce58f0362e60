"""``benchmarks/bench_bf16_fraction.py``: its fit and leave-one-out on the bf16 fraction's own grid against the closed
form of linear errors, and which runs the fraction it sets reaches."""

from types import SimpleNamespace

import pytest

from benchmarks.bench_bf16_fraction import CHIP, GRID, error
from benchmarks.bench_fp8_loo import cross_validate
from mcdla.report.llm_validation import FAMILIES, run_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

TARGETS = (0.437, 0.5349, 0.618)


def _nearest(values):
    mean = sum(values) / len(values)
    return min(GRID, key=lambda f: abs(f - mean))


def test_fit_and_leave_one_out_on_the_bf16_grid():
    """With errors ``f - t_i`` the least-RMS point of a set of rows is the grid point nearest the mean of their
    targets, on the 0.40-0.80 grid (below the fp8 grid's 0.60)."""
    runs = [SimpleNamespace(system="gb200-nvl72") for _ in TARGETS]
    errors = [{f: f - t for f in GRID} for t in TARGETS]
    got = cross_validate(runs, errors, lambda run: "all", GRID)
    assert got["fitted"]["all"] == _nearest(TARGETS) == 0.53
    for i, t in enumerate(TARGETS):
        others = TARGETS[:i] + TARGETS[i + 1:]
        assert got["loo_fraction"][i] == _nearest(others)
        assert got["loo"][i] == pytest.approx(_nearest(others) - t)


def _shipped_error(run):
    step = llm_step(preset(run.model), run.execution, run_cluster(run, None), precision=run.precision)
    return step.iteration_s / run.measured_s - 1.0


def test_the_fraction_reaches_the_blackwell_runs_only():
    """At the presets' own figures a run's error is the shipped one; a lower bf16 fraction slows a bf16 run on a
    Blackwell preset and leaves a run on another preset as it is."""
    bf16 = next(r for r in FAMILIES["megatron-bridge-moe"] if r.precision == "bf16")
    a100 = FAMILIES["megatron-a100"][0]
    assert bf16.system in CHIP and a100.system not in CHIP
    shipped = _shipped_error(bf16)
    assert error(bf16, 0.7) == pytest.approx(shipped, rel=1e-12)
    assert error(bf16, 0.6) > shipped
    assert error(a100, 0.6) == pytest.approx(_shipped_error(a100), rel=1e-12)
