"""Whole-system behaviour of mcdla.sim.simulate: oracle bound, conservation, memory bounds, deadlock, trace."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.errors import SimError
from mcdla.hardware import PoolLink, System, load_system
from mcdla.sim import default_device, evaluate_plan, simulate
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action

from .conftest import chain, late_prefetch_case, offload_all, plan_of, plans, ring_system, workloads

PRESETS = ("dc-dla", "mc-dla", "mc-dla-1n", "hc-dla")


@pytest.fixture(scope="module")
def systems() -> dict[str, object]:
    return {name: load_system(name) for name in (*PRESETS, "oracle")}


@pytest.fixture(scope="module")
def big_chain() -> Workload:
    """40 layers of 600 MB saved tensors: 24 GB of activations, more than a 16 GB device holds."""
    return chain(40, saved=600e6, fwd_flops=4e11, param=20e6)


@pytest.mark.parametrize("parallel", ["data", "model"])
@pytest.mark.parametrize("name", PRESETS)
def test_unlimited_virtualization_equals_the_oracle(systems, big_chain, name: str, parallel: str) -> None:  # type: ignore[no-untyped-def]
    """With free offloads and prefetches, offloading everything runs exactly as with unlimited device memory."""
    system = systems[name]
    assert not simulate(system, big_chain, plan_of(big_chain), parallel=parallel).feasible or parallel == "model"
    virtualized = simulate(system, big_chain, offload_all(big_chain), parallel=parallel,
                           unlimited_virtualization_bandwidth=True)
    oracle = simulate(system.as_oracle(), big_chain, plan_of(big_chain), parallel=parallel)
    assert virtualized.feasible and oracle.feasible
    assert virtualized.iteration_time_s == pytest.approx(oracle.iteration_time_s, rel=1e-12)
    assert virtualized.exposed_virtualization_s == pytest.approx(0.0, abs=1e-12)
    if name == "dc-dla":
        preset = simulate(systems["oracle"], big_chain, plan_of(big_chain), parallel=parallel)
        assert virtualized.iteration_time_s == pytest.approx(preset.iteration_time_s, rel=1e-12)


@st.composite
def _runs(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(max_layers=5))
    fraction = draw(st.sampled_from([0.4, 0.7, 1.0, 2.0]))
    name = draw(st.sampled_from(("ring", *PRESETS)))
    parallel = draw(st.sampled_from(["data", "model"]))
    return w, draw(plans(w)), name, parallel, max(fraction * w.footprint_bytes(), 1e6)


@functools.cache
def _preset(name: str) -> System:
    return ring_system(3, pool_bytes_per_s=5e9) if name == "ring" else load_system(name)


@pytest.mark.examples(60, 250)
def test_conservation_and_memory_bounds(examples) -> None:  # type: ignore[no-untyped-def]
    """Bytes offloaded equal bytes prefetched; no memory ever exceeds its capacity or goes negative."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_runs())
    def check(run) -> None:  # type: ignore[no-untyped-def]
        w, plan, name, parallel, capacity = run
        r = simulate(_preset(name).with_hbm(capacity), w, plan, parallel=parallel, record_timeline=True)
        if r.feasible:
            assert r.offloaded_bytes == pytest.approx(r.prefetched_bytes, rel=1e-12)
            n_dev = len(r.devices)
            offloaded = sum(l.saved_bytes for l in w.layers if plan.action(l.name) is Action.OFFLOAD)
            if parallel == "data":
                assert r.offloaded_bytes == pytest.approx(n_dev * offloaded, rel=1e-12)
            else:  # each device holds between a 1/n_dev slice and all of a layer's saved bytes
                assert offloaded * (1 - 1e-12) <= r.offloaded_bytes <= n_dev * offloaded * (1 + 1e-12)
            assert r.iteration_time_s == pytest.approx(
                r.compute_s + r.recompute_s + r.exposed_virtualization_s + r.exposed_communication_s, rel=1e-9)
        for node, cap in r.capacity_bytes_by_node.items():
            assert r.peak_bytes_by_node[node] <= cap * (1 + 1e-9)
            points = r.memory_timeline[node]
            assert all(0.0 <= value <= cap * (1 + 1e-9) for _t, value in points)
            assert all(t1 <= t2 for (t1, _), (t2, _) in zip(points, points[1:]))
        if r.feasible:  # everything allocated is freed again: only static bytes remain
            for device in r.devices:
                assert r.memory_timeline[device][-1][1] == pytest.approx(  # float rounding of the running sum
                    r.memory_timeline[device][0][1], rel=1e-9, abs=1e-12 * r.peak_bytes_by_node[device])

    check()


def test_deadlock_reports_needed_bytes() -> None:
    """A layer that cannot fit makes the result infeasible with the bytes its forward needed."""
    w = Workload(name="w", batch=1, layers=(
        Layer(name="a", kind=LayerKind.CONV, fwd_flops=1e9, bwd_flops=1e9, param_bytes=1e9, output_bytes=3e9,
              saved_bytes=2e9, workspace_bytes=1e9),
    ))
    static = w.static_bytes
    need_forward = static + 2e9 + 3e9 + 1e9
    system = ring_system(2).with_hbm(need_forward * 0.999)
    r = simulate(system, w, plan_of(w))
    assert not r.feasible and math.isinf(r.iteration_time_s)
    assert r.needed_bytes == pytest.approx(need_forward)
    assert r.infeasible_reason == (f"device d0 needs {need_forward / 2**30:.2f} GiB at layer a (F) but only "
                                   f"{need_forward * 0.999 / 2**30:.2f} GiB fit")
    backward = static + 2e9 + 2 * 3e9 + 1e9  # S resident plus output grad, input grad and workspace
    r = simulate(system.with_hbm(r.needed_bytes), w, plan_of(w))
    assert not r.feasible and r.needed_bytes == pytest.approx(backward)
    assert "at layer a (B)" in r.infeasible_reason
    assert simulate(system.with_hbm(backward), w, plan_of(w)).feasible


def test_static_bytes_that_do_not_fit() -> None:
    """Weights, gradients and optimizer state larger than the device are reported as such."""
    w = chain(2, param=10e9)
    r = simulate(ring_system(2).with_hbm(16e9), w, plan_of(w))
    assert not r.feasible and r.needed_bytes == pytest.approx(w.static_bytes)
    assert "for its static bytes" in r.infeasible_reason


def test_feasible_needed_bytes_reproduce_the_schedule() -> None:
    """A feasible run's needed_bytes (its peak) as capacity gives the identical schedule."""
    w = chain(10, saved=500e6)
    system = ring_system(2, pool_bytes_per_s=4e9)
    loose = simulate(system.with_hbm(12e9), w, offload_all(w))
    tight = simulate(system.with_hbm(loose.needed_bytes), w, offload_all(w))
    assert tight.feasible and tight.iteration_time_s == loose.iteration_time_s


def test_memory_waits_closed_form() -> None:
    """Tight memory: F_1 waits for S_0's offload to free it, and S_0's prefetch waits for B_1 to end."""
    w = chain(2, saved=1e9, output=0.5e9, param=0.0)  # F needs 1.5 GB, B needs 1 GB plus its saved tensor
    plan = plan_of(w, {"l0": Action.OFFLOAD})
    system = ring_system(1, pool_bytes_per_s=100e9, latency_s=1e-6)
    dev = system.devices[0]
    f = max(1e11 / (dev.peak_flops_per_s["fp16"] * 0.5), 3e9 / (dev.hbm_bytes_per_s * 0.5))
    b = max(2e11 / (dev.peak_flops_per_s["fp16"] * 0.5), 6e9 / (dev.hbm_bytes_per_s * 0.5))
    transfer = 1e9 / 100e9 + 1e-6
    assert transfer > f
    tight = simulate(system.with_hbm(2.2e9), w, plan)
    assert tight.iteration_time_s == pytest.approx(transfer + f + b + transfer + b, rel=1e-12)
    assert tight.peak_device_bytes == pytest.approx(2e9)
    roomy = simulate(system.with_hbm(20e9), w, plan)
    assert roomy.iteration_time_s == pytest.approx(max(2 * f + b, max(2 * f, transfer) + transfer) + b, rel=1e-12)


def test_prefetch_waits_until_earlier_backwards_can_run() -> None:
    """NOTE [safe prefetch]: a prefetch that fits is not granted while it would take the room an earlier
    backward needs (it is held until its own backward, after that one). Without the rule the faster offload
    link below deadlocks (l0's prefetch takes 300 MB of 400.2 MB while B of l3 needs 100 + 0.25 MB) although
    the slower link runs; with it the schedule is the closed form below."""
    w, plan = late_prefetch_case()
    dev = default_device()
    rate = dev.peak_flops_per_s["fp16"] * dev.compute_efficiency
    f4, b4 = 2e11 / rate, 4e11 / rate
    slow = evaluate_plan(w, plan, PoolLink.symmetric(8e9), device=dev)
    fast = evaluate_plan(w, plan, PoolLink(offload_bytes_per_s=16e9, prefetch_bytes_per_s=8e9), device=dev)
    assert slow.feasible and fast.feasible, fast.infeasible_reason
    # fast: S_l0 lands at 18.75 ms (F l3 waits for it), S_l2 at 25 ms while B l4 runs; l0's prefetch waits
    # until B l3 has run (t = 18.75 + F4 + B4 ms), then l0 and l2 come back one after the other.
    assert 300e6 / 16e9 + 100e6 / 16e9 < 300e6 / 16e9 + f4 + b4
    expected = 300e6 / 16e9 + f4 + b4 + 300e6 / 8e9 + 100e6 / 8e9
    assert fast.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert fast.iteration_time_s < slow.iteration_time_s
    assert fast.peak_device_bytes <= 400.2e6 * (1 + 1e-9)


def test_chrome_trace_is_valid_json_with_expected_events(systems) -> None:  # type: ignore[no-untyped-def]
    """The trace has device processes, stream threads, operations, transfers, collectives and memory counters."""
    w = chain(3, saved=50e6)
    r = simulate(systems["mc-dla"], w, plan_of(w, {"l0": "offload", "l2": "recompute"}), record_timeline=True)
    trace = json.loads(json.dumps(r.to_chrome_trace()))
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"F l0", "F l2", "R l1", "B l0", "offload l0", "prefetch l0", "all-reduce bucket 0", "memory",
            "process_name", "thread_name"} <= names
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {"gpu0", "gpu7", "mem0"} <= processes
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(r.iteration_time_s * 1e6)


def test_trace_needs_a_recorded_timeline() -> None:
    """Asking an unrecorded result for a trace is a one-line SimError that says what to do."""
    w = chain(2)
    with pytest.raises(SimError, match="record_timeline=True"):
        simulate(ring_system(2), w, plan_of(w)).to_chrome_trace()


def test_simulation_is_deterministic(systems) -> None:  # type: ignore[no-untyped-def]
    """Two runs of the same simulation give identical results."""
    w = chain(30, saved=300e6)
    a = simulate(systems["dc-dla"], w, offload_all(w), record_timeline=True)
    b = simulate(systems["dc-dla"], w, offload_all(w), record_timeline=True)
    assert dataclasses.replace(a, stats={}) == dataclasses.replace(b, stats={})


def test_measured_layer_times_replace_the_roofline() -> None:
    """A layer's measured fwd/bwd times are used for its forward, backward and recomputation."""
    layers = tuple(Layer(name=f"l{i}", kind=LayerKind.CONV, fwd_flops=1e15, bwd_flops=1e15, saved_bytes=1e6,
                         fwd_time_s=0.001 * (i + 1), bwd_time_s=0.002 * (i + 1)) for i in range(3))
    w = Workload(name="measured", batch=1, layers=layers)
    r = simulate(ring_system(1), w, plan_of(w, {"l2": "recompute"}))
    assert r.compute_s == pytest.approx(0.006 + 0.012)
    assert r.recompute_s == pytest.approx(0.002)  # F_1 re-runs before B_2
    assert r.iteration_time_s == pytest.approx(0.020)


def test_recompute_from_an_offloaded_base_waits_for_its_prefetch(v100) -> None:  # type: ignore[no-untyped-def]
    """l0 offloaded, l1-l2 recomputed: reaching the re-run of F_0 issues l0's prefetch and waits for it."""
    from mcdla.hardware import PoolLink
    from mcdla.sim import evaluate_plan

    w = chain(3, saved=200e6)
    bw, lat = 20e9, 1e-6
    plan = plan_of(w, {"l0": Action.OFFLOAD, "l1": Action.RECOMPUTE, "l2": Action.RECOMPUTE})
    layer = w.layers[0]
    peak = v100.peak_flops_per_s["fp16"] * v100.compute_efficiency
    f = max(layer.fwd_flops / peak, layer.fwd_bytes_moved / (v100.hbm_bytes_per_s * v100.memory_efficiency))
    b = max(layer.bwd_flops / peak, layer.bwd_bytes_moved / (v100.hbm_bytes_per_s * v100.memory_efficiency))
    transfer = layer.saved_bytes / bw + lat
    r = evaluate_plan(w, plan, PoolLink.symmetric(bw, latency_s=lat))
    assert r.iteration_time_s == pytest.approx(max(3 * f, transfer) + transfer + 2 * f + 3 * b, rel=1e-12)
    assert r.recompute_s == pytest.approx(2 * f)
    assert r.offloaded_bytes == r.prefetched_bytes == layer.saved_bytes


def test_full_pool_memory_blocks_offloads() -> None:
    """Offloads wait for pool space; a pool too small for the plan deadlocks, naming the pool memory."""
    from mcdla.hardware import PoolLink
    from mcdla.sim import evaluate_plan

    w = chain(3, saved=1e9)
    small = PoolLink(offload_bytes_per_s=10e9, prefetch_bytes_per_s=10e9, pool_bytes=1.5e9)
    r = evaluate_plan(w, offload_all(w), small)
    assert not r.feasible and r.infeasible_reason.startswith("memory pool needs 1.86 GiB for the offload of layer l1")
    assert r.needed_bytes == pytest.approx(2e9)
    assert r.peak_bytes_by_node["pool"] <= 1.5e9
    assert evaluate_plan(w, offload_all(w), dataclasses.replace(small, pool_bytes=3e9)).feasible


def test_pool_tiers_are_accounted(systems) -> None:  # type: ignore[no-untyped-def]
    """dc-dla: eight GPUs offload one tensor each into two host memories; mc-dla into memory-nodes."""
    saved = 500e6
    w = Workload(name="one", batch=1, optimizer_bytes_per_param_byte=0.0, layers=(
        Layer(name="x", kind=LayerKind.CONV, fwd_flops=1e9, bwd_flops=1e9, saved_bytes=saved),))
    r = simulate(systems["dc-dla"], w, offload_all(w), record_timeline=True)
    assert r.peak_bytes_by_tier["host"] == pytest.approx(8 * saved)
    assert r.peak_bytes_by_tier["memory-node"] == 0.0
    assert r.peak_bytes_by_node["host0"] == pytest.approx(4 * saved)
    assert r.memory_timeline["host"][-1][1] == 0.0
    assert r.link_bytes["gpu0->pcie0"] == pytest.approx(saved) and r.link_bytes["pcie0->cpu0"] == pytest.approx(2 * saved)
    assert r.link_utilization["pcie0->cpu0"] == pytest.approx(2 * saved / (12.8e9 * r.iteration_time_s))
    assert r.dram_bytes["host0"] == pytest.approx(8 * saved)  # written and read back by four GPUs
    mc = simulate(systems["mc-dla"], w, offload_all(w))
    assert mc.peak_bytes_by_tier["memory-node"] == pytest.approx(8 * saved)
    assert mc.peak_bytes_by_node["mem0"] == pytest.approx(saved)  # half from gpu0, half from gpu1


def test_timelines_are_recorded_only_when_asked(systems) -> None:  # type: ignore[no-untyped-def]
    """Without record_timeline the engine keeps the tiers' peaks but not their per-step timelines (only device 0's,
    which mcdla.profile reads); with it, the host tier steps up to 8 x S (eight GPUs offload S each, 16 steps in
    and out) and back to 0, and results agree."""
    saved = 500e6
    w = Workload(name="one", batch=1, optimizer_bytes_per_param_byte=0.0, layers=(
        Layer(name="x", kind=LayerKind.CONV, fwd_flops=1e9, bwd_flops=1e9, saved_bytes=saved),))
    off = simulate(systems["dc-dla"], w, offload_all(w))
    on = simulate(systems["dc-dla"], w, offload_all(w), record_timeline=True)
    assert off.memory_timeline["host"] == [] and off.memory_timeline["memory-node"] == []
    assert off.memory_timeline["device"] == on.memory_timeline["device"] != []
    assert off.peak_bytes_by_tier == on.peak_bytes_by_tier and off.peak_bytes_by_tier["host"] == pytest.approx(8 * saved)
    assert off.iteration_time_s == on.iteration_time_s
    host = on.memory_timeline["host"]
    assert len(host) == 16 and max(v for _t, v in host) == pytest.approx(8 * saved) and host[-1][1] == 0.0
    assert on.memory_timeline["device"] and on.memory_timeline["memory-node"] == []
