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
the first, the same value the dataclass's own ``__hash__`` gives. A frozen dataclass's generated ``__init__``
sets each field through ``object.__setattr__``; :func:`slot_init` gives a slotted one an ``__init__`` that
stores each field straight into its slot (the same record, built in about two thirds of the time for the model's
30-field records). A record of more than :data:`_TWIN_FIELDS` fields is built faster still through its *twin*:
a class with the same bases and slots but no frozen ``__setattr__``, so the record becomes one for the stores
(plain attribute stores, which the interpreter specialises) and then its own class again (the same memory
layout, so ``__class__`` may change between them); about half the time of the per-slot stores for 30 fields.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HashOnce", "hash_once", "pure_cache", "slot_init"]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


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


_TWIN_FIELDS = 4
"""Fields beyond which :func:`slot_init` builds a record through its twin class (its two class changes cost
about as much as four slot stores)."""


def _twin(cls: type) -> type | None:
    """``cls``'s twin for :func:`slot_init` (module docstring): its bases and slots, without its frozen
    ``__setattr__``; None where a base sets attributes its own way or keeps no slots of its own (its layout
    would not be the same)."""
    for base in cls.__mro__[1:-1]:
        if "__slots__" not in base.__dict__ or "__setattr__" in base.__dict__:
            return None
    return type(f"_{cls.__name__}Init", cls.__bases__, {"__slots__": cls.__dict__["__slots__"],
                                                          "__module__": cls.__module__})


def slot_init(cls: C) -> C:
    """Decorator (above ``@dataclass(frozen=True, slots=True)``): replace the generated ``__init__`` by one with
    the same signature (each field positional or keyword-only as declared, the same defaults) that stores each
    argument through its slot's descriptor, bypassing the frozen ``__setattr__`` (module docstring). Only for
    plain fields: a default factory, an ``InitVar``, ``init=False`` or ``__post_init__`` is refused (TypeError).
    Past :data:`_TWIN_FIELDS` fields a record of ``cls`` itself (not of a subclass) is built through its twin
    class (module docstring)."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"slot_init: {cls.__name__} must be a slotted dataclass without __post_init__")
    names: dict[str, Any] = {}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"slot_init: {cls.__name__}.{f.name} must be a plain field (no factory, init=True)")
        param = f.name
        if f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            param += f"=_default_{f.name}"
        (keyword if f.kw_only else positional).append(param)
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _set_{f.name}(self, {f.name})\n")
    params = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    twin = _twin(cls) if len(body) > _TWIN_FIELDS else None
    if twin is None:
        source = f"def __init__({params}):\n" + ("".join(body) or "    pass\n")
    else:
        names.update(_cls=cls, _twin_cls=twin, _set_class=object.__setattr__)
        stores = "".join(f"        self.{f.name} = {f.name}\n" for f in dataclasses.fields(cls))
        source = (f"def __init__({params}):\n"
                  "    if type(self) is _cls:\n"
                  "        _set_class(self, '__class__', _twin_cls)\n"
                  f"{stores}"
                  "        self.__class__ = _cls\n"
                  "        return\n"
                  + "".join(body))
    exec(source, names)  # noqa: S102 - built from the class's own field names
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__, init.__annotations__ = cls.__init__.__doc__, dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls
