"""The leave-one-out cross-validation of ``benchmarks/bench_fp8_loo.py`` against a closed form: with each row's
error linear in the fraction, ``e_i(f) = f - t_i``, the least-RMS grid point of a set of rows is the 0.01 grid
point nearest the mean of their ``t``."""

from types import SimpleNamespace

import pytest

from benchmarks.bench_fp8_loo import GRID, cross_validate, exact_fraction

TARGETS = {"a": (0.702, 0.741, 0.683), "b": (0.853, 0.811), "c": (0.664,)}


def _nearest(values):
    mean = sum(values) / len(values)
    return min(GRID, key=lambda f: abs(f - mean))


def test_in_sample_and_leave_one_out_match_the_closed_form():
    runs = [SimpleNamespace(system=g) for g, ts in TARGETS.items() for _ in ts]
    targets = [t for ts in TARGETS.values() for t in ts]
    errors = [{f: f - t for f in GRID} for t in targets]
    got = cross_validate(runs, errors, lambda run: run.system)
    for group, ts in TARGETS.items():
        assert got["fitted"][group] == _nearest(ts)
    i = 0
    for group, ts in TARGETS.items():
        for j, t in enumerate(ts):
            assert got["in_sample"][i] == pytest.approx(_nearest(ts) - t)
            others = ts[:j] + ts[j + 1:]
            if others:
                assert got["loo_fraction"][i] == _nearest(others)
                assert got["loo"][i] == pytest.approx(_nearest(others) - t)
            else:  # a row alone in its group has no leave-one-out fit
                assert got["loo"][i] is None and got["loo_fraction"][i] is None
            i += 1


def test_exact_fraction_is_the_zero_of_the_error():
    """A row whose error is linear in the fraction is exact at its target; one whose error keeps its sign over the
    grid has none."""
    assert exact_fraction({f: 0.5 * (0.7234 - f) for f in GRID}) == pytest.approx(0.7234)
    assert exact_fraction({f: 1.2 - f for f in GRID}) is None


def test_the_sweep_predicts_with_the_curves_half_tokens():
    """The half_tokens sweep prices a row as llm_step does on its preset with the curve's fraction and half_tokens
    both replaced."""
    import dataclasses

    from benchmarks.bench_fp8_loo import FAMILY, _predict
    from mcdla.report.llm_validation import FAMILIES, run_cluster
    from mcdla.sim.llm import llm_step
    from mcdla.workload.transformer import preset

    run = next(r for r in FAMILIES[FAMILY] if r.execution.tp_comm_overlap)
    cluster = run_cluster(run, None)
    curve = dataclasses.replace(cluster.gemm_efficiency, fp8_fraction=0.8, half_tokens=100.0)
    direct = llm_step(preset(run.model), run.execution, dataclasses.replace(cluster, gemm_efficiency=curve),
                      precision=run.precision).iteration_s
    assert _predict(run, cluster, 0.8, 100.0) == pytest.approx(direct, rel=1e-12)
    assert _predict(run, cluster, 0.8, 100.0) > _predict(run, cluster, 0.8)
