"""``mcdla simulate`` and ``mcdla reproduce``."""

from __future__ import annotations

import math
import os
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from mcdla.cli._app import (ScaleToOption, app, check_batch, check_budget, check_output, console, fail, key_value_table,
                           measured_times_for, print_json, strict_json, write_output)
from mcdla.errors import brief
from mcdla.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from mcdla.hardware import System
    from mcdla.workload import Plan, Workload


class Parallel(str, Enum):
    data = "data"
    model = "model"


class Policy(str, Enum):
    none = "none"
    all = "all"
    conv = "conv"


def check_planner(planner: str | None) -> None:
    """Fail unless ``planner`` is None or a registered planner name."""
    from mcdla.plan import PLANNERS  # the planners load scipy: only when a command runs

    if planner is not None and planner not in PLANNERS:
        fail(f"--planner: got {brief(planner)}; must be one of {', '.join(PLANNERS)}")


def plan_for(sys_: System, wl: Workload, *, planner: str | None, budget: str | None, policy: str) -> Plan:
    """The plan a ``--planner``/``--budget`` or ``--policy`` choice gives on the system's smallest device
    (a device with unlimited memory gets the no-offload policy)."""
    from mcdla.plan import make_plan, policy_plan
    from mcdla.sim import pool_link

    smallest = min(sys_.devices, key=lambda d: d.hbm_bytes)
    if planner is not None:
        budget_bytes = check_budget(budget, "--budget", smallest.hbm_bytes, f"{sys_.name} {smallest.name}")
        return make_plan(wl, budget_bytes, pool_link(sys_), planner=planner)
    return policy_plan(wl, "none" if math.isinf(smallest.hbm_bytes) else policy)


@app.command("simulate")
def simulate_cmd(
    system: Annotated[str, typer.Option(help="Preset name (dc-dla, mc-dla, mc-dla-1n, oracle, hc-dla) or system file.")],
    workload: Annotated[str, typer.Option(help="Zoo name (vgg-e, resnet-152, lstm, ...) or workload file.")],
    batch: Annotated[Optional[int], typer.Option(help="Batch each device processes (default: the workload's).")] = None,
    parallel: Annotated[Parallel, typer.Option(help="data: replicas + all-reduce; model: every layer split.")] = Parallel.data,
    policy: Annotated[Policy, typer.Option(help="Fixed vDNN policy (ignored with --planner).")] = Policy.all,
    planner: Annotated[Optional[str], typer.Option(help="Budgeted planner instead of a fixed policy.")] = None,
    budget: Annotated[Optional[str], typer.Option(
        help="Device-memory budget for --planner with a unit, e.g. 8GiB, at most the device memory (default: all of it).")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="Write a Chrome trace (open in Perfetto).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    scale_to: ScaleToOption = None,
) -> None:
    """Simulate one training iteration of a workload on a system with memory virtualization.

    An infeasible iteration (it does not fit the device memory) prints its result and exits with status 1.
    A workload with measured layer times simulated on other hardware than it was measured on gets a one-line
    warning on stderr unless --scale-to says how to rescale them."""
    from mcdla.hardware import load_system
    from mcdla.sim import simulate
    from mcdla.workload import load_workload

    check_planner(planner)
    check_batch(batch)
    check_output(trace, "--trace")
    if budget is not None and planner is None:
        fail("--budget: only used with --planner")
    sys_ = load_system(system)
    wl = load_workload(workload, batch=batch)
    wl = measured_times_for(wl, sys_, scale_to)
    plan = plan_for(sys_, wl, planner=planner, budget=budget, policy=policy.value)
    result = simulate(sys_, wl, plan, parallel=parallel.value, record_timeline=trace is not None)
    if trace is not None:
        write_output(trace, strict_json(result.to_chrome_trace(), indent=None), "--trace")
    summary = {
        "system": sys_.name,
        "workload": wl.name,
        "batch": wl.batch,
        "parallel": parallel.value,
        "plan": plan.planner,
        "feasible": result.feasible,
        "infeasible_reason": result.infeasible_reason,
        "iteration_time_s": result.iteration_time_s,
        "compute_s": result.compute_s,
        "recompute_s": result.recompute_s,
        "exposed_virtualization_s": result.exposed_virtualization_s,
        "exposed_communication_s": result.exposed_communication_s,
        "peak_device_bytes": result.peak_device_bytes,
        "peak_bytes_by_tier": result.peak_bytes_by_tier,
        "offloaded_bytes": result.offloaded_bytes,
        "prefetched_bytes": result.prefetched_bytes,
        "link_utilization": result.link_utilization,
    }
    if as_json:
        print_json(summary)
        _exit_if_infeasible(result)
        return
    console.print(f"[b]{wl.name}[/b] (batch {wl.batch}, {parallel.value}-parallel) on [b]{sys_.name}[/b], plan {plan.planner}")
    if not result.feasible:
        console.print(f"[red]infeasible:[/red] {result.infeasible_reason}")
    rows: list[tuple[str, str]] = [("iteration time", format_seconds(result.iteration_time_s))]
    rows += [(f"  {label}", format_seconds(value)) for label, value in (
        ("compute", result.compute_s), ("recompute", result.recompute_s),
        ("exposed virtualization", result.exposed_virtualization_s),
        ("exposed communication", result.exposed_communication_s))]
    rows += [(f"peak {tier}", format_bytes(peak)) for tier, peak in result.peak_bytes_by_tier.items()]
    rows.append(("offloaded", format_bytes(result.offloaded_bytes)))
    busiest = sorted(result.link_utilization.items(), key=lambda kv: -kv[1])[:5]
    if busiest:
        rows.append(("busiest links", ", ".join(f"{k} {100 * v:.0f}%" for k, v in busiest)))
    if trace is not None:
        rows.append(("trace", f"{trace} (open in https://ui.perfetto.dev)"))
    console.print(key_value_table(rows))
    _exit_if_infeasible(result)


def _exit_if_infeasible(result: object) -> None:
    """After printing an infeasible result: its reason on stderr, exit status 1."""
    if not getattr(result, "feasible", True):
        fail(f"infeasible: {getattr(result, 'infeasible_reason', '')}", code=1)


@app.command("reproduce")
def reproduce_cmd(
    out: Annotated[Path, typer.Option(help="Directory for results.json, results.csv and the figures.")] = Path("out"),
    policy: Annotated[Policy, typer.Option(help="Virtualization policy of dc-dla and mc-dla.")] = Policy.all,
    planner: Annotated[Optional[str], typer.Option(help="Budgeted planner instead of the fixed policy.")] = None,
    precision: Annotated[str, typer.Option(help="Arithmetic of the zoo workloads (fp16 or fp32).")] = "fp16",
    sweep: Annotated[bool, typer.Option(help="Also run the compute x PCIe-generation sweep.")] = True,
    compute_efficiency: Annotated[Optional[float], typer.Option(
        help="Sustained fraction of every device's peak FLOP/s, > 0 and <= 1, for the matrix and the variants "
             "(default: the presets' 0.7; the sweep and --sensitivity vary their own).")] = None,
    pcie_share: Annotated[Optional[str], typer.Option(
        help="dc-dla's PCIe bandwidth per GPU with all offloading at once, e.g. 12.8GB/s, for the matrix and the "
             "variants (default: the preset's 6.4GB/s, two GPUs per switch).")] = None,
    sensitivity: Annotated[bool, typer.Option(
        help="Also run the compute-efficiency x PCIe-share grid (sensitivity.json, sensitivity.png; 784 "
             "simulations, ~5-15 s).")] = False,
    variants: Annotated[str, typer.Option(
        help="Variants whose geo. mean speedup.png shows, comma-separated from fp32, conv, lp (~2 s), pofo "
             "(~35 s), or none.")] = "fp32,conv",
    workers: Annotated[Optional[int], typer.Option(help="Worker processes (default: CPU count).")] = None,
    modern: Annotated[bool, typer.Option("--modern", help="Instead: GPT-3 175B and Llama-3 405B training on "
                                         "2026 systems, offload over PCIe5 / C2C / CXL / NVLink5 memory-nodes "
                                         "vs recompute (docs/reproduction.md).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar (it is shown only on a terminal).")] = False,
) -> None:
    """The paper's comparison: 8 workloads x {dc-dla, mc-dla, oracle} x {data, model}, plus the sweep."""
    from mcdla.profile.progress import progress_bar
    from mcdla.report import experiments, figures, tables
    from mcdla.report.sensitivity import paper_crossings, sensitivity_grid

    check_planner(planner)
    if precision not in ("fp16", "fp32"):
        fail(f"--precision: got {brief(precision)}; must be fp16 or fp32")
    if workers is not None and not 1 <= workers <= 1024:
        fail(f"--workers: got {brief(workers)}; must be >= 1 and <= 1024")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out: got {brief(str(out), 200)}; cannot create it ({exc.strerror or type(exc).__name__})")
    if not os.access(out, os.W_OK):
        fail(f"--out: got {brief(str(out), 200)}; not writable (permission denied)")
    levers = _levers(compute_efficiency, pcie_share)
    variant_keys = _variant_keys(variants)
    start = time.perf_counter()
    shown = False if quiet else None
    if modern:
        _reproduce_modern(out, start, shown)
        return
    label = planner or f"vDNN-{policy.value}"
    with progress_bar("reproducing", enabled=shown) as on_progress:
        records = experiments.run_matrix(policy=policy.value, planner=planner, precision=precision, workers=workers,
                                         on_progress=on_progress, **levers)
    rows = experiments.speedup_rows(records)
    console.print(tables.speedup_table(rows, title=f"MC-DLA vs DC-DLA ({label}, {precision})"))
    tables.write_records(records, out / "results.json", out / "results.csv")
    found = experiments.variant_speedups(variant_keys, workers=workers, **levers)
    write_output(out / "variants.json", strict_json(
        {name: {"speedup": mean, "feasible": n} for name, (mean, n) in found.items()}), "--out")
    written = [out / "results.json", out / "results.csv", out / "variants.json",
               figures.plot_speedups(rows, out / "speedup.png", precision=precision, policy=label,
                                     variants={f"{name} ({n}/{len(rows)} fit)": mean
                                               for name, (mean, n) in found.items()}),
               figures.plot_breakdown(records, out / "breakdown.png")]
    if sensitivity:
        grid = sensitivity_grid(policy=policy.value, planner=planner, precision=precision, workers=workers)
        write_output(out / "sensitivity.json", strict_json(grid.to_dict()), "--out")
        written += [out / "sensitivity.json", figures.plot_sensitivity(grid, out / "sensitivity.png")]
        console.print("sensitivity: the paper's 2.8x at " + ", ".join(
            f"{100 * eff:g}% -> {share / 1e9:.1f} GB/s" for eff, share in paper_crossings(grid))
            + " (compute efficiency -> PCIe share per GPU)")
    if sweep:
        with progress_bar("compute x PCIe sweep", enabled=shown) as on_progress:
            sweep_records = experiments.compute_pcie_sweep(policy=policy.value, planner=planner, precision=precision,
                                                           workers=workers, on_progress=on_progress)
        tables.write_records(sweep_records, out / "sweep.json", out / "sweep.csv")
        written += [out / "sweep.json", figures.plot_sweep(sweep_records, out / "sweep.png")]
        console.print(tables.sweep_table(sweep_records))
    console.print(f"wrote {', '.join(str(p) for p in written)} in {time.perf_counter() - start:.1f} s")


def _levers(compute_efficiency: float | None, pcie_share: str | None) -> dict[str, float | None]:
    """The checked ``--compute-efficiency`` and ``--pcie-share`` as :func:`experiments.run_matrix` settings."""
    from mcdla.errors import ConfigError
    from mcdla.hardware import load_system
    from mcdla.report import experiments
    from mcdla.units import parse_bytes_per_s

    if compute_efficiency is not None and not 0 < compute_efficiency <= 1:
        fail(f"--compute-efficiency: got {brief(compute_efficiency)}; must be > 0 and <= 1")
    share = None
    if pcie_share is not None:
        if not pcie_share.strip().lower().endswith("/s"):
            fail(f"--pcie-share: got {brief(pcie_share)}; must be a bandwidth with its unit, e.g. 12.8GB/s")
        try:
            share = parse_bytes_per_s(pcie_share, "--pcie-share")
            experiments.with_pcie_share(load_system("dc-dla"), share)
        except ConfigError as exc:
            fail(f"--pcie-share: got {brief(pcie_share)}; {str(exc).split('; ', 1)[-1]}")
    return {"compute_efficiency": compute_efficiency, "pcie_share_bytes_per_s": share}


def _variant_keys(text: str) -> tuple[str, ...]:
    """The ``--variants`` list: keys of :data:`experiments.VARIANTS`, or none."""
    from mcdla.report import experiments

    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if keys == ("none",):
        return ()
    unknown = [k for k in keys if k not in experiments.VARIANTS]
    if unknown or not keys:
        fail(f"--variants: got {brief(text)}; must be a comma-separated list of {', '.join(experiments.VARIANTS)}, "
             "or none")
    return keys


def _reproduce_modern(out: Path, start: float, shown: bool | None) -> None:
    """``mcdla reproduce --modern``: the best configuration per system for 175B and 405B (report/modern.py)."""
    from mcdla.profile.progress import progress_bar
    from mcdla.report import modern as modern_report

    with progress_bar("modern reproduction", enabled=shown) as on_progress:
        rows = modern_report.run_modern(on_progress=on_progress)
    console.print(modern_report.modern_table(rows))
    written = [*modern_report.write_results(rows, out), modern_report.plot_modern(rows, out / "modern.png")]
    console.print(f"wrote {', '.join(str(p) for p in written)} in {time.perf_counter() - start:.1f} s")
