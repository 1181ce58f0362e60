"""NOTE [safe prefetch] in ``mcdla.sim.device``: the table-based check equals a plain walk over the ops."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcdla.hardware import PoolLink
from mcdla.sim import evaluate_plan, simulate
from mcdla.sim.device import DeviceState

from .conftest import late_prefetch_case, links_st, plans, ring_system, workloads


def reference_is_safe(dev: DeviceState) -> bool:
    """The rule as the note states it, op by op: from the running (or next) op to the first op that needs the
    H2D head's tensor, each op's request plus the prefetch of any tensor it needs that is not on the device
    (not issued yet, or still queued) must fit, once the offloads still to land have freed their bytes."""
    layer = dev.h2d[0]
    used = dev.used + dev.pf_req
    landing = list(dev.d2h) + ([dev.d2h_layer] if dev.d2h_busy else [])
    used -= sum(dev.saved[off] for off in landing if dev.fwd_done[off])
    pc = dev.pc
    if dev.busy:
        used -= dev.ops[pc].free_bytes
        pc += 1
    fetched: set[int] = set()
    for op in dev.ops[pc:]:
        need = op.need_data
        if need == layer:
            return used + op.alloc_bytes <= dev.limit
        if need >= 0 and need not in fetched and (not dev.pf_issued[need] or need in dev.h2d):
            fetched.add(need)
            used += dev.saved[need]
        if used + op.alloc_bytes > dev.limit:
            return False
        used += op.alloc_bytes - op.free_bytes
    raise AssertionError("no op needs the prefetched tensor")


@pytest.fixture
def checked(monkeypatch):  # type: ignore[no-untyped-def]
    """Every check the engine makes is also made by the reference walk; the answers are counted."""
    fast = DeviceState._prefetch_is_safe
    answers = {True: 0, False: 0}

    def both(self: DeviceState) -> bool:
        want = reference_is_safe(self)
        got = fast(self)
        assert got == want, (self.name, self.pc, self.h2d[0])
        answers[got] += 1
        return got

    monkeypatch.setattr(DeviceState, "_prefetch_is_safe", both)
    return answers


@st.composite
def _cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    w = draw(workloads(min_layers=2, max_layers=8))
    fraction = draw(st.sampled_from([0.3, 0.5, 0.7, 1.0]))
    budget = max(fraction * w.footprint_bytes(), 1e6)
    return w, draw(plans(w, budget_bytes=budget)), draw(links_st)


@pytest.mark.examples(100, 400)
def test_table_check_equals_the_walk(checked, examples) -> None:  # type: ignore[no-untyped-def]
    """On random chains, plans (offload, recompute, far prefetch triggers), links and budgets."""
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_cases())
    def check(case) -> None:  # type: ignore[no-untyped-def]
        w, plan, link = case
        evaluate_plan(w, plan, link)

    check()


def test_the_checks_said_both_answers(checked) -> None:  # type: ignore[no-untyped-def]
    """The comparison is not vacuous: over a fixed sweep the engine hears both answers."""
    w, plan = late_prefetch_case()
    for rate in (4e9, 8e9, 16e9, 32e9):
        evaluate_plan(w, plan, PoolLink(offload_bytes_per_s=rate, prefetch_bytes_per_s=8e9))
    system = ring_system(2, pool_bytes_per_s=8e9)
    simulate(system.with_hbm(400.2e6), w, plan)
    assert checked[True] > 0 and checked[False] > 0
