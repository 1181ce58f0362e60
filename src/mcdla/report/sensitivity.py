"""How the reproduction's headline depends on its two hardware levers: device speed and each GPU's PCIe share.

NOTE [sensitivity grid]
DC-DLA's vDNN iteration is bound by the bytes it moves over PCIe, MC-DLA's by compute, so their ratio is
set by the time a device spends computing per offloaded byte (its sustained FLOP/s: the preset's 70% of the
V100's fp16 tensor peak, or less) against the bandwidth each GPU gets to host memory when all eight offload
at once (6.4 GB/s on the DGX-1: two GPUs per switch uplink). The grid runs the full matrix (every zoo
workload, data- and model-parallel) at each (compute efficiency, PCIe share) and keeps the geometric-mean
MC-DLA / DC-DLA speedup over the configurations feasible on both, the number the paper reports as 2.8x.
MC-DLA's pool is its memory-nodes, so its runs depend on the efficiency alone and are shared by a row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import geometric_mean
from typing import Any

from mcdla.hardware import load_system
from mcdla.report.experiments import _map, with_compute_efficiency, with_pcie_share
from mcdla.workload import zoo

__all__ = ["PAPER_SPEEDUP", "COMPUTE_EFFICIENCIES", "PCIE_SHARES_BYTES_PER_S", "SensitivityGrid",
           "sensitivity_grid", "paper_crossings"]

PAPER_SPEEDUP = 2.8
"""MC-DLA's mean speedup over DC-DLA reported by the paper (Kwon & Rhu, MICRO 2018)."""
COMPUTE_EFFICIENCIES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
"""Sustained fraction of the device's peak FLOP/s (0.7: the presets' assumption, docs/hardware.md)."""
PCIE_SHARES_BYTES_PER_S: tuple[float, ...] = (3.2e9, 6.4e9, 9.6e9, 12.8e9, 16e9, 19.2e9)
"""PCIe bandwidth per GPU with all offloading at once (bytes/s): 6.4 GB/s is the DGX-1 (dc-dla), 12.8 GB/s a
whole x16 at DMA rate per GPU, 19.2 GB/s the host DRAM's share per GPU (four per 76.8 GB/s socket)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SensitivityGrid:
    """Geo-mean MC-DLA / DC-DLA speedups: ``speedup[i][j]`` at ``efficiencies[i]`` and ``shares_bytes_per_s[j]``
    (nan where no configuration is feasible on both), over ``feasible[i][j]`` of ``configurations``."""

    efficiencies: tuple[float, ...]
    shares_bytes_per_s: tuple[float, ...]
    speedup: tuple[tuple[float, ...], ...]
    feasible: tuple[tuple[int, ...], ...]
    configurations: int
    precision: str
    policy: str

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``sensitivity.json`` (nan becomes None)."""
        return {
            "efficiencies": list(self.efficiencies),
            "shares_bytes_per_s": list(self.shares_bytes_per_s),
            "speedup": [[None if math.isnan(v) else v for v in row] for row in self.speedup],
            "feasible": [list(row) for row in self.feasible],
            "configurations": self.configurations,
            "precision": self.precision,
            "policy": self.policy,
            "paper_speedup": PAPER_SPEEDUP,
        }


def sensitivity_grid(
    workloads: Iterable[str] | None = None,
    *,
    efficiencies: Sequence[float] = COMPUTE_EFFICIENCIES,
    shares_bytes_per_s: Sequence[float] = PCIE_SHARES_BYTES_PER_S,
    parallels: Sequence[str] = ("data", "model"),
    policy: str = "all",
    planner: str | None = None,
    precision: str = "fp16",
    saves: str = "cudnn",
    workers: int | None = None,
) -> SensitivityGrid:
    """The NOTE [sensitivity grid] over ``efficiencies`` x ``shares_bytes_per_s`` (bytes/s per GPU)."""
    names = tuple(workloads) if workloads is not None else zoo.names()
    built = [zoo.build(n, precision=precision, saves=saves) for n in names]
    dc, mc = load_system("dc-dla"), load_system("mc-dla")
    configs = [(w, p) for w in built for p in parallels]
    jobs = []
    for eff in efficiencies:
        mc_eff = with_compute_efficiency(mc, eff)
        jobs += [(mc_eff, w, {"parallel": p, "policy": policy, "planner": planner}) for w, p in configs]
        for share in shares_bytes_per_s:
            dc_point = with_pcie_share(with_compute_efficiency(dc, eff), share)
            jobs += [(dc_point, w, {"parallel": p, "policy": policy, "planner": planner}) for w, p in configs]
    records = iter(_map(jobs, workers))
    speedup, feasible = [], []
    for _eff in efficiencies:
        mc_runs = [next(records) for _ in configs]
        row, row_feasible = [], []
        for _share in shares_bytes_per_s:
            ratios = [d.iteration_time_s / m.iteration_time_s
                      for d, m in zip((next(records) for _ in configs), mc_runs) if d.feasible and m.feasible]
            row.append(geometric_mean(ratios) if ratios else math.nan)
            row_feasible.append(len(ratios))
        speedup.append(tuple(row))
        feasible.append(tuple(row_feasible))
    return SensitivityGrid(efficiencies=tuple(efficiencies), shares_bytes_per_s=tuple(shares_bytes_per_s),
                           speedup=tuple(speedup), feasible=tuple(feasible), configurations=len(configs),
                           precision=precision, policy=planner or f"vDNN-{policy}")


def paper_crossings(grid: SensitivityGrid, level: float = PAPER_SPEEDUP) -> list[tuple[float, float]]:
    """Per compute efficiency, the PCIe share (bytes/s) where the speedup falls to ``level``, interpolated
    linearly between neighbouring grid shares; rows that never cross are left out."""
    found = []
    for eff, row in zip(grid.efficiencies, grid.speedup):
        for (s0, v0), (s1, v1) in zip(zip(grid.shares_bytes_per_s, row), zip(grid.shares_bytes_per_s[1:], row[1:])):
            if (v0 - level) * (v1 - level) <= 0 and v0 != v1:
                found.append((eff, s0 + (level - v0) / (v1 - v0) * (s1 - s0)))
                break
    return found
