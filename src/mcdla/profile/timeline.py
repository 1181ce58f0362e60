"""Memory timelines of a real training step, to set beside the simulator's prediction.

Two sources, one shape (a :class:`MemoryTimeline`: seconds since the step began, bytes):

* On a CPU the only memory that virtualization changes is the saved activations, so the measured timeline is
  the runtime's own accounting of live saved storages (``StepReport.timeline``, the bytes of managed saved
  storages resident in device memory): :func:`timeline_from_report`.
* On CUDA, :func:`cuda_step_timeline` runs a step and reads the allocator's
  ``torch.cuda.memory_allocated`` at every change of the running layer (forward and backward, the owner rule
  of :mod:`mcdla.profile._owners`): device-memory snapshots at layer boundaries, which include weights,
  gradients and transient buffers besides the saved activations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from mcdla.errors import ProfileError
from mcdla.profile._owners import Granularity, OwnerTracker, Phase, units_of
from mcdla.profile._steps import compute_loss, normalize_inputs, run_forward, zero_grads

__all__ = ["MemoryTimeline", "timeline_from_report", "cuda_step_timeline"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTimeline:
    """Bytes over one step.

    Attributes:
        times_s: seconds since the step began, non-decreasing.
        bytes: bytes at each time (held until the next sample).
        what: ``"resident-saved"`` (saved activations in device memory) or ``"device-allocated"``.
        labels: optional label per sample (the layer and phase that began there).
    """

    times_s: tuple[float, ...]
    bytes: tuple[float, ...]
    what: Literal["resident-saved", "device-allocated"] = "resident-saved"
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.bytes):
            raise ProfileError(
                f"timeline: got {len(self.times_s)} times and {len(self.bytes)} byte values; must be as many"
            )
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:])):
            raise ProfileError("timeline.times_s: got decreasing times; must be non-decreasing")

    @property
    def peak_bytes(self) -> float:
        return max(self.bytes, default=0.0)

    @property
    def duration_s(self) -> float:
        return self.times_s[-1] if self.times_s else 0.0

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[float, float]], **kwargs: Any) -> MemoryTimeline:
        ordered = sorted(pairs, key=lambda p: p[0])
        return cls(times_s=tuple(float(t) for t, _ in ordered), bytes=tuple(float(b) for _, b in ordered), **kwargs)


def timeline_from_report(report: Any, *, step_time_s: float | None = None) -> MemoryTimeline:
    """The runtime's resident-saved-bytes timeline of one step (a ``mcdla.runtime`` StepReport).

    The timeline starts at 0 bytes at time 0 and, when ``step_time_s`` is given, ends there.
    """
    pairs = [(0.0, 0.0), *((float(t), float(b)) for t, b in report.timeline)]
    if step_time_s is not None:
        last = pairs[-1][1] if pairs else 0.0
        pairs.append((max(step_time_s, pairs[-1][0]), last))
    return MemoryTimeline.from_pairs(pairs, what="resident-saved")


def cuda_step_timeline(
    model: nn.Module,
    example_inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    *,
    granularity: Granularity = "leaf",
) -> MemoryTimeline:
    """Run one step of ``model`` (gradients cleared, forward, loss, backward) and sample CUDA allocated bytes.

    Samples are taken at the start of the step, at every change of the running layer and at the end, after
    synchronizing the device (so the step runs slower than usual; the bytes are what matters here). Call it
    inside ``mcdla.virtualize(...)`` to see the runtime's effect.
    """
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    if dev.type != "cuda":
        raise ProfileError(f"cuda_step_timeline: model is on {dev}; device-memory snapshots need a CUDA device")
    inputs = normalize_inputs(example_inputs)
    samples: list[tuple[float, float, str]] = []
    start = [0.0]

    def on_switch(owner: str, phase: Phase) -> None:
        torch.cuda.synchronize(dev)
        samples.append((time.perf_counter() - start[0], float(torch.cuda.memory_allocated(dev)), f"{owner} {phase}"))

    tracker = OwnerTracker(model, units_of(model, granularity), on_switch)
    zero_grads(model)
    with tracker.attached():
        torch.cuda.synchronize(dev)
        start[0] = time.perf_counter()
        samples.append((0.0, float(torch.cuda.memory_allocated(dev)), "start"))
        tracker.begin_step()
        output = run_forward(model, inputs, lambda: tracker.innermost_module)
        loss = compute_loss(output, loss_fn)
        del output
        tracker.begin_backward(loss)
        loss.backward()
        tracker.end_step()
        del loss
        torch.cuda.synchronize(dev)
        samples.append((time.perf_counter() - start[0], float(torch.cuda.memory_allocated(dev)), "end"))
    samples.sort(key=lambda s: s[0])
    return MemoryTimeline(
        times_s=tuple(s[0] for s in samples),
        bytes=tuple(s[1] for s in samples),
        what="device-allocated",
        labels=tuple(s[2] for s in samples),
    )
