"""Fixtures shared by the profile tests."""

from __future__ import annotations

import pytest


class FakeClock:
    """A ``time`` stand-in whose ``perf_counter`` only ``spend`` advances.

    Timing tests then check attribution exactly, without a loaded machine's late wake-ups (a 30 ms sleep there
    can take 55 ms) or its preemptions inside the code under test.
    """

    def __init__(self) -> None:
        self.now_s = 0.0

    def perf_counter(self) -> float:
        return self.now_s

    def spend(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
