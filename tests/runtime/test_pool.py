"""Pool specs, tier placement and spill, capacity accounting and host size classes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError
from mcdla.runtime import CompressTier, FileTier, HostBufferPool, HostTier, Pool, TierFullError, parse_pool
from mcdla.runtime import size_class_bytes


def test_spec_builds_chain_in_order(tmp_path):
    """A comma-separated spec gives the tiers in order, with their names."""
    pool = parse_pool(f"host, file:{tmp_path}, compress(file:{tmp_path / 'z'})")
    assert [type(t) for t in pool.tiers] == [HostTier, FileTier, CompressTier]
    assert pool.names == ("host", f"file:{tmp_path}", f"compress(file:{tmp_path / 'z'})")


def test_spec_capacities_parse_units(tmp_path):
    """``@SIZE`` sets a tier's capacity in bytes, inside or outside compress(...)."""
    pool = parse_pool(f"host@8MiB,compress(file:{tmp_path}@1GB)@3GiB")
    assert pool.tiers[0].capacity_bytes == 8 * 2**20
    assert pool.tiers[1].capacity_bytes == 3 * 2**30
    assert pool.tiers[1].inner.capacity_bytes == 1e9


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "non-empty"),
        ("disk:/x", "unknown tier"),
        ("compress(host", "unbalanced"),
        ("host)", "unbalanced"),
        ("host@lots", "capacity"),
        ("device:x", "integer"),
        ("host,host", "appears twice"),
        ("file:", "file path"),
    ],
)
def test_bad_specs_raise_one_line_config_errors(spec, fragment):
    """Malformed specs raise a one-line ConfigError that names the problem."""
    with pytest.raises(ConfigError) as err:
        parse_pool(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_device_tier_needs_cuda():
    """``device:N`` on a machine without that GPU is a ConfigError, not a crash."""
    import torch

    if torch.cuda.device_count() > 1:
        pytest.skip("this machine has a second GPU")
    with pytest.raises(ConfigError, match="device:1"):
        parse_pool("device:1")


def test_tier_index_by_name_kind_and_pool(tmp_path):
    """Plans name tiers by exact name, by kind, or 'pool' (the first tier)."""
    pool = parse_pool(f"host,file:{tmp_path}")
    assert pool.tier_index("pool") == 0
    assert pool.tier_index("file") == 1
    assert pool.tier_index(f"file:{tmp_path}") == 1
    with pytest.raises(ConfigError, match="not in pool"):
        pool.tier_index("device")


def test_full_tier_spills_to_next(tmp_path):
    """A reservation that does not fit the first tier lands in the next one."""
    pool = parse_pool(f"host@16KiB,file:{tmp_path}")
    first = pool.reserve(12 * 1024, label="a")
    second = pool.reserve(12 * 1024, label="b")
    assert first[0] == 0 and second[0] == 1


def test_full_pool_names_the_tensor_and_the_tiers():
    """When no tier has room the error names the tensor and every tier's free bytes."""
    pool = parse_pool("host@8KiB")
    with pytest.raises(TierFullError, match=r"saved tensor #3.*host"):
        pool.reserve(64 * 1024, label="saved tensor #3")


def test_enospc_while_writing_spills_and_marks_tier_full(tmp_path):
    """A tier that reports ENOSPC mid-write is marked full and the block goes to the next tier."""
    import errno

    pool = parse_pool(f"file:{tmp_path / 'a'},host")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    pool.tiers[0]._write_chunks = full
    data = memoryview(np.arange(5000, dtype=np.uint8))
    idx, reserved = pool.reserve(len(data), label="t")
    block = pool.write(data, index=idx, reserved_bytes=reserved, label="t")
    assert block.tier is pool.tiers[1]
    assert pool.tiers[0].used_bytes == 0 and pool.tiers[0].capacity_bytes == 0
    assert list((tmp_path / "a").iterdir()) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**40))
def test_size_class_bounds(n):
    """A size class is at least the request and at most 12.5% (or 4 KiB) above it."""
    c = size_class_bytes(n)
    assert c >= n
    assert c <= max(4096, math.ceil(n * 1.125))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=40_000)), min_size=1, max_size=40))
def test_used_bytes_never_exceed_capacity(ops):
    """Whatever sequence of stores and frees, a tier's used bytes stay within its capacity and return to 0."""
    tier = HostTier(capacity_bytes=100_000, buffers=HostBufferPool(pinned=False))
    blocks = []
    for store, n in ops:
        if store:
            got = tier.try_reserve(n)
            if got is not None:
                blocks.append(tier.write(memoryview(bytes(n)), reserved_bytes=got, label="x"))
        elif blocks:
            tier.free(blocks.pop(0))
        assert 0 <= tier.used_bytes <= tier.capacity_bytes
    for b in blocks:
        tier.free(b)
    assert tier.used_bytes == 0 and tier.block_count == 0


def test_host_pool_reuses_buffers_by_class():
    """A released buffer is handed out again for a request of the same class."""
    pool = HostBufferPool(pinned=False)
    a = pool.acquire(100_000)
    ptr = a.data_ptr()
    pool.release(a)
    b = pool.acquire(99_000)
    assert size_class_bytes(99_000) == size_class_bytes(100_000) and b.data_ptr() == ptr
    assert pool.in_use_bytes == size_class_bytes(100_000) and pool.cached_bytes == 0
    pool.release(b)
    pool.trim()
    assert pool.cached_bytes == 0 and pool.in_use_bytes == 0


def test_pool_from_tiers_and_mixed_list(tmp_path):
    """Pools can be given as tier objects; an empty pool is rejected."""
    host = HostTier(capacity_bytes=1 << 20)
    pool = Pool([host, FileTier(tmp_path)])
    assert pool.tier_index("host") == 0
    with pytest.raises(ConfigError, match="no tiers"):
        Pool([])
