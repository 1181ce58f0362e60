"""The closed loop for weights, gradients and optimizer state: plan, predict, run under the runtime, compare.

``validate_states(model, pool=...)`` profiles the model (layer times, parameter bytes per module), takes a plan
whose ``state`` entries move weights and optimizer state (the given one, or every module owning parameters:
weights, gradients and optimizer state offloaded), probes the pool's first tier for the link, predicts the step
and the peak resident offloaded-weight bytes with the engine (NOTE [predicting state] in
:mod:`mcdla.profile.predict`) and runs real Adam steps with ``mcdla.offload_parameters`` and
``mcdla.offload_optimizer`` executing the same plan. The first step is not measured: the parameter offloader
learns the forward order there and prefetches from the second on. The CPU update's speed is measured in the
same run, on the runtime's own update path: ``offload_optimizer(..., overlap=False)`` on a copy of the model,
state in the same pool, whose updates all run in ``step()`` after backward (nothing competes with them); the
fastest step's worker seconds (``update_s``: reading the state from the tier, the update, writing it back) per
parameter byte.

NOTE [state components]
    One step time hides which part of the model is off, so the result holds the parts side by side:
    the compute (the engine's sum of the profiled layer times, against the plain model's forward and
    backward measured in the same run, under the same load), the rest of the step (predicted: the
    exposed fetches and update tail; measured: the step less that plain compute, split into what forward
    and backward gained under the offloaders and the offloaded optimizer's ``step()``), the CPU updates
    (predicted from the measured rate; measured: the optimizer worker's busy seconds, ``update_s``) and
    the state copies at the probed rates: weight fetches (measured: the parameter offloader's worker,
    ``fetch_s``), the new values ``step()`` copies in (measured: ``step()`` less its wait for updates) and
    the gradients out (predicted only: they are copied on the compute thread, not timed apart).
    On a shared CPU the profile's layer times and the run's compute drift apart between the two
    measurements; ``same_run_compute_step_s`` is the prediction with its compute taken from this run's
    plain steps, so its error is the error of the offloading model alone.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mcdla.errors import ConfigError
from mcdla.hardware import PoolLink
from mcdla.profile._steps import compute_loss, normalize_inputs, run_forward
from mcdla.profile.predict import predict_states
from mcdla.profile.probe import probe_pool
from mcdla.profile.profiler import profile_run
from mcdla.profile.resolve import ResolvedModel, resolve_model
from mcdla.runtime import offload_optimizer, offload_parameters, parse_pool
from mcdla.units import format_bytes
from mcdla.workload.model import Workload
from mcdla.workload.plan import Placement, Plan, StateDecision

__all__ = ["StateValidation", "validate_states", "offload_all_plan", "adam_state_per_param_byte"]


def adam_state_per_param_byte(model: torch.nn.Module) -> float:
    """Bytes of Adam state ``offload_optimizer`` keeps per parameter byte: two moments of the parameter's dtype,
    or, for float16/bfloat16 parameters, an fp32 master and two fp32 moments (12 bytes per 2-byte parameter)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() * p.element_size() for p in params)
    state = sum(p.numel() * (12 if p.dtype in (torch.float16, torch.bfloat16) else 2 * p.element_size())
                for p in params)
    return state / total if total else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StateValidation:
    """Prediction against measurement of a state plan; seconds and bytes, errors ``(predicted - measured) / measured``."""

    model: str
    pool: str
    prefetch: tuple[int, ...]  # the distinct prefetch depths of the plan's offloaded-weight entries
    offloaded_weight_layers: int
    offloaded_optimizer_layers: int
    predicted_step_s: float
    serial_step_s: float
    measured_step_s: float
    measured_step_samples_s: tuple[float, ...]
    plain_step_s: float
    update_s_per_param_byte: float
    predicted_peak_weight_bytes: float
    measured_peak_weight_bytes: float
    link: PoolLink
    # the step's parts side by side (medians over the measured steps; NOTE [state components])
    predicted_compute_s: float
    measured_compute_s: float  # forward + backward of the plain model, measured in the same run
    predicted_update_s: float
    measured_update_s: float  # the offloaded optimizer's worker, per step
    predicted_fetch_s: float  # every weight fetch at the probed rates, one after another
    measured_fetch_s: float  # the parameter offloader's worker reading units, per step
    predicted_copy_in_s: float  # every new value step() copies in (device weights or the pool)
    measured_copy_in_s: float  # step() less its wait for updates, per step
    predicted_gradient_out_s: float  # every offloaded gradient copied out
    measured_backward_s: float  # forward + backward under the offloaders
    measured_step_call_s: float  # the offloaded optimizer's step(): waiting for updates, copying values in

    @property
    def step_time_error(self) -> float:
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def serial_step_error(self) -> float:
        return (self.serial_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def same_run_compute_step_s(self) -> float:
        """The predicted step with its compute replaced by the plain model's measured in the same run: what the
        prediction says the offloading costs, added to this run's compute (NOTE [state components])."""
        return self.predicted_step_s - self.predicted_compute_s + self.measured_compute_s

    @property
    def same_run_compute_error(self) -> float:
        return (self.same_run_compute_step_s - self.measured_step_s) / self.measured_step_s

    def components(self) -> list[tuple[str, float, float | None]]:
        """(part, predicted s, measured s or None) for the table of :meth:`summary`."""
        return [
            ("compute (plain forward + backward)", self.predicted_compute_s, self.measured_compute_s),
            ("step beyond the compute", self.predicted_step_s - self.predicted_compute_s,
             self.measured_step_s - self.measured_compute_s),
            ("  forward + backward beyond the compute", None, self.measured_backward_s - self.measured_compute_s),
            ("  step() (waits for updates, copies in)", None, self.measured_step_call_s),
            ("CPU updates (worker busy)", self.predicted_update_s, self.measured_update_s),
            ("weight fetches (worker busy)", self.predicted_fetch_s, self.measured_fetch_s),
            ("new values copied in by step()", self.predicted_copy_in_s, self.measured_copy_in_s),
            ("gradients copied out", self.predicted_gradient_out_s, None),
        ]

    def summary(self) -> str:
        spread = max(self.measured_step_samples_s) / min(self.measured_step_samples_s) - 1
        return "\n".join([
            f"{self.model}: pool {self.pool}, prefetch {','.join(map(str, self.prefetch)) or '-'}, weights of "
            f"{self.offloaded_weight_layers} and "
            f"optimizer state of {self.offloaded_optimizer_layers} module(s) offloaded",
            f"  step time:    predicted {self.predicted_step_s * 1e3:9.2f} ms   measured {self.measured_step_s * 1e3:9.2f} ms"
            f"   error {self.step_time_error:+.1%}   (samples spread {spread:.1%}; plain Adam step "
            f"{self.plain_step_s * 1e3:.2f} ms; offloaded update {self.update_s_per_param_byte * 1e9:.2f} s/GB)",
            f"                (serial bound, no spare core for copies and updates: "
            f"{self.serial_step_s * 1e3:.2f} ms, error {self.serial_step_error:+.1%})",
            f"                (compute from this run's plain steps: {self.same_run_compute_step_s * 1e3:.2f} ms, "
            f"error {self.same_run_compute_error:+.1%})",
            f"  peak weights: predicted {format_bytes(self.predicted_peak_weight_bytes):>12}   measured "
            f"{format_bytes(self.measured_peak_weight_bytes):>12}",
            "  parts (ms)                                  predicted   measured",
            *(f"    {name:<40} {_ms(p):>9} {_ms(m):>10}" for name, p, m in self.components()),
        ])


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def offload_all_plan(workload: Workload, module_names: set[str]) -> Plan:
    """A plan offloading weights, gradients and optimizer state of every module of ``workload`` owning parameters."""
    moved = Placement.OFFLOAD
    state = tuple(StateDecision(layer=l.name, weights=moved, gradients=moved, optimizer_state=moved)
                  for l in workload.layers if l.param_bytes > 0 and l.name in module_names)
    return Plan(workload=workload.name, batch=workload.batch, budget_bytes=float("inf"), decisions=(),
                layer_names=workload.layer_names, planner="offload-all-state", state=state)


def _timed_steps(model: torch.nn.Module, inputs: Any, loss_fn: Any, optimizer: Any, steps: int,
                 on_start: Callable[[], None] = lambda: None, on_end: Callable[[], None] = lambda: None
                 ) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each of ``steps`` Adam steps (forward, backward, ``step()``, ``zero_grad()``), of their forward
    and backward, and of their ``step()`` calls alone."""
    times, backwards, updates = [], [], []
    for _ in range(steps):
        on_start()
        t0 = time.perf_counter()
        compute_loss(run_forward(model, inputs), loss_fn).backward()
        t1 = time.perf_counter()
        backwards.append(t1 - t0)
        optimizer.step()
        updates.append(time.perf_counter() - t1)
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
        on_end()
    return times, backwards, updates


def _update_rate(resolved: ResolvedModel, inputs: Any, pool: Any, lr: float, steps: int) -> float:
    """Seconds of the offloaded optimizer's own updates of every parameter, its state in ``pool`` (the fastest
    of ``steps`` steps after the first): ``overlap=False`` runs them all in ``step()`` after backward, so no
    compute competes with them."""
    model = copy.deepcopy(resolved.model)
    opt = offload_optimizer(torch.optim.Adam(model.parameters(), lr=lr), pool, overlap=False)
    busy: list[float] = []
    try:
        _timed_steps(model, inputs, resolved.loss_fn, opt, steps, on_end=lambda: busy.append(opt.update_s))
    finally:
        opt.close()
    return min(busy[1:] or busy)


def validate_states(model: str | ResolvedModel, *, pool: str = "host", plan: Plan | None = None,
                    prefetch: int | None = None,
                    steps: int = 5, warmup: int = 2, lr: float = 1e-3, threads: int | None = None) -> StateValidation:
    """Profile, predict and run a state plan under Adam (see the module docstring); ``steps`` measured steps
    after ``warmup`` (at least 1, the order-learning step); ``prefetch``: the depth to give every state entry
    (None: the plan's own, 1 in the default plan); ``threads``: torch intra-op threads for the whole
    loop (None: leave as is; on a shared machine more threads than free cores make every small op wait)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads: got {threads!r}; must be an integer >= 1")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _validate_states(model, pool, plan, prefetch, steps, warmup, lr)
    finally:
        torch.set_num_threads(previous)


def _validate_states(model: str | ResolvedModel, pool: str, plan: Plan | None, prefetch: int | None, steps: int,
                     warmup: int, lr: float) -> StateValidation:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps: got {steps!r}; must be an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ConfigError(f"warmup: got {warmup!r}; must be an integer >= 1 (the first step learns the order)")
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0):
        raise ConfigError(f"prefetch: got {prefetch!r}; must be an integer >= 0")
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model)
    inputs = normalize_inputs(resolved.example_inputs)
    profiled = profile_run(resolved.model, resolved.example_inputs, resolved.loss_fn, warmup_steps=warmup,
                           measured_steps=steps, name=resolved.name,
                           optimizer_bytes_per_param_byte=adam_state_per_param_byte(resolved.model))
    workload = profiled.workload
    modules = {n for n, _ in resolved.model.named_modules()}
    chosen = plan if plan is not None else offload_all_plan(workload, modules)
    if prefetch is not None:
        chosen = dataclasses.replace(chosen, state=tuple(dataclasses.replace(sd, prefetch=prefetch)
                                                         for sd in chosen.state))
    pool_obj = parse_pool(pool)
    try:
        link = probe_pool(pool_obj).link
        plain_model = copy.deepcopy(resolved.model)
        plain = torch.optim.Adam(plain_model.parameters(), lr=lr, foreach=False)
        plain_times, plain_backwards, plain_updates = _timed_steps(plain_model, inputs, resolved.loss_fn, plain,
                                                                   warmup + steps)
        plain_s = statistics.median(plain_times[warmup:])
        update_rate = _update_rate(resolved, inputs, pool_obj, lr, warmup + steps) / max(workload.param_bytes, 1.0)
        prediction = predict_states(workload, chosen, link, update_s_per_param_byte=update_rate)
        run_model = copy.deepcopy(resolved.model)
        params = offload_parameters(run_model, pool_obj, plan=chosen)
        opt = offload_optimizer(torch.optim.Adam(run_model.parameters(), lr=lr), pool_obj, model=run_model,
                                parameters=params, plan=chosen)
        peaks: list[int] = []
        worker: list[float] = []
        fetching: list[float] = []
        waiting: list[float] = []

        def step_done() -> None:
            peaks.append(params.peak_resident_bytes)
            worker.append(opt.update_s)
            fetching.append(params.fetch_s)
            waiting.append(opt.step_wait_s)

        try:
            times, backwards, step_calls = _timed_steps(run_model, inputs, resolved.loss_fn, opt, warmup + steps,
                                                        params.reset_report, step_done)
        finally:
            opt.close()
            params.close()
    finally:
        pool_obj.close()
    measured = times[warmup:]
    return StateValidation(
        model=resolved.name, pool=pool,
        prefetch=tuple(sorted({sd.prefetch for sd in chosen.state if sd.offloads("weights")})),
        offloaded_weight_layers=sum(sd.offloads("weights") for sd in chosen.state),
        offloaded_optimizer_layers=sum(sd.offloads("optimizer_state") for sd in chosen.state),
        predicted_step_s=prediction.step_s, serial_step_s=prediction.serial_step_s, measured_step_s=statistics.median(measured),
        measured_step_samples_s=tuple(measured), plain_step_s=plain_s, update_s_per_param_byte=update_rate,
        predicted_peak_weight_bytes=prediction.peak_weight_bytes,
        measured_peak_weight_bytes=float(max(peaks[warmup:])),
        link=link,
        predicted_compute_s=prediction.compute_s, measured_compute_s=statistics.median(plain_backwards[warmup:]),
        predicted_update_s=prediction.update_s, measured_update_s=statistics.median(worker[warmup:]),
        predicted_fetch_s=prediction.fetch_s, measured_fetch_s=statistics.median(fetching[warmup:]),
        predicted_copy_in_s=prediction.copy_in_s,
        measured_copy_in_s=statistics.median([c - w for c, w in zip(step_calls[warmup:], waiting[warmup:])]),
        predicted_gradient_out_s=prediction.gradient_out_s,
        measured_backward_s=statistics.median(backwards[warmup:]),
        measured_step_call_s=statistics.median(step_calls[warmup:]),
    )
