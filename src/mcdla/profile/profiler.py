"""Profile a real PyTorch model into the workload model: measured times, counted FLOPs and saved bytes.

``profile(model, example_inputs, loss_fn)`` runs one *counting* step and then warm-up and measured *timing*
steps (forward, loss, backward) and returns a :class:`~mcdla.workload.model.Workload` whose layers are the
model's modules at the chosen granularity, named by qualified module name, with measured
``fwd_time_s``/``bwd_time_s`` (the simulator uses them instead of its roofline), FLOPs counted by
``torch.utils.flop_counter.FlopCounterMode``, the bytes each saves for backward (counted through
``saved_tensors_hooks``), and parameter and output bytes.

NOTE [two passes]
FLOP counting runs every operator through a dispatch mode, which slows it by a large factor, so counting and
timing are separate steps: the counting step attributes FLOPs and saved tensors to owners (see NOTE
[ownership] in :mod:`mcdla.profile._owners`); the timing steps only take a timestamp whenever the owner
changes. Both use the same owner rule, so times and counts describe the same layers.

NOTE [saved bytes]
A saved tensor counts the bytes of its *storage*, once per step: views of one storage (the q, k, v chunks of
one projection, a reshaped input saved by ``addmm``) are one allocation that stays alive until backward.
A storage saved by several layers (a ReLU saves its output, the next linear layer saves it as its input)
belongs by default to the *first* of them in forward order (``shared_storage_owner="first"``), the rule of
``mcdla.runtime``, whose record of a storage is made at its first save and belongs to the innermost module
running then (NOTE [attribution and plan execution] in ``mcdla.runtime._modules``): so a plan made from a
default profile offloads, keeps or recomputes a storage under the decision the runtime applies to it
(``docs/runtime.md`` says why the runtime cannot take the last saver). ``shared_storage_owner="last"``
gives it to the *last* saver, whose backward needs it first (the analytical zoo's rule, NOTE [saved-bytes
attribution] in ``mcdla/workload/zoo/_graph.py``; use it to compare with the zoo), except that a unit keeps
it against glue code and glue code against the loss (``nll_loss`` saves the log-probabilities that
``LogSoftmax`` saved). Tensors whose storage is a parameter or a buffer (``weight.t()`` saved by
``linear``) are not activations and are skipped. Tensors saved during backward are ignored.

NOTE [time attribution]
Time between owner switches belongs to the owner that was running. Owners that are not layers (a container
whose ``forward`` only calls its children) hand their time to the next layer interval of the same phase
(the previous one at the end of a phase), so the layer times of a step add up to the measured step.
"""

from __future__ import annotations

import math
import platform
import socket
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from mcdla.errors import ProfileError
from mcdla.profile._kinds import kind_of
from mcdla.profile._owners import LOSS_NAME, ROOT_NAME, Granularity, owner_names, units_of
from mcdla.profile._passes import Counts, count_step, time_steps
from mcdla.profile._steps import LossFn, infer_batch, normalize_inputs, precision_of, zero_grads
from mcdla.profile.progress import OnProgress, notify, progress_bar
from mcdla.workload.model import Layer, LayerKind, Measurement, Workload

__all__ = ["ProfileResult", "SharedOwner", "profile", "profile_run"]

SharedOwner = Literal["last", "first"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileResult:
    """A profile: the workload and the raw measurements it was made from.

    Attributes:
        workload: the profiled workload (per-layer medians).
        step_times_s: wall time of each measured step (forward, loss, backward), seconds.
        fwd_samples_s, bwd_samples_s: per layer, its forward / backward time in each measured step (s).
        device: where the model ran (``"cpu"``, ``"cuda:0"``).
        granularity: ``"leaf"`` or ``"block"``.
        saved_storages: per layer, how many storages its saved bytes are (each one transfer in the runtime).
    """

    workload: Workload
    step_times_s: tuple[float, ...]
    fwd_samples_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    bwd_samples_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    device: str = "cpu"
    granularity: str = "leaf"
    saved_storages: Mapping[str, int] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        """Median measured step time (s)."""
        return statistics.median(self.step_times_s)

    def save(self, path: str | Path) -> Path:
        """Write the workload in the zoo's file format (``.json``/``.yaml``, ``mcdla.workload.save_workload``)."""
        from mcdla.workload.io import save_workload

        return save_workload(self.workload, path)


def _layer_kind(name: str, modules: Mapping[str, nn.Module]) -> LayerKind:
    if name == LOSS_NAME:
        return LayerKind.LOSS
    module = modules.get(name)
    return kind_of(module) if module is not None else LayerKind.OTHER


def _param_bytes(model: nn.Module, units: dict[nn.Module, str], layer_names: list[str]) -> dict[str, float]:
    """Bytes of the parameters each layer owns (shared parameters once; unused ones to the first layer)."""
    owners = owner_names(model, units)
    out: dict[str, float] = defaultdict(float)
    seen: set[int] = set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            owner = owners[module]
            out[owner if owner in layer_names else layer_names[0]] += p.nbytes
    return out


def profile_run(
    model: nn.Module,
    example_inputs: Any,
    loss_fn: LossFn | None = None,
    *,
    granularity: Granularity = "leaf",
    warmup_steps: int = 2,
    measured_steps: int = 5,
    name: str | None = None,
    batch: int | None = None,
    optimizer_bytes_per_param_byte: float = 0.0,
    shared_storage_owner: SharedOwner = "first",
    min_saved_bytes: int = 0,
    peak_flops_per_s: float | None = None,
    on_progress: OnProgress | None = None,
) -> ProfileResult:
    """Profile ``model`` and return the workload with its raw measurements; see :func:`profile`.
    ``on_progress`` hears of the counting pass and of each timed step."""
    if not isinstance(model, nn.Module):
        raise ProfileError(f"model: got {type(model).__name__}; must be a torch.nn.Module")
    if granularity not in ("leaf", "block"):
        raise ProfileError(f"granularity: got {granularity!r}; must be 'leaf' or 'block'")
    for arg, value, low in (("warmup_steps", warmup_steps, 0), ("measured_steps", measured_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProfileError(f"{arg}: got {value!r}; must be an integer >= {low}")
    if isinstance(min_saved_bytes, bool) or not isinstance(min_saved_bytes, int) or min_saved_bytes < 0:
        raise ProfileError(f"min_saved_bytes: got {min_saved_bytes!r}; must be an integer >= 0")
    if shared_storage_owner not in ("last", "first"):
        raise ProfileError(f"shared_storage_owner: got {shared_storage_owner!r}; must be 'last' or 'first'")
    if loss_fn is not None and not callable(loss_fn):
        raise ProfileError(f"loss_fn: got {type(loss_fn).__name__}; must be callable or None")
    peak = peak_flops_per_s
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or not math.isfinite(peak)
                             or peak <= 0):
        raise ProfileError(f"peak_flops_per_s: got {peak_flops_per_s!r}; must be a finite FLOP/s > 0 or None")
    inputs = normalize_inputs(example_inputs)
    units = units_of(model, granularity)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.train()
    try:
        notify(on_progress, 0, warmup_steps + measured_steps, "profiling: counting FLOPs and saved bytes")
        counts, order = count_step(model, inputs, loss_fn, units, shared_storage_owner == "first", min_saved_bytes)
        layer_names = _layers(counts, order, frozenset(units.values()))
        fwd_samples, bwd_samples, step_times = time_steps(
            model, inputs, loss_fn, units, frozenset(layer_names), warmup_steps, measured_steps, device, on_progress
        )
    finally:
        zero_grads(model)
        model.train(was_training)
    modules = {(n or ROOT_NAME): m for n, m in model.named_modules()}
    params = _param_bytes(model, units, layer_names)
    layers = []
    for lname in layer_names:
        fwd_t = statistics.median(fwd_samples[lname])
        bwd_t = statistics.median(bwd_samples[lname])
        p_bytes = params.get(lname, 0.0)
        out_b = counts.output_bytes.get(lname, 0.0)
        saved = counts.saved_bytes.get(lname, 0.0)
        layers.append(
            Layer(
                name=lname,
                kind=_layer_kind(lname, modules),
                fwd_flops=counts.fwd_flops.get(lname, 0.0),
                bwd_flops=counts.bwd_flops.get(lname, 0.0),
                fwd_bytes_moved=p_bytes + saved + out_b,
                bwd_bytes_moved=2 * p_bytes + saved + 2 * out_b,
                param_bytes=p_bytes,
                output_bytes=out_b,
                saved_bytes=saved,
                fwd_time_s=fwd_t,
                bwd_time_s=bwd_t,
            )
        )
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    workload = Workload(
        name=name or type(model).__name__.lower(),
        batch=batch if batch is not None else infer_batch(inputs),
        layers=tuple(layers),
        precision=precision_of(model, inputs),
        optimizer_bytes_per_param_byte=optimizer_bytes_per_param_byte,
        description=(
            f"profiled by mcdla.profile on {socket.gethostname()} ({device}) at {stamp}: {granularity} "
            f"granularity, median of {measured_steps} steps after {warmup_steps} warm-up"
        ),
        measured_on=Measurement(device=_device_description(device), peak_flops_per_s=peak_flops_per_s),
    )
    return ProfileResult(
        workload=workload,
        step_times_s=tuple(step_times),
        fwd_samples_s={k: tuple(fwd_samples[k]) for k in layer_names},
        bwd_samples_s={k: tuple(bwd_samples[k]) for k in layer_names},
        device=str(device),
        granularity=granularity,
        saved_storages={k: counts.saved_storages.get(k, 0) for k in layer_names},
    )


def profile(
    model: nn.Module,
    example_inputs: Any,
    loss_fn: LossFn | None = None,
    *,
    granularity: Granularity = "leaf",
    warmup_steps: int = 2,
    measured_steps: int = 5,
    name: str | None = None,
    batch: int | None = None,
    optimizer_bytes_per_param_byte: float = 0.0,
    shared_storage_owner: SharedOwner = "first",
    min_saved_bytes: int = 0,
    peak_flops_per_s: float | None = None,
    progress: bool | None = None,
) -> Workload:
    """Measure one training step of ``model`` into a workload whose layers are its modules.

    Args:
        model: the module to profile (put on the device it should be measured on).
        example_inputs: a tensor, a tuple of positional forward arguments, or a dict of keyword arguments.
        loss_fn: maps the model output to a scalar loss; None means the output is the loss.
        granularity: ``"leaf"`` (every module without children) or ``"block"`` (the elements of the model's
            top-level containers, e.g. transformer blocks).
        warmup_steps, measured_steps: steps run before measuring, and steps whose per-layer median is kept.
        name: the workload's name (default: the model class name, lower case).
        batch: the workload's batch size (default: dimension 0 of the first input tensor).
        optimizer_bytes_per_param_byte: optimizer state per parameter byte, for the static memory only.
        shared_storage_owner: which layer a storage saved by several layers counts for: ``"first"`` (the
            first layer that saved it: the runtime's rule, NOTE [saved bytes]) or ``"last"`` (the
            analytical zoo's rule).
        min_saved_bytes: storages smaller than this are not counted as saved (to match a runtime that leaves
            them on the device, ``mcdla.virtualize(min_bytes=...)``).
        peak_flops_per_s: the measuring device's peak FLOP/s in the model's precision, if known; recorded in
            the workload's ``measured_on`` so ``mcdla simulate --scale-to peak`` can rescale the times.
        progress: a progress bar on stderr: True/False to force it, None (default) only when stderr is a
            terminal.

    Returns:
        A workload at the inputs' batch size; per layer FLOPs (FLOP), saved, output and parameter bytes and
        measured forward/backward times (s). Raises ProfileError (one line) when the forward fails, the
        loss is not a scalar, or an argument is malformed.
    """
    with progress_bar("profiling", enabled=progress) as on_progress:
        return profile_run(
            model,
            example_inputs,
            loss_fn,
            granularity=granularity,
            warmup_steps=warmup_steps,
            measured_steps=measured_steps,
            name=name,
            batch=batch,
            optimizer_bytes_per_param_byte=optimizer_bytes_per_param_byte,
            shared_storage_owner=shared_storage_owner,
            min_saved_bytes=min_saved_bytes,
            peak_flops_per_s=peak_flops_per_s,
            on_progress=on_progress,
        ).workload


def _device_description(device: torch.device) -> str:
    """The device that measures, in words: its kind, model name and host (``"cuda: NVIDIA H100 on node1"``)."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = _cpu_model() or platform.machine() or "unknown processor"
    return f"{device.type}: {what} on {socket.gethostname()}"


def _cpu_model() -> str:
    """The processor's model name from ``/proc/cpuinfo`` (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def _layers(counts: Counts, order: list[str], unit_names: frozenset[str]) -> list[str]:
    """Owners that are layers: every unit that ran, and every other owner with FLOPs or saved bytes."""
    active = {
        o for o in order
        if o in unit_names or counts.fwd_flops.get(o) or counts.bwd_flops.get(o) or counts.saved_bytes.get(o)
    }
    active |= {o for o in counts.bwd_flops if counts.bwd_flops[o]}
    names = [o for o in order if o in active]
    names += sorted(active - set(names))
    if not names:
        raise ProfileError("model: no module ran during forward; nothing to profile")
    return names


