"""The two passes of the profiler: a counting step and timed steps (NOTE [two passes] in
:mod:`mcdla.profile.profiler`)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from mcdla.profile._owners import LOSS_NAME, OwnerTracker, Phase, tensors_in
from mcdla.profile._steps import LossFn, StepInputs, compute_loss, run_forward, zero_grads
from mcdla.profile.progress import OnProgress, notify

__all__ = ["Counts", "count_step", "time_steps", "merge_intervals"]


def _cpu_sdpa_fwd(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _cpu_sdpa_bwd(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


def _flop_mapping() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode formulas for the CPU flash-attention kernels, which torch does not register."""
    aten = torch.ops.aten
    mapping: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_fwd
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_bwd
    return mapping


class Counts:
    """FLOPs, saved and output bytes per owner from one counting step (NOTE [saved bytes] in
    :mod:`mcdla.profile.profiler`): ``on_switch`` and ``on_output`` are the tracker's callbacks, ``pack`` the
    saved-tensor hook."""

    def __init__(
        self,
        flops: FlopCounterMode,
        skip_storages: set[tuple[str, int]],
        units: frozenset[str],
        keep_first: bool,
        min_bytes: int,
    ) -> None:
        self.keep_first = keep_first
        self.min_bytes = min_bytes
        self.flops = flops
        self.skip = skip_storages
        self.units = units
        self.fwd_flops: dict[str, float] = defaultdict(float)
        self.bwd_flops: dict[str, float] = defaultdict(float)
        self.saved_bytes: dict[str, float] = defaultdict(float)
        self.saved_storages: dict[str, int] = defaultdict(int)
        self.output_bytes: dict[str, float] = defaultdict(float)
        self.first_active: dict[str, int] = {}
        self.first_seen: dict[str, int] = {}
        self._holder: dict[tuple[str, int], str] = {}
        self._owner: str | None = None
        self._phase: Phase = "fwd"
        self._interval = 0
        self._last_total = 0

    def on_switch(self, owner: str, phase: Phase) -> None:
        self._close()
        self._owner, self._phase = owner, phase
        self._interval += 1
        if phase == "fwd":
            self.first_seen.setdefault(owner, self._interval)

    def _close(self) -> None:
        total = self.flops.get_total_flops()
        delta, self._last_total = total - self._last_total, total
        if self._owner is None or not delta:
            return
        if self._phase == "fwd":
            self.fwd_flops[self._owner] += delta
            self.first_active.setdefault(self._owner, self._interval)
        elif self._phase == "bwd":
            self.bwd_flops[self._owner] += delta

    def finish(self) -> None:
        self._close()
        self._owner = None

    def on_output(self, owner: str, output: Any) -> None:
        self.output_bytes[owner] += sum(t.nbytes for t in tensors_in(output))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._phase != "fwd" or self._owner is None:
            return t
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        nbytes = storage.nbytes()
        if key in self.skip or nbytes == 0 or nbytes < self.min_bytes:
            return t
        owner = self._owner
        previous = self._holder.get(key)
        if previous is not None and (
            previous == owner or self.keep_first or _rank(previous, self.units) > _rank(owner, self.units)
        ):
            return t
        if previous is not None:
            self.saved_bytes[previous] -= nbytes
            self.saved_storages[previous] -= 1
        self._holder[key] = owner
        self.saved_bytes[owner] += nbytes
        self.saved_storages[owner] += 1
        self.first_active.setdefault(owner, self._interval)
        return t


def _rank(owner: str, units: frozenset[str]) -> int:
    """Who keeps a storage saved by several owners: units over glue modules over the loss (NOTE [saved bytes])."""
    if owner in units:
        return 2
    return 0 if owner == LOSS_NAME else 1


def _storage_keys(model: nn.Module) -> set[tuple[str, int]]:
    keys = set()
    for t in (*model.parameters(), *model.buffers()):
        keys.add((str(t.device), t.untyped_storage().data_ptr()))
    return keys


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_step(model: nn.Module, inputs: StepInputs, loss_fn: LossFn | None, tracker: OwnerTracker) -> None:
    tracker.begin_step()
    output = run_forward(model, inputs, lambda: tracker.innermost_module)
    loss = compute_loss(output, loss_fn)
    tracker.begin_backward(loss)
    loss.backward()
    tracker.end_step()


def merge_intervals(
    intervals: list[tuple[str, Phase, float]], layers: frozenset[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-layer forward and backward seconds of one step (see NOTE [time attribution])."""
    fwd: dict[str, float] = defaultdict(float)
    bwd: dict[str, float] = defaultdict(float)
    for phase, out in (("fwd", fwd), ("bwd", bwd)):
        seq = [(o, d) for o, p, d in intervals if p == phase]
        pending = 0.0
        last: str | None = None
        for owner, dur in seq:
            if owner in layers:
                out[owner] += dur + pending
                pending, last = 0.0, owner
            else:
                pending += dur
        if pending:
            if last is None:
                last = next(iter(sorted(layers)))
            out[last] += pending
    return fwd, bwd


def count_step(
    model: nn.Module,
    inputs: StepInputs,
    loss_fn: LossFn | None,
    units: dict[nn.Module, str],
    keep_first: bool,
    min_saved_bytes: int,
) -> tuple[Counts, list[str]]:
    """One step under FlopCounterMode and saved-tensor hooks: the counts, and the owners in forward order
    (by their first FLOP or saved storage, else their first appearance)."""
    flops = FlopCounterMode(display=False, custom_mapping=_flop_mapping())
    counts = Counts(flops, _storage_keys(model), frozenset(units.values()), keep_first, min_saved_bytes)
    tracker = OwnerTracker(model, units, counts.on_switch, counts.on_output)
    zero_grads(model)
    with tracker.attached(), flops, torch.autograd.graph.saved_tensors_hooks(counts.pack, lambda t: t):
        _one_step(model, inputs, loss_fn, tracker)
        counts.finish()
    order = sorted(counts.first_seen, key=lambda o: (counts.first_active.get(o, counts.first_seen[o]),))
    return counts, order


def time_steps(
    model: nn.Module,
    inputs: StepInputs,
    loss_fn: LossFn | None,
    units: dict[nn.Module, str],
    layers: frozenset[str],
    warmup_steps: int,
    measured_steps: int,
    device: torch.device,
    on_progress: OnProgress | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Timed steps: per layer its forward and backward seconds in each measured step, and each measured
    step's wall time (s, without the tracker's own bookkeeping between forward and backward). ``on_progress``
    hears of each finished step."""
    events: list[tuple[float, str, Phase]] = []

    def on_switch(owner: str, phase: Phase) -> None:
        _sync(device)
        events.append((time.perf_counter(), owner, phase))

    tracker = OwnerTracker(model, units, on_switch)
    fwd_samples: dict[str, list[float]] = defaultdict(list)
    bwd_samples: dict[str, list[float]] = defaultdict(list)
    step_times: list[float] = []
    with tracker.attached():
        for step in range(warmup_steps + measured_steps):
            zero_grads(model)
            events.clear()
            _sync(device)
            start = time.perf_counter()
            _one_step(model, inputs, loss_fn, tracker)
            _sync(device)
            end = time.perf_counter()
            notify(on_progress, step + 1, warmup_steps + measured_steps, "profiling: timed steps")
            if step < warmup_steps:
                continue
            stamps = [t for t, _, _ in events] + [end]
            intervals = [(o, p, stamps[i + 1] - stamps[i]) for i, (_, o, p) in enumerate(events)]
            idle = sum(d for _, p, d in intervals if p == "idle")
            fwd, bwd = merge_intervals(intervals, layers)
            for lname in layers:
                fwd_samples[lname].append(fwd.get(lname, 0.0))
                bwd_samples[lname].append(bwd.get(lname, 0.0))
            step_times.append(end - start - idle)
    return fwd_samples, bwd_samples, step_times
