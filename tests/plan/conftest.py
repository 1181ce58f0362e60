"""Helpers for the planner tests: random chain workloads and links, and a problem builder."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from mcdla.hardware.pool_link import PoolLink
from mcdla.plan.chain import build_chain
from mcdla.plan.problem import Problem, make_problem
from mcdla.workload.model import Layer, LayerKind, Workload

KINDS = (LayerKind.CONV, LayerKind.FC, LayerKind.ELEMENTWISE)
MB = 1e6


@st.composite
def workloads(draw, min_layers: int = 2, max_layers: int = 5) -> Workload:
    """A random chain: whole-ish numbers of FLOP and bytes, so that equal times (ties) happen often."""
    n = draw(st.integers(min_layers, max_layers))
    layers = []
    for i in range(n):
        layers.append(Layer(
            name=f"block{i // 2}.layer{i}",
            kind=draw(st.sampled_from(KINDS)),
            fwd_flops=draw(st.integers(1, 8)) * 1e11,
            bwd_flops=draw(st.integers(1, 16)) * 1e11,
            param_bytes=1e6,
            saved_bytes=draw(st.sampled_from((0, 100, 200, 300, 500))) * MB,
            output_bytes=draw(st.sampled_from((0, 50, 100))) * MB,
            workspace_bytes=draw(st.sampled_from((0, 20, 80))) * MB,
        ))
    return Workload(name="random-chain", batch=4, layers=tuple(layers))


@st.composite
def links(draw) -> PoolLink:
    """A pool link from PCIe-like to NVLink-like rates, with or without latency, half or full duplex."""
    rate = draw(st.sampled_from((2e9, 8e9, 16e9, 50e9)))
    ratio = draw(st.sampled_from((1.0, 1.0, 0.5, 2.0)))
    return PoolLink(offload_bytes_per_s=rate, prefetch_bytes_per_s=rate * ratio,
                    latency_s=draw(st.sampled_from((0.0, 1e-5, 1e-3))), shared_direction=draw(st.booleans()))


def problem(workload: Workload, link: PoolLink, budget_bytes: float, planner: str = "test") -> Problem:
    return make_problem(workload, link, budget_bytes, planner=planner)


def peak(workload: Workload) -> float:
    """The no-offload peak device bytes of ``workload`` (closed form of the engine's accounting)."""
    return build_chain(workload).no_offload_peak_bytes()


def same(a: float, b: float, rel: float = 1e-7) -> bool:
    """Equal makespans (both infinite counts as equal)."""
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)))
