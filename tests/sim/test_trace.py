"""The Chrome trace of a simulated iteration: span details (``args``) and offload-to-prefetch flow events."""

import json

import pytest

from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.sim import simulate
from mcdla.workload import zoo


def _trace(system: str, workload: str, batch: int, parallel: str = "data") -> tuple[list[dict], object]:
    w = zoo.build(workload, batch=batch)
    result = simulate(load_system(system), w, policy_plan(w, "all"), parallel=parallel, record_timeline=True)
    return json.loads(json.dumps(result.to_chrome_trace()))["traceEvents"], w


@pytest.fixture(scope="module")
def alexnet_dc_dla():
    return _trace("dc-dla", "alexnet", 256)


def test_every_prefetch_has_a_flow_from_the_offload_of_its_tensor(alexnet_dc_dla) -> None:
    """Each prefetch span ends a flow that starts inside the offload span of the same layer on the same device."""
    events, _ = alexnet_dc_dla
    spans = [e for e in events if e["ph"] == "X"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    prefetches = [e for e in spans if e["cat"] == "prefetch"]
    assert prefetches and len(ends) == len(prefetches) == len(starts)

    def enclosing(point: dict) -> dict:
        found = [e for e in spans if e["pid"] == point["pid"] and e["tid"] == point["tid"]
                 and e["ts"] <= point["ts"] <= e["ts"] + e["dur"]]
        assert len(found) == 1
        return found[0]

    for end in ends:
        start = starts[end["id"]]
        offload, prefetch = enclosing(start), enclosing(end)
        assert (offload["cat"], prefetch["cat"]) == ("offload", "prefetch")
        assert offload["args"]["layer"] == prefetch["args"]["layer"] and offload["pid"] == prefetch["pid"]
        assert offload["ts"] + offload["dur"] <= prefetch["ts"]
        assert end["bp"] == "e" and start["cat"] == end["cat"]
    assert {enclosing(e)["args"]["layer"] for e in ends} == {p["args"]["layer"] for p in prefetches}


def test_transfer_args_carry_the_workloads_saved_bytes(alexnet_dc_dla) -> None:
    """Offload and prefetch spans carry the layer's saved bytes from the workload and the pool memory's name."""
    events, w = alexnet_dc_dla
    saved = {layer.name: layer.saved_bytes for layer in w.layers}
    transfers = [e for e in events if e["ph"] == "X" and e["cat"] in ("offload", "prefetch")]
    assert transfers
    for e in transfers:
        assert e["args"]["bytes"] == saved[e["args"]["layer"]]
        assert e["args"]["tensor"] == f"saved {e['args']['layer']}" and e["args"]["tier"]
    offloaded = {e["args"]["layer"] for e in transfers if e["cat"] == "offload"}
    assert offloaded == {name for name, nbytes in saved.items() if nbytes > 0}


def test_compute_args_carry_the_layers_flops(alexnet_dc_dla) -> None:
    """Forward and backward compute spans carry the layer's FLOPs and bytes moved from the workload."""
    events, w = alexnet_dc_dla
    layers = {layer.name: layer for layer in w.layers}
    computes = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    devices = {e["pid"] for e in computes}
    assert len(computes) == 2 * len(w.layers) * len(devices)
    for e in computes:
        layer, phase = layers[e["args"]["layer"]], e["args"]["phase"]
        expected = (layer.fwd_flops, layer.fwd_bytes_moved) if phase == "forward" else (layer.bwd_flops,
                                                                                         layer.bwd_bytes_moved)
        assert (e["args"]["flops"], e["args"]["bytes_moved"]) == pytest.approx(expected)


def test_model_parallel_compute_args_are_the_per_device_share() -> None:
    """Under model parallelism each device's compute span carries its 1/n share of the layer's FLOPs."""
    events, w = _trace("mc-dla", "alexnet", 256, parallel="model")
    n = len({e["pid"] for e in events if e["ph"] == "X" and e["cat"] == "compute"})
    fwd = {layer.name: layer.fwd_flops for layer in w.layers}
    forwards = [e for e in events if e["ph"] == "X" and e["cat"] == "compute" and e["args"]["phase"] == "forward"]
    assert n > 1 and forwards
    assert all(e["args"]["flops"] == pytest.approx(fwd[e["args"]["layer"]] / n) for e in forwards)
    collectives = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    assert collectives and all(e["args"]["bytes"] > 0 and e["args"]["kind"] in ("all-reduce", "all-gather")
                               for e in collectives)
