"""The reproduction's levers and its sensitivity grid (mcdla.report.sensitivity) against direct simulations."""

from __future__ import annotations

import dataclasses
from statistics import geometric_mean

import numpy as np
import pytest
from matplotlib.contour import ContourSet
from scipy.interpolate import RegularGridInterpolator

from mcdla.errors import ConfigError
from mcdla.hardware import LinkKind, System, load_system
from mcdla.plan import policy_plan
from mcdla.report.experiments import run_matrix, with_pcie_share
from mcdla.report.figures import sensitivity_figure
from mcdla.report.sensitivity import PAPER_SPEEDUP, paper_crossings, sensitivity_grid
from mcdla.sim import pool_link, simulate
from mcdla.workload import zoo

_WORKLOADS = ("alexnet", "lstm")
_EFFICIENCIES = (0.2, 0.45, 0.7)
_SHARES = (6.4e9, 12.8e9, 19.2e9)


@pytest.fixture(scope="module")
def grid():
    return sensitivity_grid(_WORKLOADS, efficiencies=_EFFICIENCIES, shares_bytes_per_s=_SHARES, workers=1)


def _by_hand(system: System, efficiency: float, pcie_link_bytes_per_s: float | None) -> System:
    """``system`` with every device at ``efficiency`` and, if given, every PCIe link at that rate."""
    devices = tuple(dataclasses.replace(d, compute_efficiency=efficiency) for d in system.devices)
    links = tuple(dataclasses.replace(l, bytes_per_s=pcie_link_bytes_per_s)
                  if pcie_link_bytes_per_s is not None and l.kind is LinkKind.PCIE else l for l in system.links)
    return dataclasses.replace(system, devices=devices, links=links)


def test_pcie_share_is_each_gpus_rate_with_all_offloading() -> None:
    """dc-dla puts two GPUs behind each switch uplink: a 12.8 GB/s share is every PCIe link at 25.6 GB/s."""
    shared = with_pcie_share(load_system("dc-dla"), 12.8e9)
    assert [l.bytes_per_s for l in shared.links if l.kind is LinkKind.PCIE] == pytest.approx([25.6e9] * 12)
    assert pool_link(shared).offload_bytes_per_s == pytest.approx(12.8e9)
    assert with_pcie_share(load_system("mc-dla"), 12.8e9) == load_system("mc-dla")


def test_pcie_share_past_the_host_dram_is_refused() -> None:
    """Four GPUs share a 76.8 GB/s socket, so more than 19.2 GB/s per GPU is not a PCIe setting."""
    with pytest.raises(ConfigError, match=r"pcie_share: got 25 GB/s; must be at most 19.2 GB/s"):
        with_pcie_share(load_system("dc-dla"), 25e9)


def test_run_matrix_levers_equal_a_hand_built_system() -> None:
    """run_matrix at 30% efficiency and a 12.8 GB/s share times dc-dla as a hand-edited preset does."""
    record = run_matrix(["alexnet"], systems=("dc-dla",), parallels=("data",), compute_efficiency=0.3,
                        pcie_share_bytes_per_s=12.8e9, workers=1)[0]
    workload = zoo.build("alexnet", saves="cudnn")
    direct = simulate(_by_hand(load_system("dc-dla"), 0.3, 25.6e9), workload, policy_plan(workload, "all"),
                      parallel="data")
    assert record.iteration_time_s == pytest.approx(direct.iteration_time_s, rel=1e-12)


def test_grid_point_equals_direct_simulations(grid) -> None:
    """The grid at (45%, 12.8 GB/s) is the geo-mean of dc-dla / mc-dla iterations simulated one by one."""
    dc = _by_hand(load_system("dc-dla"), 0.45, 25.6e9)
    mc = _by_hand(load_system("mc-dla"), 0.45, None)
    ratios = []
    for name in _WORKLOADS:
        workload = zoo.build(name, saves="cudnn")
        plan = policy_plan(workload, "all")
        for parallel in ("data", "model"):
            ratios.append(simulate(dc, workload, plan, parallel=parallel).iteration_time_s
                          / simulate(mc, workload, plan, parallel=parallel).iteration_time_s)
    assert grid.speedup[1][1] == pytest.approx(geometric_mean(ratios), rel=1e-12)
    assert grid.feasible[1][1] == 4


def test_paper_crossings_interpolate_the_rows(grid) -> None:
    """Each row's 2.8x crossing lies between two grid shares whose speedups bracket 2.8, on their chord."""
    crossings = paper_crossings(grid)
    assert [eff for eff, _ in crossings] == list(_EFFICIENCIES)
    for eff, share in crossings:
        row = grid.speedup[_EFFICIENCIES.index(eff)]
        assert np.interp(share, _SHARES, row) == pytest.approx(PAPER_SPEEDUP, rel=1e-12)
        j = int(np.searchsorted(_SHARES, share))
        assert (row[j - 1] - PAPER_SPEEDUP) * (row[j] - PAPER_SPEEDUP) <= 0


def test_plotted_contour_is_where_the_grid_reads_2_8x(grid) -> None:
    """The figure's contour reads 2.8x from the grid wherever it crosses a cell edge, and passes every row crossing."""
    fig = sensitivity_figure(grid)
    contours = [c for c in fig.axes[0].collections if isinstance(c, ContourSet)]
    assert len(contours) == 1 and list(contours[0].levels) == [PAPER_SPEEDUP]
    vertices = np.concatenate([p.vertices for p in contours[0].get_paths() if len(p.vertices)])
    effs, shares = 100 * np.array(_EFFICIENCIES), np.array(_SHARES) / 1e9
    on_edges = vertices[np.isclose(vertices[:, 1][:, None], effs).any(axis=1)
                        | np.isclose(vertices[:, 0][:, None], shares).any(axis=1)]
    reading = RegularGridInterpolator((effs, shares), np.array(grid.speedup))
    assert len(on_edges) >= len(_EFFICIENCIES)
    assert reading(on_edges[:, ::-1]) == pytest.approx(PAPER_SPEEDUP, rel=1e-9)
    for eff, share in paper_crossings(grid):
        assert np.min(np.hypot(vertices[:, 0] - share / 1e9, vertices[:, 1] - 100 * eff)) < 1e-9
