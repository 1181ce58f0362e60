"""pure_cache: memoised results equal the function's own, dict results are private copies, errors are not cached."""

import pytest

from mcdla.workload.memo import pure_cache
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
