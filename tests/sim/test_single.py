"""The planners' single-device view: evaluate_plan, one_device_system, closed forms of one device."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.errors import SimError
from mcdla.hardware import PoolLink, load_system
from mcdla.sim import default_device, evaluate_plan, one_device_system, simulate
from mcdla.workload.plan import Action

from .conftest import chain, links_st, offload_all, plan_of, plans, workloads


def _roofline(flops: float, moved: float, dev) -> float:  # type: ignore[no-untyped-def]
    return max(flops / (dev.peak_flops_per_s["fp16"] * dev.compute_efficiency),
               moved / (dev.hbm_bytes_per_s * dev.memory_efficiency))


def test_no_offload_iteration_is_sum_of_rooflines(v100) -> None:  # type: ignore[no-untyped-def]
    """Without virtualization one device's iteration is the sum of its layers' roofline times."""
    w = chain(6, saved=50e6, fwd_flops=3e10)
    expected = sum(_roofline(l.fwd_flops, l.fwd_bytes_moved, v100) + _roofline(l.bwd_flops, l.bwd_bytes_moved, v100)
                   for l in w.layers)
    r = evaluate_plan(w, plan_of(w), PoolLink.symmetric(16e9))
    assert r.feasible
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert r.compute_s == pytest.approx(expected, rel=1e-12)
    assert r.exposed_virtualization_s == r.exposed_communication_s == r.recompute_s == 0.0


@pytest.mark.parametrize("shared", [False, True])
def test_tiny_link_bounds_iteration_from_below(shared: bool) -> None:
    """Offloading everything over a slow link takes at least (total bytes / bandwidth) per direction used."""
    w = chain(8, saved=40e6)
    bandwidth = 1e8
    r = evaluate_plan(w, offload_all(w), PoolLink.symmetric(bandwidth, shared_direction=shared))
    directions = 2 if shared else 1
    assert r.feasible
    assert r.iteration_time_s >= directions * w.saved_bytes / bandwidth
    assert r.offloaded_bytes == r.prefetched_bytes == w.saved_bytes


@pytest.mark.parametrize("offload_bw,prefetch_bw", [(10e9, 10e9), (4e9, 20e9), (20e9, 4e9)])
def test_one_layer_offload_closed_form(offload_bw: float, prefetch_bw: float, v100) -> None:  # type: ignore[no-untyped-def]
    """One offloaded layer: max(F, S/O + l) + S/P + l + B (prefetch at end of forward, after the offload)."""
    w = chain(1, saved=300e6)
    layer, lat = w.layers[0], 5e-6
    f = _roofline(layer.fwd_flops, layer.fwd_bytes_moved, v100)
    b = _roofline(layer.bwd_flops, layer.bwd_bytes_moved, v100)
    s = layer.saved_bytes
    link = PoolLink(offload_bytes_per_s=offload_bw, prefetch_bytes_per_s=prefetch_bw, latency_s=lat)
    r = evaluate_plan(w, offload_all(w), link)
    assert r.iteration_time_s == pytest.approx(max(f, s / offload_bw + lat) + s / prefetch_bw + lat + b, rel=1e-12)
    assert r.exposed_virtualization_s == pytest.approx(r.iteration_time_s - f - b, rel=1e-9)


def test_prefetch_one_layer_ahead_closed_form(v100) -> None:  # type: ignore[no-untyped-def]
    """Two layers, l0 offloaded: its prefetch is issued with B_1 and starts once the offload is done."""
    w = chain(2, saved=48e6)
    layer, lat, bw = w.layers[0], 1e-6, 16e9
    f = _roofline(layer.fwd_flops, layer.fwd_bytes_moved, v100)
    b = _roofline(layer.bwd_flops, layer.bwd_bytes_moved, v100)
    s = layer.saved_bytes
    offloaded = s / bw + lat
    prefetched = max(2 * f, offloaded) + s / bw + lat
    assert offloaded > 2 * f and prefetched > 2 * f + b  # both waits are exercised
    r = evaluate_plan(w, plan_of(w, {"l0": Action.OFFLOAD}), PoolLink.symmetric(bw, latency_s=lat))
    assert r.iteration_time_s == pytest.approx(max(2 * f + b, prefetched) + b, rel=1e-12)


def test_recompute_segment_closed_form(v100) -> None:  # type: ignore[no-untyped-def]
    """Recomputing l1 and l2 re-runs F_0 and F_1 before B_2; peak memory is static + 5 S (out = S, no workspace)."""
    w = chain(3, saved=100e6, param=0.0)
    plan = plan_of(w, {"l1": Action.RECOMPUTE, "l2": Action.RECOMPUTE})
    layer = w.layers[0]
    f = _roofline(layer.fwd_flops, layer.fwd_bytes_moved, v100)
    b = _roofline(layer.bwd_flops, layer.bwd_bytes_moved, v100)
    r = evaluate_plan(w, plan, PoolLink.symmetric(16e9))
    assert r.recompute_s == pytest.approx(2 * f, rel=1e-12)
    assert r.iteration_time_s == pytest.approx(5 * f + 3 * b, rel=1e-12)
    assert r.peak_device_bytes == pytest.approx(5 * layer.saved_bytes, rel=1e-12)


def test_default_device_is_the_dc_dla_v100() -> None:
    """evaluate_plan's default device has the figures of the dc-dla preset's GPUs."""
    preset = load_system("dc-dla").devices[0]
    mine = default_device()
    for name in ("peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s", "compute_efficiency", "memory_efficiency"):
        assert getattr(mine, name) == getattr(preset, name), name


def test_budget_comes_from_the_plan_unless_given() -> None:
    """The plan's budget is the capacity; an explicit budget_bytes overrides it."""
    w = chain(4, saved=1e9)
    tight = plan_of(w, budget_bytes=2e9)
    link = PoolLink.symmetric(16e9)
    assert not evaluate_plan(w, tight, link).feasible
    assert evaluate_plan(w, tight, link, budget_bytes=20e9).feasible
    with pytest.raises(SimError, match="budget_bytes: got -1"):
        evaluate_plan(w, tight, link, budget_bytes=-1)


def test_asymmetric_link_is_not_a_system() -> None:
    """A link with different offload and prefetch bandwidths cannot become a System (one-line SimError)."""
    link = PoolLink(offload_bytes_per_s=1e9, prefetch_bytes_per_s=2e9)
    with pytest.raises(SimError, match="offload_bytes_per_s 1e\\+09 != prefetch_bytes_per_s 2e\\+09"):
        one_device_system(default_device(), link, 16e9)


@st.composite
def _cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(max_layers=6))
    fraction = draw(st.sampled_from([0.3, 0.6, 0.9, 1.2, math.inf]))
    budget = fraction * w.footprint_bytes() if w.footprint_bytes() > 0 else 1e9
    return w, draw(plans(w, budget_bytes=budget)), draw(links_st)


@pytest.mark.examples(100, 400)
def test_fast_path_equals_general_engine(examples) -> None:  # type: ignore[no-untyped-def]
    """evaluate_plan gives exactly the result of simulate on the equivalent one-device System."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_cases())
    def check(case) -> None:  # type: ignore[no-untyped-def]
        w, plan, link = case
        dev = default_device()
        fast = evaluate_plan(w, plan, link, device=dev)
        general = simulate(one_device_system(dev, link, plan.budget_bytes), w, plan)
        assert dataclasses.replace(fast, stats={}) == dataclasses.replace(general, stats={})

    check()
