"""The rank layout (ParallelDims) against a brute-force enumeration of Megatron's nested loops."""

import itertools

import pytest

from mcdla.errors import ConfigError
from mcdla.workload.execution import Execution
from mcdla.workload.parallel_dims import ParallelDims

SHAPES = [dict(tp=2, cp=1, dp=3, pp=2), dict(tp=4, cp=2, dp=2, pp=1), dict(tp=1, cp=1, dp=4, pp=3, ep=2),
          dict(tp=2, cp=2, dp=2, pp=2, ep=2), dict(tp=2, cp=2, dp=2, pp=1, ep=4), dict()]


def _nested(d: dict) -> list[tuple[int, int, int, int]]:
    """(tp, cp, dp, pp) of rank 0, 1, ...: the loops nested pp outermost, tp innermost (Megatron-LM)."""
    tp, cp, dp, pp = (d.get(k, 1) for k in ("tp", "cp", "dp", "pp"))
    return [(t, c, x, p) for p, x, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp))]


@pytest.mark.parametrize("shape", SHAPES)
def test_coordinates_follow_the_nested_loops(shape) -> None:
    """Rank r has the r-th coordinates of the nested loops, and rank(coordinates) inverts it."""
    dims = ParallelDims(**shape)
    order = _nested(shape)
    assert dims.world_size == len(order)
    for r, (t, c, x, p) in enumerate(order):
        got = dims.coordinates(r)
        assert (got.tp, got.cp, got.dp, got.pp) == (t, c, x, p)
        assert dims.rank(tp=t, cp=c, dp=x, pp=p) == r


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dim", ["tp", "cp", "dp", "pp", "ep"])
def test_groups_are_the_ranks_differing_only_in_one_dimension(shape, dim) -> None:
    """A group of tp/cp/dp/pp holds the ranks whose other coordinates agree (brute force over all pairs); an ep
    group the ranks of one cp x dp group whose joint index ``cp + cp_size dp`` has the same quotient by ep.
    Groups partition the ranks."""
    dims = ParallelDims(**shape)
    order = _nested(shape)
    ep = shape.get("ep", 1)
    cp = shape.get("cp", 1)
    free = {"tp": (0,), "cp": (1,), "dp": (2,), "pp": (3,), "ep": (1, 2)}[dim]

    def same_group(a: int, b: int) -> bool:
        ca, cb = order[a], order[b]
        if any(ca[i] != cb[i] for i in range(4) if i not in free):
            return False
        return dim != "ep" or (ca[1] + cp * ca[2]) // ep == (cb[1] + cp * cb[2]) // ep

    groups = dims.groups(dim)
    assert sorted(r for g in groups for r in g) == list(range(dims.world_size))
    for g in groups:
        assert len(g) == dims.size(dim)
        assert all(same_group(g[0], r) for r in g)
        assert all(dims.group(dim, r) == g for r in g)
        assert all(b - a == dims.stride(dim) for a, b in zip(g, g[1:]))
    for a in range(dims.world_size):
        assert len([b for b in range(dims.world_size) if same_group(a, b)]) == dims.size(dim)


def test_of_an_execution() -> None:
    """The layout of an execution record carries its degrees."""
    e = Execution(gpus=16, tp=2, pp=2, dp=2, cp=2, global_batch=2)
    assert ParallelDims.of(e) == ParallelDims(tp=2, cp=2, dp=2, pp=2)


@pytest.mark.parametrize("kwargs, field", [(dict(tp=0), "tp"), (dict(dp=4, ep=3), "ep"),
                                                   (dict(cp=2, dp=3, ep=4), "ep"), (dict(pp=True), "pp")])
def test_bad_degrees_are_one_line_errors(kwargs, field) -> None:
    """Degrees below 1, non-integers and an ep that does not divide cp*dp are refused, naming the field."""
    with pytest.raises(ConfigError, match=rf"parallel_dims\.{field}: got"):
        ParallelDims(**kwargs)


def test_bad_rank_and_dimension_are_one_line_errors() -> None:
    """A rank outside the world and an unknown dimension are refused."""
    dims = ParallelDims(tp=2, dp=2)
    with pytest.raises(ConfigError, match=r"rank: got 4; must be an integer in 0..3"):
        dims.coordinates(4)
    with pytest.raises(ConfigError, match=r"dimension: got 'xp'"):
        dims.groups("xp")
    with pytest.raises(ConfigError, match=r"rank: dp got 2"):
        dims.rank(dp=2)


@pytest.mark.parametrize("shape", SHAPES)
def test_strided_reduction_groups_by_brute_force(shape) -> None:
    """The gradient reduction groups as sizes and strides: ``dp cp`` ranks ``tp`` apart are the ranks whose tp and
    pp coordinates agree; ``dp cp / ep`` ranks ``tp ep`` apart are those that also share the ep index (hold the
    same experts), by brute force over the nested loops."""
    dims = ParallelDims(**shape)
    order = _nested(shape)
    tp, cp, dp, ep = (shape.get(k, 1) for k in ("tp", "cp", "dp", "ep"))
    for r in range(dims.world_size):
        t, c, x, p = order[r]
        replicas = tuple(b for b, (t2, _c2, _x2, p2) in enumerate(order) if (t2, p2) == (t, p))
        experts = tuple(b for b in replicas if (order[b][1] + cp * order[b][2]) % ep == (c + cp * x) % ep)
        assert dims.strided(r, dp * cp, tp) == replicas
        assert dims.strided(r, dp * cp // ep, tp * ep) == experts


def test_strided_groups_that_do_not_tile_the_world_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"parallel_dims.strided: got size 3, stride 1; must be integers >= 1 "
                                          r"whose product divides the 4 ranks"):
        ParallelDims(tp=2, dp=2).strided(0, 3, 1)
