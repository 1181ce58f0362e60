"""Planner quality and speed.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_plan               # prints both tables and records them in RESULTS.md
    .venv/bin/python -m benchmarks.bench_plan --no-record
    .venv/bin/python -m benchmarks.bench_plan --only speed

Quality: for the zoo's eight workloads at budgets of 25 %, 50 % and 75 % of their no-offload peak, on the
``dc-dla`` and ``mc-dla`` pool links, each planner's overhead over the no-offload lower bound (the baseline, the
compute floor of the same workload in the same run), as the engine predicts it; ``-`` where the planner cannot
meet the budget. ``brute`` is left out (the zoo's chains are far beyond it). ``milp`` runs with the time limit
given (``--milp-time-limit``); its status column says whether it proved optimality over its plan space.

Speed: ``lp`` on a 1,000-layer chain, and ``milp`` and its HiGHS formulation ``milp-highs`` on a 50-layer chain,
wall-clock seconds, each also as a multiple of one engine run of the same chain and plan (measured in the same
run). ``milp-highs`` is left out of the quality table (it is ``milp``'s second implementation, and slow).

Each part replaces its own marked section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import time

from benchmarks._results import record
from mcdla.hardware import load_system
from mcdla.plan import PLANNERS, evaluate, make_problem, run_planner, smallest_budget
from mcdla.plan.chain import build_chain
from mcdla.sim import evaluate_plan, pool_link
from mcdla.workload.model import Layer, LayerKind, Workload

COMMAND = ".venv/bin/python -m benchmarks.bench_plan"
#: The planners that take a time limit.
EXACT = ("milp", "milp-highs")
FRACTIONS = (0.25, 0.5, 0.75)
SYSTEMS = ("dc-dla", "mc-dla")
VDNN = ("vdnn-all", "vdnn-conv", "vdnn-dyn")


def synthetic_chain(n_layers: int, name: str) -> Workload:
    """A CNN-like chain: activations shrink and compute per byte grows with depth; every fourth layer saves nothing."""
    kinds = (LayerKind.CONV, LayerKind.NORM, LayerKind.ELEMENTWISE, LayerKind.CONV)
    layers = []
    for i in range(n_layers):
        stage = 4 * i // n_layers
        saved = 256e6 / 2**stage * (1 + (i * 7919) % 5) / 3
        layers.append(Layer(
            name=f"stage{stage}.block{i}", kind=kinds[i % 4], fwd_flops=1e11 * (1 + stage) * (1 + (i % 3)),
            bwd_flops=2e11 * (1 + stage) * (1 + (i % 3)), fwd_bytes_moved=3 * saved, bwd_bytes_moved=6 * saved,
            param_bytes=1e6 * 2**stage, output_bytes=saved / 2, saved_bytes=saved if i % 4 != 3 else 0.0,
            workspace_bytes=16e6))
    return Workload(name=name, batch=64, layers=tuple(layers))


def _options(planner: str, milp_time_limit: float) -> dict[str, float]:
    return {"time_limit_s": milp_time_limit} if planner in EXACT else {}


def _cell(workload, link, budget, planner, milp_time_limit):
    options = _options(planner, milp_time_limit)
    problem = make_problem(workload, link, budget, planner=planner)
    started = time.perf_counter()
    plan = run_planner(problem, **options)
    seconds = time.perf_counter() - started
    if plan is None:
        return None, seconds, ""
    result = evaluate(workload, plan, link)
    assert not result.violations, (workload.name, planner, result.violations)
    return result.overhead, seconds, plan.notes


def quality(milp_time_limit: float) -> str:
    from mcdla.workload import zoo

    planners = [p for p in PLANNERS if p not in ("brute", "milp-highs")]
    head = "| workload | system | budget | " + " | ".join(planners) + " | best | milp status |"
    rows = [head, "|" + "---|" * (len(planners) + 5)]
    worse = 0
    for system in SYSTEMS:
        link = pool_link(load_system(system))
        for name in zoo.names():
            workload = zoo.build(name)
            peak = build_chain(workload).no_offload_peak_bytes()
            for fraction in FRACTIONS:
                overheads, status = {}, ""
                for planner in planners:
                    overhead, seconds, notes = _cell(workload, link, peak * fraction, planner, milp_time_limit)
                    overheads[planner] = overhead
                    if planner == "milp":
                        status = (("optimal" if "milp: optimal" in notes else "gap " + notes.split("gap=")[-1].split(";")[0])
                                  if notes else "-") + f", {seconds:.0f} s"
                feasible = {p: o for p, o in overheads.items() if o is not None}
                best = min(feasible, key=feasible.get) if feasible else None
                vdnn = [o for p, o in feasible.items() if p in VDNN]
                if best is not None and vdnn and feasible[best] > min(vdnn) + 1e-12:
                    worse += 1
                cells = [("-" if overheads[p] is None else f"{100 * overheads[p]:.1f}%") for p in planners]
                rows.append(f"| {name} | {system} | {int(100 * fraction)}% | " + " | ".join(cells)
                            + f" | {best or '-'} | {status} |")
                print(rows[-1], flush=True)
    rows.append("")
    rows.append(f"Cells where the best planner is worse than a vDNN policy: {worse}.")
    rows.append("")
    rows.append(floors())
    return "\n".join(rows)


def floors() -> str:
    """Why some cells are empty: the smallest budget any plan can meet, and the ones lp and rotor meet."""
    from mcdla.workload import zoo

    link = pool_link(load_system("dc-dla"))
    rows = ["Smallest budgets, as a share of the no-offload peak: *any plan* = static bytes plus the largest "
            "single-operation working set (`W + max_i S_i + max(trF_i, trB_i)`), which no plan can go below; "
            "`lp` and `rotor` = what they meet (`smallest_budget`, dc-dla link).", "",
            "| workload | no-offload peak | any plan | lp | rotor |", "|---|---|---|---|---|"]
    for name in zoo.names():
        workload = zoo.build(name)
        chain = build_chain(workload)
        peak = chain.no_offload_peak_bytes()
        floor = chain.static_bytes + max(s + max(f, b) for s, f, b in zip(
            chain.saved_bytes, chain.fwd_transient_bytes, chain.bwd_transient_bytes))
        cells = [f"{100 * smallest_budget(workload, link, p, chain=chain) / peak:.0f}%" for p in ("lp", "rotor")]
        rows.append(f"| {name} | {peak / 2**30:.1f} GiB | {100 * floor / peak:.0f}% | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return "\n".join(rows)


def speed(milp_time_limit: float) -> str:
    link = pool_link(load_system("dc-dla"))
    rows = ["| planner | chain | budget | seconds | engine runs (ms each) | planner / engine run | result |",
            "|---|---|---|---|---|---|---|"]
    cases = ([("lp", 1000, f) for f in (0.75, 0.5, 0.4)]
             + [(p, 50, f) for p in EXACT for f in (0.75, 0.5, 0.3)])
    for planner, n, fraction in cases:
        workload = synthetic_chain(n, f"synthetic-{n}")
        peak = build_chain(workload).no_offload_peak_bytes()
        problem = make_problem(workload, link, peak * fraction, planner=planner)
        options = _options(planner, milp_time_limit)
        started = time.perf_counter()
        plan = run_planner(problem, **options)
        seconds = time.perf_counter() - started
        baseline_plan = plan if plan is not None else problem.offload_plan({})
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            evaluate_plan(workload, baseline_plan, link, budget_bytes=problem.budget_bytes)
        engine_s = (time.perf_counter() - t0) / reps
        if plan is None:
            result = "infeasible"
        else:
            overhead = evaluate(workload, plan, link).overhead
            result = f"+{100 * overhead:.1f}%" + (f"; {plan.notes}" if plan.notes else "")
        rows.append(f"| {planner} | {n} layers | {int(100 * fraction)}% | {seconds:.2f} | "
                    f"{problem.scorer.calls} ({1e3 * engine_s:.1f}) | {seconds / engine_s:.0f}x | {result} |")
        print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_plan", description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not update RESULTS.md")
    parser.add_argument("--only", choices=("quality", "speed"), help="run one of the two parts")
    parser.add_argument("--milp-time-limit", type=float, default=60.0, help="seconds per milp run (default 60)")
    args = parser.parse_args()
    limit = f"milp time limit {args.milp_time_limit:g} s"
    flag = f" --milp-time-limit {args.milp_time_limit:g}"  # the recorded command reproduces the run
    if args.only in (None, "speed"):
        _emit(args, "plan-speed", "Planner speed", f"{COMMAND} --only speed{flag}",
              f"{limit}. Synthetic CNN-like chains (`benchmarks/bench_plan.py`), dc-dla pool link, budget as a "
              f"fraction of the no-offload peak.\n\n{speed(args.milp_time_limit)}")
    if args.only in (None, "quality"):
        _emit(args, "plan-quality", "Planner quality", f"{COMMAND} --only quality{flag}",
              f"{limit}. Overhead over the no-offload lower bound (compute floor), as the engine predicts it; `-`: "
              f"the planner cannot meet the budget. Budgets are fractions of each workload's no-offload peak.\n\n"
              f"{quality(args.milp_time_limit)}")


def _emit(args: argparse.Namespace, name: str, title: str, command: str, text: str) -> None:
    print(f"## {title}\n\n{text}\n")
    if not args.no_record:
        record(name, title, command, text)


if __name__ == "__main__":
    main()
