"""The per-device view of the path to the memory pool, as planners see it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.errors import HardwareError

__all__ = ["PoolLink"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLink:
    """Bandwidth between one device and its memory pool.

    Attributes:
        offload_bytes_per_s: device -> pool bandwidth (bytes/s), ``math.inf`` for unlimited.
        prefetch_bytes_per_s: pool -> device bandwidth (bytes/s).
        latency_s: one-way latency each transfer pays.
        shared_direction: True when offloads and prefetches share one channel (half duplex) rather than
            each having its own direction.
        pool_bytes: capacity of the pool (bytes).
        source: where the figures come from (a preset name and how they were derived).
    """

    offload_bytes_per_s: float
    prefetch_bytes_per_s: float
    latency_s: float = 0.0
    shared_direction: bool = False
    pool_bytes: float = math.inf
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("offload_bytes_per_s", "prefetch_bytes_per_s", "pool_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
                raise HardwareError(f"link.{name}: got {value!r}; must be > 0 (math.inf for unlimited)")
            object.__setattr__(self, name, float(value))
        if isinstance(self.latency_s, bool) or not isinstance(self.latency_s, (int, float)) or not (
            math.isfinite(self.latency_s) and self.latency_s >= 0
        ):
            raise HardwareError(f"link.latency_s: got {self.latency_s!r}; must be finite and >= 0")

    @classmethod
    def symmetric(cls, bytes_per_s: float, *, latency_s: float = 0.0, shared_direction: bool = False) -> PoolLink:
        """A link with the same bandwidth each way."""
        return cls(offload_bytes_per_s=bytes_per_s, prefetch_bytes_per_s=bytes_per_s, latency_s=latency_s,
                   shared_direction=shared_direction)
