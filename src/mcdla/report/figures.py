"""PNG figures of the reproduction (matplotlib, Agg backend: no display needed).

Each figure has a builder that returns the :class:`~matplotlib.figure.Figure` (what tests inspect) and a
``plot_*`` wrapper that saves it. Colours come from the Okabe-Ito palette, which stays distinguishable with
the common colour-vision deficiencies; text is at least 8 pt at the saved size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from mcdla.report.experiments import Record, mean_speedup, sweep_speedups  # noqa: E402
from mcdla.report.sensitivity import PAPER_SPEEDUP, SensitivityGrid  # noqa: E402

__all__ = ["OKABE_ITO", "SYSTEM_SETUP", "speedup_figure", "breakdown_figure", "sweep_figure", "sensitivity_figure",
           "modern_figure", "save_figure", "plot_speedups", "plot_breakdown", "plot_sweep", "plot_sensitivity"]

OKABE_ITO: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
"""Okabe & Ito's colour-blind-safe palette (jfly.iam.u-tokyo.ac.jp/color), blue first."""
SYSTEM_SETUP = "8 x V100 16 GB (DGX-1), dc-dla: PCIe 3.0 to host DDR4, mc-dla: NVLink memory-nodes"
"""The hardware both reproduction systems share, for figure titles (docs/hardware.md)."""
_PARTS = (
    ("compute_s", "compute", OKABE_ITO[0]),
    ("recompute_s", "recompute", OKABE_ITO[5]),
    ("exposed_virtualization_s", "exposed virtualization", OKABE_ITO[1]),
    ("exposed_communication_s", "exposed communication", OKABE_ITO[2]),
)
_LINE_COLORS = OKABE_ITO[:3] + OKABE_ITO[4:6] + OKABE_ITO[7:]  # vermillion is kept for the paper's 2.8x
_PAPER_LABEL = f"paper: {PAPER_SPEEDUP:g}x"
_DPI = 120
_PRESET_SHARE_GBPS, _PRESET_EFFICIENCY_PCT = 6.4, 70.0  # dc-dla: two GPUs per 12.8 GB/s uplink; 0.7 of peak


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG and release it."""
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def speedup_figure(rows: Sequence[dict[str, Any]], *, precision: str, policy: str,
                   variants: Mapping[str, float] | None = None) -> Figure:
    """Bars of mc-dla's speedup over dc-dla per workload (data and model parallel), the oracle's as a tick and
    the paper's 2.8x as a line; a second panel with the geometric mean of this run and of each variant given
    (label -> geo-mean speedup)."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    parallels = list(dict.fromkeys(r["parallel"] for r in rows))
    fig, (ax, side) = plt.subplots(1, 2, figsize=(12.5, 4.8), width_ratios=(2.6, 1), layout="constrained")
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
        ax.bar(xs, ys, width, color=OKABE_ITO[j], hatch="//" if j else None, edgecolor="white",
               label=f"mc-dla, {par}-parallel")
        ax.scatter(xs, oracle, marker="_", s=220, color="black", zorder=3, label="oracle (no virtualization)" if j == 0 else None)
    mean = mean_speedup(rows)
    ax.axhline(PAPER_SPEEDUP, color=OKABE_ITO[3], ls="--", lw=1.5, label=_PAPER_LABEL)
    ax.axhline(mean, color="grey", ls=":", lw=1.5, label=f"this run: {mean:.2f}x")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(workloads)), workloads, rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("speedup over dc-dla (x)", fontsize=10)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.01), ncol=3, borderaxespad=0)
    ax.set_ylim(0, 1.1 * max([r["dc-dla_s"] / r["oracle_s"] for r in rows if r["speedup"] is not None] + [mean, PAPER_SPEEDUP]))
    labels = [f"this run: {precision}, {policy}", *(variants or {})]
    values = [mean, *(variants or {}).values()]
    ys = list(range(len(values)))[::-1]
    bars = side.barh(ys, values, 0.7, color=[OKABE_ITO[4]] + [OKABE_ITO[6]] * (len(values) - 1),
                     edgecolor="black", lw=0.5)
    side.bar_label(bars, [f"{v:.2f}x" for v in values], fontsize=8, padding=2)
    side.axvline(PAPER_SPEEDUP, color=OKABE_ITO[3], ls="--", lw=1.5)
    side.set_yticks(ys, labels, fontsize=8)
    side.set_xlim(0, 1.25 * max(values + [PAPER_SPEEDUP]))
    side.set_xlabel("geo. mean speedup (x)", fontsize=9)
    side.set_title("variants", fontsize=9)
    fig.suptitle(f"MC-DLA speedup over DC-DLA, {precision}, {policy}: geo. mean {mean:.2f}x ({_PAPER_LABEL})\n"
                 f"{SYSTEM_SETUP}", fontsize=10)
    return fig


def breakdown_figure(records: Sequence[Record]) -> Figure:
    """Stacked iteration-time breakdown (time / oracle time) per workload and system, one panel per parallelism,
    the legend above the panels so that it covers no bar."""
    parallels = list(dict.fromkeys(r.parallel for r in records))
    workloads = list(dict.fromkeys(r.workload for r in records))
    systems = list(dict.fromkeys(r.system for r in records))
    fig, axes = plt.subplots(len(parallels), 1, figsize=(max(8, 1.5 * len(workloads) + 2), 3.6 * len(parallels) + 0.6),
                             squeeze=False, layout="constrained")
    width = 0.8 / max(1, len(systems))
    for ax, par in zip(axes[:, 0], parallels):
        for k, system in enumerate(systems):
            bottoms = np.zeros(len(workloads))
            xs = [i + (k - (len(systems) - 1) / 2) * width for i in range(len(workloads))]
            for field, label, color in _PARTS:
                values = []
                for w in workloads:
                    rec = next((r for r in records if r.workload == w and r.parallel == par and r.system == system), None)
                    oracle = next((r for r in records if r.workload == w and r.parallel == par and r.system == "oracle"), rec)
                    feasible = rec is not None and rec.feasible and oracle is not None
                    values.append(getattr(rec, field) / oracle.iteration_time_s if feasible else 0.0)
                ax.bar(xs, values, width, bottom=bottoms, color=color, edgecolor="white", lw=0.3, label=label)
                bottoms += values
            for x, top in zip(xs, bottoms):
                ax.text(x, top, f" {system.replace('-dla', '')} {top:.1f}", ha="center", va="bottom", fontsize=8,
                        rotation=90)
        ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right", fontsize=9)
        ax.set_ylabel("time / oracle time", fontsize=9)
        ax.set_ylim(0, 1.3 * max(ax.get_ylim()[1], 1.0))
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(f"Iteration-time breakdown, {par}-parallel (bars: dc-dla, mc-dla, oracle)", fontsize=10)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="outside upper center", ncol=len(unique), fontsize=9)
    return fig


def sweep_figure(records: Sequence[Record]) -> Figure:
    """mc-dla's mean speedup over dc-dla as device compute grows, one line per PCIe generation."""
    speedups = sweep_speedups(records)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    scales: list[float] = []
    markers = "osD^v<>"
    for k, (gen, by_scale) in enumerate(speedups.items()):
        scales = list(by_scale)
        ax.plot(scales, list(by_scale.values()), marker=markers[k % len(markers)], color=_LINE_COLORS[k % len(_LINE_COLORS)],
                label=f"dc-dla with PCIe {gen}.0")
    ax.set_xscale("log", base=2)
    ax.set_xticks(scales, [f"{s:g}x" for s in scales])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(PAPER_SPEEDUP, color=OKABE_ITO[3], ls="--", lw=1.2, label=_PAPER_LABEL)
    ax.set_xlabel("device compute (x V100)", fontsize=9)
    ax.set_ylabel("mc-dla speedup over dc-dla (geo. mean)", fontsize=9)
    ax.set_title("Compute grows, PCIe does not (data-parallel)", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def sensitivity_figure(grid: SensitivityGrid) -> Figure:
    """Heatmap of the geo-mean speedup over compute efficiency x PCIe share per GPU, each cell annotated, the
    paper's 2.8x as a contour and the dc-dla preset (70%, 6.4 GB/s) marked."""
    shares = np.array(grid.shares_bytes_per_s) / 1e9
    effs = 100 * np.array(grid.efficiencies)
    values = np.array(grid.speedup, dtype=float)
    fig, ax = plt.subplots(figsize=(7.2, 5.2), layout="constrained")
    mesh = ax.pcolormesh(shares, effs, values, shading="nearest", cmap="viridis",
                         norm=LogNorm(vmin=np.nanmin(values), vmax=np.nanmax(values)))
    bar = fig.colorbar(mesh, ax=ax, label="MC-DLA / DC-DLA speedup (geo. mean)")
    ticks = [t for t in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32) if np.nanmin(values) <= t <= np.nanmax(values)]
    bar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    bar.minorticks_off()
    middle = np.sqrt(np.nanmin(values) * np.nanmax(values))
    for i, eff in enumerate(effs):
        for j, share in enumerate(shares):
            v = values[i, j]
            ax.text(share, eff, "-" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if v < middle else "black")
    contour = ax.contour(shares, effs, values, levels=[PAPER_SPEEDUP], colors=[OKABE_ITO[3]], linewidths=2.5)
    ax.clabel(contour, fmt={PAPER_SPEEDUP: _PAPER_LABEL}, fontsize=9)
    cell_w, cell_h = shares[1] - shares[0], effs[1] - effs[0]
    ax.add_patch(Rectangle((_PRESET_SHARE_GBPS - cell_w / 2, _PRESET_EFFICIENCY_PCT - cell_h / 2), cell_w, cell_h,
                           fill=False, ec=OKABE_ITO[6], lw=2.5, label="dc-dla preset (70% of fp16 peak, 6.4 GB/s)"))
    ax.set_xticks(shares, [f"{s:g}" for s in shares])
    ax.set_yticks(effs, [f"{e:g}%" for e in effs])
    ax.set_xlabel("PCIe bandwidth per GPU, all 8 offloading at once (GB/s)", fontsize=9)
    ax.set_ylabel("device compute efficiency (% of V100 fp16 tensor peak)", fontsize=9)
    fig.legend(loc="outside lower center", fontsize=8)
    ax.set_title(f"Where MC-DLA's speedup is the paper's {PAPER_SPEEDUP:g}x ({grid.precision}, {grid.policy}, "
                 f"{grid.configurations} configurations)", fontsize=10)
    return fig


def modern_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """The modern reproduction (:func:`mcdla.report.modern.run_modern` rows): speedup over DC-DLA 2026 per
    scenario and system; HBM and offload-tier bytes per GPU with each system's HBM capacity marked.

    One colour per hardware preset; a no-offload twin on the same hardware has its sibling's colour, hatched."""
    scenarios = list(dict.fromkeys((r["model"], r["gpus"]) for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    width = 0.8 / max(1, len(systems))
    fig, (speed_ax, mem_ax) = plt.subplots(2, 1, figsize=(max(9, 2.4 * len(scenarios) + 3), 8.4), layout="constrained")
    for j, name in enumerate(systems):
        mine = [(i, r) for i, sc in enumerate(scenarios) for r in rows
                if (r["model"], r["gpus"]) == sc and r["system"] == name]
        color = _LINE_COLORS[presets.index(mine[0][1]["preset"]) % len(_LINE_COLORS)] if mine else "grey"
        hatch = None if mine and mine[0][1]["offload_capacity_bytes"] else ".."
        fitting = [(i + (j - (len(systems) - 1) / 2) * width, r) for i, r in mine if r["feasible"]]
        xs = [x for x, _r in fitting]
        speed_ax.bar(xs, [r["speedup"] if r["speedup"] is not None else np.nan for _x, r in fitting], width,
                     color=color, hatch=hatch, edgecolor="white", lw=0.3, label=name)
        hbm = [r["hbm_used_bytes"] / 1e9 for _x, r in fitting]
        mem_ax.bar(xs, hbm, width, color=color, hatch=hatch, edgecolor="white", lw=0.3)
        mem_ax.bar(xs, [r["offload_used_bytes"] / 1e9 for _x, r in fitting], width, bottom=hbm, color=color,
                   alpha=0.35, edgecolor=color, lw=0.5)
        mem_ax.scatter(xs, [r["hbm_bytes"] / 1e9 for _x, r in fitting], marker="_", s=90, color="black", lw=1.8,
                       zorder=3, label="HBM capacity per GPU" if j == 0 else None)
    labels = [f"{m}\n{n:,} GPUs" for m, n in scenarios]
    speed_ax.axhline(1.0, color="grey", lw=0.8)
    speed_ax.set_ylabel("speedup over DC-DLA 2026 (x)", fontsize=9)
    speed_ax.set_title("Best configuration per system (fits HBM + offload tier); dotted: no offload, recompute",
                       fontsize=10)
    mem_ax.set_ylabel("GB per GPU: HBM used (solid), offload tier used (light)", fontsize=9)
    mem_ax.set_title("Memory per GPU", fontsize=10)
    for ax in (speed_ax, mem_ax):
        ax.set_xticks(range(len(scenarios)), labels, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    top = max((r["speedup"] for r in rows if r.get("speedup") is not None), default=1.0)
    speed_ax.set_ylim(0, 1.1 * top)
    fig.legend(*speed_ax.get_legend_handles_labels(), loc="outside upper center", ncol=5, fontsize=8)
    mem_ax.set_ylim(0, 1.25 * max((r["hbm_used_bytes"] + r["offload_used_bytes"]) / 1e9 for r in rows if r["feasible"]))
    mem_ax.legend(fontsize=8, loc="upper left")
    return fig


def plot_speedups(rows: Sequence[dict[str, Any]], path: Path, *, precision: str = "fp16", policy: str = "vDNN-all",
                  variants: Mapping[str, float] | None = None) -> Path:
    """:func:`speedup_figure` saved as a PNG at ``path``."""
    return save_figure(speedup_figure(rows, precision=precision, policy=policy, variants=variants), path)


def plot_breakdown(records: Sequence[Record], path: Path) -> Path:
    """:func:`breakdown_figure` saved as a PNG at ``path``."""
    return save_figure(breakdown_figure(records), path)


def plot_sweep(records: Sequence[Record], path: Path) -> Path:
    """:func:`sweep_figure` saved as a PNG at ``path``."""
    return save_figure(sweep_figure(records), path)


def plot_sensitivity(grid: SensitivityGrid, path: Path) -> Path:
    """:func:`sensitivity_figure` saved as a PNG at ``path``."""
    return save_figure(sensitivity_figure(grid), path)
