"""A progress bar on stderr for the calls that take more than a few seconds (profile, probe, validate,
reproduce): a rich bar while stderr is a terminal, nothing otherwise or when switched off.

Long-running functions take a plain callback, ``on_progress(done, total, what)``, and know nothing of rich;
:func:`progress_bar` is the one place that turns those calls into a bar. It lives in ``profile``, the lowest
layer whose calls are slow, so that ``profile``, ``report`` and ``cli`` can all use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["OnProgress", "progress_bar", "notify"]


class OnProgress(Protocol):
    """``on_progress(done, total, what)``: ``done`` of ``total`` units of the phase ``what`` are finished."""

    def __call__(self, done: int, total: int, what: str = ...) -> None: ...


def notify(on_progress: OnProgress | None, done: int, total: int, what: str) -> None:
    """Call ``on_progress`` if there is one (the functions that report progress take it as optional)."""
    if on_progress is not None:
        on_progress(done, total, what)


@contextmanager
def progress_bar(what: str, *, enabled: bool | None = None, console: Console | None = None) -> Iterator[OnProgress]:
    """A transient bar on stderr; yields the ``on_progress`` callback that moves it.

    Args:
        what: the label shown before the first callback names a phase.
        enabled: True/False to force it; None shows it only when stderr is a terminal (never in a pipe, a
            file or a test's captured output).
        console: where to draw (default: a console on stderr).
    """
    err = console if console is not None else Console(stderr=True, highlight=False)
    shown = err.is_terminal if enabled is None else enabled
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=err, disable=not shown, transient=True)
    task = bar.add_task(what, total=None)

    def update(done: int, total: int, what: str = what) -> None:
        bar.update(task, completed=done, total=total, description=what)

    with bar:
        yield update
