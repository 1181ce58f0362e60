"""Property: iteration time never increases when a bandwidth or a compute rate increases."""

from __future__ import annotations

import dataclasses
import functools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.hardware import LinkKind, PoolLink, System, load_system
from mcdla.sim import default_device, evaluate_plan, simulate

from .conftest import links_st, plans, ring_system, workloads

FASTER = st.sampled_from([1.25, 2.0, 10.0])


def _no_slower(slow, fast) -> None:  # type: ignore[no-untyped-def]
    if slow.feasible:
        assert fast.feasible, fast.infeasible_reason
        assert fast.iteration_time_s <= slow.iteration_time_s * (1 + 1e-9)


@st.composite
def _single_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(max_layers=6))
    fraction = draw(st.sampled_from([0.5, 0.8, 1.0, math.inf]))
    budget = math.inf if math.isinf(fraction) else max(fraction * w.footprint_bytes(), 1e6)
    return w, draw(plans(w, budget_bytes=budget)), draw(links_st), draw(FASTER), draw(st.sampled_from(
        ["offload", "prefetch", "both", "compute"]))


def _faster_link(link: PoolLink, what: str, factor: float) -> PoolLink:
    off = link.offload_bytes_per_s * (factor if what in ("offload", "both") else 1.0)
    pre = link.prefetch_bytes_per_s * (factor if what in ("prefetch", "both") else 1.0)
    return dataclasses.replace(link, offload_bytes_per_s=off, prefetch_bytes_per_s=pre)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_single_cases())
def test_single_device_is_monotone(case) -> None:  # type: ignore[no-untyped-def]
    """One device: a faster pool link (either direction) or faster compute never slows the iteration."""
    w, plan, link, factor, what = case
    dev = default_device()
    slow = evaluate_plan(w, plan, link, device=dev)
    if what == "compute":
        fast_dev = dataclasses.replace(dev, peak_flops_per_s={k: v * factor for k, v in dev.peak_flops_per_s.items()},
                                       hbm_bytes_per_s=dev.hbm_bytes_per_s * factor)
        fast = evaluate_plan(w, plan, link, device=fast_dev)
    else:
        fast = evaluate_plan(w, plan, _faster_link(link, what, factor), device=dev)
    _no_slower(slow, fast)


@functools.cache
def _base(name: str) -> System:
    return ring_system(3, pool_bytes_per_s=8e9, both_directions=True) if name == "ring" else load_system(name)


@st.composite
def _system_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(max_layers=4))
    name = draw(st.sampled_from(["ring", "dc-dla", "mc-dla", "hc-dla"]))
    kinds = sorted({link.kind for link in _base(name).links}, key=lambda k: k.value)
    change = draw(st.sampled_from(["compute", *kinds]))
    capacity = max(draw(st.sampled_from([0.6, 1.0, 3.0])) * w.footprint_bytes(), 1e6)
    return w, draw(plans(w)), name, change, draw(FASTER), draw(st.sampled_from(["data", "model"])), capacity


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_system_cases())
def test_systems_are_monotone(case) -> None:  # type: ignore[no-untyped-def]
    """Eight-device systems: faster compute or a faster kind of link never slows the iteration."""
    w, plan, name, change, factor, parallel, capacity = case
    base = _base(name).with_hbm(capacity)
    if change == "compute":
        fast_system = base.with_compute_scale(factor)
    else:
        kind = LinkKind(change)
        bandwidth = max(l.bytes_per_s for l in base.links if l.kind is kind)
        if math.isinf(bandwidth):
            return
        fast_system = base.with_link_bandwidth(kind, bandwidth * factor)
        if any(l.kind is kind and l.bytes_per_s != bandwidth for l in base.links):
            base = base.with_link_bandwidth(kind, bandwidth)  # a kind with mixed speeds: compare at equal speeds
    _no_slower(simulate(base, w, plan, parallel=parallel), simulate(fast_system, w, plan, parallel=parallel))
