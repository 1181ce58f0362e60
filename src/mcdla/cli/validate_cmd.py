"""``mcdla validate`` (profile, plan, simulate, run, compare) and ``mcdla probe`` (this machine as a system)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mcdla.cli._app import app, check_batch, check_output, check_torch_device, console, fail, print_json
from mcdla.errors import brief
from mcdla.units import parse_bytes


def _scale(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--scale: got {brief(item)}; must be KEY=VALUE, e.g. --scale hidden=256")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                fail(f"--scale {brief(key)}: got {brief(value)}; must be a number")
    return out


@app.command("validate")
def validate_cmd(
    model: Annotated[str, typer.Option(help="mlp, transformer, a zoo name, or python:MODULE:FACTORY.")],
    pool: Annotated[str, typer.Option(help="Runtime pool spec, e.g. file:/scratch or host.")],
    budget: Annotated[str, typer.Option(
        help="Device budget for the planner: a size with a unit (96MiB) or P% of saved bytes kept.")],
    planner: Annotated[Optional[str], typer.Option(help="Planner name (default: the planners' default).")] = None,
    plan: Annotated[Optional[Path], typer.Option(help="Run this plan file instead of planning.")] = None,
    steps: Annotated[int, typer.Option(help="Measured rounds (each one plain and one virtualized step).")] = 5,
    warmup: Annotated[int, typer.Option(help="Warm-up rounds.")] = 2,
    batch: Annotated[Optional[int], typer.Option(help="Batch size for the model builder.")] = None,
    scale: Annotated[Optional[list[str]], typer.Option(help="Model scale KEY=VALUE (repeatable).")] = None,
    granularity: Annotated[str, typer.Option(help="leaf or block.")] = "leaf",
    threads: Annotated[Optional[int], typer.Option(help="torch compute threads (default: as configured).")] = None,
    min_bytes: Annotated[str, typer.Option(help="Runtime min_bytes: smaller storages stay on the device.")] = "256KiB",
    plot: Annotated[Optional[Path], typer.Option(help="Write measured vs predicted memory timeline PNG here.")] = None,
    device: Annotated[Optional[str], typer.Option(help="Run the model there (cpu, cuda); default: cpu.")] = None,
    baseline: Annotated[str, typer.Option(help="Layer times under the runtime keeping all (runtime) or plain.")] = "runtime",
    io_threads: Annotated[int, typer.Option(help="I/O threads per threaded tier (0: keep the pool's own).")] = 1,
    copy_interference: Annotated[Optional[bool], typer.Option(
        "--copy-interference/--no-copy-interference",
        help="Measure and charge the compute time copies cost (default: on for CPU, off for CUDA).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar (it is shown only on a terminal).")] = False,
    states: Annotated[bool, typer.Option(
        "--states", help="Check weights/optimizer-state offload instead: run --plan's state entries (default: all "
                         "offloaded) under offload_parameters + offload_optimizer with Adam; --budget is not used.")] = False,
    state_prefetch: Annotated[Optional[int], typer.Option(
        help="With --states: layers of weights fetched ahead, for every state entry (default: the plan's own; 1 "
             "without --plan).")] = None,
) -> None:
    """Profile a model, plan it, predict its step, run it under the runtime and print both with the error."""
    from mcdla.profile.progress import progress_bar
    from mcdla.report.validate import validate

    if states:
        _validate_states(model, pool, plan, steps, warmup, batch, scale, threads, state_prefetch, as_json)
        return

    if granularity not in ("leaf", "block"):
        fail(f"--granularity: got {brief(granularity)}; must be leaf or block")
    if baseline not in ("runtime", "plain"):
        fail(f"--baseline: got {brief(baseline)}; must be runtime or plain")
    if not budget.strip().endswith("%"):
        parse_bytes(budget, "--budget", require_unit=True)  # a bare number is ambiguous: say 96MiB or 96B
    check_batch(batch)
    for option, value, least in (("--steps", steps, 1), ("--warmup", warmup, 0), ("--io-threads", io_threads, 0)):
        if not least <= value <= 10_000:
            fail(f"{option}: got {brief(value)}; must be >= {least} and <= 10000")
    if threads is not None and not 1 <= threads <= 4096:
        fail(f"--threads: got {brief(threads)}; must be >= 1 and <= 4096")
    check_output(plot, "--plot")
    check_torch_device(device)
    with progress_bar("validating", enabled=False if quiet else None) as on_progress:
        result = validate(
            model, pool=pool, budget=budget, planner=planner, plan=plan, steps=steps, warmup=warmup, batch=batch,
            scale=_scale(scale or []), granularity=granularity, threads=threads,
            min_bytes=int(parse_bytes(min_bytes, "--min-bytes")), plot=plot, device=device, baseline=baseline,
            copy_interference=copy_interference, io_threads=io_threads or None,  # type: ignore[arg-type]
            on_progress=on_progress,
        )
    if as_json:
        from mcdla.report.meta import results_meta

        print_json({"meta": results_meta(), **result.to_dict()})
        return
    _print_validation(result)


def _validate_states(model: str, pool: str, plan: Optional[Path], steps: int, warmup: int, batch: Optional[int],
                     scale: Optional[list[str]], threads: Optional[int], prefetch: Optional[int], as_json: bool) -> None:
    """``mcdla validate --states``: :func:`mcdla.report.validate_states.validate_states`, printed."""
    from mcdla.profile.resolve import resolve_model
    from mcdla.report.validate_states import validate_states
    from mcdla.workload.plan import Plan

    check_batch(batch)
    for option, value, least in (("--steps", steps, 1), ("--warmup", warmup, 1), ("--state-prefetch", prefetch, 0)):
        if value is not None and not least <= value <= 10_000:
            fail(f"{option}: got {brief(value)}; must be >= {least} and <= 10000")
    if threads is not None and not 1 <= threads <= 4096:
        fail(f"--threads: got {brief(threads)}; must be >= 1 and <= 4096")
    resolved = resolve_model(model, batch=batch, scale=_scale(scale or []))
    result = validate_states(resolved, pool=pool, plan=Plan.load(plan) if plan is not None else None,
                             prefetch=prefetch, steps=steps, warmup=warmup, threads=threads)
    if as_json:
        from mcdla.report.meta import results_meta

        print_json({"meta": results_meta(), **{k: getattr(result, k) for k in result.__dataclass_fields__
                                               if k != "link"}, "step_time_error": result.step_time_error,
                    "spare_core_error": result.spare_core_error, "fastest_error": result.fastest_error})
        return
    console.print(result.summary(), markup=False)


def _print_validation(r: Any) -> None:
    """The validation as a header, a predicted-vs-measured table and its notes (:func:`validation_view`)."""
    from mcdla.report.validate import validation_view

    console.print(validation_view(r))


@app.command("probe")
def probe_cmd(
    out: Annotated[Path, typer.Option(help="Write the system here (.yaml or .json).")],
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Where the file tiers write (default: a temp dir).")] = None,
    pool_tier: Annotated[str, typer.Option(help="The tier offloads go to: host, file or compress.")] = "file",
    device: Annotated[str, typer.Option(help="The device to measure compute on (cpu, cuda:0).")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Also print the measured links as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar (it is shown only on a terminal).")] = False,
) -> None:
    """Measure this machine (compute, memory, host/file/compress tiers) into a system file."""
    from rich.table import Table

    from mcdla.hardware import save_system
    from mcdla.profile.probe import probe_machine, probe_system
    from mcdla.profile.progress import progress_bar

    if out.suffix not in (".yaml", ".yml", ".json"):
        fail(f"--out: got {brief(str(out), 200)}; must end in .yaml, .yml or .json")
    if pool_tier not in ("host", "file", "compress"):
        fail(f"--pool-tier: got {brief(pool_tier)}; must be host, file or compress")
    check_output(out, "--out")
    if directory is not None and directory.exists() and not directory.is_dir():
        fail(f"--dir: got {brief(str(directory), 200)}; it is not a directory, must be a directory")
    check_torch_device(device)
    with progress_bar("probing", enabled=False if quiet else None) as on_progress:
        machine = probe_machine(directory, device=device, on_progress=on_progress)
    system = probe_system(machine, pool_tier=pool_tier)
    try:
        save_system(system, out)
    except OSError as exc:
        fail(f"--out: got {brief(str(out), 200)}; cannot write it ({exc.strerror or type(exc).__name__})")
    links = {
        kind: {"tier": p.tier, "offload_bytes_per_s": p.link.offload_bytes_per_s,
               "prefetch_bytes_per_s": p.link.prefetch_bytes_per_s, "latency_s": p.link.latency_s,
               "compression_ratio": p.compression_ratio}
        for kind, p in machine.tiers.items()
    }
    if as_json:
        print_json({"system": str(out), "flops_per_s": machine.flops_per_s,
                    "memory_bytes_per_s": machine.memory_bytes_per_s, "tiers": links})
        return
    console.print(f"{machine.source}", markup=False)
    console.print("compute: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in machine.flops_per_s.items())
                  + f"; memory copy {machine.memory_bytes_per_s / 1e9:.1f} GB/s")
    table = Table(title="tiers", title_justify="left")
    for column in ("tier", "write", "read", "latency"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for kind, link in links.items():
        table.add_row(kind, f"{link['offload_bytes_per_s'] / 1e9:.2f} GB/s", f"{link['prefetch_bytes_per_s'] / 1e9:.2f} GB/s",
                      f"{link['latency_s'] * 1e6:.1f} us")
    console.print(table)
    console.print(f"wrote {out} (pool tier: {pool_tier})")
