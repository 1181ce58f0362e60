"""Each tier gives back exactly what was written, once, and fails loudly on damaged or missing blocks."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import OffloadError, RuntimeTierError
from mcdla.runtime import CompressTier, FileTier, HostBufferPool, HostTier, TierFullError


def _tiers(tmp_path):
    return {
        "host": HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False)),
        "file": FileTier(tmp_path / "f", chunk_bytes=4096),
        "compress": CompressTier(FileTier(tmp_path / "c")),
    }


def _store(tier, data: bytes, label="saved tensor #7 (module 'fc1', float32[4x8])"):
    reserved = tier.try_reserve(len(data))
    return tier.write(memoryview(data), reserved_bytes=reserved, label=label)


def _load(tier, block) -> bytes:
    out = np.empty(block.nbytes, dtype=np.uint8)
    tier.read_into(block, memoryview(out))
    return out.tobytes()


@pytest.mark.parametrize("kind", ["host", "file", "compress"])
@settings(max_examples=15, deadline=None)
@given(payload=st.binary(min_size=0, max_size=20_000), zeros=st.integers(min_value=0, max_value=50_000))
def test_round_trip_is_exact(tmp_path_factory, kind, payload, zeros):
    """write then read_into returns the same bytes (random and compressible payloads, chunk edges)."""
    tier = _tiers(tmp_path_factory.mktemp(kind))[kind]
    data = payload + bytes(zeros)
    block = _store(tier, data)
    assert _load(tier, block) == data
    tier.free(block)
    assert tier.used_bytes == 0 and tier.block_count == 0


@pytest.mark.parametrize("kind", ["host", "file", "compress"])
def test_read_after_free_is_fetched_twice(tmp_path, kind):
    """A block is given back once; reading it after release names the tensor and the tier."""
    tier = _tiers(tmp_path)[kind]
    block = _store(tier, b"x" * 5000)
    tier.free(block)
    with pytest.raises(OffloadError, match=r"saved tensor #7.*fetched twice.*" + kind):
        _load(tier, block)


def test_file_blocks_are_removed_on_free(tmp_path):
    """Each block is one file, deleted when the block is freed."""
    tier = FileTier(tmp_path)
    blocks = [_store(tier, bytes([i]) * 1000) for i in range(3)]
    assert len(tier.block_paths()) == 3
    for b in blocks:
        tier.free(b)
    assert list(tmp_path.iterdir()) == []


def test_corrupted_block_file_is_detected(tmp_path):
    """Flipping one byte on disk raises OffloadError naming tensor, file tier and checksum."""
    tier = FileTier(tmp_path)
    block = _store(tier, os.urandom(10_000))
    path = block.payload
    raw = bytearray(path.read_bytes())
    raw[5000] ^= 0xFF
    path.write_bytes(raw)
    with pytest.raises(OffloadError, match=r"saved tensor #7.*file:.*corrupted"):
        _load(tier, block)


def test_truncated_block_file_is_detected(tmp_path):
    """A block file cut short raises OffloadError saying truncated."""
    tier = FileTier(tmp_path)
    block = _store(tier, os.urandom(10_000))
    os.truncate(block.payload, 4000)
    with pytest.raises(OffloadError, match=r"saved tensor #7.*truncated"):
        _load(tier, block)


def test_missing_block_file_is_detected(tmp_path):
    """A deleted block file raises OffloadError saying missing."""
    tier = FileTier(tmp_path)
    block = _store(tier, b"y" * 3000)
    block.payload.unlink()
    with pytest.raises(OffloadError, match="missing"):
        _load(tier, block)


def test_corrupted_compressed_block_is_detected(tmp_path):
    """Damage inside compress(file:...) is caught by the file checksum before decompression."""
    tier = CompressTier(FileTier(tmp_path))
    block = _store(tier, bytes(50_000) + os.urandom(1000))
    path = block.payload.payload
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(raw)
    with pytest.raises(OffloadError, match="corrupted"):
        _load(tier, block)


def test_compress_shrinks_compressible_data(tmp_path):
    """Zeros compress: the inner tier stores far fewer bytes than were written."""
    tier = CompressTier(FileTier(tmp_path))
    block = _store(tier, bytes(1 << 20))
    assert tier.stored_bytes_of(block) < 10_000
    assert tier.inner.used_bytes == tier.stored_bytes_of(block)
    assert _load(tier, block) == bytes(1 << 20)


@pytest.mark.parametrize("inner", ["host", "file"])
def test_compress_stores_random_floats_raw(tmp_path, inner):
    """Random float32 (incompressible) is stored raw, byte for byte its size; ReLU outputs still compress."""
    inner_tier = (HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False)) if inner == "host"
                  else FileTier(tmp_path))
    tier = CompressTier(inner_tier)
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(1 << 18, dtype=np.float32).tobytes()  # 1 MiB
    relu = np.maximum(rng.standard_normal(1 << 18, dtype=np.float32), 0).tobytes()
    raw, packed = _store(tier, noise), _store(tier, relu)
    assert tier.stored_bytes_of(raw) == len(noise)
    assert tier.stored_bytes_of(packed) < 0.8 * len(relu)
    assert tier.inner.used_bytes == sum(tier.inner.reservation_bytes(tier.stored_bytes_of(b)) for b in (raw, packed))
    assert _load(tier, raw) == noise and _load(tier, packed) == relu


def test_disk_full_raises_tier_full_and_leaves_no_file(tmp_path):
    """ENOSPC while writing raises TierFullError (the pool spills on it) and removes the partial file."""
    tier = FileTier(tmp_path)

    def full(fd, data):
        os.write(fd, b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    tier._write_chunks = full
    with pytest.raises(TierFullError, match=r"saved tensor #7.*disk full"):
        _store(tier, b"z" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_io_error_raises_runtime_tier_error(tmp_path):
    """OS errors that neither fill nor close the medium raise RuntimeTierError naming the tensor, the tier and
    the errno (no spill)."""
    tier = FileTier(tmp_path)

    def broken(fd, data):
        raise OSError(errno.EFBIG, "File too large")

    tier._write_chunks = broken
    with pytest.raises(RuntimeTierError, match=rf"file:.*saved tensor #7.*Errno {errno.EFBIG}\]") as err:
        _store(tier, b"z" * 1000)
    assert not isinstance(err.value, TierFullError)


def test_closed_tier_refuses_blocks(tmp_path):
    """After close() a tier refuses reservations."""
    tier = FileTier(tmp_path)
    tier.close()
    with pytest.raises(RuntimeTierError, match="closed"):
        tier.try_reserve(10)


def test_unwritable_directory_is_a_config_error(tmp_path):
    """A file tier on a directory it cannot write is rejected at construction."""
    from mcdla.errors import ConfigError

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # running as root: permissions do not bind
        pytest.skip("permissions are not enforced for this user")
    with pytest.raises(ConfigError, match="not writable"):
        FileTier(ro)


_MOVING = {
    "file-buffered": lambda p: FileTier(p / "f", chunk_bytes=64 << 10, direct=False),
    "file-direct": lambda p: FileTier(p / "f", chunk_bytes=64 << 10),
    "compress(host)": lambda p: CompressTier(HostTier(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))),
    "compress(file)": lambda p: CompressTier(FileTier(p / "c", direct=False)),
}


@pytest.mark.parametrize("kind", list(_MOVING))
def test_bytes_that_change_while_written_are_not_reported_corrupted(tmp_path, kind):
    """NOTE [bytes that move]: a thread rewrites the second half of the source during every write.

    The first half is stable and must read back exactly; the second half may hold any mix of versions,
    but what the tier checks on reading is what it stored, so no read may fail as corrupted. Checksumming
    (or compressing) the source in place failed 29 of 30 such writes.
    """
    import threading

    import torch

    tier = _MOVING[kind](tmp_path)
    n = 4 << 20
    src = torch.zeros(n, dtype=torch.uint8)
    src[: n // 2] = torch.arange(n // 2, dtype=torch.int64).remainder(251).to(torch.uint8)
    stable = src[: n // 2].clone()
    stop = threading.Event()

    def rewrite() -> None:  # torch releases the GIL inside add_, so this races the tier's I/O thread
        tail = src[n // 2 :]
        while not stop.is_set():
            tail.add_(1)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for _ in range(12):
            block = tier.write(memoryview(src.numpy()), reserved_bytes=tier.try_reserve(n), label="saved tensor #8")
            out = torch.empty(n, dtype=torch.uint8)
            try:
                tier.read_into(block, memoryview(out.numpy()))
            finally:
                tier.free(block)
            assert torch.equal(out[: n // 2], stable)
    finally:
        stop.set()
        writer.join()
