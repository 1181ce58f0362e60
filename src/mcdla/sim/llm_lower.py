"""LLM training lowered onto the program IR (:mod:`mcdla.sim.ir`) and run on the contention-aware engine.

:func:`lower` turns one execution of a transformer on a generated :class:`~mcdla.hardware.cluster.Cluster` into
per-rank programs; :func:`engine_step` runs them with :func:`mcdla.sim.ir_engine.execute` on
:meth:`Cluster.expand` and reports the iteration with the time lost to contention per link class. Every
duration and byte count comes from :func:`mcdla.sim.llm.stage_costs` and :func:`mcdla.sim.llm.rank_traffic`,
the cost source of the analytical model, so the two differ only in how the links are shared.

NOTE [LLM lowering]

* Ranks: one pipeline, the TP x CP ranks of every stage of data-parallel replica 0 (of the replicas that hold
  whole EP groups when an EP group leaves the replica, NOTE [CP and EP lowering] in
  :mod:`mcdla.sim.llm_lower_cpep`), in Megatron's rank order
  (:class:`~mcdla.workload.parallel_dims.ParallelDims`). The other replicas run the same program at the same
  time. Those on the rank's node are folded into it with their devices as mirrors (NOTE [folded
  ranks]), so the node's other GPUs, PCIe switches, host memory and memory-node links carry their traffic;
  those on other nodes share no finite resource with it (every GPU has its own rail into a non-blocking
  scale-out switch; pools are per node) and are left out. Should replicas straddle nodes unevenly, all
  of them are folded. Only the nodes that hold a simulated rank or a mirror are expanded (the nodes are
  identical), each rank on its GPU slot of its node.
* Each rank runs :func:`mcdla.sim.llm_ranks.pipeline_order`. One chunk's forward of one micro-batch is: wait
  for the input (a :class:`~mcdla.sim.ir.Recv` from the previous stage; a rank posts all its receives up front,
  one stream per peer in the order the peer sends, so receives never hold it), the chunk's compute (its
  layers, each stage's and chunk's own count under an uneven split, plus logits and loss on the last chunk of
  the last stage; under ZeRO-3 one op per layer with its gathers and reduce-scatters, NOTE [ZeRO lowering] in
  :mod:`mcdla.sim.llm_lower_zero`), then its TP collectives: the ``2 n``
  all-reduces (all-gather + reduce-scatter with sequence parallelism) of ``n`` layers as one collective of
  ``2 n`` times the bytes, the latency terms of the ``2 n - 1`` others charged with the compute they are spread
  over (a collective's closed form is its bytes' term plus a latency, so this is exact on an idle fabric), then
  the send of the activation to the next stage. Context and expert parallelism add their work between the
  compute and the TP collectives: the ring's K/V sends beside the attention steps or the CP all-gathers, and
  the MoE all-to-alls (NOTE [CP and EP lowering]). A backward is the same with the backward compute (and the
  recomputation), ``2 n`` collectives (``4 n`` with full recomputation) and the gradient sent back.
* Offload: with ``offload_activations`` the chunk's activations go out while its forward runs and come back
  while its backward runs (with ``activation_offload_sync`` after it, and the rank's next chunk waits for them:
  DeepSpeed's blocking copies; with ``offload_first_touch`` each forward copy has a host op beside it, the
  host's first-touch time, and ends with the later of the two); with ``offload_weights`` the chunk's weights
  are fetched for each forward and each backward; each copy is spread evenly over the GPU's pool memories
  (one flow per memory). The chunk's send starts when its collectives end, sharing the links with copies still in flight (a DGX H100 GPU's PCIe
  carries both its offload and its NIC's traffic); the rank's next chunk waits for the copies, so what the
  compute and the collectives do not hide is exposed.
* Where Megatron has no peer (the last chunk's forward on the last stage, the first chunk's backward on stage
  0) the rank is held for the slowest stage boundary's transfer time (``StageCosts.p2p_s``), as the analytical
  model charges every forward and backward one transfer (NOTE [pipeline sends] in :mod:`mcdla.sim.llm`).
* ``replicas="all"`` (``"auto"`` up to :data:`ALL_REPLICAS_UP_TO` GPUs) simulates every replica instead, unfolded,
  and runs the data-parallel reduction as collectives, one all-reduce per parameter group on its reduction
  group's fabric dimensions (the ``dp x cp`` replicas, the ``dp cp / ep`` holding the same experts; ZeRO-1/2
  move the same bytes; ZeRO-3's once-per-iteration collectives instead, NOTE [ZeRO lowering]): after the
  rank's pipeline, or with ``dp_overlap`` from the start of its last backward, sharing the links with it (so
  the backward's collectives, not only its compute, run beside it). With one pipeline (``"fold"``) the
  replicas on other nodes have no programs, so a rank runs the reduction's exposed part by its closed form
  (``dp_exposed_s``). Then with ``offload_optimizer`` it fetches its optimizer state (from the node's drives on
  the ``nvme`` tier), runs the Adam step and writes the state back; with ``cpu_optimizer`` its gradients go
  out, the CPU's Adam runs and the parameters come back (NOTE [ZeRO lowering]).

On an idle fabric the programs take the per-rank schedule's time (:func:`mcdla.sim.llm_ranks.simulate_ranks`)
whenever the offload is hidden by the compute; an exposed offload is shorter here, since the TP collectives
also hide it and, with several stages, the send and the last stage's logits and loss too, and a pass sends its
output before its copies end (only the rank waits for them; ``docs/llm.md``, "memory per rank"). Contention is
what sharing adds (NOTE [contention accounting] in :mod:`mcdla.sim.ir_engine`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.hardware.model import Link, LinkKind, Switch, System
from mcdla.sim.collective_models import Collective
from mcdla.sim.ir import CollectiveOp, Compute, Offload, Op, Prefetch, RankProgram, Recv, Send
from mcdla.sim.ir_engine import execute
from mcdla.sim.llm import (DEFAULT_PRECISION, LlmStep, RankTraffic, StageCosts, llm_step, precision_of, rank_traffic,
                           stage_costs, zero3_traffic)
from mcdla.sim.llm_lower_cpep import (PassExchange, batched_collectives, gradient_collectives, pass_exchanges,
                                      replica_unit)
from mcdla.sim.llm_lower_zero import (FsdpOps, NvmeMemories, fsdp_chunk, fsdp_ops, nvme_rejection, step_ops, uses_nvme,
                                      with_nvme, zero3_step_collectives)
from mcdla.sim.llm_offload import first_touch_bytes_per_s
from mcdla.sim.llm_ranks import pipeline_order
from mcdla.workload.execution import Execution
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import TransformerSpec

__all__ = ["ALL_REPLICAS_UP_TO", "REPLICAS", "LoweredIteration", "EngineStep", "lower", "engine_step",
           "lowering_rejection"]

REPLICAS = ("auto", "fold", "all")
"""How :func:`lower` treats the data-parallel replicas (NOTE [LLM lowering])."""

ALL_REPLICAS_UP_TO = 64
"""``replicas="auto"`` simulates every replica up to this many GPUs (ms to a second on the engine), one pipeline
beyond."""

_ROUNDING = 1e-12
"""Relative size below which the shared run's excess over the idle one is the rounding of two float sums."""


@dataclass(frozen=True, slots=True)
class LoweredIteration:
    """The programs of one iteration: the system they run on, each rank's device and its folded replicas'."""

    system: System
    programs: tuple[RankProgram, ...]
    devices: dict[int, str]
    mirrors: dict[int, tuple[str, ...]]
    costs: StageCosts
    fold: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStep:
    """One iteration on the engine (seconds): ``iteration_s`` on the shared fabric, ``idle_iteration_s`` with
    every transfer alone, ``contention_s`` their difference split over link classes in
    ``contention_by_class_s``; ``analytical`` is the closed form's record of the same execution."""

    iteration_s: float
    idle_iteration_s: float
    contention_s: float
    contention_by_class_s: dict[str, float]
    ranks_simulated: int
    fold: int
    solves: int
    analytical: LlmStep = field(repr=False)

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON."""
        return {"iteration_s": self.iteration_s, "idle_iteration_s": self.idle_iteration_s,
                "contention_s": self.contention_s, "contention_by_class_s": dict(self.contention_by_class_s),
                "ranks_simulated": self.ranks_simulated, "fold": self.fold, "solves": self.solves,
                "analytical_iteration_s": self.analytical.iteration_s}


def _nics_behind_pcie(cluster: Cluster, system: System) -> System:
    """``system`` with each GPU's network rail behind its PCIe x16 where the file says so (``scale_out.via_gpu_link``,
    as :func:`mcdla.hardware.traffic.node_paths` routes the scale-out class): the x16 ends in a PCIe switch
    ``<gpu>.pcie`` that leads on to the CPU socket and to the rail, so GPUDirect RDMA and the offload to host
    memory share it. The rail keeps the GPU-to-GPU latency: half of it, less the x16's, on each rail link. The
    2018 engine's rings, which this engine does not read, are dropped."""
    out = cluster.scale_out
    if out is None or cluster.nodes == 1:
        return system
    if len(cluster.path("scale-out").resources) == 1:  # the rail alone: the NIC is not behind the GPU's x16
        return system
    gpus = {d.name for d in system.devices}
    pcie = {(lk.a if lk.a in gpus else lk.b): lk for lk in system.links if lk.kind is LinkKind.PCIE
            and (lk.a in gpus) != (lk.b in gpus)}
    links: list[Link] = []
    switches = list(system.switches)
    for lk in system.links:
        gpu = lk.a if lk.a in gpus else lk.b
        if lk is pcie.get(gpu):
            cpu = lk.b if lk.a == gpu else lk.a
            switches.append(Switch(name=f"{gpu}.pcie", source="the PCIe switch a GPU and its NIC share (via_gpu_link)"))
            links += [dataclasses.replace(lk, a=gpu, b=f"{gpu}.pcie"),
                      Link(a=f"{gpu}.pcie", b=cpu, bytes_per_s=float("inf"), kind=LinkKind.PCIE,
                           source="the PCIe switch's path to the socket: the GPU's x16 is the limit")]
        elif lk.kind is LinkKind.NETWORK and gpu in pcie and out.name in (lk.a, lk.b):
            links.append(dataclasses.replace(lk, a=f"{gpu}.pcie", b=out.name,
                                             latency_s=max(0.0, lk.latency_s - pcie[gpu].latency_s)))
        else:
            links.append(lk)
    return dataclasses.replace(system, switches=tuple(switches), links=tuple(links), rings=())


class _RankBuilder:
    """The ops of one rank, with the names of the ops its next chunk must wait for."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ops: list[Op] = []
        self.last: str | None = None  # the op that ends the previous chunk (holds the rank until it ends)
        self.copies: list[str] = []  # the previous chunk's offloads and prefetches (the next chunk waits for them)

    def add(self, op: Op) -> str:
        self.ops.append(op)
        return op.name


def _tp_collectives(e: Execution, cluster: Cluster, group: tuple[int, ...], nbytes: float, count: float,
                    ) -> list[tuple[Collective, float]]:
    """``count`` TP all-reduces (or all-gather + reduce-scatter pairs) of ``nbytes``, batched
    (:func:`~mcdla.sim.llm_lower_cpep.batched_collectives`, NOTE [LLM lowering])."""
    layout = ParallelDims.of(e)
    kinds = ("all-gather", "reduce-scatter") if e.sequence_parallel else ("all-reduce",)
    return batched_collectives(kinds, nbytes, count, group, cluster.group_dims(layout.tp, layout.stride("tp")))


def _folded_peers(e: Execution, layout: ParallelDims, k: int, simulated: Sequence[int], unit: int,
                  ) -> tuple[dict[int, list[int]], int]:
    """The replicas each simulated rank stands for, ``unit`` replicas being simulated, and the fold: those that
    share its node (the others share no finite resource with it), or all of them when replicas straddle nodes
    unevenly; none with every replica simulated."""
    step = unit * layout.stride("dp")
    peers = {r: [r + d * step for d in range(1, e.dp // unit) if (r + d * step) // k == r // k] for r in simulated}
    fold = 1 + len(peers[simulated[0]])
    if any(len(ps) != fold - 1 for ps in peers.values()):  # replicas straddle nodes unevenly: fold them all
        peers = {r: [r + d * step for d in range(1, e.dp // unit)] for r in simulated}
        fold = e.dp // unit
    return peers, fold


def _simulated(e: Execution, layout: ParallelDims, unit: int) -> list[int]:
    """The ranks of the first ``unit`` replicas, replica by replica, stage by stage, in Megatron's order."""
    return [layout.rank(tp=t, cp=x, dp=d, pp=s) for d in range(unit) for s in range(e.pp) for x in range(e.cp)
            for t in range(e.tp)]


def _nvme_unlowered(e: Execution, cluster: Cluster, unit: int) -> str | None:
    """Why the NVMe tier of ``e`` cannot be lowered on ``cluster`` (sized for ``e``) with ``unit`` replicas
    simulated, or None."""
    layout, k = ParallelDims.of(e), cluster.gpus_per_node
    simulated = _simulated(e, layout, unit)
    peers, _fold = _folded_peers(e, layout, k, simulated, unit)
    if any(g // k != r // k for r in simulated for g in peers[r]):
        return (f"execution.offload_tier: got 'nvme' with the replicas of a rank on other nodes (dp={e.dp}, "
                f"{k} GPUs per node); the engine folds the NVMe tier within a node only: use replicas='all' or "
                "the analytical model for this record")
    return nvme_rejection(cluster)


def _unit(e: Execution, replicas: str) -> int:
    """How many replicas :func:`lower` simulates: every one (``all``, or ``auto`` up to
    :data:`ALL_REPLICAS_UP_TO` GPUs) or the fewest that hold whole EP groups."""
    every = replicas == "all" or (replicas == "auto" and e.gpus <= ALL_REPLICAS_UP_TO)
    return e.dp if every else replica_unit(e)  # NOTE [CP and EP lowering]


def _overlap_unlowered(e: Execution, c: StageCosts) -> str | None:
    """Why the TP-communication overlap of ``e`` cannot be lowered, or None: the engine overlaps a chunk's TP
    collectives with its GEMMs as one span, which is the closed form's per-layer rule only when every layer of the
    chunk is recomputed alike and its layers are not split into ZeRO-3's per-layer ops."""
    if not (e.tp_comm_overlap and e.tp > 1):
        return None
    if e.zero >= 3 or 0.0 < c.recomputed_share < 1.0:
        return (f"execution.tp_comm_overlap: got true with zero={e.zero}, recompute_num_layers="
                f"{e.recompute_num_layers}; the engine overlaps TP collectives with ZeRO 0-2 and a recompute of no "
                "or every layer: use the analytical model for this record")
    return None


def lowering_rejection(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                       precision: str = DEFAULT_PRECISION, replicas: str = "auto") -> str | None:
    """The one-line reason :func:`lower` refuses ``execution`` (with ``replicas``), or None when the engine lowers
    it (ConfigError as :func:`stage_costs` for a record the model itself refuses)."""
    e = execution
    why = _overlap_unlowered(e, stage_costs(spec, e, cluster, precision=precision))
    if why is not None:
        return why
    return _nvme_unlowered(e, cluster.for_gpus(e.gpus), _unit(e, replicas)) if uses_nvme(e) else None


def lower(spec: TransformerSpec, execution: Execution, cluster: Cluster, *, precision: str = DEFAULT_PRECISION,
          replicas: str = "auto") -> LoweredIteration:
    """The per-rank programs of one iteration (NOTE [LLM lowering]); ConfigError as :func:`stage_costs` or for an
    unknown ``replicas`` (``fold``: one pipeline; ``all``: every replica, with the data-parallel reduction as
    collectives; ``auto``: ``all`` up to :data:`ALL_REPLICAS_UP_TO` GPUs)."""
    if replicas not in REPLICAS:
        raise ConfigError(f"replicas: got {brief(replicas)}; must be one of {', '.join(REPLICAS)}")
    e = execution
    every = replicas == "all" or (replicas == "auto" and e.gpus <= ALL_REPLICAS_UP_TO)
    c = stage_costs(spec, e, cluster, precision=precision)
    why = _overlap_unlowered(e, c)
    if why is not None:
        raise ConfigError(why)
    traffic = rank_traffic(spec, e, precision)
    cluster = cluster.for_gpus(e.gpus)
    layout = ParallelDims.of(e)
    p, v, m = e.pp, e.virtual_stages, e.micro_batches
    k = cluster.gpus_per_node

    def rank(t: int, x: int, s: int, d: int = 0) -> int:
        return layout.rank(tp=t, cp=x, dp=d, pp=s)

    unit = _unit(e, replicas)
    replica_ids = range(unit)
    simulated = _simulated(e, layout, unit)
    peers, fold = _folded_peers(e, layout, k, simulated, unit)
    used = sorted({g // k for r in simulated for g in (r, *peers[r])})
    system = _nics_behind_pcie(cluster, cluster.with_nodes(len(used)).expand() if cluster.scale_out is not None
                               else cluster.expand())
    names = system.device_names
    where = {node: i for i, node in enumerate(used)}

    def device(g: int) -> str:
        return names[where[g // k] * k + g % k]

    nvme: NvmeMemories | None = None
    if uses_nvme(e):
        why = _nvme_unlowered(e, cluster, unit)
        if why is not None:
            raise ConfigError(why)
        system, nvme = with_nvme(cluster, system)
    zero3 = zero3_traffic(spec, e, precision_of(precision).element_bytes) if e.zero >= 3 else None
    programs: list[RankProgram] = []
    mirrors: dict[int, tuple[str, ...]] = {}
    for d in replica_ids:
        for s in range(p):
            order = pipeline_order(p, m, v, s)
            for x in range(e.cp):
                group = tuple(rank(t, x, s, d) for t in range(e.tp))
                sizes = set(c.chunk_layers[s])  # layers of the stage's chunks (one size unless the split is uneven)
                colls = {(n, forward): _tp_collectives(e, cluster, group, traffic.activation_bytes,
                                                       (2 if forward else 2 + 2 * c.recomputed_share) * n)
                         for n in sizes for forward in (True, False)}
                for t in range(e.tp):
                    r = rank(t, x, s, d)
                    pool = system.pools.get(device(r), ())
                    dp_tail: list[Collective] = []
                    if not every:
                        dp_colls = None
                    elif zero3 is not None:
                        dp_colls = zero3_step_collectives(e, cluster, zero3, r)
                        dp_tail = zero3_step_collectives(e, cluster, zero3, r, after_backward=True)
                    else:
                        dp_colls = gradient_collectives(e, cluster, traffic, r)
                    exchanges = {(n, dense): pass_exchanges(e, cluster, c, traffic, r, n, dense)
                                 for n, dense in set(zip(c.chunk_layers[s], _chunk_dense(c, s), strict=True))}
                    fsdp = fsdp_ops(e, cluster, zero3, r, collectives=every) if zero3 is not None else None
                    weights_from = (nvme.of(device(r))[0],) if nvme is not None else pool
                    ops = _rank_ops(r, order, s, p, v, c, e, traffic, pool, weights_from, colls, dp_colls, exchanges,
                                    fsdp, peer=lambda s2, t=t, x=x, d=d: rank(t, x, s2, d), dp_tail=dp_tail,
                                    first_touch=first_touch_bytes_per_s(e, cluster))
                    ops += step_ops(e, cluster, system, device(r), pool, tail=ops[-1].name,
                                    last_backward=_last_backward_waits(ops), optimizer_bytes=traffic.optimizer_bytes,
                                    optimizer_s=c.optimizer_s, precision=precision, nvme=nvme)
                    programs.append(RankProgram(rank=r, ops=tuple(ops), fold=fold))
                    if fold > 1:
                        mirrors[r] = tuple(device(g) for g in peers[r])
    return LoweredIteration(system=system, programs=tuple(programs),
                            devices={prog.rank: device(prog.rank) for prog in programs}, mirrors=mirrors, costs=c,
                            fold=fold)


def _links(s: int, p: int, v: int, forward: bool, ch: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(stage, chunk) the op's input comes from and its output goes to; None where Megatron has no peer."""
    down = (s + 1, ch) if s < p - 1 else ((0, ch + 1) if ch < v - 1 else None)
    up = (s - 1, ch) if s else ((p - 1, ch - 1) if ch else None)
    return (up, down) if forward else (down, up)


def _tag(forward: bool, mb: int, ch: int) -> str:
    return f"{'f' if forward else 'b'}{mb}c{ch}"


def _receives(s: int, p: int, m: int, v: int) -> list[tuple[int, str]]:
    """The receives of stage ``s`` as ``(source stage, tag of the op that consumes it)``, ordered as each source
    sends them (its program order), so the j-th send from a stage meets the j-th receive from it."""
    got: list[tuple[int, str]] = []
    for src in range(p):
        if src == s:
            continue
        for forward, mb, ch in pipeline_order(p, m, v, src):
            dst = _links(src, p, v, forward, ch)[1]
            if dst is not None and dst[0] == s:
                got.append((src, _tag(forward, mb, dst[1])))
    return got


def _chunk_dense(c: StageCosts, stage: int) -> tuple[int, ...]:
    """Dense leading layers of each of ``stage``'s chunks (0s when the layers are alike, NOTE [layer kinds] in
    :mod:`mcdla.sim.llm`)."""
    return c.chunk_dense[stage] if c.chunk_dense else (0,) * len(c.chunk_layers[stage])


def _rank_ops(r: int, order: Sequence[tuple[bool, int, int]], s: int, p: int, v: int, c: StageCosts,
              e: Execution, traffic: RankTraffic, pool: Sequence[str], weights_from: Sequence[str],
              colls: dict[tuple[int, bool], list[tuple[Collective, float]]], dp_colls: list[Collective] | None,
              exchanges: dict[tuple[int, int], tuple[PassExchange, PassExchange]], fsdp: FsdpOps | None, *,
              peer: Callable[[int], int], dp_tail: Sequence[Collective] = (),
              first_touch: float | None = None) -> list[Op]:
    """The ops of rank ``r`` on stage ``s`` up to its optimizer step (NOTE [LLM lowering]); ``peer(stage)``: the
    same TP x CP slot there; ``weights_from``: the memories offloaded weights are fetched from; ``colls``: the TP
    collectives of a chunk of ``n`` layers by ``(n, forward)``; ``dp_colls``: the data-parallel reduction as
    collectives, or None to run its closed-form exposed time; ``exchanges``: the CP and EP work of a forward and a
    backward pass of ``n`` layers (NOTE [CP and EP lowering]); ``fsdp``: ZeRO-3's per-layer ops, or None;
    ``first_touch``: the host's first-touch copy rate the forward's activation copies also wait on (NOTE
    [first-touch copies] in :mod:`mcdla.sim.llm_offload`), or None."""
    b = _RankBuilder(r)
    recv_of: dict[str, str] = {}
    last_backward = next((mb, ch) for forward, mb, ch in reversed(order) if not forward)
    reduce_waits: tuple[str, ...] = ()
    for src, tag in _receives(s, p, e.micro_batches, v):  # posted up front: receives never hold the rank
        recv_of[tag] = b.add(Recv(name=f"recv-{tag}", stream=f"recv-{src}", peer=peer(src), nbytes=traffic.p2p_bytes))
    in_flight: list[str] = []  # pp_comm_overlap: sends still running; a chunk waits for those two chunks back
    for forward, mb, ch in order:
        tag = _tag(forward, mb, ch)
        n, dense = c.chunk_layers[s][ch], _chunk_dense(c, s)[ch]
        kinds = c.kinds(n, dense)
        share = n / c.layers_per_stage  # of the (largest) stage's copies
        last_chunk = s == p - 1 and ch == v - 1
        dst = _links(s, p, v, forward, ch)[1]
        waits = tuple(w for w in (b.last, *b.copies, recv_of.get(tag), *in_flight[:-1]) if w)
        in_flight = in_flight[-1:]
        chunk_colls = colls[(n, forward)]
        exchange = exchanges[(n, dense)][0 if forward else 1]
        layers_s = sum(k * (x.layer_fwd_s if forward else x.layer_bwd_s + x.layer_recompute_s) for x, k in kinds)
        other_s = (c.last_fwd_s if forward else c.last_bwd_s) if last_chunk else 0.0
        latencies = sum(lat for _coll, lat in chunk_colls)  # the other calls' latencies
        hide_s = sum(k * (x.layer_tp_hide_fwd_s if forward else x.layer_tp_hide_bwd_s) for x, k in kinds)
        overlapped = hide_s > 0 and fsdp is None and bool(chunk_colls)
        # ring attention moved out of the layers into the ring steps
        other_s += (0.0 if overlapped else latencies) + exchange.compute_s
        if dp_colls and e.dp_overlap and not forward and (mb, ch) == last_backward:  # starts with the last backward
            reduce_waits = tuple(waits)
        if overlapped:  # the TP collectives run beside the GEMMs they pair with, then the rest of the chunk
            gemms = b.add(Compute(name=f"gemm-{tag}", seconds=hide_s, waits=tuple(waits)))
            done = b.add(Compute(name=f"tp-latency-{tag}", stream="tp-overlap", seconds=latencies,
                                 waits=tuple(waits)))
            for i, (coll, _latency_s) in enumerate(chunk_colls):
                done = b.add(CollectiveOp(name=f"tp{i}-{tag}", stream="tp-overlap", collective=coll, waits=(done,)))
            compute = b.add(Compute(name=f"compute-{tag}", seconds=layers_s + other_s - hide_s,
                                    waits=(gemms, done)))
            chunk_colls = []
        elif fsdp is None:
            compute = b.add(Compute(name=f"compute-{tag}", seconds=layers_s + other_s, waits=tuple(waits)))
        else:  # a negative rest (the ring's attention) comes off the layers, each the chunk's mean layer
            spread = min(0.0, other_s) / n
            compute = fsdp_chunk(b.ops, tag, waits, n, layers_s / n + spread, max(0.0, other_s), fsdp,
                                 backward=not forward)
        copies: list[str] = []
        moves: list[tuple[type[Offload] | type[Prefetch], float, Sequence[str], tuple[str, ...]]] = []
        if e.offload_activations:  # activation_offload_sync: the copy waits on the compute, then holds the next chunk
            moves.append((Offload if forward else Prefetch, share * traffic.offload_activation_bytes, pool,
                          (compute,) if e.activation_offload_sync else tuple(waits)))
        if e.offload_weights:
            moves.append((Prefetch, traffic.offload_weight_bytes / v, weights_from, tuple(waits)))
        for j, (kind, nbytes, memories, after) in enumerate(moves):
            for mem in memories:
                copies.append(b.add(kind(name=f"{kind.__name__.lower()}{j}-{mem}-{tag}", memory=mem,
                                         nbytes=nbytes / len(memories), stream=f"{kind.__name__.lower()}{j}-{mem}",
                                         waits=after)))
            if kind is Offload and first_touch is not None:  # the host faulting its pages in beside the copy
                copies.append(b.add(Compute(name=f"first-touch-{tag}", stream="first-touch",
                                            seconds=nbytes / first_touch, waits=after)))
        done = compute
        for op in exchange.ops(tag, compute):
            done = b.add(op)
        for i, (coll, _latency_s) in enumerate(chunk_colls):
            done = b.add(CollectiveOp(name=f"tp{i}-{tag}", collective=coll, waits=(done,)))
        b.copies = copies
        if p == 1:
            b.last = b.add(Compute(name=f"end-{tag}", stream="send", seconds=0.0, waits=(done,)))
        elif dst is None:
            b.last = b.add(Compute(name=f"hold-{tag}", stream="send", seconds=c.p2p_s, waits=(done,)))
        elif e.pp_comm_overlap:  # the send runs beside the next chunk (Megatron's overlap_p2p_comm)
            in_flight.append(b.add(Send(name=f"send-{tag}", peer=peer(dst[0]), nbytes=traffic.p2p_bytes,
                                        waits=(done,))))
            b.last = done
        else:
            b.last = b.add(Send(name=f"send-{tag}", peer=peer(dst[0]), nbytes=traffic.p2p_bytes, waits=(done,)))
    tail = b.add(Compute(name="pipeline-end", seconds=0.0,
                         waits=tuple(w for w in (b.last, *b.copies, *in_flight) if w)))
    if dp_colls or dp_tail:
        done = reduce_waits if e.dp_overlap else (tail,)
        for i, coll in enumerate(dp_colls or ()):
            done = (b.add(CollectiveOp(name=f"dp{i}", stream="dp", collective=coll, waits=done)),)
        for i, coll in enumerate(dp_tail):  # issued once the backward has ended (HSDP's last units)
            done = (b.add(CollectiveOp(name=f"dp-after{i}", stream="dp", collective=coll, waits=(tail, *done))),)
        b.add(Compute(name="dp-end", seconds=0.0, waits=(tail, *done)))
    elif c.dp_full_s > 0 or c.dp_tail_s > 0:
        b.add(Compute(name="dp-reduce", seconds=c.dp_exposed_s, waits=(tail,)))
    return b.ops


def _last_backward_waits(ops: Sequence[Op]) -> tuple[str, ...]:
    """What the rank's last backward waits for (its first op's waits): the CPU optimizer's gradients go out from
    there."""
    last = next(op for op in reversed(ops) if op.name.startswith("compute-b"))
    start = f"gemm-{last.name.removeprefix('compute-')}"  # an overlapped pass starts with its GEMMs
    return next((op.waits for op in ops if op.name == start), last.waits)


def engine_step(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                precision: str = DEFAULT_PRECISION, replicas: str = "auto") -> EngineStep:
    """Run the lowered iteration on the engine (:class:`EngineStep`); ConfigError as :func:`lower`."""
    lowered = lower(spec, execution, cluster, precision=precision, replicas=replicas)
    run = execute(lowered.system, lowered.programs, devices=lowered.devices, mirrors=lowered.mirrors or None)
    # two float sums of the same durations: a difference within their rounding is no contention
    contention = 0.0 if abs(run.contention_s) <= _ROUNDING * run.makespan_s else run.contention_s
    return EngineStep(iteration_s=run.makespan_s, idle_iteration_s=run.idle_makespan_s,
                      contention_s=contention, contention_by_class_s=dict(run.contention_by_class_s),
                      ranks_simulated=len(lowered.programs), fold=lowered.fold, solves=run.solves,
                      analytical=llm_step(spec, execution, cluster.for_gpus(execution.gpus), precision=precision))
