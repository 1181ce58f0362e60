"""A lock whose holder also runs work posted from other threads and from destructors.

NOTE [locking]
    One lock guards a step's state and is never held while waiting for a transfer. Work that arrives from
    other threads or from destructors (transfer completions, dying handles) is posted to an inbox and run by
    whichever thread holds the lock when it releases it, or by the poster if the lock is free. A handle that
    dies during garbage collection inside a locked region therefore never re-enters that region, and no
    completion is lost: a poster that finds the lock taken has appended its task before the holder's final
    check of the inbox, or the holder's release lets the poster's own attempt succeed.

NOTE [posts during garbage collection]
    The cyclic collector runs finalizers at any allocation, in whatever thread allocated, and that thread
    may hold any lock at that moment: the report builder's, a tier's, the virtualizer's, an executor's
    shutdown lock. A posted task takes those locks (a dying handle releases its record: it samples the
    report, frees a block, may finish the step), so running it inside the collection deadlocked the thread
    on a lock it already held. ``post`` therefore only enqueues while this thread is collecting
    (``gc.callbacks`` marks the collecting thread); the task runs at the lock's next release: the next hook,
    transfer completion or settle of that step, or ``drain``, which the virtualizer calls before it reports
    on its steps (``live_steps``, ``report``, ``synchronize``, the next ``__enter__``). A reference-count
    death outside a collection still runs at once, so backward keeps freeing blocks as it goes.

NOTE [interrupted tasks]
    A task that raises a BaseException that is not an Exception (KeyboardInterrupt, SystemExit) is reported
    to ``on_error`` as a RuntimeTierError, the lock is released, and the exception propagates to whoever
    ran the task on the main thread (where signals arrive); the tasks still queued stay queued for the next
    holder. On any other thread (an I/O worker running a transfer's completion callback) it is recorded the
    same way and not re-raised: raising there ends the executor's worker thread and strands the queue, and
    the main thread sees the failure at its next hook. Before, the interrupt escaped ``release`` with the
    lock held and every later hook of the step hung.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from mcdla.errors import RuntimeTierError

__all__: list[str] = []

_collecting: int | None = None  # ident of the thread running a garbage collection now, if any


def _note_gc(phase: str, _info: dict[str, Any]) -> None:
    global _collecting
    _collecting = threading.get_ident() if phase == "start" else None


gc.callbacks.append(_note_gc)


def collecting_here() -> bool:
    """Whether this thread is inside a garbage collection (running finalizers of cyclic garbage)."""
    return _collecting is not None and _collecting == threading.get_ident()


class _InboxLock:
    """``with lock:`` guards state; ``post(task)`` runs ``task`` under the lock, now or at the next release.

    A task that raises is handed to ``on_error`` (the step records it as its failure) so that one bad
    completion cannot leave the lock held (NOTE [interrupted tasks]).
    """

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._lock = threading.Lock()
        self.acquire = self._lock.acquire  # ``acquire(); try: ... finally: release()``: no Python frame to enter
        # the bare lock and the inbox, for the hooks: ``raw.release()``, then ``run_posted()`` only if ``inbox``
        # is not empty, is ``release`` without its Python frame (a post racing it runs itself: see ``post``)
        self.raw = self._lock
        self._inbox: deque[Callable[[], None]] = deque()
        self.inbox = self._inbox
        self._on_error = on_error

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def _run(self, task: Callable[..., None], *args: Any) -> None:
        """Run one task under the lock; a failure goes to ``on_error`` (NOTE [interrupted tasks])."""
        try:
            task(*args)
        except BaseException as err:  # noqa: BLE001 - see ``_failed``
            self._failed(err)

    def _failed(self, err: BaseException) -> None:
        """A task raised ``err``: record it; re-raise an interrupt on the main thread (NOTE [interrupted tasks])."""
        if isinstance(err, Exception):
            self._on_error(err)  # recorded as the step's failure and raised later
            return
        self._on_error(RuntimeTierError(
            f"runtime: a bookkeeping task was interrupted ({type(err).__name__}); "
            "the step's state is incomplete"))
        if threading.current_thread() is threading.main_thread():
            raise err
        # an I/O worker (a transfer's completion callback) keeps draining: raising would
        # end the executor's thread and strand the tasks queued behind this one

    def release(self) -> None:
        """Run the posted tasks, then release; repeat if a task was posted in between."""
        if not self._inbox:  # the common case: nothing posted; a post racing the release is seen just after it
            self._lock.release()
            if not self._inbox or not self._lock.acquire(blocking=False):
                return
        while True:
            try:
                while self._inbox:
                    self._run(self._inbox.popleft())
            finally:
                self._lock.release()
            if not self._inbox or not self._lock.acquire(blocking=False):
                return

    def run_posted(self) -> None:
        """After a bare ``release`` of ``raw`` (the hooks' fast path, NOTE [hot path] in ``_step``): run what was
        posted meanwhile, if the lock is free; the caller checked ``inbox`` is not empty."""
        if self._lock.acquire(blocking=False):
            self.release()

    def post(self, task: Callable[[], None]) -> None:
        self._inbox.append(task)
        if not collecting_here() and self._lock.acquire(blocking=False):  # NOTE [posts during garbage collection]
            self.release()

    def call(self, task: Callable[..., None], *args: Any) -> None:
        """``post(lambda: task(*args))`` without building the closure when the lock is free (the common case:
        a handle dying on the thread that runs backward); tasks already queued keep their turn."""
        # NOTE [posts during garbage collection]; ``collecting_here()`` and ``_run``, inline (NOTE [hot path] in
        # ``_step``: every saved tensor's handle dies through here)
        if (not self._inbox and (_collecting is None or _collecting != threading.get_ident())
                and self._lock.acquire(blocking=False)):
            try:
                task(*args)
            except BaseException as err:  # noqa: BLE001 - see ``_failed``
                self._failed(err)
            finally:
                self._lock.release()  # ``release``, inline for an empty inbox
                if self._inbox:
                    self.run_posted()
            return
        self.post(functools.partial(task, *args))

    def drain(self) -> None:
        """Run tasks left in the inbox (posted during a garbage collection) if the lock is free; never waits."""
        if self._inbox and not collecting_here() and self._lock.acquire(blocking=False):
            self.release()
