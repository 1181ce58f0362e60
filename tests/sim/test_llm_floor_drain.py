"""The per-link floor's fair drain (sim/llm_floor_drain.py, NOTE [fair drain]) against a plain one written here: the
module memoises each set of flows' rates per path table and answers a drain asked twice at once from the last
one; neither may change a bit of the answer. Also the drain's answers against closed forms: flows that share no
resource each end at their bytes over their bottleneck, two flows on one resource split it until the smaller is
through."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.hardware.traffic import TRAFFIC_CLASSES, PathResource, TrafficPath
from mcdla.sim import llm_floor_drain as llm_floor

_DRAINED = 1e-9  # a flow is through below this fraction of its bytes (the module's rounding rule)


def _plain_loads(paths: tuple[TrafficPath, ...], cls: str, way: int) -> dict[tuple[tuple[str, ...], int], float]:
    """A flow's seconds per byte on each (resource, direction) of its class's path, every resource on its own."""
    load: dict[tuple[tuple[str, ...], int], float] = {}
    for path in paths:
        if path.traffic != cls:
            continue
        for res in path.resources:
            per_byte = res.load_s_per_byte()
            if res.resource[0] != "hbm" and per_byte > 0:
                slot = (res.resource, way if res.duplex else 0)
                load[slot] = load.get(slot, 0.0) + per_byte
    return load


def _plain_rates(loads: dict, counts: dict) -> dict:
    """Progressive filling from scratch: raise every unfrozen flow's level until a resource is full, freeze the
    flows on it, repeat."""
    room = {slot: 1.0 for load in loads.values() for slot in load}
    unfrozen, rates, level = dict(loads), {}, 0.0
    while unfrozen:
        weight: dict = {}
        for flow, load in unfrozen.items():
            for slot, per_byte in load.items():
                weight[slot] = weight.get(slot, 0.0) + per_byte * counts[flow]
        rise = min(room[slot] / w for slot, w in weight.items())
        level += rise
        for slot, w in weight.items():
            room[slot] -= rise * w
        full = {slot for slot in weight if room[slot] <= _DRAINED}
        for flow in [f for f, load in unfrozen.items() if full.intersection(load)]:
            rates[flow] = level * counts[flow]
            del unfrozen[flow]
    return rates


def _plain_drain(paths: tuple[TrafficPath, ...], flows: dict) -> dict:
    """Every flow at its fair rate until the first is through, the rates refilled from scratch at each step."""
    offload = next((p for p in paths if p.traffic == "offload"), None)
    copies = max(1, sum(r.resource[0] == "dram" for r in offload.resources)) if offload is not None else 1
    loads = {key: _plain_loads(paths, cls, way) for key, (cls, way, _b) in flows.items()}
    ends = {key: 0.0 for key, load in loads.items() if not load}
    left = {key: flows[key][2] for key, load in loads.items() if load}
    now = 0.0
    while left:
        rates = _plain_rates({k: loads[k] for k in left}, {k: copies if flows[k][0] == "offload" else 1 for k in left})
        step = min(rest / rates[k] for k, rest in left.items())
        now += step
        for k in list(left):
            left[k] -= rates[k] * step
            if left[k] <= _DRAINED * flows[k][2]:
                ends[k] = now
                del left[k]
    return ends


_RESOURCES = [("link", f"l{i}") for i in range(4)] + [("dram", f"m{i}") for i in range(3)]


@st.composite
def _paths(draw: st.DrawFn) -> tuple[TrafficPath, ...]:
    """Three paths over a few shared links (duplex) and memories (one bus both ways), random capacities, sharers
    and interleaving fractions; some paths cross an unbounded resource."""
    pool = [PathResource(resource=name, duplex=name[0] == "link",
                         bytes_per_s=draw(st.sampled_from([float("inf"), 25e9, 51.2e9, 100e9, 307.2e9, 450e9])),
                         sharers=draw(st.integers(1, 8)), fraction=draw(st.sampled_from([1.0, 0.5, 0.25])))
            for name in _RESOURCES]
    return tuple(TrafficPath(traffic=cls, latency_s=1e-6,
                             resources=tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))))
                 for cls in TRAFFIC_CLASSES)


_KEYS = [(tag, cls, way) for tag in ("", "fsdp", "dp") for cls in TRAFFIC_CLASSES for way in (0, 1)
         if not (tag and cls == "offload")]


@st.composite
def _flows(draw: st.DrawFn) -> dict:
    keys = draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=8, unique=True))
    return {key: (key[1], key[2], draw(st.floats(1e3, 1e10))) for key in keys}


@settings(max_examples=150, deadline=None)
@given(paths=_paths(), first=_flows(), scale=st.floats(0.1, 10.0))
def test_memoised_drain_equals_the_plain_drain_bit_for_bit(paths, first, scale) -> None:  # type: ignore[no-untyped-def]
    table = llm_floor._PathTable(paths)
    # the same flows with other bytes reuse the memoised rates; a drain asked twice at once takes the last answer
    second = {key: (cls, way, nbytes * scale) for key, (cls, way, nbytes) in first.items()}
    for flows in (first, second, second, first):
        assert llm_floor._drain_ends(table, flows) == _plain_drain(paths, flows)


def test_remembered_drain_is_a_fresh_dict_and_forgets_the_oldest() -> None:
    """A drain asked again answers as the plain drain does even after the caller edited the last answer, and
    more distinct drains than the table remembers still each answer as the plain drain."""
    paths = (TrafficPath(traffic="offload", latency_s=1e-6, resources=(_link("x16", 50.0),)),
             TrafficPath(traffic="scale-out", latency_s=1e-6, resources=(_link("x16", 50.0),)))
    table = llm_floor._PathTable(paths)
    asked = [{("", "offload", 0): ("offload", 0, 1e9 * (k + 1)), ("", "scale-out", 0): ("scale-out", 0, 3e9)}
             for k in range(llm_floor._RECENT_DRAINS + 3)]
    for flows in asked + asked[::-1]:
        got = llm_floor._drain_ends(table, flows)
        assert got == _plain_drain(paths, flows)
        got[("", "offload", 0)] = -1.0  # the caller's copy
        assert llm_floor._drain_ends(table, flows) == _plain_drain(paths, flows)


def _link(name: str, gbps: float, sharers: int = 1) -> PathResource:
    return PathResource(resource=("link", name), bytes_per_s=gbps * 1e9, duplex=True, sharers=sharers)


@settings(max_examples=100, deadline=None)
@given(caps=st.lists(st.floats(1.0, 1000.0), min_size=6, max_size=6), sharers=st.integers(1, 8),
       nbytes=st.lists(st.floats(1e3, 1e10), min_size=6, max_size=6))
def test_flows_on_resources_of_their_own_end_at_their_bytes_over_their_bottleneck(caps, sharers, nbytes) -> None:  # type: ignore[no-untyped-def]
    # each class its own two links, each way its own direction: no resource carries two flows
    paths = tuple(TrafficPath(traffic=cls, latency_s=0.0, resources=(_link(f"{cls}a", caps[2 * i], sharers),
                                                                    _link(f"{cls}b", caps[2 * i + 1])))
                  for i, cls in enumerate(TRAFFIC_CLASSES))
    flows = {("", cls, way): (cls, way, nbytes[2 * i + way]) for i, cls in enumerate(TRAFFIC_CLASSES) for way in (0, 1)}
    ends = llm_floor._drain_ends(llm_floor._PathTable(paths), flows)
    for i, cls in enumerate(TRAFFIC_CLASSES):
        bottleneck = min(caps[2 * i] * 1e9 / sharers, caps[2 * i + 1] * 1e9)
        for way in (0, 1):
            # a flow within 1e-9 of its bytes when another is through counts as through with it
            assert ends[("", cls, way)] == pytest.approx(nbytes[2 * i + way] / bottleneck, rel=2 * _DRAINED)


def test_two_flows_on_one_memory_split_its_bus_until_the_smaller_is_through() -> None:
    # a 100 GB/s DRAM bus carries both directions: 1 GB out and 3 GB in get 50 GB/s each until the first is
    # through at 20 ms, then the rest (2 GB) goes at 100 GB/s, 20 ms more
    dram = PathResource(resource=("dram", "m0"), bytes_per_s=100e9, duplex=False, sharers=1)
    paths = (TrafficPath(traffic="scale-out", latency_s=0.0, resources=(dram,)),)
    ends = llm_floor._drain_ends(llm_floor._PathTable(paths),
                                 {("", "scale-out", 0): ("scale-out", 0, 1e9), ("", "scale-out", 1): ("scale-out", 1, 3e9)})
    assert ends[("", "scale-out", 0)] == pytest.approx(0.02, rel=1e-12)
    assert ends[("", "scale-out", 1)] == pytest.approx(0.04, rel=1e-12)
