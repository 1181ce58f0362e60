"""The measurement rounds of ``validate_states`` (NOTE [sharing measured] in :mod:`mcdla.report.validate_states`):
a plain Adam step, the runtime's CPU updates alone, the plain forward + backward beside background updates and
one step of the run, interleaved so that load drifting over seconds hits every part alike."""

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

from mcdla.profile._steps import compute_loss, run_forward
from mcdla.profile.resolve import ResolvedModel
from mcdla.runtime import offload_optimizer, offload_parameters
from mcdla.workload.plan import Placement, Plan


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
    offloader_fb: list[float] = field(default_factory=list)  # the updates-alone model's, under offload_parameters
    offloader_wait: list[float] = field(default_factory=list)  # its offloader's waits for fetches (wait_s)
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

    def fastest(self) -> _Rounds:
        """Each part's least disturbed round alone (NOTE [least disturbed] in
        :mod:`mcdla.report.validate_states`): the smallest positive value of each list (a 0 marks a round
        whose background updates finished no step), or the smallest where none is positive."""
        def least(v: list[Any]) -> list[Any]:
            positive = [x for x in v if x > 0]
            return [min(positive or v)] if v else []

        return _Rounds(**{f.name: least(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def offloader_s_per_unit_pass(self, units: int) -> float:
        """Seconds the parameter offloader adds to the compute thread per offloaded unit and pass (NOTE
        [offloader on the compute thread] in :mod:`mcdla.report.validate_states`): the fastest forward +
        backward under ``offload_parameters`` less the fastest plain one and less the smallest of its waits
        for fetches, over two passes per unit; at least 0."""
        if units <= 0 or not self.offloader_fb:
            return 0.0
        extra = min(self.offloader_fb) - min(self.plain_fb) - min(self.offloader_wait)
        return max(0.0, extra) / (2 * units)


def measure_rounds(resolved: ResolvedModel, inputs: Any, pool: Any, plan: Plan, lr: float, rounds: int,
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
    alone_holder = timing[0]
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
            alone_holder.reset_report()
            alone_fbs = _timed_steps(alone_model, inputs, loss_fn, alone, 1)[1]
            alone_s, alone_wait = alone.update_s, alone_holder.wait_s
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
            out.offloader_fb += alone_fbs
            out.offloader_wait.append(alone_wait)
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


