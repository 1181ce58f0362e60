"""The closed loop for weights, gradients and optimizer state: plan, predict, run under the runtime, compare.

``validate_states(model, pool=...)`` profiles the model (layer times, parameter bytes per module), takes a plan
whose ``state`` entries move weights and optimizer state (the given one, or every module owning parameters:
weights, gradients and optimizer state offloaded), probes the pool's first tier for the link, measures in
rounds (NOTE [sharing measured]), predicts the step and the peak resident offloaded-weight bytes with the
engine (NOTE [predicting state] in :mod:`mcdla.profile.predict`) and compares them with real Adam steps under
``mcdla.offload_parameters`` and ``mcdla.offload_optimizer`` executing the same plan, taken in the same rounds.
The first round is not measured: the parameter offloader learns the forward order there and prefetches from
the second on.

NOTE [sharing measured]
    Load from other processes drifts over seconds, so, as for activations (NOTE [measuring] in
    :mod:`mcdla.profile.rounds`), the measurements alternate: each round runs a plain Adam step, the runtime's
    CPU updates alone (on a copy of the model under the plan, its weights in ``offload_parameters`` and its
    optimizer state in the same pool as the run's, with ``offload_optimizer(..., overlap=False)``: the worker's
    busy seconds ``update_s`` of a ``step()`` that runs them after backward, reading the weights and the state
    from the tier, updating, writing the state back), the plain forward + backward while a background thread
    runs those same updates back to back, and one step of the run. The compute is the profile's layer times
    scaled together to the median plain forward + backward (the split from the layers, the total from the
    rounds); the update rate is the median alone busy seconds per parameter byte updated on the CPU; the plain
    optimizer's ``step()`` per parameter byte is the rate of the state kept on the device; the CPU sharing
    (NOTE [CPU sharing] in :mod:`mcdla.sim.device`) is the pair of stretches measured beside each other in
    each round: compute's (the plain forward + backward with updates beside it over the same round's alone;
    the engine applies it beside any helper thread of the runtime, weight fetches too)
    and the updates' (their busy seconds per step beside compute over the same round's alone), medians over
    the rounds. On an idle machine with a core per thread both are about 1; where the process has one core
    for both threads they are about 2.

NOTE [state components]
    One step time hides which part of the model is off, so the result holds the parts side by side:
    the compute (the engine's sum of the layer times, against the plain model's forward and backward of
    the rounds), the rest of the step (predicted: the exposed fetches, the compute's stretch under the
    updates and the update tail; measured: the step less that plain compute, split into what forward and
    backward gained under the offloaders and the offloaded optimizer's ``step()``), the CPU updates
    (predicted from the measured rate, each alone; measured: the optimizer worker's busy seconds,
    ``update_s``, stretched where they ran beside backward) and the state copies at the probed rates:
    weight fetches (measured: the parameter offloader's worker, ``fetch_s``), the new values ``step()``
    copies in (measured: ``step()`` less its wait for updates) and the gradients out (predicted only: on a
    CPU the runtime hands the gradient itself to the worker, no copy).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    predicted_step_s: float  # the engine with the measured CPU sharing (NOTE [sharing measured])
    serial_step_s: float
    spare_core_step_s: float  # the engine with a core of their own for updates and fetches: cpu_sharing (1, 1)
    cpu_sharing: tuple[float, float]  # measured (compute, update) stretches while both run
    measured_step_s: float
    measured_step_samples_s: tuple[float, ...]
    plain_step_s: float
    update_s_per_param_byte: float
    predicted_peak_weight_bytes: float
    measured_peak_weight_bytes: float
    link: PoolLink
    # the step's parts side by side (medians over the measured steps; NOTE [state components])
    predicted_compute_s: float
    measured_compute_s: float  # forward + backward of the plain model, measured in the rounds of the run
    predicted_update_s: float
    measured_update_s: float  # the offloaded optimizer's worker, per step
    predicted_fetch_s: float  # every weight fetch at the probed rates, one after another
    measured_fetch_s: float  # the parameter offloader's worker reading units, per step
    predicted_copy_in_s: float  # every new value step() copies in (device weights or the pool)
    measured_copy_in_s: float  # step() less its wait for updates, per step
    predicted_gradient_out_s: float  # every offloaded gradient copied out
    predicted_kept_update_s: float  # step()'s updates of the state kept on the device (and their weights' gather)
    measured_backward_s: float  # forward + backward under the offloaders
    measured_step_call_s: float  # the offloaded optimizer's step(): waiting for updates, copying values in

    @property
    def step_time_error(self) -> float:
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def serial_step_error(self) -> float:
        return (self.serial_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def spare_core_error(self) -> float:
        return (self.spare_core_step_s - self.measured_step_s) / self.measured_step_s

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
            ("step() less its wait (copies in, kept)", self.predicted_copy_in_s, self.measured_copy_in_s),
            ("  of which kept state's updates", self.predicted_kept_update_s, None),
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
            f"                (a spare core for the runtime's threads: {self.spare_core_step_s * 1e3:.2f} ms, error "
            f"{self.spare_core_error:+.1%}; measured CPU sharing: compute x{self.cpu_sharing[0]:.2f}, updates "
            f"x{self.cpu_sharing[1]:.2f} while both run)",
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


class _BackgroundUpdates:
    """The runtime's CPU updates back to back on a thread: ``step()`` of an ``overlap=False`` offloaded optimizer
    over a copy of the model whose gradients stay set; ``busy_s``: the worker's seconds of each ``step()`` that
    ended while the window was open (NOTE [sharing measured])."""

    def __init__(self, optimizer: Any) -> None:
        self._opt = optimizer
        self._stop = threading.Event()
        self.busy_s: list[float] = []
        self._thread = threading.Thread(target=self._run, name="mcdla-update-sharing", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._opt.step()
            if not self._stop.is_set():
                self.busy_s.append(self._opt.update_s)

    def __enter__(self) -> _BackgroundUpdates:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(slots=True)
class _Rounds:
    """Per measured round (seconds): the plain model's forward + backward and whole Adam step, the runtime's
    updates alone (the worker's busy seconds of an ``overlap=False`` step), the plain forward + backward with
    updates running beside it and those updates' busy seconds per step, and the run's step and its parts."""

    plain_fb: list[float] = field(default_factory=list)
    plain_step: list[float] = field(default_factory=list)
    plain_update: list[float] = field(default_factory=list)  # the plain Adam's step() (foreach=False)
    alone_update: list[float] = field(default_factory=list)
    shared_fb: list[float] = field(default_factory=list)
    shared_update: list[float] = field(default_factory=list)
    run_step: list[float] = field(default_factory=list)
    run_fb: list[float] = field(default_factory=list)
    run_step_call: list[float] = field(default_factory=list)
    worker: list[float] = field(default_factory=list)
    fetching: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)

    def cpu_sharing(self) -> tuple[float, float]:
        """(compute, update) stretches (NOTE [sharing measured]): the medians over rounds of the plain
        forward + backward with updates beside it over the same round's alone, and of the updates' busy
        seconds beside compute over that round's alone; at least 1 (contention does not speed anything up)."""
        compute = statistics.median(s / p for s, p in zip(self.shared_fb, self.plain_fb))
        updates = [s / a for s, a in zip(self.shared_update, self.alone_update) if s > 0 and a > 0]
        return max(1.0, compute), max(1.0, statistics.median(updates)) if updates else 1.0


def _measure_rounds(resolved: ResolvedModel, inputs: Any, pool: Any, plan: Plan, lr: float, rounds: int,
                    warmup: int) -> _Rounds:
    """``warmup + rounds`` rounds, each a plain step, the updates alone, the plain forward + backward beside
    background updates, and a step of the run (NOTE [sharing measured]); the first ``warmup`` are dropped."""
    loss_fn = resolved.loss_fn
    plain_model = copy.deepcopy(resolved.model)
    plain = torch.optim.Adam(plain_model.parameters(), lr=lr, foreach=False)
    # the updates measured on the run's own path: the plan's weights in a parameter offloader, its optimizer
    # state in the pool, gradients kept (overlap=False keeps them for step())
    kept_grads = dataclasses.replace(plan, state=tuple(dataclasses.replace(sd, gradients=Placement.DEVICE)
                                                       for sd in plan.state))
    timing: list[Any] = []

    def updates_only(model: torch.nn.Module) -> Any:
        holder = offload_parameters(model, pool, plan=kept_grads)
        timing.append(holder)
        opt = offload_optimizer(torch.optim.Adam(model.parameters(), lr=lr), pool, overlap=False, model=model,
                                parameters=holder, plan=kept_grads)
        timing.append(opt)
        return opt

    alone_model, shared_model = copy.deepcopy(resolved.model), copy.deepcopy(resolved.model)
    alone, shared = updates_only(alone_model), updates_only(shared_model)
    compute_loss(run_forward(shared_model, inputs), loss_fn).backward()  # gradients its updates keep using
    run_model = copy.deepcopy(resolved.model)
    params = offload_parameters(run_model, pool, plan=plan)
    opt = offload_optimizer(torch.optim.Adam(run_model.parameters(), lr=lr), pool, model=run_model,
                            parameters=params, plan=plan)
    out = _Rounds()

    def run_done() -> None:
        out.peaks.append(params.peak_resident_bytes)
        out.worker.append(opt.update_s)
        out.fetching.append(params.fetch_s)
        out.waiting.append(opt.step_wait_s)

    try:
        for r in range(warmup + rounds):
            keep = r >= warmup
            times, fbs, plain_calls = _timed_steps(plain_model, inputs, loss_fn, plain, 1)
            _timed_steps(alone_model, inputs, loss_fn, alone, 1)
            alone_s = alone.update_s
            with _BackgroundUpdates(shared) as background:
                t0 = time.perf_counter()
                compute_loss(run_forward(plain_model, inputs), loss_fn).backward()
                shared_fb = time.perf_counter() - t0
            plain.zero_grad()
            run = _timed_steps(run_model, inputs, loss_fn, opt, 1, params.reset_report, run_done)
            if not keep:
                for part in (out.worker, out.fetching, out.waiting, out.peaks):
                    part.pop()
                continue
            out.plain_step += times
            out.plain_fb += fbs
            out.plain_update += plain_calls
            out.alone_update.append(alone_s)
            out.shared_fb.append(shared_fb)
            out.shared_update.append(statistics.median(background.busy_s) if background.busy_s else 0.0)
            out.run_step += run[0]
            out.run_fb += run[1]
            out.run_step_call += run[2]
    finally:
        for o in (opt, *reversed(timing)):
            o.close()
        params.close()
    return out


def _scaled_compute(workload: Workload, compute_s: float) -> Workload:
    """``workload`` with its layer times scaled together so that they sum to ``compute_s`` (NOTE [measuring] in
    :mod:`mcdla.profile.rounds`: the split from the profile's layers, the total from the rounds' plain steps)."""
    total = sum((l.fwd_time_s or 0.0) + (l.bwd_time_s or 0.0) for l in workload.layers)
    if total <= 0:
        return workload
    k = compute_s / total
    return workload.with_layers([dataclasses.replace(l, fwd_time_s=(l.fwd_time_s or 0.0) * k,
                                                     bwd_time_s=(l.bwd_time_s or 0.0) * k)
                                 for l in workload.layers])


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
        rounds = _measure_rounds(resolved, inputs, pool_obj, chosen, lr, steps, warmup)
    finally:
        pool_obj.close()
    compute_s = statistics.median(rounds.plain_fb)
    timed = _scaled_compute(workload, compute_s)
    cpu_updated = sum(l.param_bytes for l in workload.layers if chosen.state_of(l.name).offloads("optimizer_state"))
    update_rate = statistics.median(rounds.alone_update) / max(cpu_updated, 1.0)
    device_rate = statistics.median(rounds.plain_update) / max(workload.param_bytes, 1.0)
    sharing = rounds.cpu_sharing()
    prediction = predict_states(timed, chosen, link, update_s_per_param_byte=update_rate, cpu_sharing=sharing,
                                device_update_s_per_param_byte=device_rate)
    spare = predict_states(timed, chosen, link, update_s_per_param_byte=update_rate,
                           device_update_s_per_param_byte=device_rate)
    return StateValidation(
        model=resolved.name, pool=pool,
        prefetch=tuple(sorted({sd.prefetch for sd in chosen.state if sd.offloads("weights")})),
        offloaded_weight_layers=sum(sd.offloads("weights") for sd in chosen.state),
        offloaded_optimizer_layers=sum(sd.offloads("optimizer_state") for sd in chosen.state),
        predicted_step_s=prediction.step_s, serial_step_s=prediction.serial_step_s,
        spare_core_step_s=spare.step_s, cpu_sharing=sharing,
        measured_step_s=statistics.median(rounds.run_step), measured_step_samples_s=tuple(rounds.run_step),
        plain_step_s=statistics.median(rounds.plain_step), update_s_per_param_byte=update_rate,
        predicted_peak_weight_bytes=prediction.peak_weight_bytes,
        measured_peak_weight_bytes=float(max(rounds.peaks)),
        link=link,
        predicted_compute_s=prediction.compute_s, measured_compute_s=compute_s,
        predicted_update_s=prediction.update_s, measured_update_s=statistics.median(rounds.worker),
        predicted_fetch_s=prediction.fetch_s, measured_fetch_s=statistics.median(rounds.fetching),
        predicted_copy_in_s=prediction.copy_in_s + prediction.kept_update_s,
        predicted_kept_update_s=prediction.kept_update_s,
        measured_copy_in_s=statistics.median([c - w for c, w in zip(rounds.run_step_call, rounds.waiting)]),
        predicted_gradient_out_s=prediction.gradient_out_s,
        measured_backward_s=statistics.median(rounds.run_fb),
        measured_step_call_s=statistics.median(rounds.run_step_call),
    )
