"""The file tier's direct-I/O path, its chunk plan, block removal, helper threads and default I/O threads."""

from __future__ import annotations

import errno
import os
import threading
import time
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import OffloadError
from mcdla.runtime import FileTier, TierFullError, virtualize
from mcdla.runtime import _file_io as fio
from mcdla.runtime.tiers_file import default_io_threads

from ._models import twin

LABEL = "saved tensor #3 (module 'fc', float32[64x64])"
CHUNK = 32 << 10  # small chunks: blocks of a few hundred KiB take the pipelined direct path


def _direct_or_skip(path) -> None:
    probe = path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600))
    except OSError as exc:
        pytest.skip(f"no O_DIRECT on {path}: {exc.strerror}")
    if not getattr(os, "O_DIRECT", 0):
        pytest.skip("no O_DIRECT on this platform")
    probe.unlink()


def _store(tier, data, label=LABEL):
    return tier.write(memoryview(data), reserved_bytes=tier.try_reserve(len(data)), label=label)


def _load(tier, block, skew=0) -> bytes:
    raw = np.empty(block.nbytes + skew, dtype=np.uint8)
    tier.read_into(block, memoryview(raw[skew:]))
    return raw[skew:].tobytes()


def _threads(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


def _wait_threads(prefix: str, at_most: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while _threads(prefix) > at_most and time.monotonic() < deadline:
        time.sleep(0.01)
    return _threads(prefix)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(min_value=CHUNK + 1, max_value=12 * CHUNK + 5000), src_skew=st.integers(0, 63),
       dst_skew=st.integers(0, 63), seed=st.integers(0, 2**16))
def test_direct_round_trip_is_exact(tmp_path_factory, n, src_skew, dst_skew, seed):
    """Blocks of several chunks (unaligned sizes, unaligned memory) come back byte for byte, file size exact."""
    path = tmp_path_factory.mktemp("direct")
    _direct_or_skip(path)
    tier = FileTier(path, chunk_bytes=CHUNK)
    src = np.random.default_rng(seed).integers(0, 256, n + src_skew, dtype=np.uint8)
    block = _store(tier, src[src_skew:])
    assert tier.direct and os.path.getsize(block.payload) == n
    assert block.checksum == zlib.crc32(src[src_skew:].tobytes())
    assert _load(tier, block, dst_skew) == src[src_skew:].tobytes()
    tier.free(block)
    assert tier.block_paths() == []
    tier.close()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 1 << 26), step_pages=st.integers(1, 4096))
def test_chunk_plan_tiles_the_block(n, step_pages):
    """The calls cover [0, n) in order without gaps; all offsets and all lengths but the last are aligned."""
    step = step_pages * fio.ALIGN
    plan = fio.chunk_plan(n, step)
    assert sum(m for _, m in plan) == n
    ends = [0] + [o + m for o, m in plan]
    assert [o for o, _ in plan] == ends[:-1] and all(m > 0 for _, m in plan)
    assert all(o % fio.ALIGN == 0 for o, _ in plan) and all(m % fio.ALIGN == 0 for _, m in plan[:-1])
    assert all(m <= step + fio.ALIGN for _, m in plan)
    if n >= 3 * step and step % (8 * fio.ALIGN) == 0:  # small first and last calls
        assert plan[0][1] == step // 8 and plan[-1][1] - n % fio.ALIGN == step // 8


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "extend"])
def test_direct_block_damage_is_detected(tmp_path, damage):
    """A damaged multi-chunk block raises a one-line OffloadError naming the tensor and the tier."""
    _direct_or_skip(tmp_path)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    block = _store(tier, os.urandom(5 * CHUNK + 123))
    path = block.payload
    if damage == "corrupt":
        raw = bytearray(path.read_bytes())
        raw[3 * CHUNK + 7] ^= 0x10
        path.write_bytes(raw)
    elif damage == "truncate":
        os.truncate(path, 2 * CHUNK)
    else:
        with open(path, "ab") as f:
            f.write(b"x")
    with pytest.raises(OffloadError, match=r"saved tensor #3.*file:.*(corrupted|truncated)") as err:
        _load(tier, block)
    assert "\n" not in str(err.value)


def test_direct_disk_full_leaves_no_file(tmp_path, monkeypatch):
    """ENOSPC in the middle of a direct write raises TierFullError and removes the partial file."""
    _direct_or_skip(tmp_path)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    calls = []
    real = fio.pwrite_all

    def fill_up(fd, buf, offset):
        calls.append(offset)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, buf, offset)

    monkeypatch.setattr(fio, "pwrite_all", fill_up)
    with pytest.raises(TierFullError, match=r"saved tensor #3.*disk full"):
        _store(tier, os.urandom(6 * CHUNK))
    assert len(calls) == 3 and list(tmp_path.iterdir()) == []


def test_refused_o_direct_falls_back_to_page_cache(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT (EINVAL at open) gets buffered I/O, and the bytes still round-trip."""
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    data = os.urandom(4 * CHUNK + 9)
    block = _store(tier, data)
    assert not tier.direct and _load(tier, block) == data


def test_o_direct_refused_at_write_falls_back(tmp_path, monkeypatch):
    """O_DIRECT accepted at open but refused by the write (EINVAL): the block is written again buffered."""
    _direct_or_skip(tmp_path)

    def refuse(fd, buf, offset):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(fio, "pwrite_all", refuse)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    data = os.urandom(3 * CHUNK + 1)
    block = _store(tier, data)
    assert not tier.direct and _load(tier, block) == data and len(tier.block_paths()) == 1


def test_free_removes_the_name_at_once_and_the_closer_ends(tmp_path):
    """Freeing a big block removes its file before free returns; the closer thread then ends by itself."""
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    closer = f"mcdla-io-free {tmp_path.name}"
    blocks = [_store(tier, os.urandom(3 * CHUNK)) for _ in range(3)]
    for b in blocks:
        tier.free(b)
        assert b.payload not in tier.block_paths()
    assert list(tmp_path.iterdir()) == []
    assert _wait_threads(closer, 0) == 0


def test_worker_thread_ends_with_its_io_thread(tmp_path):
    """The chunk worker made by an I/O thread goes away when that thread ends; close() ends the caller's."""
    _direct_or_skip(tmp_path)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    data = os.urandom(5 * CHUNK)

    def new_workers(before: set) -> list:  # other tests' workers may come and go meanwhile
        return [t for t in set(threading.enumerate()) - before if t.name.startswith("mcdla-io-chunk")]

    seen = []

    def io_thread():
        before = set(threading.enumerate())
        block = _store(tier, data)
        seen.extend(new_workers(before))
        tier.free(block)

    t = threading.Thread(target=io_thread)
    t.start()
    t.join()
    assert len(seen) == 1
    seen[0].join(timeout=5.0)
    assert not seen[0].is_alive()
    before = set(threading.enumerate())
    tier.free(_store(tier, data))  # now in this thread, which lives on
    mine = new_workers(before)
    assert len(mine) == 1 and mine[0].is_alive()
    tier.close()
    assert not mine[0].is_alive()


def test_virtualize_with_direct_blocks_is_exact_and_clean(tmp_path):
    """A step whose saved tensors take the direct path gives identical gradients and leaves no file or thread."""
    _direct_or_skip(tmp_path)
    ref_model, model = twin("mlp", width=256, depth=4)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(512, 256, generator=g), torch.randint(0, 10, (512,), generator=g)
    torch.manual_seed(0)
    F.cross_entropy(ref_model(x), y).backward()
    threads = threading.active_count()
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)  # 512 x 256 float32 = 512 KiB per tensor: 16 chunks
    torch.manual_seed(0)
    with virtualize(tier, min_bytes=CHUNK + 1, model=model) as vm:
        F.cross_entropy(model(x), y).backward()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert tier.direct and vm.report.offloaded_bytes > 0
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 5.0
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= threads


@pytest.mark.parametrize(("cpus", "expected"), [(1, 1), (2, 1), (3, 2), (4, 2), (64, 2)])
def test_default_io_threads_rule(cpus, expected):
    """One I/O thread on machines with at most two usable CPUs, two above."""
    assert default_io_threads(cpus) == expected


@pytest.mark.parametrize(("usable", "expected"), [(2, 1), (8, 2)])
def test_file_tier_default_follows_usable_cpus(tmp_path, monkeypatch, usable, expected):
    """FileTier's default counts the CPUs this process may use; an explicit io_threads is kept as given."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)), raising=False)
    assert FileTier(tmp_path).io_threads == expected
    assert FileTier(tmp_path, io_threads=3).io_threads == 3


def test_small_blocks_keep_the_page_cache(tmp_path, monkeypatch):
    """Blocks up to one chunk are written and read without O_DIRECT (NOTE [direct I/O])."""
    flags = []
    real_open = os.open

    def record(path, f, *args):
        flags.append(f)
        return real_open(path, f, *args)

    monkeypatch.setattr(os, "open", record)
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    data = os.urandom(CHUNK)
    block = _store(tier, data)
    assert _load(tier, block) == data
    assert flags and not any(f & getattr(os, "O_DIRECT", 0) for f in flags)
