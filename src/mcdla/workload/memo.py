"""Memoised pure functions of frozen records, for the analytical model's hot path.

The LLM time model (:func:`mcdla.sim.llm_step`) derives the same per-layer figures (FLOPs, bytes, parameter
groups, the pipeline split) from one ``(TransformerSpec, Execution)`` several times per evaluation, and a
configuration search evaluates tens of thousands of executions of one model. Both records are frozen and hash in
well under a microsecond, so a small least-recently-used cache keyed on the arguments returns the figure computed
once instead of recomputing it. Only pure functions of hashable arguments are cached (an unhashable argument is
a TypeError), keyed by type as well as value (``typed``: ``1`` and ``1.0`` are different keys); an exception is
never cached (it is raised again on the next call).

Hashing a frozen dataclass hashes the tuple of its fields on every call (an execution's 35 fields take close to
a microsecond), and each cached call hashes its arguments again: :class:`HashOnce` keeps a record's hash after
the first, the same value the dataclass's own ``__hash__`` gives.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HashOnce", "hash_once", "pure_cache"]

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


class HashOnce:
    """Base of a frozen, slotted dataclass whose hash is computed once (module docstring): the class sets
    ``__hash__ = hash_once`` in its body (so the dataclass keeps it) and inherits the slot the hash is kept in.
    The slot is not a field: ``fields``, ``asdict``, ``repr``, equality and pickling never see it (an unpickled or
    replaced record computes its hash again, as string hashes differ between processes)."""

    __slots__ = ("_hash_once",)


@functools.cache
def _hashed_names(cls: type) -> tuple[str, ...]:
    """The fields a dataclass's generated ``__hash__`` hashes, in order (``hash=None`` follows ``compare``)."""
    return tuple(f.name for f in dataclasses.fields(cls) if (f.compare if f.hash is None else f.hash))


def hash_once(self: Any) -> int:
    """``hash`` of the record's hashed fields as a tuple (what a frozen dataclass's ``__hash__`` returns), kept
    in the :class:`HashOnce` slot after the first call."""
    try:
        return self._hash_once  # type: ignore[no-any-return]
    except AttributeError:
        pass
    value = hash(tuple(getattr(self, name) for name in _hashed_names(type(self))))
    object.__setattr__(self, "_hash_once", value)
    return value
