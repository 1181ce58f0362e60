"""Hangs and leaks: destructors during garbage collection, interrupts inside posted tasks, bad trace
paths, and transfer tails that nobody waited for. Every test that could hang runs the risky part on a daemon
thread and fails after a timeout instead."""

from __future__ import annotations

import gc
import operator
import shutil
import threading
import time
from concurrent.futures import Future

import pytest
import torch
import torch.nn.functional as F

from mcdla.errors import ConfigError, RuntimeTierError
from mcdla.runtime import HostBufferPool, HostTier, virtualize
from mcdla.runtime._step import _Step
from mcdla.runtime._sync import _InboxLock
from mcdla.runtime._transfer import _Mover

from ._models import model_and_batch, wait_offloaded

HANG_S = 20.0  # generous on a loaded 2-core machine; a deadlock never finishes


def _finishes(fn, timeout_s: float = HANG_S) -> list:
    """Run ``fn`` on a daemon thread; fail (instead of hanging) if it does not return in time."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True, name="test-hang-probe")
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "deadlocked"
    return out


def _graph_in_a_cycle(vm, model, x, y) -> None:
    """Forward under ``vm``; the graph (and so every handle) is then reachable only from a reference cycle."""
    with vm:
        loss = F.cross_entropy(model(x), y)
    cycle: list = [loss]
    cycle.append(cycle)


@pytest.mark.parametrize("held", ["report", "tier", "virtualizer"])
def test_handles_dying_in_gc_under_a_held_lock_do_not_deadlock(tmp_path, held):
    """The collector frees a graph while this thread holds the report, tier or virtualizer lock: the dying
    handles' work is deferred (NOTE [posts during garbage collection]) and runs at the next look at the step."""
    model, x, y = model_and_batch()
    vm = virtualize(f"file:{tmp_path}", min_bytes=1024, model=model)
    gc.collect()
    gc.disable()  # the cycle must die inside the locked region below, not earlier
    try:
        _graph_in_a_cycle(vm, model, x, y)
        wait_offloaded(vm)
        step = vm._last
        lock = {"report": step.report._lock, "tier": vm.pool.tiers[0]._lock, "virtualizer": vm._lock}[held]

        def collect_holding_lock() -> int:
            with lock:
                return gc.collect()

        assert _finishes(collect_holding_lock)[0] > 0
    finally:
        gc.enable()
    assert vm.live_steps == 0 and vm.tracker_entries == 0  # the deferred releases ran here
    assert vm.report.complete and vm.pool.used_bytes == 0 and list(tmp_path.iterdir()) == []


def test_handles_dying_in_gc_are_drained_by_the_next_step():
    """Deferred releases of an old step run when the next step starts; nothing leaks across iterations."""
    model, x, y = model_and_batch()
    vm = virtualize("host", min_bytes=1024, model=model)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            _graph_in_a_cycle(vm, model, x, y)
            gc.collect()
            with vm:
                F.cross_entropy(model(x), y).backward()
            assert vm._live == set() and vm.pool.used_bytes == 0
    finally:
        gc.enable()


def test_interrupted_task_releases_the_lock_and_keeps_the_rest():
    """KeyboardInterrupt inside a posted task: recorded, raised to the runner, the lock is free again and the
    tasks queued behind it still run."""
    errors: list[BaseException] = []
    lock = _InboxLock(errors.append)
    ran: list[int] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with lock:
            lock.post(interrupt)
            lock.post(lambda: ran.append(1))
    assert lock._lock.acquire(blocking=False)
    lock._lock.release()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeTierError) and "KeyboardInterrupt" in str(errors[0])
    assert ran == []
    lock.drain()
    assert ran == [1]
    lock.post(lambda: ran.append(2))  # and the lock works as before
    assert ran == [1, 2]


def test_call_runs_at_once_when_free_and_after_the_tasks_already_queued():
    """``call`` runs its task at once on a free lock, queues it behind the holder otherwise, never overtakes
    tasks left in the inbox (posted during a collection), and hands a failing task to ``on_error``."""
    errors: list[BaseException] = []
    lock = _InboxLock(errors.append)
    ran: list[int] = []
    lock.call(ran.append, 1)
    assert ran == [1]
    with lock:
        lock.call(ran.append, 2)
        assert ran == [1]  # the holder runs it at release
    assert ran == [1, 2]
    lock._inbox.append(lambda: ran.append(3))  # what a post during a garbage collection leaves behind
    lock.call(ran.append, 4)
    assert ran == [1, 2, 3, 4]
    lock.call(operator.truediv, 1, 0)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    assert lock._lock.acquire(blocking=False)
    lock._lock.release()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_interrupt_in_a_handle_task_aborts_the_step_without_hanging(tmp_path, monkeypatch):
    """An interrupt while a dying handle's task runs fails the step; exit aborts it and frees everything."""
    model, x, y = model_and_batch()
    real = _Step._on_handle_dead
    calls = []

    def flaky(self, rec, unpacked):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self, rec, unpacked)

    monkeypatch.setattr(_Step, "_on_handle_dead", flaky)
    vm = virtualize(f"file:{tmp_path}", min_bytes=1024, model=model)

    def step() -> None:
        with vm:
            F.cross_entropy(model(x), y).backward()

    out = _finishes(step)
    assert isinstance(out[0], RuntimeTierError) and "interrupted" in str(out[0])
    assert vm.report.aborted and vm.live_steps == 0 and vm.tracker_entries == 0
    assert vm.pool.used_bytes == 0 and list(tmp_path.iterdir()) == []


# -- trace= ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["missing/step{step}.json", "dir"])
def test_bad_trace_path_is_a_config_error_at_construction(tmp_path, bad):
    (tmp_path / "dir").mkdir()
    with pytest.raises(ConfigError, match=r"virtualize\(trace=\.\.\.\)"):
        virtualize("host", trace=str(tmp_path / bad))


def test_trace_write_failing_at_exit_is_an_mcdla_error_and_cleans_up(tmp_path):
    """The trace directory vanishes before the step ends: exit raises ConfigError; the step is not leaked."""
    model, x, y = model_and_batch()
    folder = tmp_path / "traces"
    folder.mkdir()
    vm = virtualize("host", min_bytes=1024, model=model, trace=str(folder / "s{step}.json"))
    shutil.rmtree(folder)
    with pytest.raises(ConfigError, match=r"trace.*step 0"):
        with vm:
            F.cross_entropy(model(x), y).backward()
    assert vm.live_steps == 0 and vm.report.complete and vm.pool.used_bytes == 0


def test_trace_write_failing_after_exit_is_raised_later_and_leaks_no_step(tmp_path):
    """Backward after the exit: the failed write is kept and raised by the next call; no step piles up."""
    model, x, y = model_and_batch()
    folder = tmp_path / "traces"
    folder.mkdir()
    vm = virtualize("host", min_bytes=1024, model=model, trace=str(folder / "s{step}.json"))
    shutil.rmtree(folder)
    for i in range(3):
        if i:
            with pytest.raises(ConfigError, match=rf"trace.*step {i - 1}"):
                vm.__enter__()  # the previous step's failed trace surfaces here, before a new step starts
        with vm:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        assert vm.live_steps == 0 and vm.pool.used_bytes == 0
    with pytest.raises(ConfigError, match=r"trace.*step 2"):
        vm.synchronize()
    vm.synchronize()  # raised once


# -- CUDA fetch tails (faked on the CPU) ---------------------------------------------------------------------
class _FakeEvent:
    """Stands in for the CUDA event of an H2D copy: ``synchronize`` waits, then succeeds or fails."""

    def __init__(self, delay_s: float, fail: bool) -> None:
        self.delay_s, self.fail = delay_s, fail

    def synchronize(self) -> None:
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("injected CUDA error")


def _fake_cuda_fetch(delay_s: float, fail: bool):
    """``_Mover.fetch`` through the CUDA tail: bytes read now, the block freed after the 'copy' completes."""

    def fetch(self, rec, block) -> Future:
        tier = block.tier
        dst = torch.empty(block.nbytes, dtype=torch.uint8)
        tier.read_into(block, memoryview(dst.numpy()))
        return self._release_after_copy(rec, block, tier, dst, _FakeEvent(delay_s, fail), self.report.now_s(),
                                        event=None)

    return fetch


def test_release_after_copy_is_waited_for_by_synchronize(monkeypatch):
    """The block of a fetch is freed by a tracked tail: synchronize() returns only once every tail ran."""
    monkeypatch.setattr(_Mover, "fetch", _fake_cuda_fetch(0.05, fail=False))
    model, x, y = model_and_batch()
    host = HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))
    vm = virtualize(host, min_bytes=1024, model=model)
    with vm:
        loss = F.cross_entropy(model(x), y)
        wait_offloaded(vm)
    loss.backward()
    vm.synchronize()
    assert host.used_bytes == 0 and host.block_count == 0
    assert vm.live_steps == 0 and vm.report.complete and vm.report.fetched_bytes > 0


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_release_after_copy_failure_fails_the_step(monkeypatch, delay_s):
    """A failing tail (the copy's event reports an error) is the step's failure, not lost; one that fails
    after backward has used every tensor (50 ms) still leaves an aborted report with the error."""
    monkeypatch.setattr(_Mover, "fetch", _fake_cuda_fetch(delay_s, fail=True))
    model, x, y = model_and_batch()
    host = HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))
    vm = virtualize(host, min_bytes=1024, model=model)
    with pytest.raises(RuntimeTierError, match="injected CUDA error"):
        with vm:
            loss = F.cross_entropy(model(x), y)
            wait_offloaded(vm)
            loss.backward()
    assert vm.report.aborted and vm.live_steps == 0 and host.used_bytes == 0
