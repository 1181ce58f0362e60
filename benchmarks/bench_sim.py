"""Simulator speed: simulated iterations per second per workload, system and parallelism.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_sim            # prints the table and records it in RESULTS.md
    .venv/bin/python -m benchmarks.bench_sim --no-record

Every simulation is timed against a baseline measured in the same run, interleaved with it so machine noise
cancels: the same workload and plan through the single-device path (``evaluate_plan`` on the dc-dla pool link).
The ratio says what eight devices, their flows and their collectives cost on top of one device's streams.
Workloads: a synthetic 500-layer chain, plus the zoo when ``mcdla.workload.zoo`` is importable.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from benchmarks._results import bench_parser, markdown_table, print_and_record
from mcdla.hardware import load_system
from mcdla.sim import evaluate_plan, pool_link, simulate
from mcdla.workload.model import Layer, LayerKind, Workload
from mcdla.workload.plan import Action, Plan

COMMAND = ".venv/bin/python -m benchmarks.bench_sim"


def synthetic_chain(n_layers: int = 500) -> Workload:
    """A deep CNN-like chain: feature maps halve and parameters double every quarter of the depth."""
    kinds = (LayerKind.CONV, LayerKind.NORM, LayerKind.ELEMENTWISE, LayerKind.CONV)
    layers = []
    for i in range(n_layers):
        stage = 4 * i // n_layers
        saved = 64e6 / 2**stage
        layers.append(Layer(name=f"s{stage}.l{i}", kind=kinds[i % 4], fwd_flops=2e10 * (1 + i % 3),
                            bwd_flops=4e10 * (1 + i % 3), fwd_bytes_moved=3 * saved, bwd_bytes_moved=6 * saved,
                            param_bytes=2e5 * 2**stage, output_bytes=saved, saved_bytes=saved, workspace_bytes=4e6))
    return Workload(name=f"synthetic-{n_layers}", batch=32, layers=tuple(layers))


def offload_all(workload: Workload) -> Plan:
    return Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names,
                             actions={l.name: Action.OFFLOAD for l in workload.layers if l.saved_bytes > 0})


def _workloads() -> list[Workload]:
    out = [synthetic_chain()]
    try:
        from mcdla.workload import zoo
    except ImportError:
        return out
    return out + [zoo.build(name) for name in zoo.names()]


def _best_of(fn: Callable[[], object], budget_s: float) -> tuple[float, int]:
    """Median time of repeated calls (at least 3, about ``budget_s`` in all)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < 50):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(times)


def run(budget_s: float) -> list[tuple[str, ...]]:
    systems = {name: load_system(name) for name in ("dc-dla", "mc-dla")}
    link = pool_link(systems["dc-dla"])
    rows = []
    for workload in _workloads():
        plan = offload_all(workload)
        base_s, _ = _best_of(lambda: evaluate_plan(workload, plan, link), budget_s / 4)
        for name, system in systems.items():
            for parallel in ("data", "model"):
                sim_s, reps = _best_of(lambda: simulate(system, workload, plan, parallel=parallel), budget_s)
                base_again, _ = _best_of(lambda: evaluate_plan(workload, plan, link), budget_s / 4)
                baseline = min(base_s, base_again)
                rows.append((workload.name, str(len(workload.layers)), name, parallel, f"{1 / sim_s:8.1f}",
                             f"{sim_s * 1e3:7.1f}", f"{baseline * 1e3:6.2f}", f"{sim_s / baseline:6.1f}", str(reps)))
    return rows


HEADER = ("workload", "layers", "system", "parallel", "iterations/s", "ms/iteration", "1-device ms",
          "ratio", "reps")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget per simulation (s)")
    args = parser.parse_args(argv)
    rows = run(args.budget_s)
    text = markdown_table(HEADER, rows)
    print_and_record(args, "sim-speed", "Simulator speed", COMMAND,
                     "Offload-everything plans; ratio = 8-device simulate / single-device evaluate_plan of the same "
                     "workload and plan, measured interleaved in the same run.\n\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
