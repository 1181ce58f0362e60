"""``mcdla.virtualize``: train past the device-memory wall by moving saved tensors to a memory pool.

NOTE [one context per step]
    A :class:`Virtualizer` is entered once per training step. Each entry starts a step whose saved tensors
    it manages until they are all released, which is usually the end of backward, whether backward runs
    inside the context or after it. Two ways to use it::

        with mcdla.virtualize(pool="host,file:/scratch", budget=2 << 30) as v:   # one-shot
            loss = loss_fn(model(x), y)
            loss.backward()
        print(v.report.summary())

        vm = mcdla.virtualize(pool="file:/scratch", model=model, plan="plan.json")  # long-lived
        for x, y in data:
            with vm:                      # around forward only; backward may follow outside
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            log(vm.report)                # the last step's report, complete once its tensors are released
        vm.close()

    A long-lived virtualizer keeps its pool (and the host buffers it caches) across steps; a one-shot one
    built from a spec string builds a fresh pool and lets it go with the object. Either way each step gets
    its own I/O threads, stopped when the step finishes.

NOTE [trace files]
    ``trace=`` is checked when the virtualizer is built (its directory must exist and be writable), so a
    typo fails at once with a ConfigError naming the field. A step's trace is written after the step has
    left the live set, so a write that still fails (disk full, directory removed) never leaks the step.
    Such a failure is a ConfigError: raised by the ``with`` exit when the step finished there, else (the
    step finished in a backward after the exit, on whatever thread released its last tensor) kept and
    raised by the next ``__enter__``, ``synchronize()`` or ``close()``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from mcdla.errors import ConfigError, McdlaError
from mcdla.runtime._modules import _Attribution
from mcdla.runtime._policy import _Config
from mcdla.runtime._step import _Step
from mcdla.runtime.pool import Pool, Tier, as_pool
from mcdla.runtime.report import StepReport
from mcdla.runtime.tiers_host import HostBufferPool, HostTier
from mcdla.units import parse_bytes

if TYPE_CHECKING:
    from mcdla.workload.plan import Plan

__all__ = ["DEFAULT_MIN_BYTES", "DEFAULT_WINDOW", "Virtualizer", "virtualize", "keep_resident"]

DEFAULT_MIN_BYTES = 256 * 1024  # below this a transfer costs more in latency and bookkeeping than it frees
DEFAULT_WINDOW = 3  # storages in flight per direction (offload, prefetch)


def _detach(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach()


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class keep_resident(saved_tensors_hooks):  # noqa: N801 - a context manager, named like torch's save_on_cpu
    """Keep the tensors saved in this region on the device, even inside :func:`virtualize`.

    Only the innermost pair of saved-tensor hooks applies, so this opts a region out (the output head,
    a part of the graph that is backpropagated twice). Example::

        with mcdla.virtualize(pool="host"):
            h = body(x)                    # offloaded
            with keep_resident():
                logits = head(h)           # stays on the device
    """

    def __init__(self) -> None:
        super().__init__(_detach, _identity)


class Virtualizer(saved_tensors_hooks):
    """Saved-tensor hooks that offload what autograd saves to a tiered pool and prefetch it in backward.

    Contract (that of ``saved_tensors_hooks``): unpacking gives back a tensor equal to the saved one in
    value, dtype, size, stride, storage offset and device, so losses and gradients are bit-identical to
    the same step without mcdla. Build one with :func:`virtualize`; enter it once per step (NOTE above).
    """

    def __init__(self, *, pool: str | Pool | Tier | Sequence[str | Tier], budget: float | str | None,
                 plan: Plan | str | os.PathLike[str] | None, model: torch.nn.Module | None, min_bytes: int | str,
                 window: int, trace: str | os.PathLike[str] | None) -> None:
        budget_bytes = None if budget is None else parse_bytes(budget, field="virtualize(budget=...)")
        if plan is not None:
            plan = _as_plan(plan)
        if plan is not None and budget_bytes is not None:
            raise ConfigError("virtualize: got both budget= and plan=; a plan already says what to offload")
        min_b = parse_bytes(min_bytes, field="virtualize(min_bytes=...)")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"virtualize(window=...): got {window!r}; must be an integer >= 1")
        if trace is not None:
            trace = _check_trace(trace)
        self.pool, self._owns_pool = as_pool(pool)
        self._attr = _Attribution(model, plan, self.pool)
        self.plan = plan
        self._config = _Config(min_bytes=int(min_b), window=window, budget_bytes=budget_bytes,
                               planned=plan is not None, trace_path=None if trace is None else str(trace))
        host = next((t for t in self.pool.tiers if isinstance(t, HostTier)), None)
        self._host_buffers = host.buffers if host is not None else HostBufferPool()
        self._lock = threading.Lock()
        self._step: _Step | None = None
        self._last: _Step | None = None
        self._live: set[_Step] = set()  # steps entered and not yet finished
        self._count = 0
        self._kept_fast = False  # NOTE [kept fast path] in ``_step``: the last finished step fit under the budget
        self._closed = False
        self._trace_error: ConfigError | None = None  # NOTE [trace files]
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_in_child(weakref.ref(self)))
        super().__init__(_detach, _identity)  # replaced by the step's hooks at every entry

    def _forget_parent_steps(self) -> None:
        """In a forked child: the parent's steps are not this process's to finish or close (NOTE [forked children]
        in ``_step``); a fresh lock, since a parent thread may have held the old one at the fork."""
        for step in self._live | ({self._step} if self._step is not None else set()):
            step.foreign = True
        self._lock = threading.Lock()
        self._live = set()

    def __repr__(self) -> str:
        return f"Virtualizer(pool={self.pool.spec!r}, budget={self._config.budget_bytes}, steps={self._count})"

    # -- context ---------------------------------------------------------------------------------------
    def __enter__(self) -> Virtualizer:  # type: ignore[override]
        if self._closed:
            raise ConfigError("virtualize: this virtualizer was closed; build a new one")
        if self._step is not None:
            raise ConfigError("virtualize: already active; enter it once per step, not nested")
        self._drain()
        self._raise_trace_error()
        step = _Step(index=self._count, pool=self.pool, config=self._config, attribution=self._attr,
                     host_buffers=self._host_buffers, on_finish=self._finished, kept_fast=self._kept_fast)
        self._count += 1
        with self._lock:
            self._live.add(step)
        self._step = self._last = step
        self._attr.install(step.request_prefetch, step.module_boundary)
        # the step's own methods are the hooks (no frame of ours per saved tensor, NOTE [hot path] in
        # ``_step``); autograd keeps the pair a tensor was packed with, so it is unpacked by its own step
        self.pack_hook, self.unpack_hook = step.pack, step.unpack
        super().__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        super().__exit__()
        self._attr.remove()
        step, self._step = self._step, None
        assert step is not None
        if exc is not None:
            step.abort(exc)
            if (err := self._take_trace_error()) is not None:
                exc.add_note(str(err))
            return
        try:
            step.exit()
        except BaseException as failure:
            if (err := self._take_trace_error()) is not None:
                failure.add_note(str(err))
            raise
        self._raise_trace_error()

    def _finished(self, step: _Step) -> None:
        """A step finished (called under its lock, on any thread): forget it, then write its trace."""
        with self._lock:
            self._live.discard(step)
            # NOTE [kept fast path] in ``_step``: the next step keeps storages as tuples if this one fit
            self._kept_fast = not step.overflowed and not step.report.aborted
        path = self._config.trace_path
        if path is None or step.final_report is None:
            return
        target = Path(path.replace("{step}", str(step.index)))
        try:
            step.final_report.save_chrome_trace(target)
        except (OSError, ValueError) as exc:  # NOTE [trace files]
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            err = ConfigError(f"virtualize(trace=...): cannot write the trace of step {step.index} to {target}: "
                              f"{reason}")
            with self._lock:
                if self._trace_error is None:
                    self._trace_error = err

    def _take_trace_error(self) -> ConfigError | None:
        with self._lock:
            err, self._trace_error = self._trace_error, None
        return err

    def _raise_trace_error(self) -> None:
        err = self._take_trace_error()
        if err is not None:
            raise err

    def _drain(self) -> None:
        """Run what dying handles posted during a garbage collection (NOTE [posts during garbage collection])."""
        with self._lock:
            steps = list(self._live)
        for step in steps:
            step._lock.drain()

    # -- what users read -------------------------------------------------------------------------------
    @property
    def report(self) -> StepReport:
        """The report of the current or last step (``complete`` says whether it has finished)."""
        step = self._last
        if step is None:
            raise ConfigError("virtualize: no step has run yet; enter the context first")
        self._drain()
        if step.final_report is not None:
            return step.final_report
        return step.report.snapshot(complete=False)

    @property
    def resident_saved_bytes(self) -> int:
        """Bytes of managed saved tensors on the device now, for the current or last step."""
        return 0 if self._last is None else self._last.resident_saved_bytes

    @property
    def alive_saved_bytes(self) -> int:
        """Bytes of managed saved storages alive now, whoever holds them: those the runtime holds plus those it
        let go of that something else still references (NOTE [memory honesty] in ``_liveness``)."""
        return 0 if self._last is None else self._last.alive_saved_bytes

    @property
    def live_steps(self) -> int:
        """Steps entered whose saved tensors are not all released yet."""
        self._drain()
        with self._lock:
            return len(self._live)

    @property
    def live_records(self) -> int:
        """Managed storages tracked now, over all live steps."""
        self._drain()
        with self._lock:
            return sum(s.live_records for s in self._live)

    @property
    def tracker_entries(self) -> int:
        """Bookkeeping entries held for live steps and the last step (for leak checks; 0 when idle)."""
        with self._lock:
            steps = set(self._live) | ({self._last} if self._last is not None else set())
        return sum(s.tracker_entries for s in steps)

    def synchronize(self) -> None:
        """Wait for the transfers still running for steps whose context has exited, and apply them.

        A step whose backward ran inside the context finishes on exit. One whose backward ran after the
        exit finishes when its last saved tensor is released *and* its trailing transfers (an offload that
        the backward overtook, say) land on their I/O threads, which can be a moment after ``backward()``
        returns. Call this before reading ``live_steps`` or the pool's usage for a leak check, or before
        timing the next step without that tail.
        """
        if self._step is not None:
            raise ConfigError("virtualize: synchronize() inside the context; exit it first")
        with self._lock:
            live = list(self._live)
        for step in live:
            step.settle()
        self._raise_trace_error()

    def close(self) -> None:
        """Abort unfinished steps, free what they hold and close the pool if this virtualizer built it."""
        if self._step is not None:
            raise ConfigError("virtualize: close() inside the context; exit it first")
        with self._lock:
            live = list(self._live)
        for step in live:
            step.abort(McdlaError("virtualizer closed"))
        self._host_buffers.trim()
        if self._owns_pool:
            self.pool.close()
        self._closed = True
        self._raise_trace_error()


def _forget_in_child(ref: weakref.ref[Virtualizer]) -> Callable[[], None]:
    """An ``os.register_at_fork`` hook that holds the virtualizer weakly (hooks cannot be unregistered)."""

    def hook() -> None:
        vm = ref()
        if vm is not None:
            vm._forget_parent_steps()

    return hook


def _check_trace(trace: Any) -> str:
    """``trace=`` as a string, its directory checked (NOTE [trace files])."""
    if not isinstance(trace, (str, os.PathLike)) or not str(trace):
        raise ConfigError(f"virtualize(trace=...): got {trace!r}; must be a file path like 'trace-{{step}}.json'")
    text = os.fspath(trace)
    if not isinstance(text, str):
        raise ConfigError(f"virtualize(trace=...): got {trace!r}; must be a str path")
    first = Path(text.replace("{step}", "0"))
    folder = first.parent
    if "{step}" not in str(Path(text).parent):  # a per-step directory may be made later; checked when written
        if not folder.is_dir():
            raise ConfigError(f"virtualize(trace=...): got {text!r}; directory {str(folder)!r} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"virtualize(trace=...): got {text!r}; directory {str(folder)!r} is not writable")
        if first.is_dir():
            raise ConfigError(f"virtualize(trace=...): got {text!r}; that is a directory, must be a file path")
    return text


def _as_plan(plan: Any) -> Plan:
    # NOTE [lazy plan import] mcdla.workload pulls in its file readers (pydantic, yaml); the runtime loads
    # it only when a plan is given, so offloading by budget needs nothing beyond torch, numpy and psutil.
    from mcdla.workload.plan import Plan

    if isinstance(plan, (str, os.PathLike)):
        return Plan.load(plan)
    if not isinstance(plan, Plan):
        raise ConfigError(f"virtualize(plan=...): got {type(plan).__name__}; must be a Plan or a plan JSON path")
    return plan


def virtualize(
    pool: str | Pool | Tier | Sequence[str | Tier] = "host",
    budget: float | str | None = None,
    plan: Plan | str | os.PathLike[str] | None = None,
    *,
    model: torch.nn.Module | None = None,
    min_bytes: int | str = DEFAULT_MIN_BYTES,
    window: int = DEFAULT_WINDOW,
    trace: str | os.PathLike[str] | None = None,
) -> Virtualizer:
    """Offload the tensors autograd saves in forward to ``pool`` and bring them back ahead of backward.

    Args:
        pool: where offloaded tensors go: a spec string (``"host"``, ``"host@8GiB,file:/scratch"``,
            ``"compress(file:/scratch)"``; grammar in :mod:`mcdla.runtime.pool`), a Pool, a tier or tiers.
        budget: bytes of saved tensors allowed to stay on the device (int, or a string like ``"2GiB"``);
            beyond it the ones used last in backward are offloaded first. None offloads everything managed.
        plan: a :class:`~mcdla.workload.plan.Plan` (or its JSON file) saying per module what to offload,
            keep or recompute and when to prefetch; needs ``model``. Excludes ``budget``.
        model: the module whose ``named_modules()`` names the plan uses; with it, tensors are attributed to
            modules in the report and the model's parameters and buffers are never offloaded.
        min_bytes: storages smaller than this (bytes) stay on the device.
        window: storages in flight per direction: offloads running, and fetches running or done but unused.
        trace: path for a Chrome trace of each finished step ("{step}" is replaced by the step index).

    Parameters and views of them, buffers (with ``model``), tensors saved inside :func:`keep_resident`
    or during backward, and non-strided or wrapped tensors are never moved.
    """
    return Virtualizer(pool=pool, budget=budget, plan=plan, model=model, min_bytes=min_bytes, window=window,
                       trace=trace)
