"""The compute x PCIe sweep of the reproduction (mcdla.report.experiments) against hand-computed rates."""

from __future__ import annotations

import pytest

from mcdla.hardware import LinkKind, MemoryKind, load_system
from mcdla.report.experiments import compute_pcie_sweep, sweep_system
from mcdla.sim import pool_link

# Per GPU, all eight offloading at once: two GPUs share each switch uplink (half the x16 DMA rate, 0.8 x raw),
# four share a socket's DRAM. Host DRAM: Gen3 DDR4-2400 x 4 = 76.8, Gen4 DDR4-3200 x 8 = 204.8, Gen5/6
# DDR5-4800 x 12 = 460.8 GB/s (64-bit channels).
_CASES = {
    3: (76.8e9, min(0.8 * 16e9 / 2, 76.8e9 / 4)),     # 6.4 GB/s: the uplink binds
    4: (204.8e9, min(0.8 * 32e9 / 2, 204.8e9 / 4)),   # 12.8: the uplink
    5: (460.8e9, min(0.8 * 64e9 / 2, 460.8e9 / 4)),   # 25.6: the uplink (76.8 GB/s DDR4 would give 19.2)
    6: (460.8e9, min(0.8 * 128e9 / 2, 460.8e9 / 4)),  # 51.2: the uplink (DDR4 would give 19.2 again)
}


@pytest.mark.parametrize("gen", sorted(_CASES))
def test_sweep_system_moves_host_memory_with_the_pcie_generation(gen: int) -> None:
    dram, per_gpu = _CASES[gen]
    system = sweep_system(load_system("dc-dla"), 2.0, gen)
    hosts = [m for m in system.memories if m.kind is MemoryKind.HOST]
    assert len(hosts) == 2 and all(m.dram_bytes_per_s == dram and "GB/s" in m.source for m in hosts)
    assert all(l.bytes_per_s == pytest.approx(0.8 * 16e9 * 2 ** (gen - 3))
               for l in system.links if l.kind is LinkKind.PCIE)
    assert system.devices[0].peak_flops_per_s["fp16"] == pytest.approx(2 * 125e12)
    link = pool_link(system)
    assert link.offload_bytes_per_s == pytest.approx(per_gpu)
    assert link.prefetch_bytes_per_s == pytest.approx(per_gpu)


def test_sweep_honours_the_planner() -> None:
    """``planner`` reaches every record of the sweep (it used to run the fixed policy whatever was asked)."""
    records = compute_pcie_sweep(["alexnet"], scales=(1,), generations=(5,), planner="vdnn-conv", workers=1)
    assert len(records) == 2
    assert {r.policy for r in records} == {"vdnn-conv"}
    assert {r.pcie_generation for r in records} == {0, 5}
