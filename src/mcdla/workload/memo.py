"""Memoised pure functions of frozen records, for the analytical model's hot path.

The LLM time model (:func:`mcdla.sim.llm_step`) derives the same per-layer figures (FLOPs, bytes, parameter
groups, the pipeline split) from one ``(TransformerSpec, Execution)`` several times per evaluation, and a
configuration search evaluates tens of thousands of executions of one model. Both records are frozen and hash in
well under a microsecond, so a small least-recently-used cache keyed on the arguments returns the figure computed
once instead of recomputing it. Only pure functions of hashable arguments are cached (an unhashable argument is
a TypeError), keyed by type as well as value (``typed``: ``1`` and ``1.0`` are different keys); an exception is
never cached (it is raised again on the next call).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["pure_cache"]

F = TypeVar("F", bound=Callable[..., Any])


def pure_cache(maxsize: int = 256, *, copy_dict: bool = False) -> Callable[[F], F]:
    """Decorator: ``fn`` memoised on its arguments (:func:`functools.lru_cache` of ``maxsize`` entries, module
    docstring). ``copy_dict``: ``fn`` returns a ``dict``, handed out as a fresh copy per call so a caller that
    edits its result cannot change what the next caller gets. ``cache_clear`` empties the cache."""

    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize, typed=True)(fn)
        if not copy_dict:
            return cached  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return dict(cached(*args, **kwargs))

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap
