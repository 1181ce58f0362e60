"""Shared links: PCIe switches, interleaved memory-nodes, rings that carry collectives and offloads; pool_link."""

from __future__ import annotations

import math

import pytest

from mcdla.hardware import load_system
from mcdla.hardware.model import Link, Memory, MemoryKind, System
from mcdla.sim import pool_link, simulate
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action

from .conftest import device, plan_of, switch_system


def _one_offload(saved: float) -> Workload:
    return Workload(name="one", batch=1, optimizer_bytes_per_param_byte=0.0, layers=(
        Layer(name="x", kind=LayerKind.CONV, fwd_flops=1e9, bwd_flops=1e9, saved_bytes=saved),))


def _offload_spans(system: System, saved: float) -> dict[int, float]:
    """Duration of each device's offload of one ``saved``-byte tensor, all devices offloading at once."""
    w = _one_offload(saved)
    r = simulate(system, w, plan_of(w, {"x": Action.OFFLOAD}), record_timeline=True)
    return {dev: end - start for dev, _tid, _name, cat, start, end in r.spans if cat == "offload"}


def test_two_devices_behind_one_switch_each_get_half_the_uplink() -> None:
    """Two devices offloading through one 16 GB/s switch uplink get 8 GB/s each."""
    saved = 800e6
    spans = _offload_spans(switch_system(2, uplink_bytes_per_s=16e9), saved)
    assert spans == {0: pytest.approx(saved / 8e9), 1: pytest.approx(saved / 8e9)}


def test_dc_dla_gpus_share_their_pcie_switch() -> None:
    """On dc-dla every GPU shares a PCIe3 x16 switch uplink (12.8 GB/s achievable) with one other: 6.4 GB/s each,
    plus 2 us latency."""
    saved = 800e6
    spans = _offload_spans(load_system("dc-dla"), saved)
    assert len(spans) == 8
    assert all(d == pytest.approx(saved / 6.4e9 + 2e-6) for d in spans.values())


def test_pool_link_dc_dla_contended_and_alone() -> None:
    """pool_link sees dc-dla's 6.4 GB/s contended share and the 12.8 GB/s (0.8 x 16 GB/s raw PCIe 3.0 x16, the
    DMA-achievable rate) of a lone GPU."""
    system = load_system("dc-dla")
    shared, alone = pool_link(system, "gpu3"), pool_link(system, "gpu3", contended=False)
    raw, efficiency = 16e9, 0.8
    assert (shared.offload_bytes_per_s, shared.prefetch_bytes_per_s) == (pytest.approx(raw * efficiency / 2),
                                                                         pytest.approx(raw * efficiency / 2))
    assert (alone.offload_bytes_per_s, alone.prefetch_bytes_per_s) == (pytest.approx(raw * efficiency),
                                                                       pytest.approx(raw * efficiency))
    assert shared.latency_s == pytest.approx(2e-6) and not shared.shared_direction
    assert shared.pool_bytes == pytest.approx(256e9 / 4) and alone.pool_bytes == pytest.approx(256e9)


def test_interleaved_memory_nodes_double_offload_bandwidth() -> None:
    """mc-dla spreads pages over both neighbouring memory-nodes: twice mc-dla-1n's bandwidth, alone or all."""
    mc, one = load_system("mc-dla"), load_system("mc-dla-1n")
    for contended in (False, True):
        assert pool_link(mc, contended=contended).offload_bytes_per_s == pytest.approx(
            2 * pool_link(one, contended=contended).offload_bytes_per_s)
    saved = 1.5e9
    spans_mc, spans_one = _offload_spans(mc, saved), _offload_spans(one, saved)
    assert spans_mc[0] == pytest.approx(saved / 150e9 + 1e-6)
    assert spans_one[0] == pytest.approx(saved / 75e9 + 1e-6)


def test_pool_link_detects_a_shared_dram_bottleneck() -> None:
    """A pool whose DRAM (shared by both directions) is the bottleneck is seen as half duplex."""
    def one_device(dram: float) -> System:
        return System(name="one", devices=(device("d0"),), links=(Link(a="d0", b="h", bytes_per_s=16e9),),
                      memories=(Memory(name="h", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=dram),),
                      pools={"d0": ("h",)})
    assert pool_link(one_device(16e9)).shared_direction
    assert not pool_link(one_device(math.inf)).shared_direction
    assert pool_link(one_device(8e9)).offload_bytes_per_s == pytest.approx(8e9)


def test_ring_carries_collectives_and_prefetches() -> None:
    """On mc-dla a gradient all-reduce slows down when prefetches cross the same ring links."""
    saved, params = 3e9, 400e6
    w = Workload(name="mix", batch=1, optimizer_bytes_per_param_byte=0.0, layers=(
        Layer(name="a", kind=LayerKind.CONV, fwd_flops=1e9, bwd_flops=1e9, saved_bytes=saved),
        Layer(name="b", kind=LayerKind.FC, fwd_flops=1e9, bwd_flops=1e9, param_bytes=params),
    ))
    system = load_system("mc-dla")

    def all_reduce_s(plan) -> float:  # type: ignore[no-untyped-def]
        r = simulate(system, w, plan, bucket_bytes=params, record_timeline=True)
        return next(end - start for _d, _t, _n, cat, start, end in r.spans if cat == "collective")

    alone = all_reduce_s(plan_of(w))
    assert alone == pytest.approx(2 * 7 / 8 * params / 150e9 + 14 * 2e-6, rel=1e-9)
    assert all_reduce_s(plan_of(w, {"a": Action.OFFLOAD})) > 1.2 * alone


def _slow_hbm_system(hbm_bytes_per_s: float) -> System:
    """One device with a 100 GB/s, 1 us link to an unlimited-DRAM pool and HBM of ``hbm_bytes_per_s``."""
    return System(name="one", devices=(device("d0", hbm_bytes_per_s=hbm_bytes_per_s),),
                  links=(Link(a="d0", b="h", bytes_per_s=100e9, latency_s=1e-6),),
                  memories=(Memory(name="h", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=math.inf),),
                  pools={"d0": ("h",)})


def test_transfers_flow_through_the_device_hbm() -> None:
    """NOTE [HBM in transfers]: with 10 GB/s of HBM behind a 100 GB/s link an offload of S bytes takes
    S / 10 GB/s + 1 us, and offloads and prefetches share those 10 GB/s (the pool link looks half duplex);
    with 900 GB/s of HBM the link binds again (S / 100 GB/s)."""
    saved = 1e9
    assert _offload_spans(_slow_hbm_system(10e9), saved) == {0: pytest.approx(saved / 10e9 + 1e-6)}
    assert _offload_spans(_slow_hbm_system(900e9), saved) == {0: pytest.approx(saved / 100e9 + 1e-6)}
    link = pool_link(_slow_hbm_system(10e9))
    assert (link.offload_bytes_per_s, link.prefetch_bytes_per_s) == (pytest.approx(10e9), pytest.approx(10e9))
    assert link.shared_direction
    assert not pool_link(_slow_hbm_system(900e9)).shared_direction


def test_planner_view_counts_hbm_like_the_system() -> None:
    """evaluate_plan's one-device fabric crosses the same HBM: an offload-all iteration on a 10 GB/s-HBM device
    behind a 100 GB/s PoolLink takes as long as the System with that link."""
    from mcdla.hardware.pool_link import PoolLink
    from mcdla.sim import evaluate_plan

    saved = 1e9
    w = _one_offload(saved)
    plan = plan_of(w, {"x": Action.OFFLOAD})
    system = _slow_hbm_system(10e9)
    via_system = simulate(system, w, plan)
    via_link = evaluate_plan(w, plan, PoolLink.symmetric(100e9, latency_s=1e-6),
                             device=system.devices[0], budget_bytes=16e9)
    assert via_link.iteration_time_s == pytest.approx(via_system.iteration_time_s, rel=1e-12)
    assert via_system.iteration_time_s >= 2 * saved / 10e9  # offload, then prefetch, each at the HBM's 10 GB/s
