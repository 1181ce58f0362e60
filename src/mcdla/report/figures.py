"""PNG figures of the reproduction (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mcdla.report.experiments import Record, mean_speedup, sweep_speedups  # noqa: E402

__all__ = ["plot_speedups", "plot_breakdown", "plot_sweep"]

_PARTS = (
    ("compute_s", "compute", "#4c72b0"),
    ("recompute_s", "recompute", "#8172b2"),
    ("exposed_virtualization_s", "exposed virtualization", "#dd8452"),
    ("exposed_communication_s", "exposed communication", "#55a868"),
)


def plot_speedups(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Bars of mc-dla's speedup over dc-dla per workload (data and model parallel), oracle as a tick."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    parallels = list(dict.fromkeys(r["parallel"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(workloads) + 2), 4))
    width = 0.8 / max(1, len(parallels))
    for j, par in enumerate(parallels):
        xs, ys, oracle = [], [], []
        for i, w in enumerate(workloads):
            row = next((r for r in rows if r["workload"] == w and r["parallel"] == par), None)
            if row is None or row["speedup"] is None:
                continue
            xs.append(i + (j - (len(parallels) - 1) / 2) * width)
            ys.append(row["speedup"])
            oracle.append(row["dc-dla_s"] / row["oracle_s"])
        ax.bar(xs, ys, width, label=f"mc-dla, {par}-parallel")
        ax.scatter(xs, oracle, marker="_", s=200, color="black", zorder=3, label="oracle" if j == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(workloads)), workloads, rotation=30, ha="right")
    ax.set_ylabel("speedup over dc-dla (x)")
    ax.set_title(f"MC-DLA speedup over DC-DLA (geometric mean {mean_speedup(rows):.2f}x)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_breakdown(records: Sequence[Record], path: Path) -> Path:
    """Stacked iteration-time breakdown per workload and system, one panel per parallelism."""
    parallels = list(dict.fromkeys(r.parallel for r in records))
    workloads = list(dict.fromkeys(r.workload for r in records))
    systems = list(dict.fromkeys(r.system for r in records))
    fig, axes = plt.subplots(len(parallels), 1, figsize=(max(7, 1.6 * len(workloads) + 2), 3.4 * len(parallels)), squeeze=False)
    width = 0.8 / max(1, len(systems))
    for ax, par in zip(axes[:, 0], parallels):
        for k, system in enumerate(systems):
            bottoms = [0.0] * len(workloads)
            xs = [i + (k - (len(systems) - 1) / 2) * width for i in range(len(workloads))]
            for field, label, color in _PARTS:
                values = []
                for w in workloads:
                    rec = next((r for r in records if r.workload == w and r.parallel == par and r.system == system), None)
                    oracle = next((r for r in records if r.workload == w and r.parallel == par and r.system == "oracle"), rec)
                    norm = oracle.iteration_time_s if oracle else 1.0
                    feasible = rec is not None and rec.feasible
                    values.append(getattr(rec, field) / norm if feasible else 0.0)
                ax.bar(xs, values, width, bottom=bottoms, color=color, edgecolor="white", lw=0.3,
                       label=label if k == 0 else None)
                bottoms = [b + v for b, v in zip(bottoms, values)]
            for x, b in zip(xs, bottoms):
                ax.text(x, b, system.replace("-dla", ""), ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(range(len(workloads)), workloads, rotation=30, ha="right")
        ax.set_ylabel("time / oracle time")
        ax.set_title(f"Iteration-time breakdown, {par}-parallel")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(records: Sequence[Record], path: Path) -> Path:
    """mc-dla's mean speedup over dc-dla as device compute grows, one line per PCIe generation."""
    speedups = sweep_speedups(records)
    fig, ax = plt.subplots(figsize=(6, 4))
    scales: list[float] = []
    for gen, by_scale in speedups.items():
        scales = list(by_scale)
        ax.plot(scales, list(by_scale.values()), marker="o", label=f"dc-dla with PCIe {gen}.0")
    ax.set_xscale("log", base=2)
    ax.set_xticks(scales, [f"{s:g}x" for s in scales])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("device compute (x V100)")
    ax.set_ylabel("mc-dla speedup over dc-dla (geo. mean)")
    ax.set_title("Compute grows, PCIe does not (data-parallel)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
