"""A tier that cannot remove or take blocks never fails a step whose data is intact: it spills and warns."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from mcdla.runtime import FileTier, HostBufferPool, HostTier, Pool, virtualize

from ._models import assert_released, twin

_REMOVE_ERRNOS = [errno.EROFS, errno.EACCES, errno.EBUSY, errno.EIO]
_WRITE_ERRNOS = [errno.EROFS, errno.EACCES, errno.EIO]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _reference_and_model():
    ref_model, model = twin("mlp")
    ref_model.eval(), model.eval()
    x, y = _batch()
    F.cross_entropy(ref_model(x), y).backward()
    return [p.grad for p in ref_model.parameters()], model, x, y


def _assert_exact(ref, model) -> None:
    for a, p in zip(ref, model.parameters()):
        assert torch.equal(a, p.grad)


def _failing_for_blocks(real, code: int, *, creating_only: bool = False):
    """``real`` (os.unlink or os.open) raising OSError ``code`` for block files (for os.open: ones created)."""

    def call(path, *args, **kwargs):
        name = os.fspath(path).rsplit("/", 1)[-1]
        if name.startswith("mcdla-") and name.endswith(".blk") and (
                not creating_only or (len(args) > 0 and args[0] & os.O_CREAT)):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real(path, *args, **kwargs)

    return call


@pytest.mark.parametrize("code", _REMOVE_ERRNOS, ids=errno.errorcode.get)
def test_unremovable_blocks_do_not_fail_backward(tmp_path, monkeypatch, code):
    """Backward whose reads all succeed completes, exact, when no block file can be removed; the report warns."""
    ref, model, x, y = _reference_and_model()
    threads = threading.active_count()
    vm = virtualize(f"file:{tmp_path}", budget=0, min_bytes=1)
    monkeypatch.setattr(os, "unlink", _failing_for_blocks(os.unlink, code))
    with vm:
        F.cross_entropy(model(x), y).backward()
    vm.synchronize()
    _assert_exact(ref, model)
    report = vm.report
    assert report.complete and not report.aborted
    assert report.fetched_bytes > 0
    assert len(report.warnings) == report.managed_count
    assert all("could not remove its block" in w and f"[Errno {code}]" in w for w in report.warnings)
    assert_released(vm, threads)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EIO], ids=errno.errorcode.get)
def test_abort_with_unremovable_blocks_frees_everything(tmp_path, monkeypatch, code):
    """An aborted step whose frees all fail still frees every block's capacity, joins its threads, finishes."""
    _, model, x, _ = _reference_and_model()
    threads = threading.active_count()
    vm = virtualize(f"file:{tmp_path}", budget=0, min_bytes=1)
    monkeypatch.setattr(os, "unlink", _failing_for_blocks(os.unlink, code))

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with vm:
            out = model(x).sum()  # noqa: F841 - keeps the graph, and its blocks, alive
            deadline = time.monotonic() + 5.0
            while vm.pool.block_count < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert vm.pool.block_count >= 2
            raise Boom
    report = vm.report
    assert report.aborted and report.complete
    assert len(report.warnings) >= 2 and all(f"[Errno {code}]" in w for w in report.warnings)
    assert_released(vm, threads)


@pytest.mark.parametrize("code", _WRITE_ERRNOS, ids=errno.errorcode.get)
def test_unwritable_tier_spills_to_the_next(tmp_path, monkeypatch, code):
    """A file tier whose block files cannot be created spills to the next tier, exact, with a warning."""
    ref, model, x, y = _reference_and_model()
    host = HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))
    disk = FileTier(tmp_path)
    vm = virtualize(Pool([disk, host]), budget=0, min_bytes=1)
    monkeypatch.setattr(os, "open", _failing_for_blocks(os.open, code, creating_only=True))
    with vm:
        F.cross_entropy(model(x), y).backward()
    vm.synchronize()
    _assert_exact(ref, model)
    report = vm.report
    assert report.offloaded_bytes_by_tier.get("host", 0) == report.offloaded_bytes > 0
    assert disk.name not in report.offloaded_bytes_by_tier
    assert report.warnings and all(
        disk.name in w and f"[Errno {code}]" in w and "spilling to the next tier" in w for w in report.warnings)
    assert disk.marked_full and list(tmp_path.iterdir()) == []


def _mount(*args: str) -> bool:
    if shutil.which("mount") is None:
        return False
    try:
        return subprocess.run(["mount", *args], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_read_only_remount(tmp_path):
    """A tmpfs remounted read-only between forward and backward: backward is exact with warnings, and the next
    step spills to the host tier (skipped where this machine cannot mount)."""
    point = tmp_path / "mnt"
    point.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=64m", "tmpfs", str(point)):
        pytest.skip("cannot mount a tmpfs here (needs root or a user namespace)")
    try:
        ref, model, x, y = _reference_and_model()
        disk = FileTier(point, io_threads=1)
        host = HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))
        vm = virtualize(Pool([disk, host]), budget=0, min_bytes=1)
        with vm:
            loss = F.cross_entropy(model(x), y)
        vm.synchronize()
        assert disk.block_count > 0
        assert _mount("-o", "remount,ro", str(point))
        loss.backward()
        vm.synchronize()
        _assert_exact(ref, model)
        assert vm.report.warnings and all(f"[Errno {errno.EROFS}]" in w for w in vm.report.warnings)
        assert disk.used_bytes == 0
        model.zero_grad()
        with vm:
            F.cross_entropy(model(x), y).backward()
        vm.synchronize()
        _assert_exact(ref, model)
        assert vm.report.offloaded_bytes_by_tier.get("host", 0) == vm.report.offloaded_bytes > 0
        assert any("spilling to the next tier" in w for w in vm.report.warnings)
        vm.close()
        disk.close()
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=10)
