"""A GPU's GEMM efficiency curve: the fraction of peak a matrix multiply reaches against its per-rank width and
the tokens it multiplies, and how much longer its backward takes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.errors import HardwareError

__all__ = ["DEFAULT_BACKWARD_RATIO", "DEFAULT_FP8_FRACTION", "DEFAULT_HALF_TOKENS", "DEFAULT_HALF_WIDTH",
           "GemmEfficiency"]

DEFAULT_HALF_WIDTH = 150.0
"""Elements of per-rank GEMM width at which efficiency is half its peak: the DGX A100 fit of ``docs/llm.md``
(the ``gemm_efficiency`` of the ``dgx-a100`` preset), assumed for a GPU whose file gives no curve."""

DEFAULT_HALF_TOKENS = 0.0
"""Tokens per GEMM at which efficiency is half its peak along the token dimension; 0 = no dependence (the fit
of ``docs/llm.md`` "Kernel times" found none on the published dense runs, and no value helps the MoE runs'
small expert GEMMs without breaking the dense families: ``python -m benchmarks.bench_moe_half_tokens``,
``docs/llm.md`` "Megatron-Bridge MoE")."""

DEFAULT_BACKWARD_RATIO = 2.0
"""Backward over forward time of a GEMM (its dgrad and wgrad, twice the FLOPs) at the same efficiency."""

DEFAULT_FP8_FRACTION = 0.76
"""Fraction of the bf16 curve's efficiency an fp8 GEMM reaches against the fp8 peak, for a GPU whose file gives
none: the device-independent least-squares fit on Megatron-Bridge 25.11's FP8 runs (``validate-llm --family
megatron-bridge-fp8``; with their recipes' partial recompute and offload, gradient-reduction and pipeline-send
overlap, and FlashAttention's softmax exponentials) by ``python -m benchmarks.bench_llm_kernel_fit``
(``benchmarks/RESULTS.md``, ``docs/llm.md`` "Kernel times"). The presets those runs ran on carry one per GPU chip,
fitted on that chip's rows (``node.gemm_efficiency.fp8_fraction``; ``docs/llm.md`` "Megatron-Bridge FP8", checked
out of sample by ``python -m benchmarks.bench_fp8_loo``): what an fp8 GEMM sustains of the datasheet peak is a
property of the part."""


def _check(name: str, value: object, low: float, high: float = math.inf, low_open: bool = False) -> float:
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if bad or value < low or (low_open and value == low) or value > high:  # type: ignore[operator]
        bound = f"in ({low:g}, {high:g}]" if high < math.inf else f"finite and {'>' if low_open else '>='} {low:g}"
        raise HardwareError(f"gemm_efficiency.{name}: got {value!r}; must be {bound}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmEfficiency:
    """Fraction of peak a GEMM reaches as a function of its per-rank width ``x = hidden / tp`` (elements) and the
    tokens it multiplies ``t`` (``micro_batch * seq / cp`` for a dense GEMM, the tokens of one local expert for
    a routed expert's grouped GEMM): ``peak_fraction * x / (x + half_width) * t / (t +
    half_tokens)``; its backward takes ``backward_ratio`` x its forward; in fp8 it reaches ``fp8_fraction`` of
    that efficiency against the fp8 peak; ``bf16_over_fp8``, where given, is the chip's measured ratio of dense
    bf16 to fp8 matmul throughput, and its bf16 (and fp16) GEMMs then run at its fp8 GEMM rate times it rather than
    at the bf16 peak (NOTE [bf16 from fp8] in :mod:`mcdla.sim.llm`); ``fp8_tn_only``: its fp8 GEMMs take only the TN layout (Hopper: Transformer
    Engine 2.9's ``is_non_tn_fp8_gemm_supported`` is false below compute capability 10.0), so a tensor a backward GEMM
    reads the other way is also written transposed (``mcdla.workload.transformer.fp8_cast_bytes_per_layer``).

    Narrow per-rank matrices (small models, wide TP) and short token counts fill fewer tiles and waves of the GPU.
    The curve belongs to the device, so it sits in the hardware description with its source; it is the fitted
    part of the LLM time model (``docs/llm.md``, "Fitting" and "Kernel times").
    """

    peak_fraction: float
    half_width: float
    source: str = ""
    half_tokens: float = DEFAULT_HALF_TOKENS
    backward_ratio: float = DEFAULT_BACKWARD_RATIO
    fp8_fraction: float = DEFAULT_FP8_FRACTION
    fp8_tn_only: bool = False
    bf16_over_fp8: float | None = None
    """Measured dense bf16 over fp8 matmul throughput of the chip (in (0, 1]); None: bf16 GEMMs at the bf16 peak."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_fraction", _check("peak_fraction", self.peak_fraction, 0, 1, low_open=True))
        object.__setattr__(self, "half_width", _check("half_width", self.half_width, 0))
        object.__setattr__(self, "half_tokens", _check("half_tokens", self.half_tokens, 0))
        object.__setattr__(self, "backward_ratio", _check("backward_ratio", self.backward_ratio, 0, low_open=True))
        object.__setattr__(self, "fp8_fraction", _check("fp8_fraction", self.fp8_fraction, 0, 1, low_open=True))
        if self.bf16_over_fp8 is not None:
            object.__setattr__(self, "bf16_over_fp8", _check("bf16_over_fp8", self.bf16_over_fp8, 0, 1, low_open=True))
        if not isinstance(self.fp8_tn_only, bool):
            raise HardwareError(f"gemm_efficiency.fp8_tn_only: got {self.fp8_tn_only!r}; must be true or false")

    def at(self, width: float, tokens: float = math.inf) -> float:
        """Efficiency for a per-rank GEMM width (elements) multiplying ``tokens`` tokens (default: saturated)."""
        along_tokens = 1.0 if math.isinf(tokens) or self.half_tokens == 0 else tokens / (tokens + self.half_tokens)
        return self.peak_fraction * width / (width + self.half_width) * along_tokens
