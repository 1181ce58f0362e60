"""Which saved storages leave the device, and when: offload everything, a byte budget, or a plan.

NOTE [policy]
    budget None and no plan: offload every managed storage as it is saved. budget B: keep storages on the
    device while the kept bytes fit in B; beyond it offload the oldest kept ones first, since backward runs
    in reverse and uses them last. plan: offload exactly the storages of the modules the plan offloads,
    starting at the decision's tier, and fetch them at its ``prefetch_at`` module.

NOTE [plan budget]
    A plan is made for a device budget (``Plan.budget_bytes``), and the timing model
    (``docs/timing-model.md``) holds it: a layer's saved bytes are allocated when its forward starts, which
    waits until they fit; an offloaded tensor's bytes are freed only when its offload completes; a prefetch
    allocates when it starts and waits for room first. The runtime sees only the saved tensors, so it
    enforces the plan's share for them, ``Plan.saved_cap_bytes`` (NOTE [plan budgets] in
    ``mcdla.workload.plan``: the device budget less the static bytes, set by the planner; a plan without it
    gets ``budget_bytes``), the same way, as a cap on the resident managed saved bytes:
      - pack: a new storage of n bytes is admitted only when ``resident + n <= cap``; otherwise the forward
        waits, outside the step lock (NOTE [locking] in ``_sync``), for the oldest offload in flight to
        complete, and checks again. If no offload in flight would free memory, it does not wait: the storage
        is admitted over the cap (the engine calls such a plan infeasible; the runtime must not deadlock).
        So after every pack ``resident <= max(cap, bytes no offload in flight can free + n)``.
      - prefetch ahead (backward): the next fetch starts only when its bytes, and those of the offloaded
        storages backward needs before it (NOTE [prefetch] in ``_prefetch``), fit under the cap, in issue
        order (the engine's H2D stream waits at its head); it is retried whenever memory is freed (a use,
        an offload landing), and a tensor still not fetched when backward needs it is fetched on demand
        regardless.
    Allowance: none on the counted bytes beyond the engine's own float slack (``capacity * 1e-9``). Two
    differences are in the runtime's favour and documented rather than modelled: it admits storage by
    storage (the engine admits a layer's saved bytes at once), and it frees an offloaded storage when its
    copy completes (the engine also waits for the layer's forward to end). A storage being packed already
    exists in memory while its pack waits (the op that made it has run); the timing model counts it as the
    layer's output (a transient), which the saved-bytes view of ``mcdla validate`` leaves out, so device
    memory may exceed the counted bytes by that one storage during a wait.
    The cap is exactly the bound the plan's simulation keeps its saved bytes within: there static + saved +
    transients <= budget at every event, so saved <= budget - static, reached only at moments without
    transients. The runtime does not see transients (PyTorch allocates them), so while one is live the device
    may hold up to that transient more than the plan's simulation did, if the runtime's copies run behind the
    engine's. ``mcdla validate`` predicts with the same cap (NOTE [what is predicted] in
    ``mcdla.profile.predict``). ``budget=`` without a plan is another contract: it bounds what is *kept*;
    storages evicted beyond it stay resident until their copies land, bounded by the ``window`` of offloads
    in flight (a strict cap would make every pack beyond the budget wait for the copy it just started).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from mcdla.runtime._records import _Record, _State

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
_FIT_SLACK = 1e-9  # the engine's (mcdla.sim.device): absorbs float rounding only


def plan_cap_bytes(plan: Any) -> float | None:
    """The cap on resident saved bytes a plan sets, its ``saved_cap_bytes`` (NOTE [plan budget]); None for no
    plan or no cap."""
    cap = None if plan is None else plan.saved_cap_bytes
    return None if cap is None or math.isinf(cap) else float(cap)


def fits(resident_bytes: int, nbytes: int, cap_bytes: float | None) -> bool:
    """Whether ``nbytes`` more resident bytes stay within ``cap_bytes`` (None: no cap)."""
    return cap_bytes is None or resident_bytes + nbytes <= cap_bytes * (1.0 + _FIT_SLACK)


def freeing_offload(offloading: Iterable[_Record]) -> tuple[_Record, Future] | None:
    """The oldest offload in flight whose completion frees device memory, or None.

    For forward only: there every running copy frees its storage when it lands; in backward a copy whose
    tensor is wanted again lands without freeing (``_Step._offload_done``).
    """
    for rec in offloading:
        fut = rec.offload_future
        if rec.state is _State.OFFLOADING and fut is not None:
            return rec, fut
    return None


class _Policy:
    """Offload decisions of one step (NOTE [policy]); the kept set is its only state."""

    def __init__(self, config: _Config) -> None:
        self.cfg = config
        # read and written by the step's pack for a storage that fits (NOTE [hot path] in ``_step``)
        self.kept: OrderedDict[int, _Record] = OrderedDict()  # record id -> kept record, oldest first
        self.kept_bytes = 0
        self.budget: float | None = None if config.planned else config.budget_bytes  # what ``kept`` is held to
        # the placement of every storage when it does not depend on the module (no plan), else None
        self.fixed: _Placement | None = None if config.planned else (_OFFLOAD if config.budget_bytes is None
                                                                       else _KEEP)

    def __len__(self) -> int:
        return len(self.kept)

    def place(self, decided: Any) -> _Placement:
        """The placement of a storage saved where the plan's ``decided`` applies (None: no decision)."""
        if self.cfg.planned:
            if decided is not None and decided.offload:
                return _Placement(True, decided.start_tier, decided.prefetch_at)
            return _KEEP
        return _OFFLOAD if self.cfg.budget_bytes is None else _KEEP

    def admit(self, rec: _Record) -> Sequence[_Record]:
        """Records to offload now that ``rec`` was saved (itself, or the oldest kept beyond the budget)."""
        if rec.offload_now:
            return (rec,)
        budget = self.budget
        if budget is None:
            return ()
        self.kept[rec.id] = rec
        self.kept_bytes += rec.nbytes
        if self.kept_bytes <= budget:
            return ()  # the common case: nothing evicted, no list made
        evict = []
        while self.kept_bytes > budget and self.kept:
            _, old = self.kept.popitem(last=False)
            self.kept_bytes -= old.nbytes
            evict.append(old)
        return evict

    def forget(self, rec: _Record) -> None:
        """``rec`` is no longer on the device on the policy's account (used or released)."""
        if self.kept.pop(rec.id, None) is not None:
            self.kept_bytes -= rec.nbytes

    def clear(self) -> None:
        self.kept.clear()
        self.kept_bytes = 0
