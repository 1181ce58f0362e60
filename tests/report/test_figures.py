"""The reproduction's figures (mcdla.report.figures), inspected as matplotlib Figure objects, not pixels."""

from __future__ import annotations

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Text

from mcdla.report.experiments import compute_pcie_sweep, run_matrix, speedup_rows
from mcdla.report.figures import (OKABE_ITO, breakdown_figure, modern_figure, sensitivity_figure, speedup_figure,
                                  sweep_figure)
from mcdla.report.sensitivity import SensitivityGrid


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def records():
    return run_matrix(["alexnet", "lstm"], workers=1)


def _texts(fig: Figure) -> list[Text]:
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _smallest_font_pt(fig: Figure) -> float:
    return min(t.get_fontsize() for t in _texts(fig))


def _lines_at(ax, y: float) -> list:
    return [l for l in ax.get_lines() if list(l.get_ydata()) == [y, y]]


def _modern_rows() -> list[dict]:
    """Two scenarios x three systems: an offload system, its no-offload twin (same preset), another preset."""
    rows = []
    for model, gpus in (("gpt3-175b", 1152), ("llama3-405b", 1152)):
        for system, preset, cap, hbm in (("dc-dla-2026", "dc-dla-2026", 250e9, 80e9),
                                         ("h100-recompute", "dc-dla-2026", 0.0, 80e9),
                                         ("gb200-nvl72", "gb200-nvl72", 240e9, 192e9)):
            rows.append({"model": model, "gpus": gpus, "system": system, "preset": preset, "feasible": True,
                         "speedup": 1.0 if system != "gb200-nvl72" else 2.5, "hbm_bytes": hbm,
                         "hbm_used_bytes": 0.6 * hbm, "offload_used_bytes": 0.3 * cap,
                         "offload_capacity_bytes": cap})
    return rows


def test_speedup_title_names_precision_policy_and_system(records) -> None:
    """The title carries the precision, the policy, the systems and the paper's 2.8x."""
    fig = speedup_figure(speedup_rows(records), precision="fp16", policy="vDNN-all")
    title = fig.get_suptitle()
    for part in ("fp16", "vDNN-all", "8 x V100", "dc-dla", "mc-dla", "paper: 2.8x"):
        assert part in title


def test_speedup_marks_the_paper_and_every_variant(records) -> None:
    """Both panels draw the 2.8x line; the variant panel has one labelled bar per variant plus this run; the
    legend sits above the bars."""
    variants = {"fp32, vDNN-all": 3.4, "fp16, lp planner": 1.6}
    fig = speedup_figure(speedup_rows(records), precision="fp16", policy="vDNN-all", variants=variants)
    main, side = fig.axes
    assert _lines_at(main, 2.8)
    assert [l for l in side.get_lines() if list(l.get_xdata()) == [2.8, 2.8]]
    ticks = [t.get_text() for t in side.get_yticklabels()]
    assert ticks[1:] == list(variants) and "fp16, vDNN-all" in ticks[0]
    assert [p.get_width() for p in side.patches][1:] == pytest.approx(list(variants.values()))
    fig.canvas.draw()
    assert not main.get_legend().get_window_extent().overlaps(main.get_window_extent())


def test_breakdown_text_is_legible_and_its_legend_covers_no_panel(records) -> None:
    """Every label is >= 8 pt; the one legend sits outside every panel and lists the four parts."""
    fig = breakdown_figure(records)
    assert _smallest_font_pt(fig) >= 8
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["compute", "recompute", "exposed virtualization",
                                                          "exposed communication"]
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_modern_marks_each_systems_hbm_capacity() -> None:
    """The memory panel has a capacity mark at each fitting bar's HBM size (GB)."""
    rows = _modern_rows()
    fig = modern_figure(rows)
    marks = [c for c in fig.axes[1].collections if isinstance(c, PathCollection)]
    heights = sorted(y for c in marks for _x, y in c.get_offsets())
    assert heights == pytest.approx(sorted(r["hbm_bytes"] / 1e9 for r in rows))
    assert "HBM capacity per GPU" in [t.get_text() for t in fig.axes[1].get_legend().get_texts()]


def test_modern_palette_is_colour_blind_safe_and_twins_share_a_hatched_colour() -> None:
    """Bars are Okabe-Ito colours, one per preset; the no-offload twin has its sibling's colour, hatched."""
    fig = modern_figure(_modern_rows())
    speed = fig.axes[0]
    by_label = {}
    for container in speed.containers:
        patch = container.patches[0]
        by_label[container.get_label()] = (mcolors.to_hex(patch.get_facecolor()), patch.get_hatch())
    palette = {c.lower() for c in OKABE_ITO}
    assert {color for color, _ in by_label.values()} <= palette
    assert by_label["h100-recompute"][0] == by_label["dc-dla-2026"][0] != by_label["gb200-nvl72"][0]
    assert by_label["h100-recompute"][1] and not by_label["dc-dla-2026"][1]
    assert _smallest_font_pt(fig) >= 8


def test_sensitivity_and_sweep_text_is_legible() -> None:
    """The sensitivity heatmap annotates every cell; it and the sweep mark 2.8x and write no text under 8 pt."""
    grid = SensitivityGrid(efficiencies=(0.3, 0.7), shares_bytes_per_s=(6.4e9, 12.8e9),
                           speedup=((3.0, 2.0), (6.0, 3.5)), feasible=((4, 4), (4, 4)), configurations=4,
                           precision="fp16", policy="vDNN-all")
    fig = sensitivity_figure(grid)
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert {"3.00", "2.00", "6.00", "3.50"} <= set(cells)
    assert "2.8x" in fig.axes[0].get_title() and "fp16" in fig.axes[0].get_title()
    assert _smallest_font_pt(fig) >= 8
    sweep = sweep_figure(compute_pcie_sweep(["alexnet"], scales=(1, 2), generations=(3, 4), workers=1))
    assert _lines_at(sweep.axes[0], 2.8) and _smallest_font_pt(sweep) >= 8
