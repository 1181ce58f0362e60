"""Ring collectives against their closed forms (NOTE [ring collectives] in mcdla.sim.collectives) and against the
flow evaluator of the same Collective (mcdla.sim.ir_engine)."""

from __future__ import annotations

import pytest

from mcdla.errors import SimError
from mcdla.hardware import load_system
from mcdla.hardware.cluster import load_cluster
from mcdla.hardware.topology import Topology
from mcdla.sim import simulate
from mcdla.sim.collective_models import Collective, collective_time
from mcdla.sim.ir_engine import collective_flow_time
from mcdla.workload.model import Layer, LayerKind, Workload

from .conftest import chain, plan_of, ring_system


def _params_only(param_bytes: float, n_layers: int = 1) -> Workload:
    """Layers that compute nothing and save nothing: the iteration is its gradient all-reduces."""
    return Workload(name="grads", batch=1, optimizer_bytes_per_param_byte=0.0, layers=tuple(
        Layer(name=f"p{i}", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, param_bytes=param_bytes)
        for i in range(n_layers)))


def _all_reduce_s(size: float, n: int, rings: int, bandwidth: float, latency: float) -> float:
    return 2 * (n - 1) / n * size / (rings * bandwidth) + 2 * (n - 1) * latency


def _all_gather_s(size: float, n: int, rings: int, bandwidth: float, latency: float) -> float:
    return (n - 1) / n * size / (rings * bandwidth) + (n - 1) * latency


@pytest.mark.parametrize("both_directions", [False, True])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_uncontended_ring_all_reduce_closed_form(n: int, both_directions: bool) -> None:
    """A lone all-reduce of S bytes takes 2(N-1)/N * S/(R B) + 2(N-1) l (within 1%)."""
    size, bandwidth, latency = 400e6, 20e9, 3e-6
    system = ring_system(n, bytes_per_s=bandwidth, latency_s=latency, both_directions=both_directions)
    r = simulate(system, _params_only(size), plan_of(_params_only(size)), bucket_bytes=1e12)
    rings = 2 if both_directions and n > 2 else 1  # with 2 devices both "rings" share the one link
    expected = _all_reduce_s(size, n, rings, bandwidth, latency)
    assert r.iteration_time_s == pytest.approx(expected, rel=0.01)
    assert r.exposed_communication_s == pytest.approx(r.iteration_time_s)


@pytest.mark.parametrize("preset,rings,bandwidth,hop_latency", [
    ("dc-dla", 6, 25e9, 1e-6),   # three Hamiltonian cycles both ways, one 25 GB/s lane each
    ("mc-dla", 2, 75e9, 2e-6),   # one cycle both ways through the memory-nodes (two links per hop)
])
def test_preset_all_reduce_closed_form(preset: str, rings: int, bandwidth: float, hop_latency: float) -> None:
    """The presets' rings give the all-reduce the closed form's bus bandwidth R * B (within 1%)."""
    size = 1e9
    w = _params_only(size)
    r = simulate(load_system(preset), w, plan_of(w), bucket_bytes=1e12)
    assert r.iteration_time_s == pytest.approx(_all_reduce_s(size, 8, rings, bandwidth, hop_latency), rel=0.01)


def test_ring_link_bytes() -> None:
    """Each link of a one-way ring carries 2(N-1)/N * S bytes of an all-reduce, the reverse direction none."""
    n, size = 4, 100e6
    r = simulate(ring_system(n), _params_only(size), plan_of(_params_only(size)), bucket_bytes=1e12)
    for i in range(n):
        assert r.link_bytes[f"d{i}->d{(i + 1) % n}"] == pytest.approx(2 * (n - 1) / n * size)
        assert r.link_bytes[f"d{(i + 1) % n}->d{i}"] == 0.0
    assert r.collective_bytes == pytest.approx(size)


def test_buckets_run_one_after_another() -> None:
    """Four 50 MB gradients in 100 MB buckets make two all-reduces, each paying the latency terms."""
    n, bandwidth, latency = 4, 10e9, 5e-6
    w = _params_only(50e6, n_layers=4)
    r = simulate(ring_system(n, bytes_per_s=bandwidth, latency_s=latency), w, plan_of(w), bucket_bytes=100e6,
                 record_timeline=True)
    collectives = [s for s in r.spans if s[3] == "collective"]
    assert [s[2] for s in collectives] == ["all-reduce bucket 0", "all-reduce bucket 1"]
    assert r.iteration_time_s == pytest.approx(2 * _all_reduce_s(100e6, n, 1, bandwidth, latency), rel=1e-9)


def test_all_reduce_overlaps_backward() -> None:
    """With one bucket per layer and backward slower than an all-reduce, only the last all-reduce is exposed."""
    n, bandwidth, latency = 4, 10e9, 1e-6
    w = chain(5, saved=10e6, fwd_flops=5e11, param=100e6)
    system = ring_system(n, bytes_per_s=bandwidth, latency_s=latency)
    r = simulate(system, w, plan_of(w), bucket_bytes=100e6)
    last = _all_reduce_s(100e6, n, 1, bandwidth, latency)
    assert r.exposed_communication_s == pytest.approx(last, rel=1e-9)
    assert r.iteration_time_s == pytest.approx(r.compute_s + last, rel=1e-9)


def test_model_parallel_collectives_closed_form() -> None:
    """Model parallel: each output is all-gathered after its forward, each input gradient all-reduced after
    its backward (none for layer 0), and the next operation waits for them."""
    n, bandwidth, latency = 4, 10e9, 2e-6
    out0, out1 = 80e6, 40e6
    w = Workload(name="mp", batch=1, layers=(
        Layer(name="a", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, output_bytes=out0),
        Layer(name="b", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, output_bytes=out1),
    ))
    system = ring_system(n, bytes_per_s=bandwidth, latency_s=latency, both_directions=True)
    r = simulate(system, w, plan_of(w), parallel="model", record_timeline=True)
    expected = (_all_gather_s(out0, n, 2, bandwidth, latency) + _all_gather_s(out1, n, 2, bandwidth, latency)
                + _all_reduce_s(out0, n, 2, bandwidth, latency))
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert [s[2] for s in r.spans if s[3] == "collective"] == ["all-gather a", "all-gather b",
                                                               "all-reduce input grad b"]


def test_model_parallel_divides_compute() -> None:
    """Model parallel runs each layer's FLOPs split over the devices: compute time is 1/N of one device's."""
    w = chain(4, saved=1e6, fwd_flops=1e12, param=0.0, output=0.0)
    one = simulate(ring_system(1), w, plan_of(w))
    four = simulate(ring_system(4), w, plan_of(w), parallel="model")
    assert four.compute_s == pytest.approx(one.compute_s / 4, rel=1e-12)


def test_model_parallel_exchanges_only_after_split_weight_layers() -> None:
    """conv -> ReLU -> pool -> fc: only the conv and the fc exchange (NOTE [model-parallel exchanges]). The
    iteration is all-gather(conv out) + all-gather(fc out) + all-reduce(fc input grad = pool out); the ReLU
    and the pool neither gather their outputs nor all-reduce their input gradients."""
    n, bandwidth, latency = 4, 10e9, 2e-6
    conv_out, pool_out, fc_out = 80e6, 20e6, 4e6
    w = Workload(name="mp", batch=1, layers=(
        Layer(name="conv", kind=LayerKind.CONV, fwd_flops=0.0, bwd_flops=0.0, output_bytes=conv_out),
        Layer(name="relu", kind=LayerKind.ELEMENTWISE, fwd_flops=0.0, bwd_flops=0.0, output_bytes=conv_out),
        Layer(name="pool", kind=LayerKind.POOL, fwd_flops=0.0, bwd_flops=0.0, output_bytes=pool_out),
        Layer(name="fc", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, output_bytes=fc_out),
    ))
    system = ring_system(n, bytes_per_s=bandwidth, latency_s=latency, both_directions=True)
    r = simulate(system, w, plan_of(w), parallel="model", record_timeline=True)
    assert [s[2] for s in r.spans if s[3] == "collective"] == ["all-gather conv", "all-gather fc",
                                                               "all-reduce input grad fc"]
    expected = (_all_gather_s(conv_out, n, 2, bandwidth, latency) + _all_gather_s(fc_out, n, 2, bandwidth, latency)
                + _all_reduce_s(pool_out, n, 2, bandwidth, latency))
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert r.collective_bytes == pytest.approx(conv_out + fc_out + pool_out)


def _one_collective(parallel: str, size: float) -> tuple[Workload, str]:
    """A workload whose iteration is one collective of ``size`` bytes: an all-reduce of gradients (data parallel)
    or the all-gather of one fc layer's output (model parallel; layer 0 all-reduces no input gradient)."""
    if parallel == "data":
        return _params_only(size), "all-reduce"
    return Workload(name="mp", batch=1, layers=(
        Layer(name="fc", kind=LayerKind.FC, fwd_flops=0.0, bwd_flops=0.0, output_bytes=size),)), "all-gather"


def _ring_orders(system) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Device indices of each ring of ``system``, in ring order (read from the System, not the engine's fabric)."""
    index = {name: i for i, name in enumerate(system.device_names)}
    return [tuple(index[n] for n in ring if n in index) for ring in system.rings]


@pytest.mark.parametrize("system", [load_system("mc-dla"), ring_system(5, latency_s=3e-6, both_directions=True)],
                         ids=["mc-dla", "ring5"])
@pytest.mark.parametrize("parallel", ["data", "model"])
def test_engine_collective_equals_flow_evaluator(system, parallel: str) -> None:  # type: ignore[no-untyped-def]
    """On an idle system whose rings share no link, the engine's all-reduce (data parallel) and all-gather (model
    parallel, one fc layer) take the time the IR executor's flow evaluator gives the ring Collective of S / R
    bytes on each ring (1e-9)."""
    size = 1e9
    w, kind = _one_collective(parallel, size)
    r = simulate(system, w, plan_of(w), parallel=parallel, bucket_bytes=1e12)
    orders = _ring_orders(system)
    topo = Topology(system)
    hops = [res for order in orders for a, b in zip(order, order[1:] + order[:1])
            for res in topo.route(system.device_names[a], system.device_names[b]).resources]
    assert len(set(hops)) == len(hops), "no two ring hops share a link, so the rings run independently"
    expected = max(collective_flow_time(Collective(kind=kind, nbytes=size / len(orders), group=order), system)
                   for order in orders)
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "in-network"])
@pytest.mark.parametrize("parallel", ["data", "model"])
def test_generated_node_algorithms_match_closed_form(algorithm: str, parallel: str) -> None:
    """On one generated DGX H100 (a private NVSwitch port per GPU), the engine's all-reduce (data parallel) and
    all-gather (model parallel) under each collective_algorithm take the closed form of that algorithm on the
    cluster's scale-up dimension (1e-9)."""
    size = 2e9
    w, kind = _one_collective(parallel, size)
    r = simulate(load_system("dgx-h100"), w, plan_of(w), parallel=parallel, bucket_bytes=1e12,
                 collective_algorithm=algorithm)
    up = load_cluster("dgx-h100").scale_up
    assert r.iteration_time_s == pytest.approx(collective_time(kind, size, up, algorithm=algorithm), rel=1e-9)
    assert r.collective_bytes == pytest.approx(size)


@pytest.mark.parametrize("algorithm,needle", [("butterfly", "collective_algorithm: got 'butterfly'"),
                                              ("in-network", "crosses no switch")])
def test_bad_collective_algorithm_is_one_line(algorithm: str, needle: str) -> None:
    """An unknown algorithm, or in-network on a ring of direct links (no switch to reduce in): one-line SimError."""
    w = _params_only(1e6)
    with pytest.raises(SimError) as info:
        simulate(ring_system(4), w, plan_of(w), collective_algorithm=algorithm)
    assert needle in str(info.value) and "\n" not in str(info.value)
