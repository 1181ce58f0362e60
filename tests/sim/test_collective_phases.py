"""One collective, two evaluators: the closed form (mcdla.sim.collective_models) and the flow phases run over a
system's links (mcdla.sim.collective_phases + mcdla.sim.ir_engine) agree on an idle fabric for every kind and
algorithm, on generated hierarchical systems."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import SimError
from mcdla.hardware import FabricDim, LinkKind, load_cluster
from mcdla.sim.collective_models import KINDS, Collective, closed_form_time, double_binary_tree
from mcdla.sim.collective_phases import Reducer, lower
from mcdla.sim.fabric_of_dims import dims_system
from mcdla.sim.ir_engine import CollectiveFlows, collective_flow_time

_ALGS = ("ring", "tree", "in-network")


def _dim(p: int, b: float, a: float, name: str) -> FabricDim:
    return FabricDim(name=name, size=p, bytes_per_s=b, latency_s=a, kind=LinkKind.NVLINK, source="test")


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Collective, tuple[FabricDim, ...]]:
    n_levels = draw(st.integers(1, 3))
    sizes = [draw(st.integers(1, 6)) for _ in range(n_levels)]
    while math.prod(sizes) > 24:
        sizes[sizes.index(max(sizes))] -= 1
    dims = tuple(_dim(p, draw(st.floats(1e9, 1e12)), draw(st.floats(0.0, 1e-5)), f"d{i}") for i, p in enumerate(sizes))
    kind = draw(st.sampled_from([k for k in KINDS if k != "p2p"]))
    algs = tuple(draw(st.sampled_from(_ALGS)) for _ in sizes)
    ranks = draw(st.permutations(range(3, 3 + math.prod(sizes))))
    coll = Collective(kind=kind, nbytes=draw(st.floats(1.0, 1e10)), group=tuple(ranks), levels=tuple(sizes),
                      algorithm=algs)
    return coll, dims


@settings(max_examples=120, deadline=None)
@given(_cases())
def test_flow_phases_equal_the_closed_form_on_an_idle_fabric(case: tuple[Collective, tuple[FabricDim, ...]]) -> None:
    """Every kind x algorithm x hierarchy, any rank numbering: the phases run over the dimension star's real routes
    take the closed form's time to 1e-9."""
    coll, dims = case
    placed = {rank: f"g{q}" for q, rank in enumerate(coll.group)}  # position q at the star's coordinates of q
    flows = collective_flow_time(coll, dims_system(dims), devices=placed)
    assert flows == pytest.approx(closed_form_time(coll, dims), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("alg", _ALGS)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
def test_one_level_all_reduce_agrees_for_each_algorithm(alg: str, p: int) -> None:
    """All-reduce on one level of p ranks, each algorithm, flows against the closed form to 1e-9."""
    dims = (_dim(p, 50e9, 2e-6, "x"),)
    coll = Collective(kind="all-reduce", nbytes=3e8, group=tuple(range(p)), algorithm=alg)
    assert collective_flow_time(coll, dims_system(dims)) == pytest.approx(closed_form_time(coll, dims), rel=1e-9)


def test_p2p_agrees_with_a_plus_n_over_b() -> None:
    """A p2p across the outer level of a two-level star takes a_1 + n/B_1 both ways of evaluating it."""
    dims = (_dim(4, 400e9, 1e-6, "nv"), _dim(2, 50e9, 5e-6, "ib"))
    coll = Collective(kind="p2p", nbytes=1e9, group=(1, 5), levels=(2,))
    flows = collective_flow_time(coll, dims_system(dims))
    assert flows == pytest.approx(5e-6 + 1e9 / 50e9, rel=1e-9)
    assert closed_form_time(coll, (dims[1],)) == pytest.approx(flows, rel=1e-9)


def test_double_binary_tree_is_two_spanning_trees() -> None:
    """Each tree of the double binary tree reaches its root from every rank (no cycles), for p up to 300."""
    for p in range(1, 300):
        for parent in double_binary_tree(p):
            assert sum(1 for x in parent if x < 0) == 1
            for r in range(p):
                seen, x = 0, r
                while parent[x] >= 0:
                    x, seen = parent[x], seen + 1
                    assert seen <= p


def test_in_network_goes_through_a_reducer_and_ring_does_not() -> None:
    """In-network phases send to and from the group's reducing switch; ring phases only between members."""
    coll = Collective(kind="all-reduce", nbytes=8.0, group=(3, 1, 2, 0), algorithm="in-network")
    (phase,) = lower(coll)
    assert {f.dst for f in phase.flows if isinstance(f.src, int)} == {Reducer((3, 1, 2, 0))}
    (ring,) = lower(Collective(kind="all-reduce", nbytes=8.0, group=(3, 1, 2, 0)))
    assert [(f.src, f.dst) for f in ring.flows] == [(3, 1), (1, 2), (2, 0), (0, 3)]
    assert sum(f.nbytes for f in ring.flows) == pytest.approx(4 * 2 * 3 / 4 * 8.0)


def test_in_network_without_a_switch_is_one_line_error() -> None:
    """Two GPUs joined by a direct link have no switch to reduce in: a one-line SimError naming the ranks."""
    from mcdla.hardware.model import Device, Link, System

    dev = {"fp16": 1e15}
    system = System(name="pair", devices=tuple(Device(name=f"g{i}", peak_flops_per_s=dev, hbm_bytes=1e9,
                                                      hbm_bytes_per_s=1e12) for i in range(2)),
                    links=(Link(a="g0", b="g1", bytes_per_s=1e9),))
    coll = Collective(kind="all-reduce", nbytes=1e6, group=(0, 1), algorithm="in-network")
    with pytest.raises(SimError, match=r"in-network collective on devices \('g0', 'g1'\).*crosses no switch") as err:
        collective_flow_time(coll, system)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "gather"}, "collective kind: got 'gather'"),
    ({"nbytes": -1.0}, "collective nbytes: got -1.0"),
    ({"group": (0, 0)}, "must not repeat a rank"),
    ({"levels": (3,)}, r"collective levels: got \(3,\)"),
    ({"algorithm": "halving"}, "collective algorithm: got 'halving'"),
    ({"kind": "p2p", "group": (0, 1, 2)}, "must be exactly two"),
])
def test_bad_collective_is_one_line_error(kwargs: dict[str, object], match: str) -> None:
    """Each bad field of a Collective: one-line SimError naming it and the value."""
    fields: dict[str, object] = {"kind": "all-reduce", "nbytes": 1.0, "group": (0, 1)} | kwargs
    with pytest.raises(SimError, match=match) as err:
        Collective(**fields)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("preset", ["dgx-h100-ndr", "dgx-a100", "gh200",
                                    pytest.param("gb200-nvl72", marks=pytest.mark.slow)])  # 144 GPUs: ~8 s
def test_flow_phases_on_expanded_presets_equal_the_closed_form_on_their_dims(preset: str) -> None:
    """The two hardware views of a generated preset agree: a collective over all GPUs of 2 nodes, run as flows
    on ``Cluster.expand()``'s links, takes the closed form on ``Cluster.dims``, for every algorithm and kind."""
    cluster = load_cluster(preset)
    cluster = cluster.with_nodes(2) if cluster.scale_out is not None else cluster
    flows = CollectiveFlows(cluster.expand())
    levels = tuple(d.size for d in cluster.dims)
    for alg in _ALGS:
        for kind in ("all-reduce", "reduce-scatter", "all-to-all"):
            coll = Collective(kind=kind, nbytes=1e9, group=tuple(range(cluster.n_devices)), levels=levels,
                              algorithm=alg)
            assert flows.time(coll) == pytest.approx(closed_form_time(coll, cluster.dims), rel=1e-9)
