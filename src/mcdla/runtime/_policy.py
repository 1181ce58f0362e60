"""Which saved storages leave the device, and when: offload everything, a byte budget, or a plan.

NOTE [policy]
    budget None and no plan: offload every managed storage as it is saved. budget B: keep storages on the
    device while the kept bytes fit in B; beyond it offload the oldest kept ones first, since backward runs
    in reverse and uses them last. plan: offload exactly the storages of the modules the plan offloads,
    starting at the decision's tier, and fetch them at its ``prefetch_at`` module.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mcdla.runtime._records import _Record

__all__: list[str] = []


@dataclass(frozen=True, slots=True, kw_only=True)
class _Config:
    """The knobs of a virtualizer, validated by it (units: bytes)."""

    min_bytes: int
    window: int
    budget_bytes: float | None
    planned: bool
    trace_path: str | None


@dataclass(frozen=True, slots=True)
class _Placement:
    """What happens to a new storage: offload it now?, first tier to try, module that triggers its fetch."""

    offload_now: bool
    start_tier: int
    prefetch_at: str | None


_KEEP = _Placement(False, 0, None)
_OFFLOAD = _Placement(True, 0, None)


class _Policy:
    """Offload decisions of one step (NOTE [policy]); the kept set is its only state."""

    def __init__(self, config: _Config) -> None:
        self.cfg = config
        self._kept: OrderedDict[int, _Record] = OrderedDict()  # record id -> kept record, oldest first
        self._kept_bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def place(self, decided: Any) -> _Placement:
        """The placement of a storage saved where the plan's ``decided`` applies (None: no decision)."""
        if self.cfg.planned:
            if decided is not None and decided.offload:
                return _Placement(True, decided.start_tier, decided.prefetch_at)
            return _KEEP
        return _OFFLOAD if self.cfg.budget_bytes is None else _KEEP

    def admit(self, rec: _Record) -> list[_Record]:
        """Records to offload now that ``rec`` was saved (itself, or the oldest kept beyond the budget)."""
        if rec.offload_now:
            return [rec]
        budget = self.cfg.budget_bytes
        if self.cfg.planned or budget is None:
            return []
        self._kept[rec.id] = rec
        self._kept_bytes += rec.nbytes
        evict = []
        while self._kept_bytes > budget and self._kept:
            _, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.nbytes
            evict.append(old)
        return evict

    def forget(self, rec: _Record) -> None:
        """``rec`` is no longer on the device on the policy's account (used or released)."""
        if self._kept.pop(rec.id, None) is not None:
            self._kept_bytes -= rec.nbytes

    def clear(self) -> None:
        self._kept.clear()
        self._kept_bytes = 0
