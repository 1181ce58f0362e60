"""Which offloaded storage to fetch next in backward, within a bounded window.

NOTE [prefetch]
    Backward's first unpack starts prefetching. Offloaded storages are fetched in reverse forward order (a
    cursor walks the offload order down), or, for a plan's ``prefetch_at``, when that module's backward
    begins (requests go first). At most ``window`` storages are fetching or fetched and not yet used; each
    use frees a slot. Under a plan's budget the next fetch also waits until its bytes fit (NOTE [plan budget]
    in ``_policy``), together with those of the offloaded storages backward needs before it that are not
    back yet (packed after it: NOTE [safe prefetch] in ``mcdla.sim.device``, so a tensor fetched early for a
    far ``prefetch_at`` does not crowd out one needed sooner); it stays at the head and is retried when
    memory is freed (a use, an offload landing). A
    save after backward began is a new forward phase (the next micro-batch): the order is compacted and the
    cursor restarts at the end when that phase's backward begins.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

from mcdla.runtime._records import _Record, _State

__all__: list[str] = []


class _Prefetcher:
    """Prefetch order and window of one step (all calls under the step's lock)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._order: list[_Record] = []  # offloaded records of this forward phase, in pack order
        self._cursor: int | None = None  # next index of _order to consider (moves down)
        self._requested: deque[_Record] = deque()  # plan-triggered, fetched first
        self._by_trigger: dict[str, list[_Record]] = defaultdict(list)  # prefetch_at module -> records
        self.in_window = 0  # records fetching, or fetched and not yet used
        self.in_backward = False

    def entries(self) -> int:
        return len(self._order) + len(self._requested) + sum(map(len, self._by_trigger.values()))

    def clear(self) -> None:
        self._order.clear()
        self._requested.clear()
        self._by_trigger.clear()
        self._cursor = None

    # -- forward -------------------------------------------------------------------------------------
    def watch(self, rec: _Record) -> None:
        """Remember an offloaded record: in the order, or under its trigger module."""
        if rec.prefetch_at is None:
            self._order.append(rec)
        else:
            self._by_trigger[rec.prefetch_at].append(rec)

    def new_forward_phase(self) -> None:
        self.in_backward = False
        self._cursor = None
        self._order = [r for r in self._order if r.state in (_State.OFFLOADING, _State.OFFLOADED)]

    # -- backward ------------------------------------------------------------------------------------
    def begin_backward(self) -> None:
        if not self.in_backward:
            self.in_backward = True
            if self._cursor is None:
                self._cursor = len(self._order) - 1

    def request(self, module: str) -> None:
        """The backward of ``module`` began: its waiting records go to the front."""
        self.begin_backward()
        self._requested.extend(self._by_trigger.pop(module, ()))

    def take(self, rec: _Record) -> None:
        """``rec`` starts fetching: it occupies a window slot until used or released."""
        if not rec.counted_window:
            rec.counted_window = True
            self.in_window += 1

    def give_back(self, rec: _Record) -> None:
        if rec.counted_window:
            rec.counted_window = False
            self.in_window -= 1

    def bytes_needed_before(self, rec: _Record) -> int:
        """Bytes of the offloaded storages, not fetched yet, that backward uses before ``rec``: those packed
        after it (backward runs in reverse pack order on a chain)."""
        waiting = (r for group in (self._order, self._requested, *self._by_trigger.values()) for r in group)
        return sum(r.nbytes for r in waiting if r.id > rec.id and r.state is _State.OFFLOADED)

    def may_fetch(self) -> bool:
        """Whether :meth:`next` may find a record (a cheap test the unpack hook makes before a top-up)."""
        return (self.in_backward and self.in_window < self.window
                and (bool(self._requested) or (self._cursor is not None and self._cursor >= 0)))

    def next(self, fits: Callable[[_Record], bool] | None = None) -> _Record | None:
        """The next record to fetch ahead, if backward runs, the window has room and ``fits`` (if given)
        accepts it; a record that does not fit stays next."""
        if not self.in_backward or self.in_window >= self.window:
            return None
        while self._requested:
            rec = self._requested[0]
            if rec.state is not _State.OFFLOADED:
                self._requested.popleft()
                continue
            if fits is not None and not fits(rec):
                return None
            return self._requested.popleft()
        while self._cursor is not None and self._cursor >= 0:
            rec = self._order[self._cursor]
            if rec.state is not _State.OFFLOADED:
                self._cursor -= 1
                continue
            if fits is not None and not fits(rec):
                return None
            self._cursor -= 1
            return rec
        return None
