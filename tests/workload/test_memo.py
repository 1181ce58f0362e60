"""pure_cache: memoised results equal the function's own, dict results are private copies, errors are not cached; slot_init
builds the record the generated __init__ builds."""

import dataclasses
import inspect
import pickle

import pytest

from mcdla.workload.memo import _TWIN_FIELDS, HashOnce, hash_once, pure_cache, slot_init
from mcdla.workload.transformer import layer_fwd_flops, preset


def test_cached_result_is_computed_once_per_key() -> None:
    """A second call with equal arguments returns the first result without running the function again."""
    calls = []

    @pure_cache(8)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]


def test_keys_are_typed() -> None:
    """1 and 1.0 are different keys, so an int argument never gets the float call's result type."""

    @pure_cache(8)
    def half(x: float) -> float:
        return x / 2 if isinstance(x, float) else x // 2

    assert half(3.0) == 1.5
    assert half(3) == 1


def test_dict_results_are_fresh_copies() -> None:
    """Editing the dict one call returned leaves the next call's answer as the function computes it."""
    spec = preset("gpt3-175b")
    first = layer_fwd_flops(spec, 2, attention="flash")
    expected = dict(layer_fwd_flops.__wrapped__(spec, 2, attention="flash"))  # the uncached function
    first["gemm"] = -1.0
    assert layer_fwd_flops(spec, 2, attention="flash") == expected


def test_errors_are_raised_again() -> None:
    """An exception is not cached: each call with failing arguments raises."""
    calls = []

    @pure_cache(8)
    def positive(x: int) -> int:
        calls.append(x)
        if x <= 0:
            raise ValueError(x)
        return x

    for _ in range(2):
        with pytest.raises(ValueError):
            positive(-1)
    assert calls == [-1, -1]


@dataclasses.dataclass(frozen=True, slots=True)
class Point(HashOnce):
    x: int
    y: str
    note: str = dataclasses.field(default="", compare=False)

    __hash__ = hash_once


def test_hash_once_gives_the_dataclass_hash_and_keeps_fields() -> None:
    """A HashOnce record hashes as the tuple of its fields (what a frozen dataclass's own hash is), computed once
    per object; the kept hash is no field, so fields, asdict, repr, equality and pickling are the record's own."""
    p = Point(3, "a", note="ignored")
    assert hash(p) == hash((3, "a")) == hash(p)
    assert [f.name for f in dataclasses.fields(p)] == ["x", "y", "note"]
    assert dataclasses.asdict(p) == {"x": 3, "y": "a", "note": "ignored"}
    assert repr(p) == "Point(x=3, y='a', note='ignored')"
    assert p == Point(3, "a") and hash(Point(3, "a")) == hash(p)
    copy = pickle.loads(pickle.dumps(p))
    assert copy == p and hash(copy) == hash(p)
    moved = dataclasses.replace(p, x=4)
    assert hash(moved) == hash((4, "a"))


def test_execution_and_spec_hash_as_their_fields() -> None:
    """Execution and TransformerSpec keep the hash of their fields' tuple (the dataclass rule), so equal records
    built apart are one cache key."""
    from mcdla.workload.execution import Execution

    spec = preset("gpt3-175b")
    e = Execution(gpus=64, tp=8, pp=4, dp=2, global_batch=64)
    for record in (spec, e):
        assert hash(record) == hash(tuple(getattr(record, f.name) for f in dataclasses.fields(record)))
    assert hash(Execution(gpus=64, tp=8, pp=4, dp=2, global_batch=64)) == hash(e)


def _pair(**options):
    """The same frozen slotted dataclass twice: with its generated ``__init__`` and with :func:`slot_init`'s."""
    made = []
    for wrap in (lambda cls: cls, slot_init):
        @wrap
        @dataclasses.dataclass(frozen=True, slots=True, **options)
        class Rec:
            a: float
            b: int = 2
            c: tuple[int, ...] = ()

        made.append(Rec)
    return made


@pytest.mark.parametrize("options", [{}, {"kw_only": True}])
def test_slot_init_builds_the_record_the_generated_init_builds(options):
    """Same signature, same field values, repr and hash; still frozen; a missing argument is still an error."""
    plain, fast = _pair(**options)
    assert str(inspect.signature(fast)) == str(inspect.signature(plain))
    args = {"a": 1.5, "b": 7, "c": (1, 2)}
    for kwargs in (args, {"a": 0.25}):
        got, want = fast(**kwargs), plain(**kwargs)
        assert repr(got).replace(fast.__qualname__, "") == repr(want).replace(plain.__qualname__, "")
        assert dataclasses.astuple(got) == dataclasses.astuple(want) and hash(got) == hash(want)
    assert dataclasses.replace(fast(**args), b=9).b == 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(**args).a = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        fast()  # type: ignore[call-arg]


def test_slot_init_refuses_what_it_cannot_copy():
    """A class without slots, with a default factory or with ``__post_init__`` is refused, naming it."""
    @dataclasses.dataclass(frozen=True)
    class Open:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Open, Factory, Post):
        with pytest.raises(TypeError, match=cls.__name__):
            slot_init(cls)


def test_slot_init_builds_a_wide_record_through_its_twin():
    """Past ``_TWIN_FIELDS`` fields the record is built through its twin class: the same record as the generated
    ``__init__``'s (repr, hash, fields), of its own class and still frozen; a subclass's record is built by the
    per-slot stores, of the subclass."""
    names = [f"f{i}" for i in range(_TWIN_FIELDS + 3)]
    made = []
    for wrap in (lambda cls: cls, slot_init):
        cls = type("Wide", (), {"__annotations__": dict.fromkeys(names, "float"), "__module__": __name__,
                                "f0": 0.5})
        made.append(wrap(dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)))
    plain, fast = made
    values = {name: i + 0.25 for i, name in enumerate(names)}
    for kwargs in (values, {k: v for k, v in values.items() if k != "f0"}):
        got, want = fast(**kwargs), plain(**kwargs)
        assert type(got) is fast
        assert repr(got) == repr(want) and hash(got) == hash(want)
        assert dataclasses.astuple(got) == dataclasses.astuple(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(**values).f1 = 2.0  # type: ignore[attr-defined]

    class Sub(fast):  # type: ignore[misc, valid-type]  # inherits slot_init's __init__
        __slots__ = ()

    sub = Sub(**values)
    assert type(sub) is Sub and dataclasses.astuple(sub) == dataclasses.astuple(fast(**values))
