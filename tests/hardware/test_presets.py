"""Bundled presets load, carry sources, and have the topology the docs describe."""

import math
from dataclasses import replace

import pytest

from mcdla.hardware import LinkKind, Topology, load_system, preset_names

REQUIRED = {"dc-dla", "mc-dla", "mc-dla-1n", "oracle", "hc-dla"}


def test_required_presets_exist() -> None:
    """The five presets of the simulator issue are bundled."""
    assert REQUIRED <= set(preset_names())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_figure_has_a_source(name) -> None:
    """Every device, memory and link of a preset carries a non-empty source."""
    system = load_system(name)
    for item in (*system.devices, *system.memories, *system.links):
        assert item.source.strip(), f"{name}: {item} has no source"


def test_dgx1_nvlink_lanes_are_six_per_gpu() -> None:
    """dc-dla: every V100 has six NVLink2 lanes of 25 GB/s (150 GB/s per direction in all)."""
    system = load_system("dc-dla")
    for dev in system.device_names:
        total = sum(l.bytes_per_s for l in system.links if l.kind is LinkKind.NVLINK and dev in (l.a, l.b))
        assert total == pytest.approx(150e9)


def test_dgx1_two_gpus_share_each_pcie_switch() -> None:
    """dc-dla: the pool route of gpu0 and gpu1 share the PCIe switch uplink, gpu2 does not."""
    topo = Topology(load_system("dc-dla"))
    shared = lambda a, b: set(topo.route(a, "host0").resources) & set(topo.route(b, "host0").resources)
    assert ("link", "pcie0", "cpu0") in shared("gpu0", "gpu1")
    assert ("link", "pcie0", "cpu0") not in shared("gpu0", "gpu2")


def test_mcdla_device_reaches_both_neighbours_at_link_speed() -> None:
    """mc-dla: each device's pool is its two ring neighbours, 75 GB/s per direction each; mc-dla-1n uses one."""
    two = Topology(load_system("mc-dla")).pool_routes("gpu3")
    one = Topology(load_system("mc-dla-1n")).pool_routes("gpu3")
    assert sorted(r.dst for r in two) == ["mem2", "mem3"] and [r.dst for r in one] == ["mem3"]
    assert sum(r.bottleneck_bytes_per_s for r in two) == pytest.approx(150e9)


def test_oracle_is_dcdla_with_unlimited_memory() -> None:
    """oracle: same links as dc-dla, infinite device memory."""
    oracle, dc = load_system("oracle"), load_system("dc-dla")
    assert all(math.isinf(d.hbm_bytes) for d in oracle.devices)
    assert oracle.links == dc.links


def test_rings_visit_every_device_over_existing_links() -> None:
    """Every preset's collective rings are cycles over existing links (Topology validates them)."""
    for name in preset_names():
        topo = Topology(load_system(name))
        for r in range(topo.ring_count):
            hops = list(topo.ring_hops(r))
            assert len(hops) == len(topo.system.devices)


@pytest.mark.parametrize("name", ["dc-dla", "oracle"])
def test_pcie_links_carry_the_dma_achievable_rate(name) -> None:
    """PCIe 3.0 x16 links run at what DMA achieves, 0.8 x the raw 16 GB/s per direction = 12.8 GB/s, and the
    source states both factors."""
    pcie = [l for l in load_system(name).links if l.kind is LinkKind.PCIE]
    assert len(pcie) == 12
    for link in pcie:
        assert link.bytes_per_s == pytest.approx(0.8 * 16e9)
        assert "16 GB/s" in link.source and "0.8" in link.source


def test_effective_hbm_rate_is_the_bandwidth_times_memory_efficiency() -> None:
    """The sustained HBM rate memory-bound kernels get is the device's HBM bandwidth times its memory efficiency:
    dgx-h100's two fields' product, 3.35 TB/s x 0.8 by hand, and 3.35 TB/s x 0.5 with the efficiency changed."""
    h100 = load_system("dgx-h100").devices[0]
    assert h100.effective_hbm_bytes_per_s == h100.hbm_bytes_per_s * h100.memory_efficiency
    assert h100.effective_hbm_bytes_per_s == pytest.approx(3.35e12 * 0.8, rel=1e-15)
    assert replace(h100, memory_efficiency=0.5).effective_hbm_bytes_per_s == pytest.approx(3.35e12 * 0.5, rel=1e-15)
