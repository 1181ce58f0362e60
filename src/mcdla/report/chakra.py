"""Export a simulated iteration as Chakra execution traces, one file per rank (``docs/chakra.md``).

Every operation of a device's iteration becomes one node of its rank's trace, with the time it started and
took in the simulation:

=========================  ================  =====================================================
operation                  node type         attributes (Chakra's names, as its feeder reads them)
=========================  ================  =====================================================
forward, re-run, backward  COMP_NODE         ``num_ops`` (FLOP), ``tensor_size`` (bytes moved)
offload of a saved tensor  MEM_STORE_NODE    ``tensor_size`` (bytes)
prefetch of it             MEM_LOAD_NODE     ``tensor_size`` (bytes)
all-reduce / all-gather    COMM_COLL_NODE    ``comm_type`` (ALL_REDUCE / ALL_GATHER), ``comm_size``
=========================  ================  =====================================================

All carry ``is_cpu_op`` = false, ``duration_micros`` and ``start_time_micros`` (rounded to whole
microseconds, as the schema's integers require), and the exact values as ``mcdla.start_s`` /
``mcdla.duration_s`` (for compute ops the program's duration itself, for transfers and collectives end less
start). The engine has no point-to-point transfers, so no COMM_SEND/RECV nodes appear.

NOTE [chakra dependencies]
``data_deps`` (what Chakra's feeder and ASTRA-sim schedule by) say what each operation waited for in the
engine: a compute op its predecessor on the stream, the prefetch of the tensor it needs and, under model
parallelism, the blocking collective its predecessor launched; an offload (issued when the forward that saves
the tensor starts) the op before that forward and the previous offload (one D2H stream); a prefetch the
offload of its tensor, the previous prefetch (one H2D stream) and the op whose start or end issued it (the op
before it when issued at an op's start); a collective the op that launched it and the previous collective (one
communicator). Every dependency ended no later than the node started. Waits for memory (an operation held
until another frees device or pool memory) are not dependencies: a replay without mcdla's memory model does
not see them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcdla.errors import SimError
from mcdla.hardware.model import System
from mcdla.sim import SimResult, build_program, simulate
from mcdla.sim.program import ALL_GATHER, BACKWARD, FORWARD, PHASES, Program
from mcdla.workload.chakra import MCDLA_FORMAT, SCHEMA_VERSION, pb, write_trace
from mcdla.workload.model import Workload
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.plan import Plan

__all__ = ["ChakraRank", "chakra_ranks", "iter_chakra_ranks", "simulate_to_chakra", "trace_paths"]


@dataclass(frozen=True, slots=True)
class ChakraRank:
    """One rank's trace: its ``GlobalMetadata`` and ``Node`` messages, nodes in dependency order."""

    rank: int
    metadata: Any
    nodes: tuple[Any, ...]


def trace_paths(prefix: str | Path, ranks: int) -> list[Path]:
    """``<prefix>.<rank>.et`` for each rank, Chakra's naming."""
    return [Path(f"{prefix}.{r}.et") for r in range(ranks)]


def _attr(name: str, **value: Any) -> Any:
    return pb.AttributeProto(name=name, **value)


def _micros(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


class _Draft:
    __slots__ = ("key", "name", "type", "start", "end", "deps", "attrs")

    def __init__(self, key: int, name: str, node_type: int, start: float, end: float, attrs: list[Any]) -> None:
        self.key = key
        self.name = name
        self.type = node_type
        self.start = start
        self.end = end
        self.deps: list[int] = []
        self.attrs = attrs


def _layer_attrs(workload: Workload, k: int) -> list[Any]:
    layer = workload.layers[k]
    out = [_attr("mcdla.layer_kind", string_val=layer.kind.value)]
    for field in ("param_bytes", "output_bytes", "saved_bytes", "workspace_bytes"):
        out.append(_attr(f"mcdla.{field}", double_val=getattr(layer, field)))
    if layer.inputs:
        out.append(_attr("mcdla.inputs", string_list=pb.StringList(values=list(layer.inputs))))
    return out


def _rank_nodes(rank: int, program: Program, workload: Workload, spans: Sequence[tuple], share: int) -> list[Any]:
    """The nodes of one rank (NOTE [chakra dependencies])."""
    names = program.layer_names
    comp = [s for s in spans if s[0] == rank and s[1] == 0]
    offload = {s[2]: s for s in spans if s[0] == rank and s[1] == 1}
    prefetch_spans = [s for s in spans if s[0] == rank and s[1] == 2]
    prefetch = {s[2]: s for s in prefetch_spans}
    colls = [s for s in spans if s[0] == -1 and s[1] == 3]
    ops = program.ops
    if len(comp) != len(ops) or any(s[2] != op.label for s, op in zip(comp, ops)):
        raise SimError(f"Chakra export: rank {rank}'s recorded operations do not match its program")
    drafts: list[_Draft] = []

    def add(name: str, node_type: int, span: tuple, attrs: list[Any], duration: float | None = None) -> _Draft:
        start, end = span[4], span[5]
        d = _Draft(len(drafts), name, node_type, start, end, [
            _attr("is_cpu_op", bool_val=False), *attrs, _attr("mcdla.start_s", double_val=start),
            _attr("mcdla.duration_s", double_val=end - start if duration is None else duration)])
        drafts.append(d)
        return d

    comp_nodes: list[_Draft] = []
    for op, span in zip(ops, comp):
        layer = workload.layers[op.layer]
        fwd = op.kind != BACKWARD
        flops = (layer.fwd_flops if fwd else layer.bwd_flops) / share
        moved = (layer.fwd_bytes_moved if fwd else layer.bwd_bytes_moved) / share
        attrs = [_attr("num_ops", int64_val=round(flops)), _attr("tensor_size", uint64_val=round(moved)),
                 _attr("mcdla.phase", string_val=PHASES[op.kind]), _attr("mcdla.layer", string_val=names[op.layer]),
                 _attr("mcdla.layer_index", int64_val=op.layer), _attr("mcdla.flops", double_val=flops), _attr("mcdla.bytes_moved", double_val=moved)]
        if op.kind == FORWARD:
            attrs += _layer_attrs(workload, op.layer)
        comp_nodes.append(add(op.label, pb.COMP_NODE, span, attrs, op.duration_s))  # exact, not end - start

    def memory_node(kind: str, node_type: int, k: int, found: dict[str, tuple]) -> _Draft:
        label = f"{kind} {names[k]}"
        if label not in found:
            raise SimError(f"Chakra export: rank {rank} has no recorded {label!r}")
        nbytes = program.saved_bytes[k]
        return add(label, node_type, found[label], [
            _attr("tensor_size", uint64_val=round(nbytes)), _attr("mcdla.layer", string_val=names[k]),
            _attr("mcdla.bytes", double_val=nbytes)])

    # offloads, in D2H order (the order their forwards issue them)
    offload_node: dict[int, _Draft] = {}
    previous: _Draft | None = None
    for m, op in enumerate(ops):
        if op.offload >= 0:
            d = memory_node("offload", pb.MEM_STORE_NODE, op.offload, offload)
            if m > 0:
                d.deps.append(comp_nodes[m - 1].key)
            if previous is not None:
                d.deps.append(previous.key)
            offload_node[op.offload] = previous = d
    # prefetches: who issued each (the op before, for issue at reach or start; the op itself at its end)
    issuer: dict[int, int] = {}
    for m, op in enumerate(ops):
        for k in (*op.reach_prefetch, *op.start_prefetch):
            issuer.setdefault(k, m - 1)
        for k in op.end_prefetch:
            issuer.setdefault(k, m)
    prefetch_node: dict[int, _Draft] = {}
    previous = None
    order = {names.index(s[2].removeprefix("prefetch ")): i for i, s in enumerate(prefetch_spans)}
    for k in sorted(order, key=order.__getitem__):
        d = memory_node("prefetch", pb.MEM_LOAD_NODE, k, prefetch)
        if k in offload_node:
            d.deps.append(offload_node[k].key)
        if previous is not None:
            d.deps.append(previous.key)
        if issuer.get(k, -1) >= 0:
            d.deps.append(comp_nodes[issuer[k]].key)
        prefetch_node[k] = previous = d
    # collectives, in launch order; the compute ops' dependencies
    coll_index = 0
    blocking: _Draft | None = None
    previous = None
    for m, op in enumerate(ops):
        node = comp_nodes[m]
        if m > 0:
            node.deps.append(comp_nodes[m - 1].key)
        if op.need_data >= 0:
            node.deps.append(prefetch_node[op.need_data].key)
        if blocking is not None:
            node.deps.append(blocking.key)
            blocking = None
        if op.coll_bytes > 0:
            if coll_index >= len(colls):
                raise SimError(f"Chakra export: rank {rank} launches more collectives than were recorded")
            kind = pb.ALL_GATHER if op.coll_kind == ALL_GATHER else pb.ALL_REDUCE
            d = add(op.coll_label, pb.COMM_COLL_NODE, colls[coll_index], [
                _attr("comm_type", int64_val=kind), _attr("comm_size", int64_val=round(op.coll_bytes)),
                _attr("mcdla.bytes", double_val=op.coll_bytes)])
            d.deps.append(node.key)
            if previous is not None:
                d.deps.append(previous.key)
            previous = d
            coll_index += 1
            if op.coll_blocks:
                blocking = d
    return _ordered(drafts)


def _ordered(drafts: list[_Draft]) -> list[Any]:
    """Number the nodes in a dependency order (earliest start first) and build the messages."""
    children: list[list[int]] = [[] for _ in drafts]
    pending = [0] * len(drafts)
    for d in drafts:
        d.deps = sorted(set(d.deps))
        for dep in d.deps:
            children[dep].append(d.key)
            pending[d.key] += 1
    ready = [(d.start, d.key) for d in drafts if pending[d.key] == 0]
    heapq.heapify(ready)
    ids: dict[int, int] = {}
    while ready:
        _, key = heapq.heappop(ready)
        ids[key] = len(ids)
        for c in children[key]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, (drafts[c].start, c))
    assert len(ids) == len(drafts), "Chakra export: dependency cycle"
    nodes = [None] * len(drafts)
    for d in drafts:
        node = pb.Node(id=ids[d.key], name=d.name, type=d.type, start_time_micros=_micros(d.start),
                       duration_micros=_micros(d.end - d.start))
        node.data_deps.extend(sorted(ids[k] for k in d.deps))
        node.attr.extend(d.attrs)
        nodes[ids[d.key]] = node
    return nodes


def chakra_ranks(system: System, workload: Workload, plan: Plan, result: SimResult, *, parallel: str = "data",
                 bucket_bytes: float = 25 * 2**20) -> list[ChakraRank]:
    """The traces of ``result``, a feasible iteration simulated with ``record_timeline=True`` from these same
    arguments (SimError otherwise)."""
    return list(iter_chakra_ranks(system, workload, plan, result, parallel=parallel, bucket_bytes=bucket_bytes))


def iter_chakra_ranks(system: System, workload: Workload, plan: Plan, result: SimResult, *, parallel: str = "data",
                      bucket_bytes: float = 25 * 2**20) -> Iterator[ChakraRank]:
    """:func:`chakra_ranks` one rank at a time, so that a writer holds one rank's nodes, not every rank's
    (1,024 ranks of a large workload are gigabytes); the spans are grouped by rank once (linear, not ranks x
    spans)."""
    if not result.recorded:
        raise SimError("Chakra export: the result has no timeline; simulate with record_timeline=True")
    if not result.feasible:
        raise SimError(f"Chakra export: the iteration is infeasible ({result.infeasible_reason}); nothing ran to "
                       "export")
    if tuple(d.name for d in system.devices) != result.devices:
        raise SimError(f"Chakra export: result of devices {list(result.devices)} is not of system {system.name!r}")
    n = len(system.devices)
    share = n if parallel == "model" else 1
    # rank r is device r: every device one tensor-parallel (model) or data-parallel rank of one group
    layout = ParallelDims(tp=n) if parallel == "model" else ParallelDims(dp=n)
    cache: dict[tuple[Any, ...], Program] = {}
    by_rank: dict[int, list[tuple]] = {}
    for span in result.spans:
        by_rank.setdefault(span[0], []).append(span)
    shared = by_rank.get(-1, [])  # collectives, recorded once for every rank
    for rank in range(layout.world_size):
        device, where = system.devices[rank], layout.coordinates(rank)
        key = (tuple(sorted(device.peak_flops_per_s.items())), device.hbm_bytes_per_s, device.compute_efficiency,
               device.memory_efficiency)
        if key not in cache:
            cache[key] = build_program(workload, plan, device, model_parallel=parallel == "model", n_devices=n,
                                       bucket_bytes=bucket_bytes)
        nodes = _rank_nodes(rank, cache[key], workload, [*by_rank.get(rank, ()), *shared], share)
        meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
        meta.attr.extend([
            _attr("schema", string_val=f"1.0.2-chakra.{SCHEMA_VERSION}"),
            _attr("mcdla.format", string_val=MCDLA_FORMAT),
            _attr("mcdla.system", string_val=system.name), _attr("mcdla.device", string_val=device.name),
            _attr("mcdla.rank", int64_val=rank), _attr("mcdla.world_size", int64_val=layout.world_size),
            _attr("mcdla.tp_rank", int64_val=where.tp), _attr("mcdla.dp_rank", int64_val=where.dp),
            _attr("mcdla.workload", string_val=workload.name), _attr("mcdla.batch", int64_val=workload.batch),
            _attr("mcdla.precision", string_val=workload.precision),
            _attr("mcdla.optimizer_bytes_per_param_byte", double_val=workload.optimizer_bytes_per_param_byte),
            _attr("mcdla.planner", string_val=plan.planner), _attr("mcdla.parallel", string_val=parallel),
            _attr("mcdla.time_share", int64_val=share), _attr("mcdla.bucket_bytes", double_val=bucket_bytes),
            _attr("mcdla.iteration_time_s", double_val=result.iteration_time_s),
        ])
        yield ChakraRank(rank, meta, tuple(nodes))


def simulate_to_chakra(prefix: str | Path, system: System, workload: Workload, plan: Plan, *,
                       parallel: str = "data", bucket_bytes: float = 25 * 2**20) -> tuple[SimResult, list[Path]]:
    """Simulate one iteration and write its Chakra traces ``<prefix>.<rank>.et``; returns the result and paths.

    Raises SimError for an infeasible iteration (nothing is written then)."""
    if not bucket_bytes > 0 or math.isinf(bucket_bytes):
        raise SimError(f"bucket_bytes: got {bucket_bytes!r}; must be finite and > 0")
    result = simulate(system, workload, plan, parallel=parallel, bucket_bytes=bucket_bytes,  # type: ignore[arg-type]
                      record_timeline=True)
    paths = trace_paths(prefix, len(system.devices))
    ranks = iter_chakra_ranks(system, workload, plan, result, parallel=parallel, bucket_bytes=bucket_bytes)
    for r, path in zip(ranks, paths):
        write_trace(path, r.metadata, r.nodes)
    return result, paths
