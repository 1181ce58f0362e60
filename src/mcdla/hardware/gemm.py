"""A GPU's GEMM efficiency curve: the fraction of peak a matrix multiply reaches against its per-rank width."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.errors import HardwareError

__all__ = ["DEFAULT_HALF_WIDTH", "GemmEfficiency"]

DEFAULT_HALF_WIDTH = 150.0
"""Elements of per-rank GEMM width at which efficiency is half its peak: the DGX A100 fit of ``docs/llm.md``
(the ``gemm_efficiency`` of the ``dgx-a100`` preset), assumed for a GPU whose file gives no curve."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmEfficiency:
    """Fraction of peak a GEMM reaches as a function of its per-rank width ``x = hidden / tp`` (elements):
    ``peak_fraction * x / (x + half_width)``.

    Narrow per-rank matrices (small models, wide TP) fill fewer tiles and waves of the GPU. The curve belongs to
    the device, so it sits in the hardware description with its source; it is the only fitted part of the LLM
    time model (``docs/llm.md``, "Fitting").
    """

    peak_fraction: float
    half_width: float
    source: str = ""

    def __post_init__(self) -> None:
        p, w = self.peak_fraction, self.half_width
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise HardwareError(f"gemm_efficiency.peak_fraction: got {p!r}; must be in (0, 1]")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w >= 0):
            raise HardwareError(f"gemm_efficiency.half_width: got {w!r}; must be finite and >= 0")
        object.__setattr__(self, "peak_fraction", float(p))
        object.__setattr__(self, "half_width", float(w))

    def at(self, width: float) -> float:
        """Efficiency for a per-rank GEMM width (elements)."""
        return self.peak_fraction * width / (width + self.half_width)
