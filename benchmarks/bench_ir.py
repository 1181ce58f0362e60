"""Program IR executor speed: idle-fabric collective flow evaluations, and a 1,024-GPU representative program.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_ir            # prints the tables and records them in RESULTS.md
    .venv/bin/python -m benchmarks.bench_ir --no-record

1. Each collective's flow evaluation (:class:`mcdla.sim.ir_engine.CollectiveFlows`: lowering and max-min phases
   on the dimension star, routes kept after the first call, whose time is shown apart) against its closed form
   (:func:`mcdla.sim.collective_models.closed_form_time`), timed in the same run, interleaved; the ratio is what
   the flow evaluator costs on top of the formula.
2. A representative program on ``dgx-h100-ndr`` (128 nodes, 1,024 GPUs): one full node (stage 0, TP=8 with
   in-network all-reduces on NVLink) and one pipeline (GPU 0 of nodes 1..15 as stages 1..15; their TP peers are
   not represented), each rank folded x8 with its data-parallel replicas on nodes 16 d + s as mirrors; per
   micro-batch forward compute, TP all-reduce, activation offload to the host, pipeline send, then the backward
   in reverse with prefetches (GPipe order). The baseline measured in the same run is building the system and
   its topology (``Cluster.expand`` + ``Topology``), which any engine run needs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware import FabricDim, LinkKind, load_cluster
from mcdla.hardware.model import System
from mcdla.hardware.topology import Topology
from mcdla.sim.collective_models import Collective, closed_form_time
from mcdla.sim.fabric_of_dims import dims_system
from mcdla.sim.ir import CollectiveOp, Compute, Offload, Op, Prefetch, RankProgram, Recv, Send
from mcdla.sim.ir_engine import CollectiveFlows, execute

COMMAND = ".venv/bin/python -m benchmarks.bench_ir"


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _dim(p: int, b: float, a: float, name: str, kind: LinkKind) -> FabricDim:
    return FabricDim(name=name, size=p, bytes_per_s=b, latency_s=a, kind=kind, source="bench")


def collective_rows(repeat: int) -> list[tuple[str, ...]]:
    nv8, ib16 = _dim(8, 450e9, 1e-6, "nvlink", LinkKind.NVLINK), _dim(16, 50e9, 5e-6, "ib", LinkKind.NETWORK)
    cases = [
        ("ring all-reduce, 8", "all-reduce", (nv8,), ("ring",)),
        ("in-network all-reduce, 8", "all-reduce", (nv8,), ("in-network",)),
        ("tree all-reduce, 64", "all-reduce", (_dim(64, 50e9, 5e-6, "ib", LinkKind.NETWORK),), ("tree",)),
        ("hierarchical all-reduce, 8 x 16 (in-network, ring)", "all-reduce", (nv8, ib16), ("in-network", "ring")),
        ("hierarchical all-to-all, 8 x 4", "all-to-all", (nv8, ib16.subgroup(4)), ("ring", "ring")),
    ]
    rows = []
    for label, kind, dims, algs in cases:
        size = 1
        for d in dims:
            size *= d.size
        coll = Collective(kind=kind, nbytes=1e9, group=tuple(range(size)), levels=tuple(d.size for d in dims),
                          algorithm=algs)
        t0 = time.perf_counter()
        flows = CollectiveFlows(dims_system(dims))
        first = flows.time(coll)
        first_s = time.perf_counter() - t0
        flow_s, closed_s = [], []
        for _ in range(repeat):  # interleaved so machine noise hits both
            flow_s.append(_median_s(lambda: flows.time(coll), 1))
            closed_s.append(_median_s(lambda: closed_form_time(coll, dims), 1))
        flow, closed = statistics.median(flow_s), statistics.median(closed_s)
        rel = abs(first / closed_form_time(coll, dims) - 1)
        rows.append((label, f"{first_s * 1e3:.1f}", f"{flow * 1e3:.2f}", f"{closed * 1e6:.1f}", f"{flow / closed:,.0f}x",
                     f"{rel:.1e}"))
    return rows


def representative_programs(system: System, micro_batches: int, stages: int = 16,
                            tp: int = 8, fold: int = 8) -> list[RankProgram]:
    """Stage 0 = the node's ``tp`` GPUs, stage s > 0 = GPU 0 of node s; ranks are system device indices."""
    names = system.device_names
    index = {n: i for i, n in enumerate(names)}
    stage_ranks = [[index[f"n0.gpu{g}"] for g in range(tp)]] + [[index[f"n{s}.gpu0"]] for s in range(1, stages)]
    head = [ranks[0] for ranks in stage_ranks]
    tp_group = tuple(stage_ranks[0])
    act, tp_bytes, saved, fwd_s = 48e6, 200e6, 1.2e9, 0.04
    programs = []
    for s, ranks in enumerate(stage_ranks):
        for rank in ranks:
            memory = system.pools[names[rank]][0]
            ops: list[Op] = []
            for m in range(micro_batches):
                waits: tuple[str, ...] = ()
                if s > 0:
                    ops.append(Recv(name=f"ra{m}", nbytes=act, peer=head[s - 1]))
                    waits = (f"ra{m}",)
                ops.append(Compute(name=f"f{m}", seconds=fwd_s, waits=waits))
                last = f"f{m}"
                if s == 0:
                    ops.append(CollectiveOp(name=f"tf{m}", waits=(last,), collective=Collective(
                        kind="all-reduce", nbytes=tp_bytes, group=tp_group, algorithm="in-network")))
                    last = f"tf{m}"
                ops.append(Offload(name=f"o{m}", nbytes=saved, memory=memory, waits=(last,)))
                if s < stages - 1 and rank == head[s]:
                    ops.append(Send(name=f"sa{m}", nbytes=act, peer=head[s + 1], waits=(last,)))
            for m in reversed(range(micro_batches)):
                waits = (f"o{m}",)
                ops.append(Prefetch(name=f"p{m}", nbytes=saved, memory=memory, waits=waits))
                waits = (f"p{m}",)
                if s < stages - 1:
                    if rank == head[s]:
                        ops.append(Recv(name=f"rg{m}", nbytes=act, peer=head[s + 1]))
                        waits += (f"rg{m}",)
                ops.append(Compute(name=f"b{m}", seconds=2 * fwd_s, waits=waits))
                last = f"b{m}"
                if s == 0:
                    ops.append(CollectiveOp(name=f"tb{m}", waits=(last,), collective=Collective(
                        kind="all-reduce", nbytes=tp_bytes, group=tp_group, algorithm="in-network")))
                    last = f"tb{m}"
                if s > 0:
                    ops.append(Send(name=f"sg{m}", nbytes=act, peer=head[s - 1], waits=(last,)))
            programs.append(RankProgram(rank=rank, ops=tuple(ops), fold=fold))
    return programs


def program_rows(micro_batches: int) -> tuple[list[tuple[str, ...]], str]:
    t0 = time.perf_counter()
    system = load_cluster("dgx-h100-ndr").expand()
    Topology(system)
    build_s = time.perf_counter() - t0
    programs = representative_programs(system, micro_batches)
    names = system.device_names
    mirrors = {}
    for p in programs:  # data-parallel replica d of node s's GPU sits on node 16 d + s
        node, gpu = names[p.rank].split(".")
        mirrors[p.rank] = tuple(f"n{16 * d + int(node[1:])}.{gpu}" for d in range(1, p.fold))
    t0 = time.perf_counter()
    run = execute(system, programs, mirrors=mirrors)
    exec_s = time.perf_counter() - t0
    n_ops = sum(len(p.ops) for p in programs)
    row = (f"{len(system.devices):,} GPUs, {len(programs)} ranks x fold 8, {micro_batches} micro-batches",
           f"{n_ops:,}", f"{exec_s:.2f}", f"{build_s:.2f}", f"{exec_s / build_s:.1f}x", f"{run.makespan_s:.3f}",
           f"{run.contention_s * 1e3:.1f}", f"{run.solves:,}")
    split = ", ".join(f"{c} {s * 1e3:.1f} ms" for c, s in run.contention_by_class_s.items()) or "none"
    return [row], split


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, default=16)
    args = parser.parse_args(argv)
    coll = markdown_table(("collective (1 GB)", "first (routing) ms", "flows ms", "closed form us",
                           "flows / closed form", "rel. diff"),
                          collective_rows(args.repeat))
    rows, split = program_rows(args.micro_batches)
    prog = markdown_table(("program", "ops", "execute s", "expand + topology s", "execute / build", "makespan s",
                           "contention ms", "rate solves"), rows)
    text = (f"{coll}\n\n{prog}\n\nContention split by link class: {split}. `execute` runs the programs twice "
            "(shared fabric, then idle for the contention baseline).")
    print_and_record(args, "ir-executor", "Program IR executor: collective flow evaluation and a 1,024-GPU program",
                     COMMAND, text)


if __name__ == "__main__":
    main()
