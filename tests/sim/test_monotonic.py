"""Property: iteration time never increases when a bandwidth or a compute rate increases."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mcdla.hardware import LinkKind, PoolLink, System, load_system
from mcdla.sim import default_device, evaluate_plan, simulate
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action

from .conftest import late_prefetch_case, links_st, plan_of, plans, ring_system, workloads

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


@pytest.mark.examples(200, 1000)
def test_single_device_is_monotone(examples) -> None:  # type: ignore[no-untyped-def]
    """One device: a faster pool link (either direction) or faster compute never slows the iteration."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_single_cases())
    @example((*late_prefetch_case(), PoolLink.symmetric(8e9), 2.0, "offload"))  # NOTE [safe prefetch] in mcdla.sim
    def check(case) -> None:  # type: ignore[no-untyped-def]
        w, plan, link, factor, what = case
        dev = default_device()
        slow = evaluate_plan(w, plan, link, device=dev)
        if what == "compute":
            fast_dev = dataclasses.replace(dev, hbm_bytes_per_s=dev.hbm_bytes_per_s * factor,
                                           peak_flops_per_s={k: v * factor for k, v in dev.peak_flops_per_s.items()})
            fast = evaluate_plan(w, plan, link, device=fast_dev)
        else:
            fast = evaluate_plan(w, plan, _faster_link(link, what, factor), device=dev)
        _no_slower(slow, fast)

    check()


@functools.cache
def _base(name: str) -> System:
    return ring_system(3, pool_bytes_per_s=8e9, both_directions=True) if name == "ring" else load_system(name)


def _faster_network(system: System, factor: float) -> System:
    """Every link and every memory's DRAM bandwidth multiplied by ``factor``."""
    return dataclasses.replace(
        system,
        links=tuple(dataclasses.replace(l, bytes_per_s=l.bytes_per_s * factor) for l in system.links),
        memories=tuple(dataclasses.replace(m, dram_bytes_per_s=m.dram_bytes_per_s * factor) for m in system.memories),
    )


# Systems where speeding up one kind of link cannot re-divide a link between flows that cross that kind and
# flows that do not (docs/simulator.md, "Monotonicity"): dc-dla's pool traffic (PCIe) and collectives
# (NVLink) use disjoint links; mc-dla and the ring have one kind of link. On hc-dla the rings cross the X-bus
# and share the GPU-CPU NVLink with pool traffic (test_one_faster_link_can_slow_a_shared_one).
_PER_KIND = ("ring", "dc-dla", "mc-dla")


@st.composite
def _system_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(max_layers=4))
    name = draw(st.sampled_from(["ring", "dc-dla", "mc-dla", "hc-dla"]))
    kinds = sorted({link.kind for link in _base(name).links}, key=lambda k: k.value) if name in _PER_KIND else []
    change = draw(st.sampled_from(["compute", "network", *kinds]))
    capacity = max(draw(st.sampled_from([0.6, 1.0, 3.0])) * w.footprint_bytes(), 1e6)
    return w, draw(plans(w)), name, change, draw(FASTER), draw(st.sampled_from(["data", "model"])), capacity


@pytest.mark.examples(60, 250)
def test_systems_are_monotone(examples) -> None:  # type: ignore[no-untyped-def]
    """Eight-device systems: faster compute, a faster network (every link and memory), or a faster kind of
    link where that cannot re-divide a shared link (``_PER_KIND``) never slows the iteration."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_system_cases())
    def check(case) -> None:  # type: ignore[no-untyped-def]
        w, plan, name, change, factor, parallel, capacity = case
        base = _base(name).with_hbm(capacity)
        if change == "compute":
            fast_system = base.with_compute_scale(factor)
        elif change == "network":
            fast_system = _faster_network(base, factor)
        else:
            kind = LinkKind(change)
            bandwidth = max(l.bytes_per_s for l in base.links if l.kind is kind)
            if math.isinf(bandwidth):
                return
            fast_system = base.with_link_bandwidth(kind, bandwidth * factor)
            if any(l.kind is kind and l.bytes_per_s != bandwidth for l in base.links):
                base = base.with_link_bandwidth(kind, bandwidth)  # a kind with mixed speeds: compare at equal speeds
        _no_slower(simulate(base, w, plan, parallel=parallel), simulate(fast_system, w, plan, parallel=parallel))

    check()


def test_one_faster_link_can_slow_a_shared_one() -> None:
    """Max-min fair sharing is not monotone in one link's speed, and the engine shows it where it happens.

    On hc-dla each ring step of the all-reduce crosses a GPU-CPU NVLink and the X-bus; each GPU's offload
    crosses the same NVLink. With the X-bus the ring's bottleneck, a faster X-bus lets the all-reduce take a
    larger share of the NVLink, so the offloads (and the prefetches behind them) finish later and the
    iteration, which waits on them, is slower. A faster network as a whole is faster.
    """
    def layer(name: str, saved: float = 0.0, flops: float = 0.0, params: float = 0.0) -> Layer:
        return Layer(name=name, kind=LayerKind.CONV, fwd_flops=flops, bwd_flops=2 * flops, saved_bytes=saved,
                     param_bytes=params)

    w = Workload(name="w", batch=4, layers=(layer("l0"), layer("l1", 20e6, 1e10), layer("l2", params=30e6)),
                 optimizer_bytes_per_param_byte=1.0)
    plan = plan_of(w, {"l1": Action.OFFLOAD})
    base = load_system("hc-dla").with_hbm(110e6)
    xbus = max(l.bytes_per_s for l in base.links if l.kind is LinkKind.CPU_INTERCONNECT)
    runs = {label: simulate(system, w, plan, record_timeline=True) for label, system in (
        ("base", base), ("xbus", base.with_link_bandwidth(LinkKind.CPU_INTERCONNECT, 1.25 * xbus)),
        ("network", _faster_network(base, 1.25)))}

    def end(run, category: str) -> float:  # type: ignore[no-untyped-def]
        return max(span[5] for span in run.spans if span[3] == category)

    assert end(runs["xbus"], "collective") < end(runs["base"], "collective")
    assert end(runs["xbus"], "offload") > end(runs["base"], "offload")
    assert runs["xbus"].iteration_time_s > runs["base"].iteration_time_s
    assert runs["network"].iteration_time_s < runs["base"].iteration_time_s
