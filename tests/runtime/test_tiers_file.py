"""The file tier's direct-I/O path, its chunk plan, block removal, helper threads and default I/O threads."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError, OffloadError
from mcdla.runtime import FileTier, HostBufferPool, HostTier, Pool, TierFullError, tiers_file, virtualize
from mcdla.runtime import _file_io as fio
from mcdla.runtime.tiers_file import default_io_threads, sweep_dead_blocks

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


@pytest.mark.examples(8, 25)
def test_direct_round_trip_is_exact(tmp_path_factory, examples):
    """Blocks of several chunks (unaligned sizes, unaligned memory) come back byte for byte, file size exact."""
    settings(max_examples=examples, deadline=None)(given(
        n=st.integers(min_value=CHUNK + 1, max_value=12 * CHUNK + 5000), src_skew=st.integers(0, 63),
        dst_skew=st.integers(0, 63), seed=st.integers(0, 2**16),
    )(lambda **case: _check_direct_round_trip(tmp_path_factory, **case)))()


def _check_direct_round_trip(tmp_path_factory, n, src_skew, dst_skew, seed):
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


# -- transient ENOSPC, planted files, directory mode, crash cleanup -----------------------------------------
def _enospc_once(tier):
    real, calls = tier._write_chunks, []

    def write(fd, data):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    tier._write_chunks = write
    return calls


def _pool_write(pool, data):
    idx, reserved = pool.reserve(len(data), label=LABEL)
    return pool.write(memoryview(data), index=idx, reserved_bytes=reserved, label=LABEL)


def test_transient_enospc_full_mark_expires(tmp_path, monkeypatch):
    """One ENOSPC spills to the next tier and marks the file tier full; once the mark is full_retry_s old
    and the disk shows room, the tier takes blocks again with its configured capacity."""
    monkeypatch.setattr(FileTier, "full_retry_s", 0.3)
    disk = FileTier(tmp_path / "d", capacity_bytes=1 << 20)
    host = HostTier(capacity_bytes=1 << 20, buffers=HostBufferPool(pinned=False))
    pool = Pool([disk, host])
    calls = _enospc_once(disk)
    data = np.arange(5000, dtype=np.uint8)
    assert _pool_write(pool, data).tier is host and disk.marked_full and disk.capacity_bytes == 0
    assert _pool_write(pool, data).tier is host and len(calls) == 1  # the mark is fresh: no write tried
    time.sleep(0.35)
    block = _pool_write(pool, data)
    assert block.tier is disk and not disk.marked_full and disk.capacity_bytes == 1 << 20
    assert _load(disk, block) == data.tobytes()


def test_full_mark_stays_while_the_disk_shows_no_room(tmp_path, monkeypatch):
    """After the retry time, a disk that still shows no free space keeps the mark and costs no write."""
    monkeypatch.setattr(FileTier, "full_retry_s", 0.05)
    disk = FileTier(tmp_path, capacity_bytes=1 << 20)
    calls = _enospc_once(disk)
    pool = Pool([disk, HostTier(capacity_bytes=1 << 20, buffers=HostBufferPool(pinned=False))])
    data = np.arange(5000, dtype=np.uint8)
    _pool_write(pool, data)
    with monkeypatch.context() as m:
        m.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
        time.sleep(0.1)
        assert _pool_write(pool, data).tier is not disk and disk.marked_full and len(calls) == 1
    time.sleep(0.1)
    assert _pool_write(pool, data).tier is disk


def _returns_in_time(fn, timeout_s: float = 20.0):
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "blocked"
    return out[0]


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
@pytest.mark.parametrize("size", [1000, 3 * CHUNK])
def test_planted_file_is_refused_not_waited_on(tmp_path, plant, size):
    """A FIFO or symlink planted under a block's name: read raises OffloadError at once, free does not hang."""
    tier = FileTier(tmp_path, chunk_bytes=CHUNK)
    block = _store(tier, os.urandom(size))
    path = block.payload
    path.unlink()
    if plant == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere").write_bytes(b"x" * size)
        path.symlink_to(tmp_path / "elsewhere")
    err = _returns_in_time(lambda: _load(tier, block))
    assert isinstance(err, OffloadError) and re.search(r"saved tensor #3.*(not a regular file|symbolic link)", str(err))
    _returns_in_time(lambda: tier.free(block))
    assert not path.exists() and not path.is_symlink()


def test_created_directory_is_private(tmp_path):
    """A pool directory the tier creates is 0700; an existing one keeps its mode."""
    FileTier(tmp_path / "new" / "pool")
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "pool").st_mode) & 0o077 == 0
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)
    FileTier(tmp_path / "shared")
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o755


_CHILD = """
import sys, time
import numpy as np
from mcdla.runtime.tiers_file import FileTier
tier = FileTier(sys.argv[1])
data = np.ones(5000, dtype=np.uint8)
blocks = [tier.write(memoryview(data), reserved_bytes=tier.try_reserve(5000), label="t") for _ in range(3)]
print("ready", flush=True)
if sys.argv[2] == "exit":
    sys.stdin.readline()  # exit once the parent has seen the blocks
    sys.exit(0)
time.sleep(120)
"""


@pytest.mark.parametrize("end", ["sigkill", pytest.param("sigterm", marks=pytest.mark.slow),
                                 pytest.param("exit", marks=pytest.mark.slow)])  # ~2 s each: SIGKILL by default
def test_blocks_of_a_process_that_died_do_not_stay(tmp_path, end):
    """SIGTERM and a plain exit remove the process's blocks; after SIGKILL the next tier sweeps them, while
    a live process's blocks are never swept."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), end], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert len(list(tmp_path.glob("*.blk"))) == 3
        if end == "sigkill":
            assert FileTier(tmp_path).swept_blocks == 0  # the owner is alive
            assert len(list(tmp_path.glob("*.blk"))) == 3
            child.send_signal(signal.SIGKILL)
        elif end == "sigterm":
            child.send_signal(signal.SIGTERM)
        else:
            child.stdin.write("exit\n")
            child.stdin.flush()
        rc = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert rc == {"sigkill": -signal.SIGKILL, "sigterm": -signal.SIGTERM, "exit": 0}[end]
    if end == "sigkill":
        assert len(list(tmp_path.glob("*.blk"))) == 3
        assert FileTier(tmp_path).swept_blocks == 3
    assert list(tmp_path.glob("*.blk")) == []


def test_sweep_keeps_foreign_and_own_live_blocks(tmp_path):
    """Another host's blocks, a dead pid's under another host tag, this process's live tier: all kept."""
    tier = FileTier(tmp_path)
    mine = _store(tier, os.urandom(100))
    other_host = tmp_path / "mcdla-00000000-999999-0123abcd-0.blk"
    other_host.write_bytes(b"x")
    stale_same_pid = tmp_path / f"mcdla-{tiers_file._HOST_TAG}-{os.getpid()}-0badc0de-0.blk"
    stale_same_pid.write_bytes(b"x")
    assert sweep_dead_blocks(tmp_path) == 1  # the earlier process with this pid
    assert other_host.exists() and mine.payload.exists() and not stale_same_pid.exists()


def _crc_preserving_edit(data: bytes) -> bytes:
    """``data`` with its first 4 bytes changed and bytes 8-11 set so that its CRC-32 is unchanged.

    CRC-32 is affine over GF(2): crc(d ^ e) = crc(d) ^ crc(e) ^ crc(0...0) for messages of one length, so it
    suffices that e's part at bytes 8-11 cancels the CRC change of e's part at bytes 0-3 (a 32x32 system).
    """
    n = len(data)
    zero = zlib.crc32(bytes(n))

    def effect(e: bytes) -> int:
        return zlib.crc32(e) ^ zero

    def unit(bit: int) -> bytes:
        e = bytearray(n)
        e[8 + bit // 8] = 1 << (bit % 8)
        return bytes(e)

    head = bytearray(n)
    head[:4] = b"\xde\xad\xbe\xef"
    target = effect(bytes(head))
    rows = [(effect(unit(b)), 1 << b) for b in range(32)]  # (effect, which unit bits make it)
    basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (effect, combination)
    for eff, comb in rows:
        for pivot, (beff, bcomb) in basis.items():
            if eff >> pivot & 1:
                eff, comb = eff ^ beff, comb ^ bcomb
        if eff:
            pivot = eff.bit_length() - 1
            for other, (oeff, ocomb) in list(basis.items()):
                if oeff >> pivot & 1:
                    basis[other] = (oeff ^ eff, ocomb ^ comb)
            basis[pivot] = (eff, comb)
    comb = 0
    for pivot, (beff, bcomb) in basis.items():
        if target >> pivot & 1:
            comb ^= bcomb
    edit = bytearray(head)
    edit[8:12] = comb.to_bytes(4, "little")
    out = bytes(a ^ b for a, b in zip(data, edit))
    assert out != data and zlib.crc32(out) == zlib.crc32(data)
    return out


@pytest.mark.parametrize("digest", ["crc32", "blake2b"])
def test_crc_preserving_edit(tmp_path, digest):
    """An edit that keeps the CRC-32 passes the CRC tier (its documented limit) and fails the keyed digest."""
    tier = FileTier(tmp_path, digest=digest)
    data = os.urandom(4096)
    block = _store(tier, data)
    path = block.payload
    path.write_bytes(_crc_preserving_edit(path.read_bytes()))
    if digest == "crc32":
        assert _load(tier, block) != data
    else:
        with pytest.raises(OffloadError, match=r"corrupted \(keyed BLAKE2b [0-9a-f]{32}, written [0-9a-f]{32}\)"):
            _load(tier, block)


def test_unknown_digest_is_a_config_error(tmp_path):
    """FileTier(digest=...) outside the choices is one ConfigError line naming the field and the choices."""
    with pytest.raises(ConfigError, match=r"\.digest: got 'md5'; must be one of crc32, blake2b"):
        FileTier(tmp_path, digest="md5")


@pytest.mark.parametrize("direct", [False, True])
def test_keyed_digest_round_trip_and_damage(tmp_path, direct):
    """With digest="blake2b" multi-chunk blocks (direct or buffered) read back exactly; one flipped bit fails."""
    tier = FileTier(tmp_path, digest="blake2b", chunk_bytes=4096, direct=direct)
    data = os.urandom(10 * 4096 + 123)
    block = _store(tier, data)
    assert _load(tier, block) == data
    raw = bytearray(block.payload.read_bytes())
    raw[5000] ^= 0x10
    block.payload.write_bytes(raw)
    with pytest.raises(OffloadError, match="corrupted"):
        _load(tier, block)
