"""Context parallelism's K/V exchange in attention, per layer and micro-batch on one rank, as Megatron-Core runs it.

A context-parallel group of ``cp`` ranks splits every sequence: each rank holds the queries, keys and values of
``s / cp`` tokens and needs every other rank's K and V for its attention. The group is a
:class:`~mcdla.workload.parallel_dims.ParallelDims` group like any other, mapped to the fabric dimensions it
spans by :meth:`~mcdla.hardware.cluster.Cluster.group_dims`, so it may leave the NVLink domain.
NOTE [context parallel exchange] (also ``docs/llm.md``):

* The block one rank exchanges is its K and V on one TP rank: ``b (s / cp) (kv_width + v_width) / tp``
  elements (:func:`kv_block_bytes`).
* ``cp_comm="p2p"`` (Transformer Engine's ring, Megatron-Core's default): the forward runs ``cp`` attention
  steps, one per block, and sends the K/V block on around the ring ``cp - 1`` times, each send overlapped with
  the attention of the block it already holds. Every dimension the group spans carries some of the ring's
  hops, and the ranks step together, so the slowest hop paces every step: a send costs the largest
  point-to-point cost ``a + n / B`` over those dimensions (the outermost one on a real fabric, where the
  network is slower than NVLink). Causal attention is load balanced
  as Megatron does it (the sequence cut into ``2 cp`` chunks, rank ``i`` holding chunks ``i`` and
  ``2 cp - 1 - i``), which gives every step the same share of the rank's attention: ``attention / cp``. So
  the exposed time is ``(cp - 1) max(0, send - attention / cp)`` in forward. The backward sends K/V and their
  gradients (two blocks) per step against twice the attention compute: twice the forward's exposure.
* ``cp_comm="all_gather"``: one all-gather of the ``cp`` blocks before the forward attention, an all-gather
  and a reduce-scatter of the gradients in backward; not overlapped (Transformer Engine's ``all_gather``).
* Recomputation of the attention core (``selective`` or ``full``) repeats the forward exchange in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster
from mcdla.sim.collective_models import collective_time, p2p_time
from mcdla.workload.execution import Execution
from mcdla.workload.layer_counts import layer_shares
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import TransformerSpec

__all__ = ["CpExchange", "cp_exchange", "kv_block_bytes"]


def kv_block_bytes(spec: TransformerSpec, micro_batch: int, *, tp: int, cp: int) -> float:
    """Bytes of one rank's K and V block: ``b (s / cp) (kv_hidden + v_width) / tp`` elements."""
    return spec.bytes_per_element * micro_batch * spec.seq_len / cp * (spec.kv_hidden + spec.v_width) / tp


@dataclass(frozen=True, slots=True, kw_only=True)
class CpExchange:
    """One layer's K/V exchange on one rank and micro-batch (seconds): the whole transfer time and what the
    attention compute does not hide, in forward and in backward (recomputed forward included)."""

    fwd_comm_s: float
    bwd_comm_s: float
    fwd_exposed_s: float
    bwd_exposed_s: float


_NO_EXCHANGE = CpExchange(fwd_comm_s=0.0, bwd_comm_s=0.0, fwd_exposed_s=0.0, bwd_exposed_s=0.0)
"""The exchange without context parallelism (a frozen record, so every such execution shares it)."""


def cp_exchange(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                attention_fwd_s: float) -> CpExchange:
    """The exchange of NOTE [context parallel exchange] for one layer; ``attention_fwd_s`` is the rank's
    attention-core forward time of that layer (seconds), the compute a ring send overlaps with."""
    e = execution
    if e.cp == 1:
        return _NO_EXCHANGE
    layout = ParallelDims.of(e)
    dims = cluster.group_dims(e.cp, layout.stride("cp"))
    block = kv_block_bytes(spec, e.micro_batch, tp=e.tp, cp=e.cp)
    if e.cp_comm == "p2p":
        send = max(p2p_time(block, d) for d in dims)  # the slowest hop paces the ring
        step_compute = attention_fwd_s / e.cp
        fwd_comm, fwd_exposed = (e.cp - 1) * send, (e.cp - 1) * max(0.0, send - step_compute)
        bwd_comm, bwd_exposed = 2 * fwd_comm, 2 * fwd_exposed
    else:
        gathered = e.cp * block
        fwd_comm = fwd_exposed = collective_time("all-gather", gathered, dims)
        bwd_comm = bwd_exposed = fwd_comm + collective_time("reduce-scatter", gathered, dims)
    again = layer_shares(e, spec).attention_recomputed  # the recomputed attentions' exchange, in backward
    if again:
        bwd_comm, bwd_exposed = bwd_comm + again * fwd_comm, bwd_exposed + again * fwd_exposed
    return CpExchange(fwd_comm_s=fwd_comm, bwd_comm_s=bwd_comm, fwd_exposed_s=fwd_exposed, bwd_exposed_s=bwd_exposed)
