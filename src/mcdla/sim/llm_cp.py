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

from collections.abc import Sequence
from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster, FabricDim
from mcdla.sim.collective_models import collective_time, p2p_time
from mcdla.sim.llm_moe import all_to_all_bytes
from mcdla.workload.execution import Execution
from mcdla.workload.layer_counts import layer_shares
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import TransformerSpec

__all__ = ["CpExchange", "batched_latency_s", "cp_exchange", "kv_block_bytes", "ring_attention_moved_s"]


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


def batched_latency_s(kind: str, nbytes: float, count: float, dims: Sequence[FabricDim]) -> float:
    """What ``count`` calls of ``kind`` on ``nbytes`` take beyond one call of ``count`` times the bytes on
    ``dims``: the latency terms the engine charges with a pass's compute when it runs the pass's calls of one
    kind as one (NOTE [CP and EP lowering] in :mod:`mcdla.sim.llm_lower_cpep`)."""
    return count * collective_time(kind, nbytes, dims) - collective_time(kind, count * nbytes, dims)


def ring_attention_moved_s(spec: TransformerSpec, execution: Execution, cluster: Cluster, *, layers: int,
                           attention_fwd_s: float, recomputed: float, act_bytes: float,
                           last: tuple[float, float]) -> tuple[float, float]:
    """Under ZeRO-3, the attention a chunk pass of ``layers`` layers runs in its CP ring's steps instead of in
    its layers, forward and backward (NOTE [ZeRO lowering] in :mod:`mcdla.sim.llm_lower_zero`): the ring steps'
    attention (``attention_fwd_s / cp`` per layer and step, ``cp - 1`` steps forward, ``2 (cp - 1)`` backward,
    ``cp - 1`` more with a recomputed attention) less the pass's other compute, which gives it up first: the
    batched TP calls' latency terms (``act_bytes`` a call, the ``recomputed`` share of the layers calling
    twice as many in the backward), the EP all-to-alls' (:func:`batched_latency_s`) and ``last`` (the last
    chunk's logits and loss, forward and backward; zeros for any other chunk). 0 where that is more, and
    without a ring. The layers the gathers hide behind are then that much shorter."""
    e = execution
    if e.cp == 1 or e.cp_comm != "p2p":
        return 0.0, 0.0
    layout = ParallelDims.of(e)
    rest = list(last)
    if e.tp > 1:
        dims = cluster.group_dims(e.tp, layout.stride("tp"))
        kinds = ("all-gather", "reduce-scatter") if e.sequence_parallel else ("all-reduce",)
        for i, calls in enumerate((2.0, 2 + 2 * recomputed)):
            rest[i] += sum(batched_latency_s(k, act_bytes, calls * layers, dims) for k in kinds)
    a2a = all_to_all_bytes(spec, e) if e.ep > 1 and spec.moe_layers else 0.0
    if a2a:
        dims, share = cluster.group_dims(e.ep, layout.stride("ep")), spec.moe_layers / spec.layers
        for i, calls in enumerate((2, 4 if e.recompute == "full" else 2)):
            rest[i] += batched_latency_s("all-to-all", a2a, calls * layers * share, dims)
    step = layers * attention_fwd_s / e.cp
    back = (e.cp - 1) * (3 if e.recomputes_attention else 2)
    return max(0.0, (e.cp - 1) * step - rest[0]), max(0.0, back * step - rest[1])
