"""ZeRO-3/FSDP, ZeRO-Offload and ZeRO-Infinity lowered onto the program IR, for :mod:`mcdla.sim.llm_lower`.

NOTE [ZeRO lowering]

* ZeRO-3 as run (NOTE [ZeRO-3 as run] in :mod:`mcdla.sim.llm`): a chunk's layers are one compute op each, and
  its weights' all-gathers and, in the backward, its gradients' reduce-scatters are ops on the rank's ``fsdp``
  stream, which runs them one at a time in issue order (the analytical model's one link per group). With
  ``fsdp_prefetch = d >= 1`` the gathers of the chunk's first ``d`` layers are issued when the chunk starts and
  that of layer ``i + d`` when layer ``i`` starts (it waits for what layer ``i`` waits for); with 0 a layer's
  gather is issued when the layer before it ends; a reduce-scatter when its layer's compute ends. A full
  recompute runs inside the layer's backward op and uses the backward's gather. The chunk's other compute (the
  logits and loss, the TP collectives' latency terms) runs before the backward's layers and after the forward's,
  and its TP collectives (and CP/EP exchanges) after the last layer and its reduce-scatter, so the layers'
  exposure is the closed form's (:func:`mcdla.sim.llm.fsdp_exposed_s`); the attention the CP ring runs beside
  its sends comes off the layer ops evenly. Bytes, groups and order come from
  :func:`mcdla.sim.llm.zero3_traffic` (one per parameter tensor with ``zero3_collectives="per-tensor"``, issued
  one after the other in the layer's turn). With every replica simulated the gathers and reduce-scatters are
  collectives on the shard group's fabric dimensions (HSDP: the shard group inside ``hsdp_shard``) and the
  once-per-iteration reduction (the embedding's reduce-scatter and gather, HSDP's all-reduce of each shard
  across the replicas) runs as collectives on the ``dp`` stream, the part HSDP issues after the backward
  (``Zero3Traffic.after_backward``) after the pipeline and the rest; with one pipeline folded the shard group's
  other members have no programs, so each runs for its closed-form time on the ``fsdp`` stream and shares no
  link.
* ZeRO-Offload (``cpu_optimizer``): the GPU's passes over the rank's gradient shard (a fixed-duration op,
  :func:`mcdla.sim.llm_offload.gradient_passes_s`), then the shard goes out in fp32 to the host memories of its
  pool, both from the start of its last backward with ``dp_overlap`` (DeepSpeed's ``overlap_comm``), after the pipeline
  without it (NOTE [ZeRO-Offload] in :mod:`mcdla.sim.llm_offload`); after the pipeline (and the reduction) and
  the gradients' arrival the CPU's Adam runs for :func:`mcdla.sim.llm_offload.cpu_adam_s` (a fixed-duration op:
  the host DRAM and the drives it streams are not links of the engine's system), then the updated 16-bit
  parameters come back. With
  ``delayed_param_update`` the previous iteration's step and its parameters' return run from the iteration's
  start beside the pipeline.
* ZeRO-Infinity (``offload_tier="nvme"``): the node's NVMe drives join the system (:func:`with_nvme`) as two
  memories, ``nvme-read`` at the node's read bandwidth and ``nvme-write`` at its write bandwidth, each behind
  every CPU socket of the node over a link that never binds, so every GPU reaches them through its own PCIe
  path and the node's GPUs share the drives (two memories since a drive's sequential read and write figures
  differ; where reads and writes overlap, a stage writing its optimizer state while another still fetches its
  weights, each direction keeps its full figure, an optimistic simplification). Offloaded weights are fetched from
  ``nvme-read``; a GPU optimizer's state is read from ``nvme-read`` and written back to ``nvme-write``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import Cluster
from mcdla.hardware.model import Link, LinkKind, Memory, MemoryKind, System
from mcdla.sim.collective_models import Collective, collective_time
from mcdla.sim.ir import CollectiveOp, Compute, Offload, Op, Prefetch
from mcdla.sim.llm import ShardCollective, Zero3Traffic, precision_of
from mcdla.sim.llm_offload import MASTER_GRAD_BYTES, cpu_adam_s, gradient_passes_s
from mcdla.workload.execution import Execution
from mcdla.workload.parallel_dims import ParallelDims

__all__ = ["FsdpOps", "NvmeMemories", "fsdp_ops", "fsdp_chunk", "zero3_step_collectives", "step_ops", "uses_nvme",
           "nvme_rejection", "with_nvme"]


@dataclass(frozen=True, slots=True)
class FsdpOps:
    """One rank's ZeRO-3 collectives per layer: each a :class:`Collective` (every replica simulated) or the
    seconds it takes alone (one pipeline folded); ``prefetch``: ``fsdp_prefetch``."""

    gathers: tuple[Collective | float, ...]
    reduces: tuple[Collective | float, ...]
    prefetch: int


def _collective(c: ShardCollective, e: Execution, cluster: Cluster, rank: int) -> Collective:
    """``c`` as the collective of ``rank``'s group (``c.size`` ranks ``c.stride`` apart,
    :meth:`~mcdla.workload.parallel_dims.ParallelDims.strided`)."""
    dims = cluster.group_dims(c.size, c.stride)
    return Collective(kind=c.kind, nbytes=c.nbytes, group=ParallelDims.of(e).strided(rank, c.size, c.stride),
                      levels=tuple(d.size for d in dims), algorithm=tuple(d.algorithm for d in dims))


def _alone_s(c: ShardCollective, cluster: Cluster) -> float:
    return collective_time(c.kind, c.nbytes, cluster.group_dims(c.size, c.stride))


def fsdp_ops(e: Execution, cluster: Cluster, traffic: Zero3Traffic, rank: int, *, collectives: bool) -> FsdpOps:
    """The per-layer ops of :class:`FsdpOps` for ``rank`` (NOTE [ZeRO lowering])."""
    def one(c: ShardCollective) -> Collective | float:
        return _collective(c, e, cluster, rank) if collectives else _alone_s(c, cluster)

    return FsdpOps(gathers=tuple(one(c) for c in traffic.gathers if c.size > 1),
                   reduces=tuple(one(c) for c in traffic.reduces if c.size > 1), prefetch=e.fsdp_prefetch)


def zero3_step_collectives(e: Execution, cluster: Cluster, traffic: Zero3Traffic, rank: int,
                           *, after_backward: bool = False) -> list[Collective]:
    """ZeRO-3's once-per-iteration reduction of ``rank`` as collectives (NOTE [ZeRO lowering]): ``step``, or
    with ``after_backward`` the part issued once the backward has ended (HSDP's last units)."""
    return [_collective(c, e, cluster, rank) for c in (traffic.after_backward if after_backward else traffic.step)]


def _op(name: str, item: Collective | float, waits: tuple[str, ...]) -> Op:
    if isinstance(item, Collective):
        return CollectiveOp(name=name, stream="fsdp", collective=item, waits=waits)
    return Compute(name=name, stream="fsdp", seconds=item, waits=waits)


def fsdp_chunk(ops: list[Op], tag: str, waits: tuple[str, ...], layers: int, layer_s: float, other_s: float,
               fsdp: FsdpOps, *, backward: bool) -> str:
    """Append one chunk's compute under ZeRO-3 to ``ops`` (NOTE [ZeRO lowering]): ``layers`` ops of ``layer_s``
    with their gathers (and reduce-scatters in the backward), and ``other_s`` of the chunk's other compute
    before the backward's layers or after the forward's; the chunk starts after ``waits``. Returns the name of
    the op that ends it (the last layer and its reduce-scatter done)."""
    start = f"compute-{tag}"
    ops.append(Compute(name=start, seconds=other_s if backward else 0.0, waits=waits))
    gathered: dict[int, str] = {}

    def gather(j: int, after: tuple[str, ...]) -> None:
        for i, item in enumerate(fsdp.gathers):
            ops.append(_op(f"gather{i}-l{j}-{tag}", item, after))
            gathered[j] = ops[-1].name

    d = fsdp.prefetch
    for j in range(min(d, layers)):
        gather(j, (start,))
    prev, ends = start, [start]
    for j in range(layers):
        if not d:
            gather(j, (prev,))
        layer_waits = (prev, gathered[j]) if j in gathered else (prev,)
        if d and j + d < layers:
            gather(j + d, layer_waits)  # issued when layer j starts
        ops.append(Compute(name=f"layer{j}-{tag}", seconds=layer_s, waits=layer_waits))
        prev = ops[-1].name
        ends = [prev]
        if backward:
            for i, item in enumerate(fsdp.reduces):
                ops.append(_op(f"reduce{i}-l{j}-{tag}", item, (prev,)))
                ends.append(ops[-1].name)
    ops.append(Compute(name=f"layers-{tag}", seconds=0.0 if backward else other_s, waits=tuple(ends)))
    return ops[-1].name


@dataclass(frozen=True, slots=True)
class NvmeMemories:
    """The memories of a node's NVMe drives in the engine's system (:func:`with_nvme`), by node prefix."""

    read: dict[str, str]
    write: dict[str, str]

    def of(self, device: str) -> tuple[str, str]:
        """(read, write) memories of the drives in ``device``'s node."""
        return self.read[_node_of(device)], self.write[_node_of(device)]


def _node_of(name: str) -> str:
    """The ``n{j}`` prefix of a name in a multi-node expansion, "" in a single node's."""
    head = name.split(".", 1)[0]
    return head if "." in name and head[:1] == "n" and head[1:].isdigit() else ""


def uses_nvme(e: Execution) -> bool:
    """Whether the lowering moves data between a GPU and the drives: offloaded weights or a GPU optimizer's
    state on the ``nvme`` tier (the CPU optimizer's state never leaves the host's side)."""
    return e.offload_tier == "nvme" and (e.offload_weights or (e.offload_optimizer and not e.cpu_optimizer))


def _sockets(system: System) -> dict[str, set[str]]:
    """The CPU sockets of each node (by ``n{j}`` prefix): the switches its host memories hang on."""
    hosts = {m.name for m in system.memories if m.kind is MemoryKind.HOST}
    switches = {sw.name for sw in system.switches}
    sockets: dict[str, set[str]] = {}
    for lk in system.links:
        for mem, other in ((lk.a, lk.b), (lk.b, lk.a)):
            if mem in hosts and other in switches:
                sockets.setdefault(_node_of(mem), set()).add(other)
    return sockets


def nvme_rejection(cluster: Cluster) -> str | None:
    """Why :func:`with_nvme` cannot add ``cluster``'s drives (none, or no CPU socket to hang them on), or None."""
    if cluster.nvme is None:
        return f"execution.offload_tier: got 'nvme'; {cluster.name} has no node.nvme drives"
    if not _sockets(cluster.node_system()):
        return (f"execution.offload_tier: got 'nvme'; the engine hangs the drives of {cluster.name} on its CPU "
                "sockets and its nodes have none: use the analytical model for this record")
    return None


def with_nvme(cluster: Cluster, system: System) -> tuple[System, NvmeMemories]:
    """``system`` (expanded from ``cluster``) with each node's NVMe drives as the two memories of NOTE [ZeRO
    lowering]; one-line ConfigError as :func:`nvme_rejection`."""
    why = nvme_rejection(cluster)
    if why is not None:
        raise ConfigError(why)
    nvme = cluster.nvme
    assert nvme is not None
    memories, links = list(system.memories), list(system.links)
    read: dict[str, str] = {}
    write: dict[str, str] = {}
    for node, cpus in sorted(_sockets(system).items()):
        prefix = f"{node}." if node else ""
        for label, rate, names in (("read", nvme.read_bytes_per_s, read), ("write", nvme.write_bytes_per_s, write)):
            name = names[node] = f"{prefix}nvme-{label}"
            memories.append(Memory(name=name, kind=MemoryKind.HOST, capacity_bytes=nvme.capacity_bytes,
                                   dram_bytes_per_s=rate, source=f"node.nvme, the drives' sequential {label} "
                                   f"bandwidth over the node: {nvme.source}"))
            links += [Link(a=cpu, b=name, bytes_per_s=float("inf"), kind=LinkKind.PCIE,
                           source="the drives' PCIe lanes to the socket: the drives' bandwidth is the limit "
                                  "(mcdla assumption)") for cpu in sorted(cpus)]
    return dataclasses.replace(system, memories=tuple(memories), links=tuple(links)), NvmeMemories(read, write)


def _spread(kind: type[Offload] | type[Prefetch], label: str, memories: Sequence[str], nbytes: float,
            waits: tuple[str, ...]) -> list[Op]:
    """A copy of ``nbytes`` split evenly over ``memories``, one stream each."""
    return [kind(name=f"{label}-{mem}", stream=f"{label.split('-')[0]}-{mem}", memory=mem,
                 nbytes=nbytes / len(memories), waits=waits) for mem in memories]


def step_ops(e: Execution, cluster: Cluster, system: System, device: str, pool: Sequence[str], *, tail: str,
             last_backward: tuple[str, ...], optimizer_bytes: float, optimizer_s: float, precision: str,
             nvme: NvmeMemories | None) -> list[Op]:
    """The optimizer step's ops after ``tail`` (the pipeline and the reduction; NOTE [ZeRO lowering]):
    Adam on the GPU with its state where ``offload_optimizer`` keeps it (the pool or the drives), or on the CPU
    (``cpu_optimizer``) with the gradients going out from ``last_backward`` (the waits of the last backward)."""
    prec = precision_of(precision)
    if e.cpu_optimizer:
        params = optimizer_bytes / prec.optimizer_bytes
        kinds = {m.name: m.kind for m in system.memories}
        host = [m for m in pool if kinds[m] is MemoryKind.HOST] or list(pool)
        step_s = cpu_adam_s(e, cluster, params, optimizer_bytes=prec.optimizer_bytes)
        weights = prec.element_bytes * params
        # the GPU's passes over the gradients, then the fp32 gradients out, beside the last backward with
        # overlap_comm, after it without (NOTE [ZeRO-Offload])
        passes = Compute(name="gradient-passes", stream="gradient-passes",
                         seconds=gradient_passes_s(cluster, params, prec.element_bytes),
                         waits=last_backward if e.dp_overlap else (tail,))
        out = [passes, *_spread(Offload, "gradients-out", host, MASTER_GRAD_BYTES * params, (passes.name,))]
        if e.delayed_param_update:  # the previous iteration's step, beside this one's pipeline
            adam: Op = Compute(name="cpu-adam", stream="cpu-adam", seconds=step_s)
            back = _spread(Prefetch, "parameters-in", host, weights, (adam.name,))
            end = Compute(name="step-end", seconds=0.0, waits=(tail, *(op.name for op in (*out, *back))))
            return [*out, adam, *back, end]
        adam = Compute(name="cpu-adam", stream="cpu-adam", seconds=step_s, waits=(tail, *(op.name for op in out)))
        return [*out, adam, *_spread(Prefetch, "parameters-in", host, weights, (adam.name,))]
    if not e.offload_optimizer:
        return [Compute(name="adam", seconds=optimizer_s, waits=(tail,))]
    src, dst = ((nvme.of(device)[0],), (nvme.of(device)[1],)) if nvme is not None else (pool, pool)
    fetched = _spread(Prefetch, "optimizer-in", src, optimizer_bytes, (tail,))
    adam = Compute(name="adam", seconds=optimizer_s, waits=(tail, *(op.name for op in fetched)))
    return [*fetched, adam, *_spread(Offload, "optimizer-out", dst, optimizer_bytes, (adam.name,))]
