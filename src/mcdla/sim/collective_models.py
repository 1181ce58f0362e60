"""One collective description and its closed-form evaluator (the time on an idle fabric of dimensions).

A :class:`Collective` is described once: its kind, its per-rank buffer ``nbytes``, its communicator group (a
list of ranks), its levels (the group as a hierarchy, innermost first) and the algorithm on each level. Two
evaluators read it: :func:`closed_form_time` here, on :class:`~mcdla.hardware.cluster.FabricDim` s, and the
flow evaluator of :mod:`mcdla.sim.collective_phases`, which lowers it to phases of concurrent flows that the
contention-aware executor (:mod:`mcdla.sim.ir_engine`) runs over a system's real links. On an idle fabric the
two agree to 1e-9 for every kind and algorithm (tests/sim/test_collective_phases.py, NOTE [why the phases
equal the closed forms] in :mod:`mcdla.sim.collective_phases`).

A dimension has ``p`` ranks (``size``), each with bandwidth ``B`` into it per direction (``bytes_per_s``) and a
one-way GPU-to-GPU latency ``a`` (``latency_s``). ``n`` is the buffer size in bytes (see :data:`KINDS`).

NOTE [collective closed forms]
Uncontended, bandwidth-optimal pipelining, no protocol overhead; each formula is what the flow phases of
:mod:`mcdla.sim.collective_phases` take on an idle fabric:

=================  =================================  ====================================================
kind               ring                               in-network (NVLink SHARP / IB SHARP)
=================  =================================  ====================================================
all-reduce         2 (p-1)/p n/B + 2 (p-1) a          n/B + 2 a  (each GPU sends n up while the switch
                                                      multicasts the reduced n down, pipelined; a for each
                                                      way: to the reducing switch, back from it)
reduce-scatter     (p-1)/p n/B + (p-1) a              (p-1)/p n/B + 2 a
all-gather         (p-1)/p n/B + (p-1) a              (p-1)/p n/B + 2 a  (multicast: latency, not bytes)
broadcast          n/B + (p-1) a  (pipelined chain)   n/B + 2 a
=================  =================================  ====================================================

``tree`` (NCCL's double binary tree, :func:`double_binary_tree`) is an all-reduce algorithm: two trees, each
carrying n/2, reduce up and broadcast down at once (pipelined). Every tree edge carries n/2 each way, so a GPU's
port carries ``k`` flows of n/2 where ``k`` is its number of tree edges (parent and children, over both trees);
the busiest port decides: ``k_max n / (2B) + 2 depth a`` (:func:`tree_port_flows`). For p >= 4 some GPU is an
inner node of one tree and a leaf of the other (``k_max`` = 4: ``2 n/B``, NCCL's figure); p = 3 gives 3
(``1.5 n/B``) and p = 2 gives 2 (``n/B``, one edge each way in each tree), where a flat ``2 n/B`` would overstate
what the trees move. ``depth`` is the deeper tree's height, ceil(log2 p) for this construction. Like
NCCL, reduce-scatter, all-gather and broadcast have no tree algorithm and use the ring on a ``tree`` level.

``all-to-all`` (expert parallel) is a direct exchange on a switched dimension whatever its algorithm: each GPU
sends the (p-1)/p of its ``n`` bytes meant for others, to all peers at once: ``(p-1)/p n/B + a``.

Hierarchical (several levels, innermost first, e.g. ``(nvlink, ib)`` with sizes k and m):

* all-reduce: reduce-scatter n over level 0, then over level 1 on the n/k shard, ... all-reduce on the
  outermost level on the shard n / (product of the inner sizes), then all-gather back out. With every level a
  ring of the same B this equals the flat ring's bandwidth term 2 (P-1)/P n/B, P = k m (a test checks it), with
  latency terms per level instead of 2 (P-1) a.
* reduce-scatter: over level 0 on n, level 1 on n/k, ...; all-gather: the reverse order (outer first on the
  smallest shard); broadcast: outermost level first, each level on the whole n.
* all-to-all: traffic whose highest differing level is i (a fraction (p_i - 1) prod_{j<i} p_j / P of n)
  crosses level i, one level after the other: sum over i of that / B_i + a_i.

Point-to-point (``p2p``, pipeline parallel send/recv of activations): ``a + n/B`` on the dimension the two
ranks are separated by (:meth:`~mcdla.hardware.cluster.Cluster.dim_between`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from mcdla.errors import HardwareError, SimError
from mcdla.hardware.cluster import ALGORITHMS, FabricDim

__all__ = ["OPS", "KINDS", "Collective", "closed_form_time", "double_binary_tree", "tree_port_flows",
           "collective_time", "p2p_time", "bus_bandwidth"]

OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast")
"""Collectives :func:`collective_time` prices, with ``n`` = per-GPU buffer: all-reduce its size, reduce-scatter
its input, all-gather its output (the gathered whole), all-to-all its send buffer (including the part it
keeps), broadcast the root's buffer."""

KINDS = (*OPS, "p2p")
"""Kinds of a :class:`Collective`: :data:`OPS` plus ``p2p`` (a group of two, the first sends to the second)."""


def _check_bytes(owner: str, nbytes: object, error: type[Exception]) -> float:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise error(f"{owner}: got {nbytes!r}; must be a finite number >= 0")
    return float(nbytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One collective on a communicator group, described once for both evaluators.

    Attributes:
        kind: one of :data:`KINDS`.
        nbytes: per-rank buffer in bytes (:data:`OPS` says which buffer).
        group: the member ranks; their order is the ring order, and position ``q`` of the group has level
            coordinates ``q % levels[0]``, ``q // levels[0] % levels[1]``, ... (innermost level varies fastest).
            A ``broadcast`` is rooted at ``group[0]``; a ``p2p`` sends from ``group[0]`` to ``group[1]``.
        levels: sizes of the hierarchy's levels, innermost first (product = ``len(group)``); default one level.
        algorithm: one name of :data:`~mcdla.hardware.cluster.ALGORITHMS` per level (a single name is used for
            every level). Several levels make the collective hierarchical.
    """

    kind: str
    nbytes: float
    group: tuple[int, ...]
    levels: tuple[int, ...] = ()
    algorithm: tuple[str, ...] | str = "ring"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SimError(f"collective kind: got {self.kind!r}; must be one of {', '.join(KINDS)}")
        object.__setattr__(self, "nbytes", _check_bytes("collective nbytes", self.nbytes, SimError))
        group = tuple(self.group)
        if not group or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in group):
            raise SimError(f"collective group: got {self.group!r}; must be a non-empty list of ranks (integers >= 0)")
        if len(set(group)) != len(group):
            raise SimError(f"collective group: got {group!r}; must not repeat a rank")
        object.__setattr__(self, "group", group)
        if self.kind == "p2p" and len(group) != 2:
            raise SimError(f"collective group: got {len(group)} ranks for a p2p; must be exactly two (sender, receiver)")
        levels = tuple(self.levels) if self.levels else (len(group),)
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in levels) or math.prod(levels) != len(group):
            raise SimError(f"collective levels: got {levels!r}; must be integers >= 1 whose product is the group's "
                           f"{len(group)} ranks")
        object.__setattr__(self, "levels", levels)
        algs = (self.algorithm,) * len(levels) if isinstance(self.algorithm, str) else tuple(self.algorithm)
        if len(algs) != len(levels):
            raise SimError(f"collective algorithm: got {len(algs)} names for {len(levels)} levels; must give one per level")
        for alg in algs:
            if alg not in ALGORITHMS:
                raise SimError(f"collective algorithm: got {alg!r}; must be one of {', '.join(ALGORITHMS)}")
        object.__setattr__(self, "algorithm", algs)

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.group)


@lru_cache(maxsize=1024)
def double_binary_tree(p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NCCL's double binary tree on ``p`` ranks: the parent of each rank (-1 at a root) in each of the two trees.

    Tree 0 is NCCL's ``ncclGetBtree``: rank 0 is the root; rank r > 0 with lowest set bit ``b`` hangs under
    ``(r ^ b) | 2b`` when that exists, else under ``r ^ b``, so odd ranks are leaves. Tree 1 mirrors it
    (r -> p-1-r) when p is even and shifts it (r -> r+1 mod p) when p is odd, so most ranks are a leaf in one
    tree and an inner node in the other.
    """

    def btree_parent(r: int) -> int:
        if r == 0:
            return -1
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        return up if up < p else r ^ bit

    first = tuple(btree_parent(r) for r in range(p))
    if p % 2 == 0:
        second = tuple(-1 if first[p - 1 - r] < 0 else p - 1 - first[p - 1 - r] for r in range(p))
    else:
        second = tuple(-1 if first[(r - 1) % p] < 0 else (first[(r - 1) % p] + 1) % p for r in range(p))
    return first, second


def _height(parent: tuple[int, ...]) -> int:
    depth = [0] * len(parent)
    for r in range(len(parent)):
        d, x = 0, r
        while parent[x] >= 0:
            x, d = parent[x], d + 1
        depth[r] = d
    return max(depth, default=0)


@lru_cache(maxsize=1024)
def tree_port_flows(p: int) -> tuple[int, int]:
    """``(k_max, depth)`` of :func:`double_binary_tree` (p): the most tree edges at one rank over both trees
    (each edge a flow of n/2 each way through that rank's port), and the deeper tree's height."""
    edges = [0] * p
    for parent in double_binary_tree(p):
        for child, up in enumerate(parent):
            if up >= 0:
                edges[child] += 1
                edges[up] += 1
    return max(edges), max(_height(t) for t in double_binary_tree(p))


def _one(kind: str, n: float, dim: FabricDim, algorithm: str) -> float:
    """One level (the table of NOTE [collective closed forms])."""
    p, b, a = dim.size, dim.bytes_per_s, dim.latency_s
    if p == 1 or n == 0.0:
        return 0.0
    if kind == "p2p":
        return a + n / b
    if kind == "all-to-all":
        return (p - 1) / p * n / b + a
    if algorithm == "in-network":
        return n / b + 2 * a if kind in ("all-reduce", "broadcast") else (p - 1) / p * n / b + 2 * a
    if kind == "broadcast":
        return n / b + (p - 1) * a
    if algorithm == "tree" and kind == "all-reduce":
        k_max, depth = tree_port_flows(p)
        return k_max * (n / 2) / b + 2 * depth * a
    steps = 2 * (p - 1) if kind == "all-reduce" else p - 1  # ring (and tree's reduce-scatter / all-gather)
    return steps / p * n / b + steps * a


def closed_form_time(collective: Collective, dims: Sequence[FabricDim]) -> float:
    """Seconds ``collective`` takes on an idle fabric whose level ``i`` is ``dims[i]`` (NOTE [collective closed forms]).

    ``dims`` gives each level's bandwidth and latency; its sizes must be the collective's levels.
    """
    seq = tuple(dims)
    if tuple(d.size for d in seq) != collective.levels:
        raise SimError(f"closed_form_time dims: got sizes {tuple(d.size for d in seq)}; must be the collective's "
                       f"levels {collective.levels}")
    algs = collective.algorithm
    assert isinstance(algs, tuple)
    return _closed_form(collective.kind, collective.nbytes, seq, algs)


def _closed_form(kind: str, n: float, seq: tuple[FabricDim, ...], algs: tuple[str, ...]) -> float:
    """:func:`closed_form_time` on checked parts: ``kind`` of ``n`` bytes over levels ``seq`` (at least one)
    with one algorithm per level; :func:`collective_time` calls it without building the group's rank list."""
    if kind == "p2p":
        return _one("p2p", n, seq[0], algs[0])
    if kind == "all-to-all":
        total_ranks = math.prod(d.size for d in seq)
        inner, t = 1, 0.0
        for d in seq:
            fraction = (d.size - 1) * inner / total_ranks
            if d.size > 1 and n > 0:
                t += fraction * n / d.bytes_per_s + d.latency_s
            inner *= d.size
        return t
    if kind == "broadcast":
        return sum(_one("broadcast", n, d, alg) for d, alg in zip(seq, algs))
    shard, t = n, 0.0
    if kind in ("all-reduce", "reduce-scatter"):
        last = len(seq) - 1 if kind == "all-reduce" else len(seq)
        for d, alg in zip(seq[:last], algs[:last]):  # reduce-scatter outward, shard shrinking
            t += _one("reduce-scatter", shard, d, alg)
            shard /= d.size
        if kind == "reduce-scatter":
            return t
        t += _one("all-reduce", shard, seq[-1], algs[-1])
        for d, alg in zip(reversed(seq[:-1]), reversed(algs[:-1])):  # all-gather back inward
            shard *= d.size
            t += _one("all-gather", shard, d, alg)
        return t
    # all-gather: outermost first on the smallest shard
    shard = n / math.prod(d.size for d in seq[:-1])
    for i in range(len(seq) - 1, -1, -1):
        t += _one("all-gather", shard, seq[i], algs[i])
        if i > 0:
            shard *= seq[i - 1].size
    return t


def collective_time(op: str, nbytes: float, dims: FabricDim | Sequence[FabricDim], *,
                    algorithm: str | Sequence[str] | None = None) -> float:
    """Seconds for collective ``op`` on an ``nbytes`` per-GPU buffer over ``dims`` (NOTE [collective closed forms]).

    ``dims`` is one :class:`FabricDim` or a sequence, innermost first (hierarchical). ``algorithm`` overrides
    each dimension's own: one name for all, or one per dimension. An empty sequence (a group of one) costs 0.
    The collective is the :class:`Collective` on ranks ``0..P-1`` with one level per dimension.
    """
    if op not in OPS:
        raise HardwareError(f"collective op: got {op!r}; must be one of {', '.join(OPS)}")
    n = _check_bytes("collective nbytes", nbytes, HardwareError)
    seq = (dims,) if isinstance(dims, FabricDim) else tuple(dims)
    for d in seq:
        if not isinstance(d, FabricDim):
            raise HardwareError(f"collective dims: got {type(d).__name__}; must be FabricDim (or a sequence of them)")
    if algorithm is None:
        algs = tuple(d.algorithm for d in seq)
    elif isinstance(algorithm, str):
        algs = (algorithm,) * len(seq)
    else:
        algs = tuple(algorithm)
        if len(algs) != len(seq):
            raise HardwareError(f"collective algorithm: got {len(algs)} names for {len(seq)} dimensions; must give one per dimension")
    for alg in algs:
        if alg not in ALGORITHMS:
            raise HardwareError(f"collective algorithm: got {alg!r}; must be one of {', '.join(ALGORITHMS)}")
    if not seq:
        return 0.0
    return _closed_form(op, n, seq, algs)


def p2p_time(nbytes: float, dim: FabricDim) -> float:
    """Seconds to send ``nbytes`` from one rank to another across ``dim`` (pipeline-parallel send/recv): a + n/B."""
    n = _check_bytes("p2p nbytes", nbytes, HardwareError)
    if not isinstance(dim, FabricDim):
        raise HardwareError(f"p2p dim: got {type(dim).__name__}; must be a FabricDim")
    return 0.0 if n == 0.0 else dim.latency_s + n / dim.bytes_per_s  # the closed form's p2p row


def bus_bandwidth(op: str, nbytes: float, seconds: float, ranks: int) -> float:
    """NCCL-tests' bus bandwidth of a measured or modelled collective: algbw x the op's factor
    (2 (p-1)/p for all-reduce, (p-1)/p otherwise), so results compare with nccl-tests output."""
    if op not in OPS:
        raise HardwareError(f"collective op: got {op!r}; must be one of {', '.join(OPS)}")
    n = _check_bytes("collective nbytes", nbytes, HardwareError)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise HardwareError(f"bus_bandwidth seconds: got {seconds!r}; must be finite and > 0")
    factor = 2 * (ranks - 1) / ranks if op == "all-reduce" else (ranks - 1) / ranks
    return n / seconds * factor
