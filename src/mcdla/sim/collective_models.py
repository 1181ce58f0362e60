"""Closed-form collective times per fabric dimension, for models at scale (an LLM time model at 1k-16k GPUs).

The event engine (:mod:`mcdla.sim.collectives`) runs ring collectives as flows on a materialised system; these
functions price a collective on :class:`~mcdla.hardware.cluster.FabricDim` s without building anything. A
dimension has ``p`` ranks (``size``), each with bandwidth ``B`` into it per direction (``bytes_per_s``) and a
one-way GPU-to-GPU latency ``a`` (``latency_s``). ``n`` is the buffer size in bytes (see :data:`OPS`).

NOTE [collective closed forms]
Uncontended, bandwidth-optimal pipelining, no protocol overhead (the event engine's ring makes the same
assumptions and agrees with ``ring`` exactly; tests/sim/test_collective_models.py):

=================  =================================  ====================================================
op                 ring                               in-network (NVLink SHARP / IB SHARP)
=================  =================================  ====================================================
all-reduce         2 (p-1)/p n/B + 2 (p-1) a          n/B + 2 a  (each GPU sends n up, the switch reduces
                                                      and multicasts n down; a for each way)
reduce-scatter     (p-1)/p n/B + (p-1) a              (p-1)/p n/B + 2 a
all-gather         (p-1)/p n/B + (p-1) a              (p-1)/p n/B + 2 a  (multicast: latency, not bytes)
=================  =================================  ====================================================

``tree`` (NCCL's double binary tree) is an all-reduce algorithm: each GPU is an inner node of one tree and a leaf
of the other, each tree carrying n/2, so every GPU sends and receives 2n over the reduce and broadcast:
``2 n/B + 2 ceil(log2 p) a`` (depth ceil(log2 p) up, then down). Like NCCL, reduce-scatter and all-gather have no
tree algorithm and use the ring on a ``tree`` dimension.

``all-to-all`` (expert parallel) is a direct exchange on a switched dimension whatever its algorithm: each GPU
sends the (p-1)/p of its ``n`` bytes meant for others, to all peers at once: ``(p-1)/p n/B + a``.

Hierarchical (a sequence of dimensions, innermost first, e.g. ``(nvlink, ib)`` with sizes k and m):

* all-reduce: reduce-scatter n over dim 0, then over dim 1 on the n/k shard, ... all-reduce on the outermost
  dimension on the shard n / (product of the inner sizes), then all-gather back out. With every dimension a ring
  of the same B this equals the flat ring's bandwidth term 2 (P-1)/P n/B, P = k m (a test checks it), with
  latency terms per dimension instead of 2 (P-1) a.
* reduce-scatter: over dim 0 on n, dim 1 on n/k, ...; all-gather: the reverse order (outer first on the
  smallest shard).
* all-to-all: traffic whose highest differing dimension is i (a fraction (p_i - 1) prod_{j<i} p_j / P of n)
  crosses dimension i: sum over i of that / B_i + a_i.

Point-to-point (pipeline parallel send/recv of activations): ``a + n/B`` on the dimension the two ranks are
separated by (:meth:`~mcdla.hardware.cluster.Cluster.dim_between`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mcdla.errors import HardwareError
from mcdla.hardware.cluster import ALGORITHMS, FabricDim

__all__ = ["OPS", "collective_time", "p2p_time", "bus_bandwidth"]

OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
"""Collectives, with ``n`` = per-GPU buffer: all-reduce its size, reduce-scatter its input, all-gather its
output (the gathered whole), all-to-all its send buffer (including the part it keeps)."""


def _check(op: str, nbytes: float) -> float:
    if op not in OPS:
        raise HardwareError(f"collective op: got {op!r}; must be one of {', '.join(OPS)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise HardwareError(f"collective nbytes: got {nbytes!r}; must be a finite number >= 0")
    return float(nbytes)


def _one(op: str, n: float, dim: FabricDim, algorithm: str) -> float:
    """One dimension (the table of NOTE [collective closed forms])."""
    p, b, a = dim.size, dim.bytes_per_s, dim.latency_s
    if p == 1 or n == 0.0:
        return 0.0
    if op == "all-to-all":
        return (p - 1) / p * n / b + a
    if algorithm == "in-network":
        return n / b + 2 * a if op == "all-reduce" else (p - 1) / p * n / b + 2 * a
    if algorithm == "tree" and op == "all-reduce":
        return 2 * n / b + 2 * math.ceil(math.log2(p)) * a
    steps = 2 * (p - 1) if op == "all-reduce" else p - 1  # ring (and tree's reduce-scatter / all-gather)
    return steps / p * n / b + steps * a


def collective_time(op: str, nbytes: float, dims: FabricDim | Sequence[FabricDim], *,
                    algorithm: str | Sequence[str] | None = None) -> float:
    """Seconds for collective ``op`` on an ``nbytes`` per-GPU buffer over ``dims`` (NOTE [collective closed forms]).

    ``dims`` is one :class:`FabricDim` or a sequence, innermost first (hierarchical). ``algorithm`` overrides
    each dimension's own: one name for all, or one per dimension. An empty sequence (a group of one) costs 0.
    """
    n = _check(op, nbytes)
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
    if op == "all-to-all":
        total_ranks = math.prod(d.size for d in seq)
        inner, t = 1, 0.0
        for d in seq:
            fraction = (d.size - 1) * inner / total_ranks
            if d.size > 1 and n > 0:
                t += fraction * n / d.bytes_per_s + d.latency_s
            inner *= d.size
        return t
    shard, t = n, 0.0
    if op in ("all-reduce", "reduce-scatter"):
        last = len(seq) - 1 if op == "all-reduce" else len(seq)
        for d, alg in zip(seq[:last], algs[:last]):  # reduce-scatter outward, shard shrinking
            t += _one("reduce-scatter", shard, d, alg)
            shard /= d.size
        if op == "reduce-scatter":
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


def p2p_time(nbytes: float, dim: FabricDim) -> float:
    """Seconds to send ``nbytes`` from one rank to another across ``dim`` (pipeline-parallel send/recv): a + n/B."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise HardwareError(f"p2p nbytes: got {nbytes!r}; must be a finite number >= 0")
    if not isinstance(dim, FabricDim):
        raise HardwareError(f"p2p dim: got {type(dim).__name__}; must be a FabricDim")
    return 0.0 if nbytes == 0 else dim.latency_s + nbytes / dim.bytes_per_s


def bus_bandwidth(op: str, nbytes: float, seconds: float, ranks: int) -> float:
    """NCCL-tests' bus bandwidth of a measured or modelled collective: algbw x the op's factor
    (2 (p-1)/p for all-reduce, (p-1)/p otherwise), so results compare with nccl-tests output."""
    n = _check(op, nbytes)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise HardwareError(f"bus_bandwidth seconds: got {seconds!r}; must be finite and > 0")
    factor = 2 * (ranks - 1) / ranks if op == "all-reduce" else (ranks - 1) / ranks
    return n / seconds * factor
