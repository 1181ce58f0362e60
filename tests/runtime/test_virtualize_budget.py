"""A plan's budget caps the resident saved bytes, as in the timing model: pack waits for in-flight offloads
(NOTE [plan budget] in ``mcdla.runtime._policy``), never deadlocks, and gradients stay bit-identical.

The tier is slowed with sleeps so that offloads fall behind the forward. Sleeps alone do not make that hold
on a loaded 2-core machine (each layer's own sleep and ops can then take longer than a write), so where a test
needs the offloads behind, the tier also holds each write until the forward has got far enough
(``_Probe.hold``): the order of events, not the machine's speed, decides who waits. The independent count: every layer saves exactly its input (one storage
of ``NBYTES``; a custom Function's saves are packed when its forward returns) and, when the next layer
starts, the bytes of the storages of all inputs saved so far that are still alive are summed. Nothing but
the runtime holds an earlier input (each output is a new storage, the model's own input is copied first),
so that sum is what the device really holds in saved tensors, whoever counts it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from mcdla.runtime import Block, FileTier, Tier, virtualize
from mcdla.workload.plan import Plan

LAYERS = 8
ROWS, WIDTH = 128, 256
NBYTES = ROWS * WIDTH * 4  # one saved input
FWD_S = 0.01  # each layer's forward (and backward)
WRITE_S = 0.06  # each offload: six layers' forward, so offloads fall behind


class _Probe:
    """Weak references to the storages of the inputs saved so far; the live bytes after each save."""

    def __init__(self, lag: int | None = None) -> None:
        self.refs: list[weakref.ref] = []
        self.samples: list[int] = []
        self.lag = lag  # None: writes are not held
        self._progress = threading.Condition()
        self.returned = 0  # layers whose forward has returned
        self.forward_done = False

    def saving(self, x: torch.Tensor) -> None:
        """A layer starts: count what earlier layers saved, then remember its input."""
        self.sample()
        self.refs.append(weakref.ref(x.untyped_storage()))

    def returning(self) -> None:
        """A layer's forward is about to return (its save is packed next)."""
        with self._progress:
            self.returned += 1
            self._progress.notify_all()

    def done(self) -> None:
        """The forward is over."""
        with self._progress:
            self.forward_done = True
            self._progress.notify_all()

    def hold(self, label: str) -> None:
        """Hold the offload of layer i's input until layer i + ``lag``'s forward has returned (so its pack sees
        the copy still running) or the forward is over. Bounded, so a runtime that waited where it should not
        fails the test instead of hanging it."""
        if self.lag is None or "module '" not in label:
            return
        layer = int(label.split("module '")[1].split("'")[0])
        with self._progress:
            self._progress.wait_for(lambda: self.returned > layer + self.lag or self.forward_done, timeout=10.0)

    def sample(self) -> None:
        alive = {}
        for ref in self.refs:
            s = ref()
            if s is not None:
                alive[s.data_ptr()] = s.nbytes()
        self.samples.append(sum(alive.values()))


class _SinScale(torch.autograd.Function):
    """y = sin(x * w), saving x (the managed storage) and w (a parameter, never moved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, probe: _Probe | None) -> torch.Tensor:
        if probe is not None:
            probe.saving(x)
        ctx.save_for_backward(x, w)
        time.sleep(FWD_S)
        y = torch.sin(x * w)
        if probe is not None:
            probe.returning()
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        time.sleep(FWD_S)
        c = grad * torch.cos(x * w)
        return c * w, (c * x).sum(0), None


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(WIDTH) + 0.5)
        self.probe: _Probe | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SinScale.apply(x, self.w, self.probe)


class _Copy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0  # saves nothing; the first layer's input is a storage only it and the runtime hold


def _model(probe: _Probe | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [_Layer() for _ in range(LAYERS)]
    for layer in layers:
        layer.probe = probe
    return nn.Sequential(OrderedDict([("copy", _Copy()), *((str(i), l) for i, l in enumerate(layers))]))


def _step(model: nn.Module, ctx: Any = None, probe: _Probe | None = None) -> list[torch.Tensor]:
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    with ctx if ctx is not None else contextlib.nullcontext():
        loss = model(x).sum()
        if probe is not None:
            probe.sample()  # the last layer's save, after forward
            probe.done()
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _plan(actions: dict[str, str], budget_bytes: float) -> Plan:
    names = ["", "copy", *(str(i) for i in range(LAYERS))]
    return Plan.from_actions(workload="sin", batch=ROWS, layer_names=names, actions=actions, budget_bytes=budget_bytes)


class _SleepyTier(Tier):
    """Blocks in memory; each write takes ``WRITE_S``, each read ``FWD_S``; one I/O thread."""

    kind = "sleepy"

    def __init__(self, probe: _Probe | None = None) -> None:
        super().__init__(name="sleepy", capacity_bytes=1 << 30, io_threads=1)
        self.probe = probe

    def _write(self, data, *, reserved_bytes, label):  # noqa: ANN001, ANN202
        if self.probe is not None:
            self.probe.hold(label)
        time.sleep(WRITE_S)
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=bytes(data))

    def _read_into(self, block, out):  # noqa: ANN001, ANN202
        time.sleep(FWD_S)
        np.copyto(np.frombuffer(out, dtype=np.uint8), np.frombuffer(block.payload, dtype=np.uint8))

    def _discard(self, block):  # noqa: ANN001, ANN202
        block.payload = None


class _SlowFileTier(Tier):
    """A real file tier behind a write that first sleeps ``WRITE_S`` (a disk slowed by other writers)."""

    kind = "file"

    def __init__(self, path: Any, probe: _Probe | None = None) -> None:
        self.inner = FileTier(path, io_threads=1)
        super().__init__(name=f"slow({self.inner.name})", capacity_bytes=math.inf, io_threads=1)
        self.probe = probe

    def _write(self, data, *, reserved_bytes, label):  # noqa: ANN001, ANN202
        if self.probe is not None:
            self.probe.hold(label)
        time.sleep(WRITE_S)
        got = self.inner.try_reserve(len(data))
        assert got is not None
        inner = self.inner.write(data, reserved_bytes=got, label=label)
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=inner)

    def _read_into(self, block, out):  # noqa: ANN001, ANN202
        self.inner.read_into(block.payload, out)

    def _discard(self, block):  # noqa: ANN001, ANN202
        self.inner.free(block.payload)

    def close(self) -> None:
        super().close()
        self.inner.close()


def _tier(kind: str, tmp_path: Any, probe: _Probe | None = None) -> Tier:
    return _SleepyTier(probe) if kind == "sleepy" else _SlowFileTier(tmp_path, probe)


def _run(tier: Tier, plan: Plan, *, window: int = LAYERS, probe: _Probe | None = None,
         ) -> tuple[_Probe, Any, list[torch.Tensor]]:
    probe = _Probe() if probe is None else probe
    model = _model(probe)
    vm = virtualize(tier, plan=plan, model=model, min_bytes=NBYTES, window=window)
    grads = _step(model, vm, probe)
    vm.close()
    return probe, vm.report, grads


ALL = {str(i): "offload" for i in range(LAYERS)}
TIERS = ["sleepy", "file"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tier", TIERS)
def test_without_a_budget_offloads_pile_up(tmp_path, tier):
    """The scenario is real: with no budget the same plan holds most layers' inputs at once (the window
    never binds), far above the cap the next test sets. The writes are held until the forward is over: a
    runtime that waited for them without a budget would be caught, however fast the machine runs them."""
    probe = _Probe(lag=LAYERS)
    probe, report, _ = _run(_tier(tier, tmp_path, probe), _plan(ALL, math.inf), probe=probe)
    assert max(probe.samples) >= 5 * NBYTES
    assert report.pack_wait_s == 0 and report.offloaded_bytes == LAYERS * NBYTES


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tier", TIERS)
def test_plan_budget_caps_resident_saved_bytes(tmp_path, tier):
    """Budget 2.5 inputs: at most two inputs are ever alive (independent count) or counted (report), the
    forward waited for offloads (reported, and traced), and the gradients are bit-identical."""
    reference = _step(_model())
    cap = 2.5 * NBYTES
    probe = _Probe(lag=2)  # layer i's copy runs until layer i + 2, which needs its room, has packed
    probe, report, grads = _run(_tier(tier, tmp_path, probe), _plan(ALL, cap), probe=probe)
    assert max(probe.samples) <= 2 * NBYTES
    assert report.peak_resident_saved_bytes <= 2 * NBYTES  # over the whole step, backward included
    assert report.offloaded_bytes == LAYERS * NBYTES and report.complete
    budget_waits = [w for w in report.waits if w.kind == "pack" and w.reason == "budget"]
    assert budget_waits
    assert report.pack_wait_s >= (LAYERS - 3) * (WRITE_S - FWD_S) * 0.5  # the forward ran at the tier's pace
    trace = report.chrome_trace()["traceEvents"]
    assert sum(e.get("cat") == "pack wait" for e in trace) == sum(w.kind == "pack" for w in report.waits)
    for got, want in zip(grads, reference):
        assert torch.equal(got, want)


@pytest.mark.timeout(60)
def test_kept_bytes_count_against_the_budget(tmp_path):
    """Layers 0-2 kept, the rest offloaded, budget 4.5 inputs: the offloads share the 1.5 inputs left, so at
    most one copy's storage is alive beside the three kept (independent count)."""
    actions = {str(i): "offload" for i in range(3, LAYERS)}
    probe, report, _ = _run(_SleepyTier(), _plan(actions, 4.5 * NBYTES))
    assert max(probe.samples) <= 4 * NBYTES
    assert report.peak_resident_saved_bytes <= 4 * NBYTES
    assert report.pack_wait_s > 0 and report.offloaded_bytes == (LAYERS - 3) * NBYTES


@pytest.mark.timeout(60)
def test_no_wait_when_nothing_in_flight_can_free(tmp_path):
    """A plan that keeps more than its budget: no offload could make room, so pack never waits (no deadlock)
    and every input stays resident, as planned."""
    probe, report, _ = _run(_SleepyTier(), _plan({}, 1.5 * NBYTES))
    assert report.complete and report.pack_wait_s == 0 and report.offloaded_bytes == 0
    assert max(probe.samples) == report.peak_resident_saved_bytes == LAYERS * NBYTES


@pytest.mark.timeout(60)
def test_over_budget_keeps_bound_the_wait_to_what_offloads_free(tmp_path):
    """Layers 0-3 kept with a budget of 2.5 inputs: the kept bytes alone exceed it; each offloaded input then
    waits for the copies in flight, so at most the kept four plus the one being packed are alive."""
    actions = {str(i): "offload" for i in range(4, LAYERS)}
    probe, report, _ = _run(_SleepyTier(), _plan(actions, 2.5 * NBYTES))
    assert report.complete
    assert max(probe.samples) <= 5 * NBYTES
    assert report.peak_resident_saved_bytes <= 5 * NBYTES
    assert report.pack_wait_s > 0


@pytest.mark.timeout(60)
def test_prefetch_ahead_waits_for_room_under_the_budget():
    """Backward: fetches ahead start only when they fit (the timeline never exceeds the cap), the rest come
    on demand, and gradients stay bit-identical."""
    reference = _step(_model())
    cap = 1.5 * NBYTES
    probe, report, grads = _run(_SleepyTier(), _plan(ALL, cap))
    assert max(b for _, b in report.timeline) <= NBYTES
    assert report.fetches_ahead >= LAYERS - 2  # still ahead of use, one at a time
    for got, want in zip(grads, reference):
        assert torch.equal(got, want)


@pytest.mark.timeout(60)
def test_budget_mode_bound_is_kept_bytes_plus_window(tmp_path):
    """budget= without a plan bounds what is kept; evicted storages in flight add at most ``window`` more
    (independent count), also when the tier is slow; gradients stay bit-identical."""
    reference = _step(_model())
    window = 2
    # the pack of layer i + 2 + window waits for layer i's copy (window copies in flight): held until just
    # before that pack, the copy is still running there
    probe = _Probe(lag=2 + window)
    model = _model(probe)
    vm = virtualize(_SlowFileTier(tmp_path, probe), budget=2 * NBYTES, model=model, min_bytes=NBYTES, window=window)
    grads = _step(model, vm, probe)
    vm.close()
    assert max(probe.samples) <= (2 + window) * NBYTES
    assert vm.report.pack_wait_s > 0  # the window, not the budget, held the forward
    assert {w.reason for w in vm.report.waits if w.kind == "pack"} == {"window"}
    for got, want in zip(grads, reference):
        assert torch.equal(got, want)


@pytest.mark.timeout(60)
def test_waits_do_not_hold_the_step_lock():
    """While pack waits for room, completions still land and reports can be read from another thread."""
    probe = _Probe()
    model = _model(probe)
    vm = virtualize(_SleepyTier(), plan=_plan(ALL, 1.5 * NBYTES), model=model, min_bytes=NBYTES, window=LAYERS)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(vm.resident_saved_bytes)
            _ = vm.tracker_entries  # takes the step lock
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _step(model, vm)
    finally:
        stop.set()
        watcher.join()
        vm.close()
    assert vm.report.pack_wait_s > 0 and len(seen) > 10 and max(seen) <= NBYTES


class _Tagged(torch.autograd.Function):
    """y = sin(x * w) like ``_SinScale``; its backward logs ``("use", name)`` once the saved input is back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, name: str, log: list) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.name, ctx.log = name, log
        return torch.sin(x * w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        x, w = ctx.saved_tensors
        ctx.log.append(("use", ctx.name))
        time.sleep(FWD_S)
        c = grad * torch.cos(x * w)
        return c * w, (c * x).sum(0), None, None


class _TaggedLayer(_Layer):
    def __init__(self, name: str, log: list) -> None:
        super().__init__()
        self.name, self.log = name, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Tagged.apply(x, self.w, self.name, self.log)


class _ReadLog(_SleepyTier):
    """Writes at once; each read takes ``FWD_S`` and then logs ``("read", module)``. Logged at the end: the
    runtime issues a fetch as soon as an unpack frees room, so a read's start may precede the ``use`` that
    the backward logs just after that unpack."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def _write(self, data, *, reserved_bytes, label):  # noqa: ANN001, ANN202
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=bytes(data))

    def _read_into(self, block, out):  # noqa: ANN001, ANN202
        super()._read_into(block, out)
        self.log.append(("read", block.label.split("module '")[1].split("'")[0]))


@pytest.mark.timeout(60)
def test_fetch_ahead_leaves_room_for_tensors_needed_sooner():
    """Layers 1-2 kept, 0 offloaded with ``prefetch_at`` layer 6, 3-7 offloaded, cap 3.5 inputs. Fetching 0's
    input as soon as it fits (when 6 has used its own) would leave no room for 5, 4 and 3, which backward
    needs first: they would come on demand over the cap (4 inputs). So 0 waits until they are used
    (NOTE [prefetch] in ``mcdla.runtime._prefetch``, like NOTE [safe prefetch] in ``mcdla.sim.device``). The
    independent count, from the tier's reads and the backward's uses: kept inputs plus fetched ones not yet
    used never exceed 3, and the gradients are bit-identical."""
    log: list[tuple[str, str]] = []
    torch.manual_seed(0)
    layers = [_TaggedLayer(str(i), log) for i in range(LAYERS)]
    model = nn.Sequential(OrderedDict([("copy", _Copy()), *((str(i), l) for i, l in enumerate(layers))]))
    reference = _step(_model())  # the same weights: both draw them after manual_seed(0)
    actions = {str(i): "offload" for i in (0, *range(3, LAYERS))}
    names = ["", "copy", *(str(i) for i in range(LAYERS))]
    plan = Plan.from_actions(workload="sin", batch=ROWS, layer_names=names, actions=actions,
                             budget_bytes=3.5 * NBYTES, prefetch_at={"0": "6"})
    vm = virtualize(_ReadLog(log), plan=plan, model=model, min_bytes=NBYTES, window=LAYERS)
    grads = _step(model, vm)
    vm.close()

    reads = [name for event, name in log if event == "read"]
    # a copy still in flight when backward wants its tensor lands without freeing it: never read, it stays
    # resident until used (on a loaded machine, layer 7's)
    kept, back, peak = {"1", "2", *(set(actions) - set(reads))}, set(), 0
    for event, name in log:
        if event == "read":
            back.add(name)
            peak = max(peak, len(kept | back))
        else:
            kept.discard(name)
            back.discard(name)
    assert len(set(reads)) == len(reads) and set(reads) <= set(actions) and {"0", "3", "4", "5"} <= set(reads)
    assert reads.index("0") > reads.index("3")  # 0's input came back only after 3's, needed before it
    assert peak <= 3
    assert vm.report.peak_resident_saved_bytes <= 3.5 * NBYTES
    for got, want in zip(grads, reference):
        assert torch.equal(got, want)
