"""A deterministic discrete-event queue: a heap of ``(time_s, priority, seq, handler, arg)``.

Ties in time resolve by priority, then by insertion order (``seq``), so a simulation replays identically every
run; there is no wall clock and no randomness. The queue knows nothing of the domain: an event is a callable
and one argument, called as ``handler(arg, time_s)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from mcdla.errors import SimError

__all__ = ["EventQueue"]


class EventQueue:
    """Pending events ordered by ``(time_s, priority, seq)``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Callable[[Any, float], None], Any]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time_s: float, handler: Callable[[Any, float], None], arg: Any = None, priority: int = 0) -> None:
        """Schedule ``handler(arg, time_s)`` at ``time_s`` (seconds); lower ``priority`` runs first on a tie."""
        if not time_s >= 0 or math.isinf(time_s):
            raise SimError(f"event time: got {time_s!r}; must be finite and >= 0")
        self._seq += 1
        heapq.heappush(self._heap, (time_s, priority, self._seq, handler, arg))

    def peek_time(self) -> float:
        """Time of the next event (s), ``math.inf`` when the queue is empty."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_and_run(self) -> float:
        """Run the next event; returns its time (s)."""
        time_s, _prio, _seq, handler, arg = heapq.heappop(self._heap)
        handler(arg, time_s)
        return time_s

    def run_until(self, time_s: float) -> int:
        """Run every event scheduled at or before ``time_s``, including ones they schedule; returns how many."""
        heap = self._heap
        count = 0
        while heap and heap[0][0] <= time_s:
            t, _prio, _seq, handler, arg = heapq.heappop(heap)
            handler(arg, t)
            count += 1
        return count
