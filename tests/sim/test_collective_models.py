"""Closed-form collective models (NOTE [collective closed forms] in mcdla.sim.collective_models): hand-derived
numbers, identities between algorithms, and agreement with the event engine's rings."""

from __future__ import annotations

import math

import pytest

from mcdla.errors import HardwareError
from mcdla.hardware import FabricDim, LinkKind, load_cluster, load_system, system_from_dict
from mcdla.sim import simulate
from mcdla.sim.collective_models import bus_bandwidth, collective_time, p2p_time
from mcdla.workload.model import Layer, LayerKind, Workload

from .conftest import plan_of, ring_system


def _dim(p: int, b: float = 100e9, a: float = 1e-6, alg: str = "ring", name: str = "d") -> FabricDim:
    return FabricDim(name=name, size=p, bytes_per_s=b, latency_s=a, algorithm=alg, kind=LinkKind.NVLINK, source="test")


def _params_only(param_bytes: float) -> Workload:
    """One layer that computes nothing: the iteration is its gradient all-reduce."""
    return Workload(name="grads", batch=1, optimizer_bytes_per_param_byte=0.0, layers=(
        Layer(name="p0", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, param_bytes=param_bytes),))


# -- one dimension, numbers worked by hand -----------------------------------------------------------------------
def test_ring_numbers() -> None:
    """p=4, n=1 GB, B=100 GB/s, a=1 us: all-reduce 2*3/4*10 ms + 6 us; all-gather/reduce-scatter 3/4*10 ms + 3 us."""
    d = _dim(4)
    assert collective_time("all-reduce", 1e9, d) == pytest.approx(0.015 + 6e-6, rel=1e-12)
    assert collective_time("all-gather", 1e9, d) == pytest.approx(0.0075 + 3e-6, rel=1e-12)
    assert collective_time("reduce-scatter", 1e9, d) == pytest.approx(0.0075 + 3e-6, rel=1e-12)


def test_tree_numbers() -> None:
    """Double binary tree all-reduce: 2 n/B + 2 ceil(log2 p) a: p=8 -> 20 ms + 6 us, p=5 -> depth 3 as well."""
    assert collective_time("all-reduce", 1e9, _dim(8, alg="tree")) == pytest.approx(0.02 + 6e-6, rel=1e-12)
    assert collective_time("all-reduce", 1e9, _dim(5, alg="tree")) == pytest.approx(0.02 + 6e-6, rel=1e-12)
    # no tree reduce-scatter / all-gather (as in NCCL): the ring's
    assert collective_time("all-gather", 1e9, _dim(8, alg="tree")) == collective_time("all-gather", 1e9, _dim(8))


def test_tree_small_groups_move_what_their_trees_carry() -> None:
    """p=2: each tree is one edge carrying n/2 each way, so a port carries n: n/B + 2a (10 ms + 2 us); p=3: the
    trees 1-2-0 and 0-1, 2-0 give ranks 0 and 2 three edges: 1.5 n/B + 2*2 a (15 ms + 4 us)."""
    assert collective_time("all-reduce", 1e9, _dim(2, alg="tree")) == pytest.approx(0.01 + 2e-6, rel=1e-12)
    assert collective_time("all-reduce", 1e9, _dim(3, alg="tree")) == pytest.approx(0.015 + 4e-6, rel=1e-12)


def test_tree_beats_ring_only_on_latency() -> None:
    """At 1,024 ranks the tree's log latency wins (20 ms of ring latency alone); among 8 ranks with a large
    buffer the ring's 2 (p-1)/p factor beats the tree's 2."""
    ring, tree = _dim(1024, b=50e9, a=5e-6), _dim(1024, b=50e9, a=5e-6, alg="tree")
    assert collective_time("all-reduce", 1e6, tree) < collective_time("all-reduce", 1e6, ring)
    ring, tree = _dim(8, b=50e9, a=5e-6), _dim(8, b=50e9, a=5e-6, alg="tree")
    assert collective_time("all-reduce", 10e9, tree) > collective_time("all-reduce", 10e9, ring)


def test_in_network_numbers() -> None:
    """SHARP-like all-reduce moves n once each way: n/B + 2a (8 GPUs at 450 GB/s, 1 GB: 2.222 ms + 2 us), about
    half the ring's 2*7/8 n/B; all-gather keeps the ring's bytes but pays 2a instead of (p-1)a."""
    d = _dim(8, b=450e9, alg="in-network")
    assert collective_time("all-reduce", 1e9, d) == pytest.approx(1e9 / 450e9 + 2e-6, rel=1e-12)
    assert collective_time("all-gather", 1e9, d) == pytest.approx(7 / 8 * 1e9 / 450e9 + 2e-6, rel=1e-12)
    ring = collective_time("all-reduce", 1e9, d.with_algorithm("ring"))
    assert collective_time("all-reduce", 1e9, d) / ring == pytest.approx((1 / 450e9 + 2e-15) / (1.75 / 450e9 + 14e-15), rel=1e-9)


def test_all_to_all_and_p2p_numbers() -> None:
    """All-to-all on a switch: (p-1)/p n/B + a; send/recv: a + n/B."""
    assert collective_time("all-to-all", 1e9, _dim(8)) == pytest.approx(7 / 8 * 0.01 + 1e-6, rel=1e-12)
    assert p2p_time(1e9, _dim(2, b=50e9, a=5e-6)) == pytest.approx(0.02 + 5e-6, rel=1e-12)
    assert p2p_time(0.0, _dim(2)) == 0.0


def test_trivial_groups_cost_nothing() -> None:
    """A group of one rank, an empty hierarchy or an empty buffer takes no time."""
    assert collective_time("all-reduce", 1e9, _dim(1)) == 0.0
    assert collective_time("all-reduce", 1e9, ()) == 0.0
    assert collective_time("all-gather", 0.0, _dim(8)) == 0.0


# -- hierarchical -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,m", [(2, 2), (8, 4), (8, 128), (72, 16), (4, 3)])
def test_hierarchical_ring_bytes_equal_flat_ring(k: int, m: int) -> None:
    """With equal B and no latency, RS(k) + AR(m) on n/k + AG(k) moves exactly the flat ring's 2 (P-1)/P n/B."""
    b, n = 80e9, 3e9
    flat = collective_time("all-reduce", n, _dim(k * m, b=b, a=0.0))
    hier = collective_time("all-reduce", n, (_dim(k, b=b, a=0.0), _dim(m, b=b, a=0.0)))
    assert hier == pytest.approx(flat, rel=1e-12)
    assert flat == pytest.approx(2 * (k * m - 1) / (k * m) * n / b, rel=1e-12)
    for op in ("all-gather", "reduce-scatter"):
        assert collective_time(op, n, (_dim(k, b=b, a=0.0), _dim(m, b=b, a=0.0))) == pytest.approx(
            (k * m - 1) / (k * m) * n / b, rel=1e-12)


def test_hierarchical_numbers_dgx_h100_ndr() -> None:
    """128 DGX H100, 1 GB all-reduce, rings everywhere, worked by hand:
    RS in node 7/8 GB / 450 GB/s + 7 us, AR across nodes on 125 MB: 2*127/128 * 125 MB / 50 GB/s + 254 * 5 us,
    AG in node as the RS."""
    c = load_cluster("dgx-h100-ndr")
    up, out = c.dims
    rs = 7 / 8 * 1e9 / 450e9 + 7 * 1e-6
    ar = 2 * 127 / 128 * 125e6 / 50e9 + 254 * 5e-6
    expected = rs + ar + rs
    assert collective_time("all-reduce", 1e9, c.dims, algorithm="ring") == pytest.approx(expected, rel=1e-12)
    # NVLink SHARP in the node (the preset's own algorithm): RS and AG are latency-cheaper, same bytes
    rs_nvls = 7 / 8 * 1e9 / 450e9 + 2e-6
    assert collective_time("all-reduce", 1e9, c.dims) == pytest.approx(rs_nvls + ar + rs_nvls, rel=1e-12)
    # per-dimension override: tree across nodes
    tree = 2 * 125e6 / 50e9 + 2 * 7 * 5e-6
    assert collective_time("all-reduce", 1e9, c.dims, algorithm=("ring", "tree")) == pytest.approx(rs + tree + rs, rel=1e-12)


def test_hierarchical_ring_all_reduce_is_reduce_scatter_plus_all_gather() -> None:
    """For rings, an all-reduce is a reduce-scatter then an all-gather, hierarchy or not."""
    dims = (_dim(8, b=450e9, a=1e-6), _dim(16, b=50e9, a=5e-6), _dim(4, b=25e9, a=10e-6))
    ar = collective_time("all-reduce", 2e9, dims)
    assert ar == pytest.approx(collective_time("reduce-scatter", 2e9, dims) + collective_time("all-gather", 2e9, dims), rel=1e-12)


def test_hierarchical_all_to_all_numbers() -> None:
    """8 GPUs x 4 nodes, 1 GB each: 7/32 of it crosses NVLink, 24/32 crosses the rails."""
    dims = (_dim(8, b=400e9, a=1e-6), _dim(4, b=50e9, a=5e-6))
    expected = 7 / 32 * 1e9 / 400e9 + 1e-6 + 24 / 32 * 1e9 / 50e9 + 5e-6
    assert collective_time("all-to-all", 1e9, dims) == pytest.approx(expected, rel=1e-12)


def test_bus_bandwidth_of_the_ring_is_the_link() -> None:
    """nccl-tests' busbw of a latency-free ring all-reduce is the per-GPU bandwidth B."""
    d = _dim(16, b=50e9, a=0.0)
    assert bus_bandwidth("all-reduce", 1e9, collective_time("all-reduce", 1e9, d), 16) == pytest.approx(50e9, rel=1e-12)


def test_errors_are_one_line() -> None:
    """Bad op, size, algorithm or dimension: one line naming field, value and what is allowed."""
    cases = [
        (lambda: collective_time("gather", 1.0, _dim(2)), "collective op: got 'gather'; must be one of"),
        (lambda: collective_time("all-reduce", -1.0, _dim(2)), "collective nbytes: got -1.0"),
        (lambda: collective_time("all-reduce", math.nan, _dim(2)), "collective nbytes: got nan"),
        (lambda: collective_time("all-reduce", 1.0, _dim(2), algorithm="halving"), "collective algorithm: got 'halving'"),
        (lambda: collective_time("all-reduce", 1.0, (_dim(2), _dim(2)), algorithm=("ring",)), "got 1 names for 2"),
        (lambda: collective_time("all-reduce", 1.0, [1]), "collective dims: got int"),
        (lambda: _dim(0), "fabric dimension 'd'.size: got 0"),
        (lambda: _dim(2, alg="sharp"), "algorithm: got 'sharp'; must be one of ring, tree, in-network"),
        (lambda: _dim(4).subgroup(5), "subgroup: got 5; must be an integer in 1..4"),
    ]
    for call, message in cases:
        with pytest.raises(HardwareError, match=None) as info:
            call()
        assert message in str(info.value) and "\n" not in str(info.value)


# -- agreement with the event engine ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_all_reduce_matches_engine(n: int) -> None:
    """The engine's all-reduce on a one-way ring of direct links equals the ring closed form."""
    size, bw, lat = 400e6, 20e9, 3e-6
    w = _params_only(size)
    r = simulate(ring_system(n, bytes_per_s=bw, latency_s=lat), w, plan_of(w), bucket_bytes=1e12)
    assert r.iteration_time_s == pytest.approx(collective_time("all-reduce", size, _dim(n, b=bw, a=lat)), rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 7])
def test_ring_all_gather_matches_engine(n: int) -> None:
    """Model parallel on one layer: the iteration is the all-gather of its output, as the ring closed form says."""
    out, bw, lat = 120e6, 10e9, 2e-6
    w = Workload(name="mp", batch=1, layers=(Layer(name="a", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, output_bytes=out),))
    r = simulate(ring_system(n, bytes_per_s=bw, latency_s=lat), w, plan_of(w), parallel="model")
    assert r.iteration_time_s == pytest.approx(collective_time("all-gather", out, _dim(n, b=bw, a=lat)), rel=1e-9)


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "gb200-nvl72"])
def test_generated_node_ring_matches_engine(preset: str) -> None:
    """A generated node's ring through its NVSwitch runs at the per-GPU port bandwidth: the engine equals the ring
    closed form on the cluster's scale-up dimension."""
    size = 2e9
    w = _params_only(size)
    r = simulate(load_system(preset), w, plan_of(w), bucket_bytes=1e12)
    up = load_cluster(preset).scale_up
    assert r.iteration_time_s == pytest.approx(collective_time("all-reduce", size, up, algorithm="ring"), rel=1e-9)


def _two_level(nodes: int, gpus: int, *, up_bw: float, out_bw: float, up_lat: float, out_lat: float) -> dict:
    fig = "test figure"
    return {
        "format": "mcdla-system/1", "name": "mini",
        "node": {"gpus": gpus, "source": fig,
                 "gpu": {"peak_flops_per_s": {"fp16": "100TFLOP/s"}, "hbm": "80GB", "hbm_bandwidth": "2TB/s", "source": fig},
                 "scale_up": {"bandwidth": up_bw, "latency": up_lat, "source": fig}},
        "scale_out": {"nodes": nodes, "bandwidth": out_bw, "latency": out_lat, "source": fig},
    }


@pytest.mark.parametrize("nodes,gpus", [(2, 4), (3, 2), (4, 1)])
def test_generated_rail_rings_match_engine(nodes: int, gpus: int) -> None:
    """Across nodes the engine runs ``gpus`` rail-aligned rings, each crossing one rail per node: a flat ring over
    all P GPUs with the node's aggregate rail bandwidth (gpus x B_out) and the rail's latency per step."""
    up_bw, out_bw, up_lat, out_lat, size = 400e9, 25e9, 1e-6, 4e-6, 1e9
    system = system_from_dict(_two_level(nodes, gpus, up_bw=up_bw, out_bw=out_bw, up_lat=up_lat, out_lat=out_lat))
    assert len(system.rings) == gpus
    w = _params_only(size)
    r = simulate(system, w, plan_of(w), bucket_bytes=1e12)
    p = nodes * gpus
    flat = FabricDim(name="flat", size=p, bytes_per_s=gpus * out_bw, latency_s=out_lat)
    assert r.iteration_time_s == pytest.approx(collective_time("all-reduce", size, flat), rel=1e-9)
