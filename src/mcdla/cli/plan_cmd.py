"""``mcdla plan``: make a plan for a workload under a device-memory budget and say what the engine predicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from mcdla.cli._app import (ScaleToOption, app, check_batch, check_budget, check_output, console, fail, key_value_table,
                           measured_times_for, print_json)
from mcdla.errors import brief
from mcdla.units import format_bytes, format_seconds

__all__ = ["plan_cmd"]


@app.command("plan")
def plan_cmd(
    workload: Annotated[str, typer.Option(help="Zoo name (vgg-e, resnet-152, lstm, ...) or workload file.")],
    system: Annotated[str, typer.Option(help="Preset name or system file; its first device and pool link are used.")],
    budget: Annotated[Optional[str], typer.Option(
        help="Device-memory budget with a unit, e.g. 16GiB or 512MiB, at most the device's memory (default: all of it).")] = None,
    planner: Annotated[str, typer.Option(
        help="Planner name (lp, milp, rotor, vdnn-all, ...; a wrong name lists them all).")] = "lp",
    batch: Annotated[Optional[int], typer.Option(help="Batch size (default: the workload's).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the plan as JSON (mcdla-plan/1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    scale_to: ScaleToOption = None,
    states: Annotated[bool, typer.Option(
        "--states", help="Also offload layers' optimizer state, gradients and weights as the budget needs.")] = False,
    state_prefetch: Annotated[int, typer.Option(
        help="With --states: layers of offloaded weights fetched ahead, written into each state entry.")] = 1,
) -> None:
    """Plan what to offload, prefetch or recompute, and print the predicted iteration time and its overhead.

    A workload with measured layer times planned for other hardware than it was measured on gets a one-line
    warning on stderr unless --scale-to says how to rescale them."""
    from mcdla.hardware import load_system
    from mcdla.plan import PLANNERS, evaluate, make_plan
    from mcdla.sim import pool_link
    from mcdla.workload import load_workload

    if planner not in PLANNERS:
        fail(f"--planner: got {brief(planner)}; must be one of {', '.join(PLANNERS)}")
    check_batch(batch)
    check_output(out, "--out")
    if not 0 <= state_prefetch <= 10_000:
        fail(f"--state-prefetch: got {brief(state_prefetch)}; must be >= 0 and <= 10000")
    sys_ = load_system(system)
    device = sys_.devices[0]
    link = pool_link(sys_, device.name)
    budget_bytes = check_budget(budget, "--budget", device.hbm_bytes, f"{sys_.name} {device.name}")
    wl = load_workload(workload, batch=batch)
    wl = measured_times_for(wl, sys_, scale_to)
    plan = make_plan(wl, budget_bytes, link, planner=planner, device=device, states=states,
                     state_prefetch=state_prefetch)
    result = evaluate(wl, plan, link, device=device)
    if result.violations:
        fail(f"plan by {planner} does not run within {format_bytes(budget_bytes)}: {result.violations[0]}")
    if out is not None:
        try:
            plan.save(out)
        except OSError as exc:
            fail(f"--out: got {brief(str(out), 200)}; cannot write it ({exc.strerror or type(exc).__name__})")
    summary = {
        "workload": wl.name,
        "batch": wl.batch,
        "system": sys_.name,
        "planner": planner,
        "budget_bytes": None if math.isinf(budget_bytes) else budget_bytes,
        "offloaded_bytes": result.offloaded_bytes,
        "recomputed_bytes": result.recomputed_bytes,
        "resident_bytes": result.resident_bytes,
        "peak_device_bytes": result.peak_device_bytes,
        "iteration_time_s": result.makespan_s,
        "lower_bound_s": result.lower_bound_s,
        "overhead": result.overhead,
        "state_offloaded": {c: sum(sd.offloads(c) for sd in plan.state)
                            for c in ("weights", "gradients", "optimizer_state")},
        "notes": plan.notes,
        "plan_file": str(out) if out is not None else None,
    }
    if as_json:
        print_json(summary)
        return
    console.print(f"{wl.name} (batch {wl.batch}) on {sys_.name}, budget {format_bytes(budget_bytes)}, planner {planner}")
    rows = [("offloaded", format_bytes(result.offloaded_bytes)), ("recomputed", format_bytes(result.recomputed_bytes)),
            ("resident", f"{format_bytes(result.resident_bytes)} (peak device {format_bytes(result.peak_device_bytes)})"),
            ("iteration", f"{format_seconds(result.makespan_s)} (+{100 * result.overhead:.1f}% over the no-offload "
                          f"bound {format_seconds(result.lower_bound_s)})")]
    if plan.state:
        moved = summary["state_offloaded"]
        rows.append(("state offloaded", f"{moved['optimizer_state']} layers' optimizer state and gradients, "
                                        f"{moved['weights']} layers' weights"))
    if plan.notes:
        rows.append(("notes", plan.notes))
    if out is not None:
        rows.append(("plan", str(out)))
    console.print(key_value_table(rows))
