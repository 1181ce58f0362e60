"""mcdla.profile.probe: tier throughput fits, this machine as a System, and bad input."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import ConfigError
from mcdla.hardware import load_system, save_system
from mcdla.profile import probe as probe_module
from mcdla.profile.probe import MachineProbe, TierProbe, _fit, probe_pool, probe_system, probe_tiers
from mcdla.runtime.pool import Block, Tier

SIZES = (64 << 10, 1 << 20)


@settings(max_examples=50, deadline=None)
@given(
    bw=st.floats(min_value=1e6, max_value=1e12),
    lat=st.floats(min_value=0.0, max_value=1e-2),
)
def test_fit_recovers_an_exact_line(bw: float, lat: float) -> None:
    """Times that follow latency + bytes/bandwidth exactly give back that bandwidth and latency."""
    sizes = [1 << 16, 1 << 20, 1 << 24]
    got_bw, got_lat = _fit(sizes, [lat + s / bw for s in sizes])
    assert got_bw == pytest.approx(bw, rel=1e-6)
    assert got_lat == pytest.approx(lat, rel=1e-6, abs=1e-12)


def test_fit_never_returns_a_negative_latency() -> None:
    """Noisy times that would fit a negative intercept fall back to total bytes over total time."""
    bw, lat = _fit([100, 200], [2.0, 2.5])  # intercept 1.5 s (fine) ...
    assert lat == pytest.approx(1.5)
    bw, lat = _fit([100, 200], [1.0, 3.0])  # ... intercept -1 s: not physical
    assert lat == 0.0 and bw == pytest.approx(300 / 4.0)


class _SlowTier(Tier):
    """A tier that takes 2 ms + bytes / 200 MB/s to write and 1 ms + bytes / 400 MB/s to read: on ``clock`` if
    given, else in real time (sleeps)."""

    kind = "slow"

    def __init__(self, clock: Any = None) -> None:
        super().__init__(name="slow", capacity_bytes=float("inf"), io_threads=0)
        self.spend = time.sleep if clock is None else clock.spend

    def _write(self, data: memoryview, *, reserved_bytes: int, label: str) -> Block:
        self.spend(2e-3 + len(data) / 200e6)
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=bytes(data))

    def _read_into(self, block: Block, out: memoryview) -> None:
        self.spend(1e-3 + block.nbytes / 400e6)
        out[:] = block.payload

    def _discard(self, block: Block) -> None:
        block.payload = None


def test_probe_measures_a_tier_with_known_speed(monkeypatch: pytest.MonkeyPatch, fake_clock) -> None:
    """Probing a tier of known latency and bandwidth recovers them: each write and read is timed on its own,
    and the fit is exact. The probe's clock is one only the tier advances (the ``fake_clock`` fixture)."""
    clock = fake_clock
    monkeypatch.setattr(probe_module, "time", clock)
    probe = probe_pool(_SlowTier(clock), sizes_bytes=(2 << 20, 8 << 20), repeats=3)
    assert probe.link.offload_bytes_per_s == pytest.approx(200e6, rel=1e-6)
    assert probe.link.prefetch_bytes_per_s == pytest.approx(400e6, rel=1e-6)
    assert probe.link.latency_s == pytest.approx((2e-3 + 1e-3) / 2, rel=1e-6)
    assert [w for _, w, _ in probe.samples] == pytest.approx([2e-3 + n / 200e6 for n in (2 << 20, 8 << 20)])


def test_probe_measures_a_sleeping_tier_in_real_time() -> None:
    """The same tier sleeping for real: the probe reads the real clock. Loose bounds: a loaded machine wakes
    sleepers late (which only makes transfers look slower), but never early."""
    probe = probe_pool(_SlowTier(), sizes_bytes=(2 << 20, 8 << 20), repeats=3)
    for n, w, r in probe.samples:
        assert w >= 2e-3 + n / 200e6 and r >= 1e-3 + n / 400e6
    assert probe.link.offload_bytes_per_s > 0 and probe.link.prefetch_bytes_per_s > 0


def test_probe_tiers_measures_host_file_and_compress(tmp_path: Path) -> None:
    """All three tiers give positive bandwidths, and the file tier leaves no block files behind."""
    links = probe_tiers(tmp_path, sizes_bytes=SIZES, repeats=1)
    assert set(links) == {"host", "file", "compress"}
    for link in links.values():
        assert link.offload_bytes_per_s > 0 and link.prefetch_bytes_per_s > 0
    assert list(tmp_path.glob("*.blk")) == []


def test_unwritable_directory_is_one_line_error(tmp_path: Path) -> None:
    """A pool directory without write permission raises a one-line ConfigError naming it."""
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    with pytest.raises(ConfigError, match="not writable"):
        probe_pool(f"file:{locked}", sizes_bytes=SIZES, repeats=1)


def test_directory_under_a_file_is_one_line_error(tmp_path: Path) -> None:
    """A pool directory that cannot be created (a file is in the way) raises ConfigError."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot create directory"):
        probe_pool(f"file:{blocker / 'pool'}", sizes_bytes=SIZES, repeats=1)


def test_bad_sizes_are_rejected() -> None:
    """Sizes must be positive."""
    with pytest.raises(ConfigError, match="probe sizes"):
        probe_pool("host", sizes_bytes=(0,))


def _machine() -> MachineProbe:
    from mcdla.hardware import PoolLink

    def tier(name: str, w: float, r: float) -> TierProbe:
        link = PoolLink(offload_bytes_per_s=w, prefetch_bytes_per_s=r, latency_s=1e-5)
        return TierProbe(tier=name, link=link, samples=())

    return MachineProbe(
        host="testhost", device="cpu", flops_per_s={"fp32": 1e11}, memory_bytes=16e9, memory_bytes_per_s=2e10,
        tiers={"host": tier("host", 3e10, 3e10), "file": tier("file:/x", 3e9, 5e9)}, measured_at="2030-01-01T00:00Z",
    )


def test_probe_system_round_trips_through_a_file(tmp_path: Path) -> None:
    """The probed system saves as YAML, loads back, and its pool link has the slower file direction."""
    system = probe_system(_machine())
    path = tmp_path / "machine.yaml"
    save_system(system, path)
    back = load_system(path)
    assert back.pool_of("dev0") == ("pool-file",)
    link = next(l for l in back.links if l.b == "pool-file")
    assert link.bytes_per_s == pytest.approx(3e9)
    assert "measured on testhost" in back.devices[0].source
    assert back.devices[0].flops_per_s("fp32") == pytest.approx(1e11)


def test_probe_system_rejects_an_unprobed_pool_tier() -> None:
    """Asking for a pool tier that was not probed is a one-line ConfigError listing the probed ones."""
    with pytest.raises(ConfigError, match="probed tiers are host, file"):
        probe_system(_machine(), pool_tier="compress")
