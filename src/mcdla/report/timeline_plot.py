"""PNG of a step's measured memory timeline beside the simulator's predicted one (matplotlib, Agg).

Curves take the Okabe-Ito colours of :mod:`mcdla.report.figures` (colour-blind safe); the legend sits below the
axes so that it covers no curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mcdla.profile.timeline import MemoryTimeline  # noqa: E402
from mcdla.report.figures import OKABE_ITO  # noqa: E402

__all__ = ["plot_memory_timelines"]

_MIB = float(1 << 20)


def _draw(ax: plt.Axes, line: MemoryTimeline, label: str, color: str, end_s: float | None) -> None:
    times = [t * 1e3 for t in line.times_s]
    values = [b / _MIB for b in line.bytes]
    if end_s is not None and times and end_s * 1e3 > times[-1]:
        times.append(end_s * 1e3)
        values.append(values[-1])
    ax.step(times, values, where="post", color=color, lw=1.4, label=label)
    ax.axhline(line.peak_bytes / _MIB, color=color, lw=0.8, ls=":")
    if end_s is not None:
        ax.axvline(end_s * 1e3, color=color, lw=0.8, ls="--")


def plot_memory_timelines(
    measured: MemoryTimeline,
    predicted: MemoryTimeline,
    path: str | Path,
    *,
    title: str = "",
    measured_step_s: float | None = None,
    predicted_step_s: float | None = None,
    extra: Sequence[tuple[str, MemoryTimeline]] = (),
) -> Path:
    """Plot measured and predicted bytes over one step on a shared time axis; return the PNG path.

    Dotted lines mark each curve's peak, dashed lines each step's end (``*_step_s``, seconds). ``extra``
    adds further (label, timeline) curves, e.g. CUDA allocated bytes next to resident saved bytes.
    """
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    _draw(ax, measured, f"measured ({measured.what}), peak {measured.peak_bytes / _MIB:.1f} MiB", OKABE_ITO[3],
          measured_step_s)
    _draw(ax, predicted, f"predicted ({predicted.what}), peak {predicted.peak_bytes / _MIB:.1f} MiB", OKABE_ITO[0],
          predicted_step_s)
    for (label, line), color in zip(extra, (OKABE_ITO[2], OKABE_ITO[5], OKABE_ITO[1])):
        _draw(ax, line, label, color, None)
    ax.set_xlabel("time since step start (ms)", fontsize=9)
    ax.set_ylabel("MiB", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.set_title(title or "memory over one training step: measured vs predicted", fontsize=10)
    fig.legend(fontsize=8, loc="outside lower center", ncol=2)
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
