"""Import of Chakra ET files as workloads (mcdla.workload.chakra) and one-line errors for bad files."""

import gzip
import math

import pytest

from mcdla.errors import WorkloadError
from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.report.chakra import simulate_to_chakra
from mcdla.sim import simulate
from mcdla.workload import load_workload, zoo
from mcdla.workload.chakra import encode_varint, load_chakra_workload, read_trace
from mcdla.workload.et_def import et_def_pb2 as pb
from mcdla.workload.plan import Action, Decision, Plan


def frame(*messages) -> bytes:
    """Length-prefix each message the way Chakra's protolib.encodeMessage does (written out here)."""
    out = b""
    for m in messages:
        data = m.SerializeToString()
        n, prefix = len(data), b""
        while n >= 0x80:
            prefix += bytes([(n & 0x7F) | 0x80])
            n >>= 7
        out += prefix + bytes([n]) + data
    return out


def comp(node_id, name, micros, deps=(), gpu=True, num_ops=None):
    node = pb.Node(id=node_id, name=name, type=pb.COMP_NODE, duration_micros=micros)
    node.data_deps.extend(deps)
    node.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=not gpu))
    if num_ops is not None:
        node.attr.append(pb.AttributeProto(name="num_ops", int64_val=num_ops))
    return node


def test_encode_varint() -> None:
    """The writer's varint against one computed by hand: 300 = 0b10_0101100 -> 0xAC 0x02."""
    assert encode_varint(0) == b"\x00" and encode_varint(127) == b"\x7f"
    assert encode_varint(128) == b"\x80\x01" and encode_varint(300) == b"\xac\x02"
    for n in (2**14, 2**21 + 5, 2**35):
        decoded, shift = 0, 0
        for byte in encode_varint(n):
            decoded |= (byte & 0x7F) << shift
            shift += 7
        assert decoded == n


# -- round trip through the simulator --------------------------------------------------------------------------
def _offload_and_recompute(w):
    decisions = []
    for i, layer in enumerate(w.layers):
        if i and layer.saved_bytes > 0:
            decisions.append(Decision(layer=layer.name, action=Action.OFFLOAD if i % 2 else Action.RECOMPUTE))
    return Plan(workload=w.name, batch=w.batch, budget_bytes=math.inf, decisions=tuple(decisions),
                layer_names=w.layer_names, planner="mixed")


@pytest.mark.parametrize(("system_name", "wl_name", "batch", "parallel", "plan_kind"), [
    ("dc-dla", "alexnet", 128, "data", "all"),
    ("mc-dla", "alexnet", 256, "model", "all"),
    ("mc-dla", "resnet-152", 8, "data", "mixed"),
    ("mc-dla", "lstm", 64, "model", "mixed"),
])
def test_an_exported_trace_reimports_to_the_same_iteration(tmp_path, system_name, wl_name, batch, parallel,
                                                            plan_kind) -> None:
    """mcdla's own traces map back exactly: the same layers and, as measured times, the simulated ones, so
    the same system, plan and parallelism give the same iteration time (equal, not approximately).

    Under model parallelism a rank's times are its share; the importer multiplies them by the world size and
    the simulator divides again: exact for a power-of-two world size (mc-dla has 8 devices), within a
    rounding (relative 1e-12 allowed) otherwise."""
    system = load_system(system_name)
    w = zoo.build(wl_name, batch=batch)
    plan = _offload_and_recompute(w) if plan_kind == "mixed" else policy_plan(w, plan_kind)
    result, paths = simulate_to_chakra(tmp_path / "t", system, w, plan, parallel=parallel)
    imported = load_workload(str(paths[-1]))  # through the ordinary workload loader
    assert imported.layer_names == w.layer_names
    assert imported.name == w.name and imported.batch == w.batch
    for a, b in zip(imported.layers, w.layers):
        assert (a.saved_bytes, a.param_bytes, a.output_bytes, a.inputs, a.kind) == (
            b.saved_bytes, b.param_bytes, b.output_bytes, b.inputs, b.kind)
    again = simulate(system, imported, plan, parallel=parallel)
    n = len(system.devices)
    if parallel == "data" or n & (n - 1) == 0:
        assert again.iteration_time_s == result.iteration_time_s
    else:
        assert again.iteration_time_s == pytest.approx(result.iteration_time_s, rel=1e-12)
    assert again.offloaded_bytes == result.offloaded_bytes
    assert again.peak_device_bytes == result.peak_device_bytes


# -- a hand-built generic trace -----------------------------------------------------------------------------------
def tiny_trace(path, gz=False):
    """Written with the generated classes directly, like Chakra's converters: three GPU kernels whose file
    order differs from their dependency order, a CPU op, a collective and a memory load."""
    meta = pb.GlobalMetadata(version="0.0.4")
    meta.attr.append(pb.AttributeProto(name="schema", string_val="1.0.2-chakra.0.0.4"))
    nodes = [
        comp(10, "matmul", 250, deps=[12], num_ops=2_000_000),
        comp(11, "aten::linear", 999, gpu=False),
        comp(12, "conv", 100),
        pb.Node(id=13, name="allreduce", type=pb.COMM_COLL_NODE, duration_micros=5000, data_deps=[10]),
        comp(14, "relu", 50, deps=[13]),
        pb.Node(id=15, name="load", type=pb.MEM_LOAD_NODE, duration_micros=70),
    ]
    data = frame(meta, *nodes)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_a_hand_built_trace_imports_its_gpu_compute_nodes_in_dependency_order(tmp_path, gz) -> None:
    path = tiny_trace(tmp_path / ("tiny.0.et.gz" if gz else "tiny.0.et"), gz=gz)
    w = load_chakra_workload(path)
    assert w.layer_names == ("conv", "matmul", "relu")
    assert [l.fwd_time_s for l in w.layers] == [100e-6, 250e-6, 50e-6]
    assert [l.bwd_time_s for l in w.layers] == [0.0, 0.0, 0.0]
    assert w.layers[1].fwd_flops == 2e6
    assert w.saved_bytes == 0 and w.static_bytes == 0
    assert w.name == "tiny.0"
    # on one device with no offloads the iteration is the serialized compute time
    result = simulate(load_system("dc-dla"), w, policy_plan(w, "none"))
    assert result.iteration_time_s == pytest.approx(400e-6, rel=1e-12)


def test_cpu_ops_are_kept_when_the_trace_marks_none_as_gpu(tmp_path) -> None:
    meta = pb.GlobalMetadata(version="0.0.4")
    a, b = comp(1, "op", 30, gpu=False), comp(2, "op", 20, gpu=False, deps=[1])
    path = tmp_path / "cpu.et"
    path.write_bytes(frame(meta, a, b))
    w = load_chakra_workload(path)
    assert w.layer_names == ("op #1", "op #2")  # repeated names made distinct by id
    assert sum(l.fwd_time_s for l in w.layers) == pytest.approx(50e-6)


# -- bad files --------------------------------------------------------------------------------------------------
def _error(path) -> str:
    with pytest.raises(WorkloadError) as info:
        load_chakra_workload(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text
    return text


def test_no_durations_is_refused(tmp_path) -> None:
    path = tmp_path / "nodur.et"
    path.write_bytes(frame(pb.GlobalMetadata(version="0.0.4"), comp(1, "a", 0), comp(2, "b", 0, deps=[1])))
    assert "carry no durations" in _error(path)


def test_no_compute_nodes_is_refused(tmp_path) -> None:
    path = tmp_path / "comm.et"
    coll = pb.Node(id=1, name="ar", type=pb.COMM_COLL_NODE, duration_micros=10)
    path.write_bytes(frame(pb.GlobalMetadata(version="0.0.4"), coll))
    assert "no COMP_NODE" in _error(path)


def test_a_dependency_cycle_is_refused(tmp_path) -> None:
    path = tmp_path / "cycle.et"
    path.write_bytes(frame(pb.GlobalMetadata(version="0.0.4"), comp(1, "a", 5, deps=[2]), comp(2, "b", 5, deps=[1])))
    assert "cycle" in _error(path)


def test_truncated_varint(tmp_path) -> None:
    path = tmp_path / "trunc.et"
    path.write_bytes(frame(pb.GlobalMetadata(version="0.0.4"), comp(1, "a", 5)) + b"\x96")  # continuation bit, then EOF
    text = _error(path)
    assert "message 2" in text and "truncated" in text and "varint" in text


def test_truncated_message(tmp_path) -> None:
    data = frame(pb.GlobalMetadata(version="0.0.4"), comp(1, "a", 5))
    path = tmp_path / "cut.et"
    path.write_bytes(data[:-3])
    text = _error(path)
    assert "message 1" in text and "truncated" in text


def test_an_overlong_varint(tmp_path) -> None:
    path = tmp_path / "long.et"
    path.write_bytes(b"\xff" * 11)
    assert "longer than 10 bytes" in _error(path)


def test_a_node_where_the_metadata_belongs(tmp_path) -> None:
    path = tmp_path / "nometa.et"
    path.write_bytes(frame(comp(1, "a", 5), comp(2, "b", 5)))
    assert "message 0 at byte 0: not a Chakra GlobalMetadata" in _error(path)


def test_a_metadata_where_a_node_belongs(tmp_path) -> None:
    path = tmp_path / "twometa.et"
    data = frame(pb.GlobalMetadata(version="0.0.4"), pb.GlobalMetadata(version="0.0.4"))
    path.write_bytes(data)
    assert "message 1 at byte" in _error(path) and "not a Chakra Node" in _error(path)


def test_not_a_trace_at_all(tmp_path) -> None:
    path = tmp_path / "text.et"
    path.write_text("hello, this is not protobuf\n")
    _error(path)
    empty = tmp_path / "empty.et"
    empty.write_bytes(b"")
    assert "empty" in _error(empty)
    assert "no such file" in _error(tmp_path / "missing.et")


def test_an_mcdla_trace_missing_a_backward_is_refused(tmp_path) -> None:
    system = load_system("dc-dla")
    w = zoo.build("alexnet", batch=64)
    _, paths = simulate_to_chakra(tmp_path / "t", system, w, policy_plan(w, "none"))
    meta, nodes = read_trace(paths[0])
    kept = [n for n in nodes if n.name != f"B {w.layer_names[3]}"]
    bad = tmp_path / "bad.et"
    bad.write_bytes(frame(meta, *kept))
    assert "one F and one B compute node per layer" in _error(bad)


# -- bounds (NOTE [trace bounds]) -------------------------------------------------------------------------------
def test_a_gzip_bomb_is_refused_by_its_ratio_before_it_inflates(tmp_path) -> None:
    """30 MiB of zeros gzipped (~30 KB) stops at MAX_GZIP_RATIO x the gzipped size, with both sizes named."""
    from mcdla.workload.chakra import MAX_GZIP_RATIO

    packed = gzip.compress(bytes(30 * 2**20), compresslevel=9)
    path = tmp_path / "zeros.et.gz"
    path.write_bytes(packed)
    text = _error(path)
    assert f"inflates past {MAX_GZIP_RATIO * len(packed)} bytes" in text and f"its {len(packed)} gzipped" in text


def test_a_trace_with_more_nodes_than_the_bound_is_refused(tmp_path, monkeypatch) -> None:
    """Parsing stops at the first node past MAX_TRACE_NODES (here lowered to 5), naming the bound; 5 nodes pass."""
    import mcdla.workload.chakra as chakra

    monkeypatch.setattr(chakra, "MAX_TRACE_NODES", 5)
    meta = pb.GlobalMetadata(version="0.0.4")
    ok = tmp_path / "five.et"
    ok.write_bytes(frame(meta, *(comp(i, f"k{i}", 10) for i in range(5))))
    assert len(load_chakra_workload(ok).layers) == 5
    many = tmp_path / "six.et"
    many.write_bytes(frame(meta, *(comp(i, f"k{i}", 10) for i in range(6))))
    assert "message 6 at byte" in (text := _error(many)) and "more than 5 nodes" in text


def _mcdla_trace(tmp_path, edit):
    """alexnet's exported rank-0 trace with ``edit(first forward node)`` applied."""
    system = load_system("dc-dla")
    w = zoo.build("alexnet", batch=64)
    _, paths = simulate_to_chakra(tmp_path / "t", system, w, policy_plan(w, "none"))
    meta, nodes = read_trace(paths[0])
    first = next(n for n in nodes if n.name == f"F {w.layer_names[1]}")
    edit(first)
    bad = tmp_path / "bad.et"
    bad.write_bytes(frame(meta, *nodes))
    return bad


def _set_attr(node, name, **value):
    kept = [a for a in node.attr if a.name != name]
    del node.attr[:]
    node.attr.extend(kept)
    node.attr.append(pb.AttributeProto(name=name, **value))


def test_a_scalar_mcdla_inputs_is_one_line(tmp_path) -> None:
    """mcdla.inputs given as a scalar (int or string) instead of a string_list is a WorkloadError naming it."""
    for value in (dict(int64_val=3), dict(string_val="conv1")):
        path = _mcdla_trace(tmp_path, lambda n, v=value: _set_attr(n, "mcdla.inputs", **v))
        assert "mcdla.inputs: got" in (text := _error(path)) and "must be a list of layer names" in text


def test_param_bytes_past_the_bound_is_one_line_not_an_assertion(tmp_path) -> None:
    """mcdla.param_bytes = 1e308 (finite, but inf once multiplied by the optimizer factor) is refused with the
    bound, and simulating the trace is then never reached."""
    from mcdla.workload.io import MAX_LAYER_BYTES

    path = _mcdla_trace(tmp_path, lambda n: _set_attr(n, "mcdla.param_bytes", double_val=1e308))
    assert "mcdla.param_bytes: got 1e+308" in (text := _error(path)) and f"{MAX_LAYER_BYTES:g}" in text
