"""Helpers for the simulator tests: synthetic chains, random plans, small hand-made systems."""

from __future__ import annotations

import math

import pytest
from hypothesis import strategies as st

from mcdla.hardware.model import Device, Link, Memory, MemoryKind, Switch, System
from mcdla.hardware.pool_link import PoolLink
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action, Plan

KINDS = (LayerKind.CONV, LayerKind.FC, LayerKind.ELEMENTWISE, LayerKind.NORM)


def device(name: str = "gpu0", *, hbm_bytes: float = 16e9, flops: float = 100e12, hbm_bytes_per_s: float = 1e12,
           compute_efficiency: float = 0.5, memory_efficiency: float = 0.5) -> Device:
    """A device with round figures (effective 50 TFLOP/s fp16, 500 GB/s HBM)."""
    return Device(name=name, peak_flops_per_s={"fp16": flops, "fp32": flops / 4}, hbm_bytes=hbm_bytes,
                  hbm_bytes_per_s=hbm_bytes_per_s, compute_efficiency=compute_efficiency,
                  memory_efficiency=memory_efficiency, source="test")


def chain(n: int, *, saved: float = 100e6, fwd_flops: float = 1e11, param: float = 1e6, output: float | None = None,
          workspace: float = 0.0, name: str = "chain") -> Workload:
    """A chain of ``n`` identical layers (bytes moved = 3x / 6x the saved bytes, conv/elementwise alternating)."""
    out = saved if output is None else output
    layers = tuple(
        Layer(name=f"l{i}", kind=LayerKind.CONV if i % 2 == 0 else LayerKind.ELEMENTWISE, fwd_flops=fwd_flops,
              bwd_flops=2 * fwd_flops, fwd_bytes_moved=3 * saved, bwd_bytes_moved=6 * saved, param_bytes=param,
              output_bytes=out, saved_bytes=saved, workspace_bytes=workspace)
        for i in range(n)
    )
    return Workload(name=name, batch=8, layers=layers)


def synthetic_500() -> Workload:
    """A 500-layer chain shaped like a deep CNN: feature maps shrink and parameters grow with depth."""
    layers = []
    for i in range(500):
        stage = i // 125
        saved = 64e6 / 2**stage
        layers.append(Layer(
            name=f"block{stage}.layer{i}", kind=KINDS[i % len(KINDS)], fwd_flops=2e10 * (1 + (i % 3)),
            bwd_flops=4e10 * (1 + (i % 3)), fwd_bytes_moved=3 * saved, bwd_bytes_moved=6 * saved,
            param_bytes=2e5 * 2**stage, output_bytes=saved, saved_bytes=saved if i % 4 != 3 else 0.0,
            workspace_bytes=4e6))
    return Workload(name="synthetic-500", batch=32, layers=tuple(layers))


def plan_of(workload: Workload, actions: dict[str, Action | str] | None = None, *, budget_bytes: float = math.inf,
            prefetch_at: dict[str, str] | None = None) -> Plan:
    return Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names,
                             actions=actions or {}, budget_bytes=budget_bytes, prefetch_at=prefetch_at)


def offload_all(workload: Workload) -> Plan:
    return plan_of(workload, {l.name: Action.OFFLOAD for l in workload.layers if l.saved_bytes > 0})


def late_prefetch_case() -> tuple[Workload, Plan]:
    """l0 (300 MB) is offloaded and prefetched when B of l4 starts; l3 (kept) needs 0.25 MB in backward
    (NOTE [safe prefetch] in ``mcdla.sim.device``; budget 400.2 MB)."""
    def layer(name: str, saved: float = 0.0, workspace: float = 0.0, flops: float = 0.0) -> Layer:
        return Layer(name=name, kind=LayerKind.CONV, fwd_flops=flops, bwd_flops=2 * flops, saved_bytes=saved,
                     workspace_bytes=workspace)

    w = Workload(name="w", batch=1, layers=(layer("l0", 300e6), layer("l1"), layer("l2", 100e6),
                                             layer("l3", 100e6, 0.25e6), layer("l4", flops=2e11)))
    plan = plan_of(w, {"l0": Action.OFFLOAD, "l2": Action.OFFLOAD}, budget_bytes=400.2e6, prefetch_at={"l0": "l4"})
    return w, plan


def ring_system(n: int, *, bytes_per_s: float = 10e9, latency_s: float = 1e-6, both_directions: bool = False,
                pool_bytes_per_s: float | None = None) -> System:
    """``n`` devices in one ring of direct links (optionally used both ways), each with its own host memory."""
    devs = tuple(device(f"d{i}") for i in range(n))
    links = [Link(a=f"d{i}", b=f"d{(i + 1) % n}", bytes_per_s=bytes_per_s, latency_s=latency_s)
             for i in range(n if n > 2 else n - 1)]
    memories, pools = [], {}
    if pool_bytes_per_s is not None:
        for i in range(n):
            memories.append(Memory(name=f"h{i}", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=math.inf))
            links.append(Link(a=f"d{i}", b=f"h{i}", bytes_per_s=pool_bytes_per_s, latency_s=latency_s))
            pools[f"d{i}"] = (f"h{i}",)
    order = tuple(f"d{i}" for i in range(n))
    rings = ((order, (order[0], *reversed(order[1:]))) if both_directions else (order,)) if n > 1 else ()
    return System(name=f"ring{n}", devices=devs, memories=tuple(memories), links=tuple(links), pools=pools,
                  rings=rings)


def switch_system(n_devices: int = 2, *, uplink_bytes_per_s: float = 16e9) -> System:
    """``n_devices`` behind one switch whose uplink leads to one host memory (a PCIe switch under a socket)."""
    devs = tuple(device(f"d{i}") for i in range(n_devices))
    links = [Link(a=f"d{i}", b="sw", bytes_per_s=uplink_bytes_per_s) for i in range(n_devices)]
    links.append(Link(a="sw", b="host", bytes_per_s=uplink_bytes_per_s))
    order = tuple(d.name for d in devs)
    links += [Link(a=order[i], b=order[(i + 1) % n_devices], bytes_per_s=50e9) for i in range(n_devices if n_devices > 2 else 1)]
    return System(name="switch", devices=devs, switches=(Switch(name="sw"),),
                  memories=(Memory(name="host", kind=MemoryKind.HOST, capacity_bytes=1e12, dram_bytes_per_s=math.inf),),
                  links=tuple(links), pools={d: ("host",) for d in order}, rings=(order,) if n_devices > 1 else ())


# -- hypothesis strategies ----------------------------------------------------------------------------------------
_size = st.sampled_from([0.0, 1e6, 5e6, 2e7, 1e8, 3e8])
_flops = st.sampled_from([0.0, 1e9, 1e10, 5e10, 2e11])


@st.composite
def workloads(draw: st.DrawFn, min_layers: int = 1, max_layers: int = 7) -> Workload:
    n = draw(st.integers(min_layers, max_layers))
    layers = []
    for i in range(n):
        f = draw(_flops)
        layers.append(Layer(name=f"l{i}", kind=draw(st.sampled_from(KINDS)), fwd_flops=f, bwd_flops=2 * f,
                            fwd_bytes_moved=draw(_size), bwd_bytes_moved=draw(_size), param_bytes=draw(_size) / 10,
                            output_bytes=draw(_size), saved_bytes=draw(_size), workspace_bytes=draw(_size) / 4))
    return Workload(name="random", batch=4, layers=tuple(layers), optimizer_bytes_per_param_byte=1.0)


@st.composite
def plans(draw: st.DrawFn, workload: Workload, budget_bytes: float = math.inf) -> Plan:
    """A random valid plan: any action (layer 0 never recomputed), sometimes a later prefetch trigger."""
    names = workload.layer_names
    actions, prefetch = {}, {}
    for i, name in enumerate(names):
        choices = [Action.KEEP, Action.OFFLOAD] + ([Action.RECOMPUTE] if i > 0 else [])
        actions[name] = draw(st.sampled_from(choices))
        if actions[name] is Action.OFFLOAD and i + 1 < len(names) and draw(st.booleans()):
            prefetch[name] = names[draw(st.integers(i + 1, len(names) - 1))]
    return plan_of(workload, actions, budget_bytes=budget_bytes, prefetch_at=prefetch)


links_st = st.builds(
    lambda bw, lat, shared: PoolLink.symmetric(bw, latency_s=lat, shared_direction=shared),
    st.sampled_from([1e9, 8e9, 16e9, 75e9, math.inf]), st.sampled_from([0.0, 1e-6, 1e-4]), st.booleans(),
)


@pytest.fixture
def v100() -> Device:
    from mcdla.sim import default_device

    return default_device()
