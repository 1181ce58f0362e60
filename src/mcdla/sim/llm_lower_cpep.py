"""Context and expert parallelism lowered onto the program IR: the ops :mod:`mcdla.sim.llm_lower` adds to a chunk.

A chunk pass of ``n`` layers on one rank (NOTE [LLM lowering]) runs its compute, then what this module adds
(:meth:`PassExchange.ops`), then its TP collectives and its pipeline send. Every byte count and duration comes
from :func:`mcdla.sim.llm.stage_costs` and :func:`mcdla.sim.llm.rank_traffic`, and every group from
:class:`~mcdla.workload.parallel_dims.ParallelDims`, so on an idle fabric a pass takes what the analytical model
charges it.

NOTE [CP and EP lowering]

* Batched calls: the ``k`` calls of one kind a pass makes (``k`` per-layer collectives) run as one collective
  of ``k`` times the bytes; what the ``k`` calls take beyond the one (their latency terms) is charged with the
  pass's compute (:func:`batched_collectives`; the TP collectives are batched the same way).
* CP ring (``cp_comm="p2p"``, NOTE [context parallel exchange]): the forward runs ``cp - 1`` ring steps after
  the rest of the pass's compute; in step ``j`` the rank computes the attention of the block it holds
  (``n attention / cp``, :attr:`~mcdla.sim.llm.StageCosts.layer_attention_fwd_s`) while it sends that block
  (``n`` layers' K/V, :attr:`~mcdla.sim.llm.RankTraffic.kv_block_bytes`) to the next rank of its CP group and
  receives the previous rank's; the next step waits for the three. The last block's attention is in the
  pass's compute. A step's send is held ``(n - 1) a`` (``a``: the latency of the dimension its hop crosses)
  before it starts, so on an idle fabric it takes the ``n`` layers' sends, ``n (a + block / B)``, and the
  slowest hop paces the step: ``n max(attention / cp, a + block / B)``, the ``n`` layers' steps of the closed
  form. The backward runs
  ``2 (cp - 1)`` such steps (the K/V and then its gradient per ring step, each against half of the step's
  attention, as the model counts twice the forward's exposure), and ``cp - 1`` more for a recomputed
  attention. Ranks on both sides of a slow hop (a ring that leaves the node) pace the ring; the others wait
  for them at the next step's rendezvous.
* CP all-gather (``cp_comm="all_gather"``): an all-gather of the ``cp`` blocks per layer in the forward, an
  all-gather and a reduce-scatter in the backward (one more all-gather with recomputation), batched, on the
  CP group's fabric dimensions.
* EP: the dispatch and the combine of every MoE layer as all-to-alls on the EP group's dimensions, two per
  mean layer in the forward, two (four with full recomputation) in the backward, weighted by the share of MoE
  layers as the model's mean layer is, batched. The capacity factor's expert FLOPs are in the compute. With
  ``ep_dispatcher: hybridep`` inside one scale-up domain (:func:`~mcdla.sim.llm_moe.hybridep_priced`) the
  dispatch and the combine take the closed form's time at HybridEP's measured rate with the pass's compute and
  put nothing on the links (NOTE [expert parallelism]).
* The data-parallel reduction (every replica simulated): one all-reduce per parameter group over its
  reduction group (:attr:`~mcdla.sim.llm.RankTraffic.gradient_groups`: the dense parameters over the ``dp x
  cp`` replicas, the routed experts over the ``dp cp / ep`` ranks that hold them), one after the other
  (:func:`gradient_collectives`).
* One pipeline (``replicas="fold"``): an EP group leaves a replica when ``ep`` does not divide ``cp``; the
  lowering then simulates ``lcm(ep, cp) / cp`` replicas, the fewest that hold whole EP groups
  (:func:`replica_unit`), and folds the others onto them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster, FabricDim
from mcdla.sim.collective_models import Collective
from mcdla.sim.ir import CollectiveOp, Compute, Op, Recv, Send
from mcdla.sim.llm import RankTraffic, StageCosts
from mcdla.sim.llm_cp import batched_latency_s
from mcdla.sim.llm_moe import hybridep_priced
from mcdla.workload.execution import Execution
from mcdla.workload.parallel_dims import ParallelDims

__all__ = ["PassExchange", "batched_collectives", "gradient_collectives", "pass_exchanges", "replica_unit"]


def batched_collectives(kinds: Sequence[str], nbytes: float, count: float, group: tuple[int, ...],
                        dims: Sequence[FabricDim]) -> list[tuple[Collective, float]]:
    """``count`` calls of each of ``kinds`` on ``nbytes`` as one collective of ``count`` times the bytes per
    kind, each with what the ``count`` calls take beyond the one (NOTE [CP and EP lowering]); none for a group
    of one or nothing to move."""
    if len(group) == 1 or count == 0 or nbytes == 0:
        return []
    levels, algs = tuple(d.size for d in dims), tuple(d.algorithm for d in dims)
    return [(Collective(kind=k, nbytes=count * nbytes, group=group, levels=levels, algorithm=algs),
             batched_latency_s(k, nbytes, count, dims)) for k in kinds]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ring:
    """The ring steps of one pass: ``steps`` of ``compute_s`` of attention beside a send of ``nbytes`` to
    ``send_to``, held ``hold_s`` first, and a receive from ``recv_from``."""

    steps: int
    compute_s: float
    hold_s: float
    nbytes: float
    send_to: int
    recv_from: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PassExchange:
    """The CP and EP work of one chunk pass (forward or backward) on one rank: ``compute_s`` is what the pass's
    compute gains (the batched calls' latency terms) less the attention the ring steps run beside their sends;
    then the ring steps and the collectives (CP all-gathers, EP all-to-alls), one after the other."""

    compute_s: float = 0.0
    ring: _Ring | None = None
    collectives: tuple[Collective, ...] = ()

    def ops(self, tag: str, after: str) -> list[Op]:
        """The ops of the pass ``tag`` after the op ``after`` (its compute); the last one ends the exchange."""
        out: list[Op] = []
        done = after
        ring = self.ring
        for j in range(ring.steps if ring is not None else 0):
            assert ring is not None
            attention, hold, send, recv = (f"cp{j}-{what}-{tag}" for what in ("attention", "hold", "send", "recv"))
            out += [Compute(name=attention, seconds=ring.compute_s, waits=(done,)),
                    Compute(name=hold, stream="cp", seconds=ring.hold_s, waits=(done,)),
                    Send(name=send, stream="cp-send", peer=ring.send_to, nbytes=ring.nbytes, waits=(hold,)),
                    Recv(name=recv, stream="cp-recv", peer=ring.recv_from, nbytes=ring.nbytes, waits=(done,))]
            done = f"cp{j}-{tag}"  # the step ends when its attention, its send and its receive have
            out.append(Compute(name=done, stream="cp", seconds=0.0, waits=(attention, send, recv)))
        for i, coll in enumerate(self.collectives):
            out.append(CollectiveOp(name=f"x{i}-{tag}", collective=coll, waits=(done,)))
            done = out[-1].name
        return out


def pass_exchanges(e: Execution, cluster: Cluster, c: StageCosts, traffic: RankTraffic, rank: int, layers: int,
                   dense: int = 0) -> tuple[PassExchange, PassExchange]:
    """The forward and backward :class:`PassExchange` of a chunk of ``layers`` layers on ``rank``, ``dense`` of
    them dense leading layers (NOTE [CP and EP lowering]; the all-to-alls on the MoE layers only where the costs
    price each kind of layer, NOTE [layer kinds] in :mod:`mcdla.sim.llm`)."""
    layout = ParallelDims.of(e)
    n, recomputes = layers, e.recomputes_attention
    fwd: list[tuple[Collective, float]] = []
    bwd: list[tuple[Collective, float]] = []
    ring_f = ring_b = None
    overlap_f = overlap_b = 0.0
    if e.cp > 1:
        group = layout.group("cp", rank)
        if e.cp_comm == "p2p":
            at = group.index(rank)
            step = n * c.layer_attention_fwd_s / e.cp  # one block's attention over the pass's layers
            send_to = group[(at + 1) % e.cp]
            ring_f = _Ring(steps=e.cp - 1, compute_s=step, hold_s=(n - 1) * cluster.dim_between(rank, send_to).latency_s,
                           nbytes=n * traffic.kv_block_bytes, send_to=send_to, recv_from=group[at - 1])
            ring_b = dataclasses.replace(ring_f, steps=(e.cp - 1) * (3 if recomputes else 2))
            overlap_f, overlap_b = ring_f.steps * step, ring_b.steps * step
        else:
            dims = cluster.group_dims(e.cp, layout.stride("cp"))
            gathered = e.cp * traffic.kv_block_bytes
            fwd += batched_collectives(("all-gather",), gathered, n, group, dims)
            bwd += batched_collectives(("all-gather",), gathered, n * (2 if recomputes else 1), group, dims)
            bwd += batched_collectives(("reduce-scatter",), gathered, n, group, dims)
    kinds = c.kinds(n, dense)
    if hybridep_priced(e, cluster):  # HybridEP's dispatch and combine, at its measured rate: the pass's time
        overlap_f -= sum(k * x.layer_ep_fwd_s for x, k in kinds)
        overlap_b -= sum(k * x.layer_ep_bwd_s for x, k in kinds)
    elif e.ep > 1:
        group, dims = layout.group("ep", rank), cluster.group_dims(e.ep, layout.stride("ep"))
        per_layer_b = 4 if e.recompute == "full" else 2
        # MoE layers of the chunk: its own where each kind is priced apart, else the mean layer's share of them
        moe = n - dense if c.layer_kinds else n * traffic.moe_layer_share
        fwd += batched_collectives(("all-to-all",), traffic.all_to_all_bytes, 2 * moe, group, dims)
        bwd += batched_collectives(("all-to-all",), traffic.all_to_all_bytes, per_layer_b * moe, group, dims)
        # what moe_a2a_overlap's combined steps hide behind the other micro-batch's compute (NOTE [EP overlap])
        overlap_f += sum(k * x.layer_ep_hidden_fwd_s for x, k in kinds)
        overlap_b += sum(k * x.layer_ep_hidden_bwd_s for x, k in kinds)
    return (PassExchange(compute_s=sum(lat for _c, lat in fwd) - overlap_f, ring=ring_f,
                         collectives=tuple(coll for coll, _lat in fwd)),
            PassExchange(compute_s=sum(lat for _c, lat in bwd) - overlap_b, ring=ring_b,
                         collectives=tuple(coll for coll, _lat in bwd)))


def gradient_collectives(e: Execution, cluster: Cluster, traffic: RankTraffic, rank: int) -> list[Collective]:
    """The data-parallel reduction of ``rank``'s gradients as :func:`mcdla.sim.llm.stage_costs` prices it: one
    all-reduce per reduction group (:attr:`~mcdla.sim.llm.RankTraffic.gradient_groups`) on its fabric
    dimensions, one after the other (ZeRO-1/2 move the same bytes)."""
    layout = ParallelDims.of(e)
    out = []
    for nbytes, size, stride in traffic.gradient_groups:
        if size == 1:
            continue
        dims = cluster.group_dims(size, stride)
        out.append(Collective(kind="all-reduce", nbytes=nbytes, group=layout.strided(rank, size, stride),
                              levels=tuple(d.size for d in dims), algorithm=tuple(d.algorithm for d in dims)))
    return out


def replica_unit(e: Execution) -> int:
    """The fewest data-parallel replicas that hold whole EP groups: ``lcm(ep, cp) / cp`` (1 when ``ep``
    divides ``cp``); one pipeline simulates these and folds the others onto them."""
    return math.lcm(e.ep, e.cp) // e.cp
