"""A process forked during a step never touches its parent's blocks, cleanup or transfers."""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from mcdla.runtime import FileTier, Pool, tiers_file, virtualize

from ._models import twin

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

_CHILD_DEADLINE_S = 20.0


def _exit_like_sys_exit(code: int = 0) -> None:
    """End a forked child as ``sys.exit`` would (atexit handlers and finalizers run), without pytest's teardown."""
    try:
        atexit._run_exitfuncs()
    finally:
        os._exit(code)


def _wait_child(pid: int) -> int:
    """The child's wait status; kills it and fails if it has not ended within the deadline (a hang)."""
    deadline = time.monotonic() + _CHILD_DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child did not end within {_CHILD_DEADLINE_S} s")


def _reference_grads(ref_model, x, y) -> list[torch.Tensor]:
    F.cross_entropy(ref_model(x), y).backward()
    return [p.grad for p in ref_model.parameters()]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _assert_exact(ref: list[torch.Tensor], model) -> None:
    for a, p in zip(ref, model.parameters()):
        assert torch.equal(a, p.grad)


def _some_block_files(directory) -> set:
    """Block files in ``directory`` once at least one offload has landed (the last ones wait for forward's end)."""
    deadline = time.monotonic() + 5.0
    while not (files := set(directory.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert files
    return files


def _set_up(tmp_path):
    ref_model, model = twin("mlp")
    model.eval(), ref_model.eval()  # no dropout: one reference backward suffices
    x, y = _batch()
    return _reference_grads(ref_model, x, y), model, x, y, virtualize(f"file:{tmp_path}", budget=0, min_bytes=1)


def test_child_exit_keeps_parent_blocks(tmp_path):
    """A child that exits (atexit finalizers run) leaves the parent's block files; backward is exact."""
    ref, model, x, y, vm = _set_up(tmp_path)
    with vm:
        loss = F.cross_entropy(model(x), y)
    vm.synchronize()
    files = sorted(tmp_path.iterdir())
    assert files
    pid = os.fork()
    if pid == 0:
        _exit_like_sys_exit(0)
    assert os.waitstatus_to_exitcode(_wait_child(pid)) == 0
    assert sorted(tmp_path.iterdir()) == files
    loss.backward()
    _assert_exact(ref, model)
    vm.synchronize()
    assert list(tmp_path.iterdir()) == []


def test_sigterm_to_child_keeps_parent_blocks(tmp_path):
    """SIGTERM to a child (Pool.terminate) runs the inherited handler without removing the parent's files."""
    ref, model, x, y, vm = _set_up(tmp_path)
    if signal.getsignal(signal.SIGTERM) is not tiers_file._on_sigterm:
        pytest.skip("the file tier's SIGTERM cleanup is not installed (SIGTERM had a handler already)")
    with vm:
        loss = F.cross_entropy(model(x), y)
    vm.synchronize()
    files = sorted(tmp_path.iterdir())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # says it is ready first: Python drops signals that arrive while it sets up a child
        # a child still alive at half the deadline prints where it is (the test's captured stderr) and exits 1
        faulthandler.dump_traceback_later(_CHILD_DEADLINE_S / 2, exit=True)
        os.write(write, b"r")
        time.sleep(_CHILD_DEADLINE_S)
        os._exit(3)
    os.close(write)
    assert os.read(read, 1) == b"r"
    os.close(read)
    os.kill(pid, signal.SIGTERM)
    status = _wait_child(pid)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, (
        f"child ended with wait status {status}, not by SIGTERM (its traceback, if it hung: captured stderr)")
    assert sorted(tmp_path.iterdir()) == files
    loss.backward()
    _assert_exact(ref, model)


def test_child_unwinding_through_with_does_not_abort_parent(tmp_path):
    """A child that leaves the ``with`` block by an exception frees nothing of the parent's step."""
    ref, model, x, y, vm = _set_up(tmp_path)
    parent = os.getpid()
    try:
        with vm:
            loss = F.cross_entropy(model(x), y)
            files = _some_block_files(tmp_path)
            pid = os.fork()
            if pid == 0:
                raise SystemExit(0)
            assert os.waitstatus_to_exitcode(_wait_child(pid)) == 0
            assert files <= set(tmp_path.iterdir())
            loss.backward()
    finally:
        if os.getpid() != parent:
            _exit_like_sys_exit(0)
    assert not vm.report.aborted
    _assert_exact(ref, model)


def test_child_raising_with_io_in_flight_does_not_hang(tmp_path):
    """A child that raises inside the ``with`` block while the parent's offload is in flight exits at once."""
    ref_model, model = twin("mlp")
    model.eval(), ref_model.eval()
    x, y = _batch()
    ref = _reference_grads(ref_model, x, y)
    tier = FileTier(tmp_path)
    release, entered = threading.Event(), threading.Event()
    real = tier._write_chunks

    def held_write(fd, data):
        entered.set()
        release.wait(_CHILD_DEADLINE_S)
        return real(fd, data)

    tier._write_chunks = held_write
    vm = virtualize(Pool([tier]), budget=0, min_bytes=1, window=64)  # forward never waits for the held write
    parent = os.getpid()
    try:
        with vm:
            loss = F.cross_entropy(model(x), y)
            assert entered.wait(_CHILD_DEADLINE_S)  # an offload is inside its write now
            assert not release.is_set()
            pid = os.fork()
            if pid == 0:
                raise RuntimeError("the child fails inside the with block")
            release.set()
            assert os.waitstatus_to_exitcode(_wait_child(pid)) == 0
            loss.backward()
    finally:
        if os.getpid() != parent:
            _exit_like_sys_exit(0)
    assert not vm.report.aborted
    _assert_exact(ref, model)
    vm.synchronize()
    assert list(tmp_path.iterdir()) == []


def test_child_cannot_unpack_parent_tensors(tmp_path):
    """Backward in a child through the parent's graph raises OffloadError naming the owner (never hangs)."""
    _, model, x, y, vm = _set_up(tmp_path)
    with vm:
        loss = F.cross_entropy(model(x), y)
    vm.synchronize()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            loss.backward()
            message = b"no error"
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            message = f"{type(exc).__name__}: {exc}".encode()
        os.write(write, message[:4000])
        _exit_like_sys_exit(0)
    os.close(write)
    assert os.waitstatus_to_exitcode(_wait_child(pid)) == 0
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    assert message.startswith("OffloadError: ") and f"saved by process {os.getpid()}" in message
    loss.backward()
