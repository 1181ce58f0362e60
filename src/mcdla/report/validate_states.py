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

NOTE [offloader on the compute thread]
    The parameter offloader's hooks run on the compute thread before and after each offloaded unit's forward
    and backward: Python, the fetch's hand-off to its worker thread and, with one interpreter lock for both
    threads, the wait for the lock while the worker holds it. The engine sees only the fetch itself, so each
    round also times the forward + backward of the updates-alone model (its weights under
    ``offload_parameters``, gradients kept, no optimizer in backward) beside the plain one: the difference less
    that offloader's own waits for fetches (``ParameterOffloader.wait_s``, which the engine models as exposed
    fetches) is the offloader's cost on the compute thread, per unit and pass added to the forward and
    backward time of each layer whose weights the plan offloads. It is a difference of two times each
    disturbed by load, by more than the cost itself in a loaded round (a 1-2 ms cost per step against rounds
    spread by tens of ms), so it is taken between the fastest rounds of each (load only adds time): the
    fastest forward + backward under the offloader less the fastest plain one less the smallest wait.

NOTE [least disturbed]
    Under load from other processes single steps spread by tens of percent within a run, and a median over a
    few rounds lands on whichever side most of them fell. Beside the medians' prediction the result holds a
    second one from each measured part's fastest round (the least disturbed: load only adds time), the
    compute, the rates, the stretches and the offloader's cost each taken from its own fastest round, against
    the fastest measured step of the run.

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

import dataclasses
import statistics
from dataclasses import dataclass

import torch

from mcdla.errors import ConfigError
from mcdla.hardware import PoolLink
from mcdla.profile._steps import normalize_inputs
from mcdla.profile.predict import StatePrediction, predict_states
from mcdla.profile.probe import probe_pool
from mcdla.profile.profiler import profile_run
from mcdla.profile.resolve import ResolvedModel, resolve_model
from mcdla.report._state_rounds import _Rounds, measure_rounds
from mcdla.runtime import parse_pool
from mcdla.units import format_bytes
from mcdla.workload.model import Layer, Workload
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
    offloader_s_per_unit_pass: float  # NOTE [offloader on the compute thread]
    serial_step_s: float
    fastest_predicted_step_s: float  # the same engine from each part's fastest round (NOTE [least disturbed])
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
    predicted_compute_s: float  # the plain compute, without the offloader's hooks
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
    def fastest_error(self) -> float:
        """The least-disturbed prediction against the fastest measured step (NOTE [least disturbed])."""
        fastest = min(self.measured_step_samples_s)
        return (self.fastest_predicted_step_s - fastest) / fastest

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
            ("parameter offloader on the compute thread",
             self.offloader_s_per_unit_pass * 2 * self.offloaded_weight_layers, None),
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
            f"x{self.cpu_sharing[1]:.2f} while both run; parameter offloader "
            f"{self.offloader_s_per_unit_pass * 1e3:.2f} ms per unit and pass)",
            f"                (least disturbed: {self.fastest_predicted_step_s * 1e3:.2f} ms predicted from each "
            f"part's fastest round, {min(self.measured_step_samples_s) * 1e3:.2f} ms the fastest step, error "
            f"{self.fastest_error:+.1%})",
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


def _scaled_compute(workload: Workload, compute_s: float, hook_s: float = 0.0,
                    hooked: frozenset[str] = frozenset()) -> Workload:
    """``workload`` with its layer times scaled together so that they sum to ``compute_s`` (NOTE [measuring] in
    :mod:`mcdla.profile.rounds`: the split from the profile's layers, the total from the rounds' plain steps),
    then ``hook_s`` added to the forward and to the backward of each layer in ``hooked`` (NOTE [offloader on
    the compute thread])."""
    total = sum((l.fwd_time_s or 0.0) + (l.bwd_time_s or 0.0) for l in workload.layers)
    if total <= 0 and not hook_s:
        return workload
    k = compute_s / total if total > 0 else 1.0

    def extra(l: Layer) -> float:
        return hook_s if l.name in hooked else 0.0

    return workload.with_layers([dataclasses.replace(l, fwd_time_s=(l.fwd_time_s or 0.0) * k + extra(l),
                                                     bwd_time_s=(l.bwd_time_s or 0.0) * k + extra(l))
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


def _predict(workload: Workload, plan: Plan, link: PoolLink, rounds: _Rounds
             ) -> tuple[StatePrediction, StatePrediction, float, float, tuple[float, float]]:
    """The engine's step from the rounds' medians: with the measured CPU sharing and with a spare core, the
    offloader's cost per unit and pass, the update rate and the sharing used."""
    hooked = frozenset(sd.layer for sd in plan.state if sd.offloads("weights"))
    hook_s = rounds.offloader_s_per_unit_pass(len(hooked))
    timed = _scaled_compute(workload, statistics.median(rounds.plain_fb), hook_s, hooked)
    cpu_updated = sum(l.param_bytes for l in workload.layers if plan.state_of(l.name).offloads("optimizer_state"))
    update_rate = statistics.median(rounds.alone_update) / max(cpu_updated, 1.0)
    device_rate = statistics.median(rounds.plain_update) / max(workload.param_bytes, 1.0)
    sharing = rounds.cpu_sharing()
    prediction = predict_states(timed, plan, link, update_s_per_param_byte=update_rate, cpu_sharing=sharing,
                                device_update_s_per_param_byte=device_rate)
    spare = predict_states(timed, plan, link, update_s_per_param_byte=update_rate,
                           device_update_s_per_param_byte=device_rate)
    return prediction, spare, hook_s, update_rate, sharing


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
        rounds = measure_rounds(resolved, inputs, pool_obj, chosen, lr, steps, warmup)
    finally:
        pool_obj.close()
    compute_s = statistics.median(rounds.plain_fb)
    prediction, spare, hook_s, update_rate, sharing = _predict(workload, chosen, link, rounds)
    fastest = _predict(workload, chosen, link, rounds.fastest())[0]
    return StateValidation(
        model=resolved.name, pool=pool,
        prefetch=tuple(sorted({sd.prefetch for sd in chosen.state if sd.offloads("weights")})),
        offloaded_weight_layers=sum(sd.offloads("weights") for sd in chosen.state),
        offloaded_optimizer_layers=sum(sd.offloads("optimizer_state") for sd in chosen.state),
        predicted_step_s=prediction.step_s, offloader_s_per_unit_pass=hook_s, serial_step_s=prediction.serial_step_s,
        fastest_predicted_step_s=fastest.step_s, spare_core_step_s=spare.step_s, cpu_sharing=sharing,
        measured_step_s=statistics.median(rounds.run_step), measured_step_samples_s=tuple(rounds.run_step),
        plain_step_s=statistics.median(rounds.plain_step), update_s_per_param_byte=update_rate,
        predicted_peak_weight_bytes=prediction.peak_weight_bytes,
        measured_peak_weight_bytes=float(max(rounds.peaks)),
        link=link,
        predicted_compute_s=compute_s, measured_compute_s=compute_s,
        predicted_update_s=prediction.update_s, measured_update_s=statistics.median(rounds.worker),
        predicted_fetch_s=prediction.fetch_s, measured_fetch_s=statistics.median(rounds.fetching),
        predicted_copy_in_s=prediction.copy_in_s + prediction.kept_update_s,
        predicted_kept_update_s=prediction.kept_update_s,
        measured_copy_in_s=statistics.median([c - w for c, w in zip(rounds.run_step_call, rounds.waiting)]),
        predicted_gradient_out_s=prediction.gradient_out_s,
        measured_backward_s=statistics.median(rounds.run_fb),
        measured_step_call_s=statistics.median(rounds.run_step_call),
    )
