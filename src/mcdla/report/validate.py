"""The closed loop: profile a real model, plan, simulate, run the plan under the runtime, compare.

``validate(model, pool=..., budget=...)`` returns a :class:`ValidationResult` with the predicted and the
measured step time and peak resident saved bytes, and their errors; ``mcdla validate`` prints it. The steps:

1. profile the model with the runtime's rules: storages under ``min_bytes`` are not counted (the runtime
   leaves them alone) and a storage saved by several modules counts for the first (the runtime's record
   belongs to the module that saved it first);
2. probe the pool's first tier from the model's device (:func:`mcdla.profile.probe.probe_pool`): the link
   the planner sees (with the per-storage latency folded in, NOTE [one transfer per storage]);
3. plan under the budget (or take the given plan) and make it executable (NOTE [executing the plan] in
   :mod:`mcdla.profile.predict`); its ``saved_cap_bytes`` is the saved-bytes budget, which the runtime honours as
   the engine does, holding the forward back while offloads in flight free room (NOTE [plan budget] in
   :mod:`mcdla.runtime._policy`);
4. measure in alternating rounds, probing the link again in each (NOTE [measuring] in
   :mod:`mcdla.profile.rounds`);
5. predict with the engine from the per-layer medians of the rounds (NOTE [what is predicted]) and compare
   with the median measured step and peak resident saved bytes; both sides include their waits for memory
   (the engine's memory stalls, the runtime's ``pack_wait_s``), reported beside them.
"""

from __future__ import annotations

import dataclasses
import io
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mcdla.errors import ConfigError
from mcdla.hardware import PoolLink
from mcdla.profile._steps import normalize_inputs, zero_grads
from mcdla.profile.predict import (
    charge_copies,
    executable_plan,
    make_plan_for,
    parse_budget,
    per_storage_link,
    predict,
)
from mcdla.profile.probe import probe_pool
from mcdla.profile.profiler import profile_run
from mcdla.profile.progress import OnProgress
from mcdla.profile.resolve import ResolvedModel, resolve_model, to_device
from mcdla.profile.rounds import WINDOW, Baseline, measure_rounds, one_copy_stream
from mcdla.profile.timeline import cuda_step_timeline, timeline_from_report
from mcdla.report.tables import key_value_table
from mcdla.runtime import DEFAULT_MIN_BYTES, parse_pool, virtualize
from mcdla.units import format_bytes, format_seconds
from mcdla.workload.plan import Action, Plan

__all__ = ["ValidationResult", "validate", "validation_view", "parse_budget", "executable_plan", "predict"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationResult:
    """Prediction against measurement for one model, pool, budget and planner.

    Times in seconds, sizes in bytes; errors are signed relative errors ``(predicted - measured) / measured``.
    ``saved_budget_bytes`` is the cap on resident saved bytes both the engine and the runtime honoured;
    ``predicted_wait_s`` the engine's compute waits (memory stalls and prefetches not yet done) in the
    predicted step, ``pack_wait_s`` and ``unpack_wait_s`` the runtime's in the median measured step.
    """

    model: str
    pool: str
    planner: str
    budget_bytes: float
    threads: int
    layers: int
    offloaded_layers: tuple[str, ...]
    planned_offload_bytes: float
    measured_offload_bytes: float
    offloaded_bytes_by_layer: Mapping[str, float]
    predicted_step_s: float
    engine_step_s: float
    copy_cost_s_per_byte: float
    measured_step_s: float
    plain_step_s: float
    profiled_step_s: float
    measured_step_samples_s: tuple[float, ...]
    predicted_peak_saved_bytes: float
    measured_peak_saved_bytes: float
    saved_bytes: float
    unpack_wait_s: float
    link: PoolLink
    saved_budget_bytes: float = math.inf
    pack_wait_s: float = 0.0
    predicted_wait_s: float = 0.0
    probed_link: PoolLink | None = None
    notes: tuple[str, ...] = ()
    plot: str | None = None

    @property
    def step_time_error(self) -> float:
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def peak_saved_error(self) -> float:
        m = self.measured_peak_saved_bytes
        return (self.predicted_peak_saved_bytes - m) / m if m > 0 else (0.0 if self.predicted_peak_saved_bytes == 0 else math.inf)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, link in (("link", self.link), ("probed_link", self.probed_link or self.link)):
            out[key] = {
                "offload_bytes_per_s": link.offload_bytes_per_s,
                "prefetch_bytes_per_s": link.prefetch_bytes_per_s,
                "latency_s": link.latency_s,
                "source": link.source,
            }
        out["offloaded_bytes_by_layer"] = dict(self.offloaded_bytes_by_layer)
        out["saved_budget_bytes"] = self.saved_budget_bytes if math.isfinite(self.saved_budget_bytes) else None
        out["offloaded_layers"] = list(self.offloaded_layers)
        out["measured_step_samples_s"] = list(self.measured_step_samples_s)
        out["notes"] = list(self.notes)
        out["step_time_error"] = self.step_time_error
        out["peak_saved_error"] = self.peak_saved_error
        return out

    def summary(self) -> str:
        """The validation as plain text: :func:`validation_view` (what ``mcdla validate`` prints), uncoloured,
        on a page wide enough that no cell wraps."""
        page = io.StringIO()
        Console(file=page, width=_TEXT_WIDTH, color_system=None, highlight=False).print(validation_view(self))
        return "\n".join(line.rstrip() for line in page.getvalue().splitlines())


_TEXT_WIDTH = 1000
"""Columns of :meth:`ValidationResult.summary`'s page: room for any row (a table takes the width it needs)."""


def validation_view(r: ValidationResult) -> Group:
    """The validation as rich renderables: a header, the predicted-vs-measured table (step time, peak saved
    bytes, waits, each with its error) and the reference figures and notes as a two-column table."""
    header = Text(f"{r.model}: pool {r.pool}, budget {format_bytes(r.budget_bytes)}, planner {r.planner}, "
                  f"{r.layers} layers, {r.threads} compute thread(s)")
    plan = Text(f"plan: offload {len(r.offloaded_layers)} layer(s), {format_bytes(r.planned_offload_bytes)} (runtime "
                f"offloaded {format_bytes(r.measured_offload_bytes)}); link write {r.link.offload_bytes_per_s / 1e9:.2f}"
                f" GB/s, read {r.link.prefetch_bytes_per_s / 1e9:.2f} GB/s")
    table = Table(title_justify="left")
    for column in ("", "predicted", "measured", "error"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("step time", format_seconds(r.predicted_step_s), format_seconds(r.measured_step_s),
                  f"{r.step_time_error:+.1%}")
    table.add_row("peak saved bytes", format_bytes(r.predicted_peak_saved_bytes), format_bytes(r.measured_peak_saved_bytes),
                  f"{r.peak_saved_error:+.1%}")
    table.add_row("waits", format_seconds(r.predicted_wait_s),
                  f"{format_seconds(r.pack_wait_s)} pack + {format_seconds(r.unpack_wait_s)} unpack", "")
    cap = format_bytes(r.saved_budget_bytes) if math.isfinite(r.saved_budget_bytes) else "none"
    rows = [("engine alone", format_seconds(r.engine_step_s)),
            ("copies cost compute", f"{r.copy_cost_s_per_byte * 1e9:.3f} s/GB"),
            ("plain step", format_seconds(r.plain_step_s)), ("profiled step", format_seconds(r.profiled_step_s)),
            ("saved-bytes cap", cap)]
    rows += [("note", n) for n in r.notes]
    if r.plot:
        rows.append(("timeline", str(r.plot)))
    return Group(header, plan, table, key_value_table(rows))


# -- the loop --------------------------------------------------------------------------------------------------
def validate(
    model: str | ResolvedModel,
    *,
    pool: str,
    budget: str | float,
    planner: str | None = None,
    plan: Plan | str | Path | None = None,
    steps: int = 5,
    warmup: int = 2,
    granularity: str = "leaf",
    min_bytes: int = DEFAULT_MIN_BYTES,
    threads: int | None = None,
    batch: int | None = None,
    scale: Mapping[str, Any] | None = None,
    plot: str | Path | None = None,
    device: str | None = None,
    baseline: Baseline = "runtime",
    copy_interference: bool | None = None,
    io_threads: int | None = 1,
    on_progress: OnProgress | None = None,
) -> ValidationResult:
    """Profile, plan, simulate, run under the runtime and compare (see the NOTEs of this module).

    Args:
        model: a model spec (:func:`mcdla.profile.resolve.resolve_model`) or a resolved model.
        pool: the runtime pool spec (``"file:/scratch"``); its first tier is probed for the link.
        budget: device budget for the planner (:func:`parse_budget`).
        planner: planner name (None: the planners' default); ignored when ``plan`` is given.
        plan: run this plan instead of planning (it must name this model's modules).
        steps, warmup: measured and warm-up rounds (each a plain and a virtualized step).
        granularity: ``"leaf"`` or ``"block"``; min_bytes: the runtime's ``min_bytes`` (bytes).
        threads: torch intra-op threads for the whole loop (None: leave as is).
        batch, scale: passed to the model builder.
        plot: write the measured and predicted memory timelines of one step to this PNG.
        device: move the model and its inputs there first (``"cuda"``); None leaves them where they are.
        baseline: ``"runtime"`` takes the layer times under the runtime with nothing offloaded, ``"plain"``
            without it (NOTE [measuring] in :mod:`mcdla.profile.rounds`).
        copy_interference: measure what copies cost compute and charge it to the layers they overlap
            (NOTE [copies on the CPU]); None: on for a CPU model, off on CUDA (copy engines).
        io_threads: I/O threads of each threaded tier (NOTE [one copy stream]); None keeps the pool's.
        on_progress: hears of each profiling step and each measured round (:mod:`mcdla.profile.progress`).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps: got {steps!r}; must be an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup: got {warmup!r}; must be an integer >= 0")
    if baseline not in ("runtime", "plain"):
        raise ConfigError(f"baseline: got {baseline!r}; must be 'runtime' or 'plain'")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads: got {threads!r}; must be an integer >= 1")
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model, batch=batch, scale=scale)
    if device is not None:
        resolved = to_device(resolved, device)
    if io_threads is not None and (isinstance(io_threads, bool) or not isinstance(io_threads, int) or io_threads < 1):
        raise ConfigError(f"io_threads: got {io_threads!r}; must be an integer >= 1 or None")
    pool_obj = parse_pool(pool)
    shared = one_copy_stream(pool_obj, io_threads)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _validate(resolved, pool_obj, pool, budget, planner, plan, steps, warmup, granularity, min_bytes, plot,
                         baseline, copy_interference, shared, on_progress)
    finally:
        torch.set_num_threads(previous_threads)
        pool_obj.close()


def _validate(resolved: ResolvedModel, pool_obj: Any, pool: str, budget: str | float, planner: str | None,
              plan: Plan | str | Path | None, steps: int, warmup: int, granularity: str, min_bytes: int,
              plot: str | Path | None, baseline: Baseline, copy_interference: bool | None,
              shared: bool, on_progress: OnProgress | None = None) -> ValidationResult:
    model, inputs = resolved.model, normalize_inputs(resolved.example_inputs)
    profiled = profile_run(model, resolved.example_inputs, resolved.loss_fn, granularity=granularity,  # type: ignore[arg-type]
                           warmup_steps=warmup, measured_steps=min(3, steps), name=resolved.name,
                           min_saved_bytes=int(min_bytes), shared_storage_owner="first", on_progress=on_progress)
    workload = profiled.workload
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    first = dataclasses.replace(probe_pool(pool_obj, device=device).link, shared_direction=shared)
    plan_link = per_storage_link(first, workload, profiled.saved_storages)
    budget_bytes = parse_budget(budget, workload)
    modules = [n for n, _ in model.named_modules()]
    if plan is not None:
        chosen = plan if isinstance(plan, Plan) else Plan.load(plan)
        chosen.check_matches(sorted(set(modules) | set(workload.layer_names)), workload=resolved.name)
        planner_name = chosen.planner
    else:
        chosen = make_plan_for(workload, budget_bytes, plan_link, planner)
        planner_name = chosen.planner
    run_plan, notes = executable_plan(chosen, workload, modules)
    interference = device.type == "cpu" if copy_interference is None else copy_interference
    rounds = measure_rounds(resolved, inputs, pool=pool_obj, plan=run_plan, workload=workload, granularity=granularity,
                            min_bytes=int(min_bytes), steps=steps, warmup=warmup, baseline=baseline,
                            copy_interference=interference, on_progress=on_progress)
    times = rounds.layer_times()
    timed = workload.with_layers([
        dataclasses.replace(l, fwd_time_s=times[l.name][0], bwd_time_s=times[l.name][1]) for l in workload.layers
    ])
    probed = dataclasses.replace(rounds.link(), shared_direction=shared)
    link = per_storage_link(probed, workload, profiled.saved_storages)
    engine_s = predict(timed, run_plan, link).step_s
    copy_cost = rounds.copy_cost_s_per_byte()
    prediction = predict(charge_copies(timed, run_plan, copy_cost), run_plan, link)
    predicted_s, predicted_peak, predicted_line = prediction.step_s, prediction.peak_saved_bytes, prediction.timeline
    median_i = sorted(range(len(rounds.run)), key=lambda i: rounds.run[i])[len(rounds.run) // 2]
    report = rounds.reports[median_i]
    offloaded = {k: float(v) for k, v in report.offloaded_bytes_by_layer.items()}
    plot_path = None
    if plot is not None:
        from mcdla.report.timeline_plot import plot_memory_timelines

        measured_line = timeline_from_report(report, step_time_s=rounds.run[median_i])
        extra = []
        if device.type == "cuda":
            vm = virtualize(pool=pool_obj, plan=run_plan, model=model, min_bytes=int(min_bytes), window=WINDOW)
            try:
                with vm:
                    line = cuda_step_timeline(model, resolved.example_inputs, resolved.loss_fn,
                                              granularity=granularity)  # type: ignore[arg-type]
            finally:
                zero_grads(model)
                vm.close()
            extra.append(("CUDA allocated bytes (synchronized at every layer)", line))
        plot_path = str(plot_memory_timelines(
            measured_line, predicted_line, plot, measured_step_s=rounds.run[median_i], predicted_step_s=predicted_s,
            title=f"{resolved.name}: resident saved bytes, {pool}, budget {format_bytes(budget_bytes)}",
            extra=extra,
        ))
    offload_layers = run_plan.layers_with(Action.OFFLOAD)
    return ValidationResult(
        model=resolved.name, pool=pool, planner=planner_name, budget_bytes=budget_bytes,
        threads=torch.get_num_threads(), layers=len(workload), offloaded_layers=offload_layers,
        planned_offload_bytes=sum(workload.layers[workload.index_of(n)].saved_bytes for n in offload_layers),
        measured_offload_bytes=float(report.offloaded_bytes), offloaded_bytes_by_layer=offloaded,
        predicted_step_s=predicted_s, engine_step_s=engine_s, copy_cost_s_per_byte=copy_cost, measured_step_s=statistics.median(rounds.run),
        plain_step_s=statistics.median(rounds.plain), profiled_step_s=statistics.median(rounds.profiled),
        measured_step_samples_s=tuple(rounds.run),
        predicted_peak_saved_bytes=predicted_peak,
        measured_peak_saved_bytes=float(statistics.median(r.peak_resident_saved_bytes for r in rounds.reports)),
        saved_bytes=workload.saved_bytes, unpack_wait_s=float(report.unpack_wait_s), link=link, probed_link=probed,
        saved_budget_bytes=run_plan.saved_cap_bytes, pack_wait_s=float(report.pack_wait_s),
        predicted_wait_s=prediction.wait_s, notes=notes,
        plot=plot_path,
    )


