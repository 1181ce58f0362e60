"""Alternating measurement rounds: per-layer times of profiled steps and wall times of virtualized steps.

NOTE [measuring]
Load from other processes on the machine drifts over seconds, so measurement alternates. Each
round runs one plain step (no hooks: the reference), one *profiled* step (the profiler's timing pass, giving
per-layer times) and one step under the runtime running the plan, then probes the pool's tier briefly (three
sizes, once each): the file tier's speed drifts with what else writes to the disk, as compute drifts with
load. With ``baseline="runtime"`` (the default) the profiled step runs under the runtime too, with a
keep-everything plan: the layer times then include the runtime's own per-tensor bookkeeping (its pack and
unpack hooks, its records), which every step under the runtime pays and the timing model does not know about;
what remains between prediction and measurement is the cost of the transfers themselves. ``baseline="plain"``
profiles without the runtime. The runtime's in-flight ``window`` is set so high it never binds, since the
timing model has no such limit.

A layer's time is the median over the rounds, so a rare slow round does not move it; but under background
load every round has some slow layer, and the sum of per-layer medians falls short of the median step. The
per-layer medians are therefore scaled together to the median profiled step: the split comes from the
layers, the total from whole steps. The link is the per-direction median of the rounds' probes.

NOTE [copies on the CPU]
The timing model's copy streams are copy engines: a transfer never slows compute. On a CPU the runtime's
I/O threads copy with the same cores (and the same memory bandwidth, and the same interpreter lock) as the
compute, and when no core is idle every byte they move costs compute time. With ``copy_interference`` each
round also times the profiled step while a background thread moves bytes through the tier as fast as it
can, and records the compute time lost per byte moved (``(loaded - profiled) / bytes``, at least 0). Where no
core is free this is about ``1 / tier bandwidth``; on an idle machine with a spare core it is near 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mcdla.hardware import PoolLink
from mcdla.profile._owners import units_of
from mcdla.profile._passes import time_steps
from mcdla.profile._steps import StepInputs, compute_loss, run_forward, zero_grads
from mcdla.profile.probe import probe_pool
from mcdla.profile.progress import OnProgress, notify
from mcdla.profile.resolve import ResolvedModel
from mcdla.runtime import virtualize
from mcdla.workload.model import Workload
from mcdla.workload.plan import Plan

__all__ = ["Rounds", "Baseline", "measure_rounds", "run_virtualized_step", "one_copy_stream", "WINDOW"]

Baseline = Literal["runtime", "plain"]
_ROUND_PROBE_SIZES = (64 << 10, 1 << 20, 8 << 20)
WINDOW = 1 << 16
"""The runtime's in-flight window for validation runs: high enough never to bind."""


@dataclass(slots=True)
class Rounds:
    """What the measured rounds gave (seconds): per-layer times of the profiled steps, wall times of the
    plain and the virtualized steps, and the runtime's report of each virtualized step."""

    fwd: dict[str, list[float]] = field(default_factory=dict)
    bwd: dict[str, list[float]] = field(default_factory=dict)
    plain: list[float] = field(default_factory=list)
    profiled: list[float] = field(default_factory=list)
    run: list[float] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    links: list[PoolLink] = field(default_factory=list)
    copy_costs: list[float] = field(default_factory=list)

    def copy_cost_s_per_byte(self) -> float:
        """Median compute time lost per byte the tier moved in the background (NOTE [copies on the CPU])."""
        return statistics.median(self.copy_costs) if self.copy_costs else 0.0

    def link(self) -> PoolLink:
        """The median (per direction, and latency) of the links probed in the rounds."""
        if not self.links:
            raise ValueError("no link was probed")
        return dataclasses.replace(
            self.links[0],
            offload_bytes_per_s=statistics.median(l.offload_bytes_per_s for l in self.links),
            prefetch_bytes_per_s=statistics.median(l.prefetch_bytes_per_s for l in self.links),
            latency_s=statistics.median(l.latency_s for l in self.links),
            source=f"median of {len(self.links)} probes, one per round; the first: {self.links[0].source}",
        )

    def layer_times(self) -> dict[str, tuple[float, float]]:
        """Per layer (forward s, backward s): medians over the rounds, scaled to the median profiled step."""
        med = {n: (statistics.median(self.fwd[n]), statistics.median(self.bwd[n])) for n in self.fwd}
        total = sum(f + b for f, b in med.values())
        scale = statistics.median(self.profiled) / total if total > 0 and self.profiled else 1.0
        return {n: (f * scale, b * scale) for n, (f, b) in med.items()}


def one_copy_stream(pool: Any, io_threads: int | None) -> bool:
    """Give every threaded tier of ``pool`` ``io_threads`` I/O threads (None: leave them); return whether the
    first tier now moves both directions on one thread, i.e. offloads and prefetches share one stream.

    NOTE [one copy stream]
    The timing model has one offload and one prefetch stream per device, each running one transfer at a time.
    A file tier with one I/O thread runs offloads and prefetches one at a time on that thread: the model's
    streams with a shared direction (``PoolLink.shared_direction``). With two threads on a 2-core machine the
    runtime's writes were measured 7x slower each (two writers and the compute thread fighting for the
    cores), so validation runs one thread per tier unless told otherwise.
    """
    if io_threads is not None:
        for tier in pool.tiers:
            if tier.io_threads > 0:
                tier.io_threads = int(io_threads)
    return pool.tiers[0].io_threads == 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_virtualized_step(vm: Any, resolved: ResolvedModel, inputs: StepInputs, device: torch.device) -> float:
    """Wall time (s) of one step (gradients cleared, forward, loss, backward) under the virtualizer ``vm``."""
    zero_grads(resolved.model)
    _sync(device)
    t0 = time.perf_counter()
    with vm:
        loss = compute_loss(run_forward(resolved.model, inputs), resolved.loss_fn)
        loss.backward()
    _sync(device)
    return time.perf_counter() - t0


def _plain_step(resolved: ResolvedModel, inputs: StepInputs, device: torch.device) -> float:
    zero_grads(resolved.model)
    _sync(device)
    t0 = time.perf_counter()
    compute_loss(run_forward(resolved.model, inputs), resolved.loss_fn).backward()
    _sync(device)
    return time.perf_counter() - t0


class _Traffic:
    """A background thread writing and reading 1 MiB blocks through a tier as fast as it can."""

    def __init__(self, tier: Any) -> None:
        self._tier = tier
        self._stop = threading.Event()
        self.moved_bytes = 0
        self._thread = threading.Thread(target=self._run, name="mcdla-copy-interference", daemon=True)

    def _run(self) -> None:
        data = torch.randn((1 << 20) // 4).relu_().view(torch.uint8)
        out = torch.empty_like(data)
        src, dst = memoryview(data.numpy()), memoryview(out.numpy())
        while not self._stop.is_set():
            got = self._tier.try_reserve(len(src))
            if got is None:
                return
            block = self._tier.write(src, reserved_bytes=got, label="copy-interference block")
            self._tier.read_into(block, dst)
            self._tier.free(block)
            self.moved_bytes += 2 * len(src)

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure_rounds(
    resolved: ResolvedModel,
    inputs: StepInputs,
    *,
    pool: Any,
    plan: Plan,
    workload: Workload,
    granularity: str,
    min_bytes: int,
    steps: int,
    warmup: int,
    baseline: Baseline = "runtime",
    copy_interference: bool = False,
    on_progress: OnProgress | None = None,
) -> Rounds:
    """Run ``warmup + steps`` rounds (NOTE [measuring]) and keep the last ``steps``; with
    ``copy_interference`` also measure what background copies cost compute (NOTE [copies on the CPU]).
    ``on_progress`` hears of each finished round."""
    model = resolved.model
    units = units_of(model, granularity)  # type: ignore[arg-type]
    layers = frozenset(workload.layer_names)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    keep_all = Plan.from_actions(workload=plan.workload, batch=plan.batch, layer_names=plan.layer_names, actions={})
    vm = virtualize(pool=pool, plan=plan, model=model, min_bytes=min_bytes, window=WINDOW)
    keep_vm = virtualize(pool=pool, plan=keep_all, model=model, min_bytes=min_bytes, window=WINDOW)
    rounds = Rounds(fwd={n: [] for n in layers}, bwd={n: [] for n in layers})
    try:
        for r in range(warmup + steps):
            plain = _plain_step(resolved, inputs, device)
            zero_grads(model)
            with keep_vm if baseline == "runtime" else contextlib.nullcontext():
                fwd, bwd, profiled = time_steps(model, inputs, resolved.loss_fn, units, layers, 0, 1, device)
            cost = None
            if copy_interference:
                zero_grads(model)
                runtime = keep_vm if baseline == "runtime" else contextlib.nullcontext()
                with _Traffic(pool.tiers[0]) as traffic, runtime:
                    start = traffic.moved_bytes
                    _, _, loaded = time_steps(model, inputs, resolved.loss_fn, units, layers, 0, 1, device)
                    moved = traffic.moved_bytes - start
                cost = max(0.0, loaded[0] - profiled[0]) / moved if moved else 0.0
            elapsed = run_virtualized_step(vm, resolved, inputs, device)
            link = probe_pool(pool, sizes_bytes=_ROUND_PROBE_SIZES, repeats=1, device=device).link
            notify(on_progress, r + 1, warmup + steps, "measuring: plain and virtualized rounds")
            if r < warmup:
                continue
            rounds.links.append(link)
            if cost is not None:
                rounds.copy_costs.append(cost)
            for n in layers:
                rounds.fwd[n] += fwd[n]
                rounds.bwd[n] += bwd[n]
            rounds.plain.append(plain)
            rounds.profiled += profiled
            rounds.run.append(elapsed)
            rounds.reports.append(vm.report)
    finally:
        zero_grads(model)
        vm.close()
        keep_vm.close()
    return rounds
