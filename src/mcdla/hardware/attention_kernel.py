"""A measured attention kernel build: how long its fused attention takes against the LLM model's own pricing.

The LLM time model prices a layer's causal attention core from its FLOPs, the fused kernel's HBM bytes and the
softmax's exponentials (NOTE [flash attention] in :mod:`mcdla.workload.transformer`); on Blackwell that lands
within 7 % of cuDNN 9.17 and later (``python -m benchmarks.bench_attention_kernels``). Older builds ran the same
shapes slower, and a run made with one of them took its times. A node names such builds (``attention_kernels``
in the system file) with the measured kernel's forward and backward times over the model's, at the sequence
lengths they were measured at, and a run's ``execution.attention_kernel`` picks one
(NOTE [attention kernel build] in :mod:`mcdla.sim.llm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mcdla.errors import ConfigError, HardwareError, brief

__all__ = ["AttentionKernel"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKernel:
    """One kernel build's measured forward and backward time over the model's, by sequence length.

    Attributes:
        name: the build as a run names it (e.g. ``cudnn-9.13.1``).
        seq_lens: the sequence lengths it was measured at, increasing.
        fwd: measured over modelled forward time at each of ``seq_lens``.
        bwd: the same for the backward.
        source: where the times come from.
    """

    name: str
    seq_lens: tuple[int, ...]
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        where = f"attention_kernels.{self.name}"
        if not self.seq_lens or not len(self.seq_lens) == len(self.fwd) == len(self.bwd):
            raise HardwareError(f"{where}: got {len(self.seq_lens)} seq_lens, {len(self.fwd)} fwd, {len(self.bwd)} "
                                "bwd; must be as many of each, at least one")
        if any(b <= a for a, b in zip(self.seq_lens, self.seq_lens[1:])):
            raise HardwareError(f"{where}.seq_lens: got {list(self.seq_lens)}; must be increasing")
        for field in ("fwd", "bwd"):
            for value in getattr(self, field):
                if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                    raise HardwareError(f"{where}.{field}: got {value!r}; must be finite numbers > 0")

    def scale(self, seq_len: int) -> tuple[float, float]:
        """The forward and backward factors at ``seq_len``: linear between the measured lengths; a one-line
        ConfigError outside them (no measurement to stand on)."""
        s = self.seq_lens
        if not s[0] <= seq_len <= s[-1]:
            span = f"{s[0]}" if len(s) == 1 else f"{s[0]} to {s[-1]}"
            raise ConfigError(f"execution.attention_kernel: got {brief(self.name)} at sequence {seq_len}; "
                              f"its times were measured at sequence {span} only")
        return float(np.interp(seq_len, s, self.fwd)), float(np.interp(seq_len, s, self.bwd))
