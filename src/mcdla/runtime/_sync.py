"""A lock whose holder also runs work posted from other threads and from destructors.

NOTE [locking]
    One lock guards a step's state and is never held while waiting for a transfer. Work that arrives from
    other threads or from destructors (transfer completions, dying handles) is posted to an inbox and run by
    whichever thread holds the lock when it releases it, or by the poster if the lock is free. A handle that
    dies during garbage collection inside a locked region therefore never re-enters that region, and no
    completion is lost: a poster that finds the lock taken has appended its task before the holder's final
    check of the inbox, or the holder's release lets the poster's own attempt succeed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType

__all__: list[str] = []


class _InboxLock:
    """``with lock:`` guards state; ``post(task)`` runs ``task`` under the lock, now or at the next release.

    A task that raises is handed to ``on_error`` (the step records it as its failure) so that one bad
    completion cannot leave the lock held.
    """

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._lock = threading.Lock()
        self._inbox: deque[Callable[[], None]] = deque()
        self._on_error = on_error

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def release(self) -> None:
        """Run the posted tasks, then release; repeat if a task was posted in between."""
        while True:
            while self._inbox:
                task = self._inbox.popleft()
                try:
                    task()
                except Exception as err:  # noqa: BLE001 - recorded as the step's failure and raised later
                    self._on_error(err)
            self._lock.release()
            if not self._inbox or not self._lock.acquire(blocking=False):
                return

    def post(self, task: Callable[[], None]) -> None:
        self._inbox.append(task)
        if self._lock.acquire(blocking=False):
            self.release()
