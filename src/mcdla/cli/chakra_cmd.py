"""``mcdla export-chakra``: simulate one iteration and write it as Chakra execution traces (``docs/chakra.md``).

Reading a trace back is ``mcdla simulate --workload trace.0.et`` (workload files ending in ``.et``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mcdla.cli._app import app, check_batch, check_output, console, fail, print_json
from mcdla.cli.sim_cmd import Parallel as _Parallel
from mcdla.cli.sim_cmd import Policy as _Policy
from mcdla.cli.sim_cmd import check_planner, plan_for
from mcdla.errors import brief
from mcdla.units import format_seconds


def _write_traces(ranks: Iterable[Any], paths: list[Path], prefix: Path) -> None:
    """Write each rank's trace as it is built (one rank in memory at a time), with a progress bar on a
    terminal. Each file appears only when complete; on an OS error (a full disk) or an interrupt the traces
    this run wrote are removed too, so no partial set is left, and the error is one line naming --prefix."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from mcdla.workload.chakra import write_trace

    err = Console(stderr=True, highlight=False)
    progress = Progress(TextColumn("writing traces"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err, disable=not err.is_terminal or len(paths) < 64, transient=True)
    written: list[Path] = []
    try:
        with progress:
            task = progress.add_task("export", total=len(paths))
            for rank, path in zip(ranks, paths):
                write_trace(path, rank.metadata, rank.nodes)
                written.append(path)
                progress.advance(task)
    except BaseException as exc:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        if isinstance(exc, OSError):
            fail(f"--prefix: got {brief(str(prefix), 200)}; cannot write ({exc.strerror or type(exc).__name__}); "
                 f"no trace left")
        raise


@app.command("export-chakra")
def export_chakra_cmd(
    system: Annotated[str, typer.Option(help="Preset name or system file.")],
    workload: Annotated[str, typer.Option(help="Zoo name or workload file.")],
    prefix: Annotated[Path, typer.Option(help="Write <prefix>.<rank>.et, one Chakra trace per device.")],
    batch: Annotated[Optional[int], typer.Option(help="Batch each device processes (default: the workload's).")] = None,
    parallel: Annotated[_Parallel, typer.Option(help="data: replicas + all-reduce; model: every layer split.")] = _Parallel.data,
    policy: Annotated[_Policy, typer.Option(help="Fixed vDNN policy (ignored with --planner).")] = _Policy.all,
    planner: Annotated[Optional[str], typer.Option(help="Budgeted planner instead of a fixed policy.")] = None,
    budget: Annotated[Optional[str], typer.Option(help="Device-memory budget for --planner, e.g. 8GiB.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the files and the iteration time as JSON.")] = False,
) -> None:
    """Simulate one training iteration and write it as Chakra ET files (one per rank) for Chakra's tools and
    ASTRA-sim. An infeasible iteration writes nothing and exits with status 1."""
    from mcdla.hardware import load_system
    from mcdla.report.chakra import iter_chakra_ranks, trace_paths
    from mcdla.sim import simulate
    from mcdla.workload import load_workload

    check_planner(planner)
    if budget is not None and planner is None:
        fail("--budget: only used with --planner")
    check_batch(batch)
    if not prefix.name:
        fail(f"--prefix: got {brief(str(prefix), 200)}; must end in a file name")
    sys_ = load_system(system)
    for path in trace_paths(prefix, len(sys_.devices)):
        check_output(path, "--prefix")
    wl = load_workload(workload, batch=batch)
    plan = plan_for(sys_, wl, planner=planner, budget=budget, policy=policy.value)
    result = simulate(sys_, wl, plan, parallel=parallel.value, record_timeline=True)
    if not result.feasible:
        fail(f"infeasible: {result.infeasible_reason}; no trace written", code=1)
    paths = trace_paths(prefix, len(sys_.devices))
    _write_traces(iter_chakra_ranks(sys_, wl, plan, result, parallel=parallel.value), paths, prefix)
    if as_json:
        print_json({"files": [str(p) for p in paths], "iteration_time_s": result.iteration_time_s,
                    "system": sys_.name, "workload": wl.name, "parallel": parallel.value, "plan": plan.planner})
        return
    console.print(f"[b]{wl.name}[/b] on [b]{sys_.name}[/b] ({parallel.value}-parallel, plan {plan.planner}): "
                  f"iteration {format_seconds(result.iteration_time_s)}")
    console.print(f"  wrote {len(paths)} Chakra traces: {paths[0]} .. {paths[-1]}")
