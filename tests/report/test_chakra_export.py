"""Chakra ET export of a simulated iteration (mcdla.report.chakra), checked with a reader written here.

The files are split into messages by this module's own varint reader and decoded by this module's own
protobuf wire-format reader, using the field numbers of Chakra's schema (``Node``: id 1, name 2, type 3,
data_deps 5, start_time_micros 6, duration_micros 7, attr 10; ``AttributeProto``: name 1, double_val 3,
int64_val 9, uint64_val 13, bool_val 27, string_val 29), so neither the writer's framing nor the generated
classes are trusted. Expected values come from the engine's own record (``SimResult.spans``) and programs.
"""

import math
import struct
from collections import Counter

import pytest

from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.report.chakra import chakra_ranks, simulate_to_chakra
from mcdla.sim import build_program, simulate
from mcdla.workload import zoo
from mcdla.workload.plan import Action, Decision, Plan

COMP, MEM_LOAD, MEM_STORE, COMM_COLL = 4, 2, 3, 7


# -- an independent reader -----------------------------------------------------------------------------------
def varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def split_messages(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size, pos = varint(data, pos)
        out.append(data[pos:pos + size])
        pos += size
    assert pos == len(data)
    return out


def fields(msg: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of every field: ints for varint/fixed, bytes for length-delimited."""
    out, pos = [], 0
    while pos < len(msg):
        key, pos = varint(msg, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(msg, pos)
        elif wire == 1:
            value, pos = msg[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = varint(msg, pos)
            value, pos = msg[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = msg[pos:pos + 4], pos + 4
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def decode_attr(msg: bytes) -> tuple[str, str, object]:
    name, kind, value = "", None, None
    for number, wire, v in fields(msg):
        if number == 1:
            name = v.decode()
        elif number == 3:
            kind, value = "double", struct.unpack("<d", v)[0]
        elif number == 9:
            kind, value = "int64", v
        elif number == 13:
            kind, value = "uint64", v
        elif number == 27:
            kind, value = "bool", bool(v)
        elif number == 29:
            kind, value = "string", v.decode()
        else:
            kind, value = f"field{number}", v
    return name, kind, value


def decode_node(msg: bytes) -> dict:
    node = {"id": 0, "name": "", "type": 0, "deps": [], "start_us": 0, "dur_us": 0, "attr": {}}
    for number, wire, v in fields(msg):
        if number == 1:
            node["id"] = v
        elif number == 2:
            node["name"] = v.decode()
        elif number == 3:
            node["type"] = v
        elif number == 5:
            if wire == 2:  # packed
                pos = 0
                while pos < len(v):
                    dep, pos = varint(v, pos)
                    node["deps"].append(dep)
            else:
                node["deps"].append(v)
        elif number == 6:
            node["start_us"] = v
        elif number == 7:
            node["dur_us"] = v
        elif number == 10:
            name, kind, value = decode_attr(v)
            node["attr"][name] = (kind, value)
    return node


def read_rank(path) -> tuple[dict, list[dict]]:
    messages = split_messages(path.read_bytes())
    meta = {}
    for number, _, v in fields(messages[0]):
        if number == 1:
            meta["version"] = v.decode()
        elif number == 2:
            name, kind, value = decode_attr(v)
            meta[name] = value
    return meta, [decode_node(m) for m in messages[1:]]


# -- cases -----------------------------------------------------------------------------------------------------
def mixed_plan(w):
    """Offload, recompute and keep, with one prefetch triggered later than the default."""
    names = w.layer_names
    decisions = []
    for i, name in enumerate(names):
        if i == 0 or w.layers[i].saved_bytes <= 0:
            continue
        if i % 3 == 1:
            decisions.append(Decision(layer=name, action=Action.RECOMPUTE))
        elif i % 3 == 2:
            later = names[min(i + 2, len(names) - 1)] if i + 2 < len(names) else None
            decisions.append(Decision(layer=name, action=Action.OFFLOAD, tier="pool", prefetch_at=later))
    return Plan(workload=w.name, batch=w.batch, budget_bytes=math.inf, decisions=tuple(decisions),
                layer_names=names, planner="mixed")


CASES = {
    "dc-dla-data-all": ("dc-dla", "alexnet", 128, "data", "all"),
    "mc-dla-model-all": ("mc-dla", "alexnet", 256, "model", "all"),
    "mc-dla-data-mixed": ("mc-dla", "vgg-e", 16, "data", "mixed"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    system_name, wl_name, batch, parallel, policy = CASES[request.param]
    system = load_system(system_name)
    w = zoo.build(wl_name, batch=batch)
    plan = mixed_plan(w) if policy == "mixed" else policy_plan(w, policy)
    prefix = tmp_path_factory.mktemp("chakra") / "it"
    result, paths = simulate_to_chakra(prefix, system, w, plan, parallel=parallel)
    assert result.feasible
    n = len(system.devices)
    programs = [build_program(w, plan, d, model_parallel=parallel == "model", n_devices=n,
                              bucket_bytes=25 * 2**20) for d in system.devices]
    return system, w, plan, parallel, result, paths, programs


def test_one_file_per_rank_named_like_chakra(exported) -> None:
    system, _, _, _, _, paths, _ = exported
    assert [p.name for p in paths] == [f"it.{r}.et" for r in range(len(system.devices))]
    assert all(p.is_file() for p in paths)


def test_metadata_comes_first(exported) -> None:
    system, w, _, parallel, result, paths, _ = exported
    for rank, path in enumerate(paths):
        meta, _ = read_rank(path)
        assert meta["version"] == "0.0.4"
        assert meta["mcdla.rank"] == rank and meta["mcdla.world_size"] == len(system.devices)
        # one group over every device: the rank is its index in the model- or data-parallel dimension
        assert (meta["mcdla.tp_rank"], meta["mcdla.dp_rank"]) == ((rank, 0) if parallel == "model" else (0, rank))
        assert meta["mcdla.workload"] == w.name and meta["mcdla.parallel"] == parallel
        assert meta["mcdla.iteration_time_s"] == result.iteration_time_s


def test_node_counts_equal_the_programs(exported) -> None:
    """COMP nodes = program ops; MEM_STORE / MEM_LOAD = offloaded layers; COMM_COLL = collectives launched."""
    _, _, _, _, _, paths, programs = exported
    for path, program in zip(paths, programs):
        _, nodes = read_rank(path)
        counts = Counter(n["type"] for n in nodes)
        offloaded = sum(program.offloaded)
        assert counts[COMP] == len(program.ops)
        assert counts[MEM_STORE] == offloaded == sum(op.offload >= 0 for op in program.ops)
        assert counts[MEM_LOAD] == offloaded
        assert counts[COMM_COLL] == sum(op.coll_bytes > 0 for op in program.ops)
        assert len(nodes) == sum(counts.values())
        comp = [n for n in nodes if n["type"] == COMP]
        assert [n["name"] for n in comp] == [op.label for op in program.ops]  # ids follow the stream order


def _spans_of(result, rank):
    by_name = {}
    for dev, stream, name, _cat, start, end in result.spans:
        if dev in (rank, -1):
            assert name not in by_name, f"label {name!r} is not unique"
            by_name[name] = (start, end)
    return by_name


def test_durations_and_starts_equal_the_simulation(exported) -> None:
    _, _, _, _, result, paths, programs = exported
    for rank, path in enumerate(paths):
        spans = _spans_of(result, rank)
        _, nodes = read_rank(path)
        assert {n["name"] for n in nodes} == set(spans)
        ops = {op.label: op for op in programs[rank].ops}
        for n in nodes:
            start, end = spans[n["name"]]
            kind, duration = n["attr"]["mcdla.duration_s"]
            if n["type"] == COMP:  # the program's own duration, exactly
                assert duration == ops[n["name"]].duration_s
                assert duration == pytest.approx(end - start, rel=1e-12, abs=1e-15)
            else:
                assert duration == end - start
            assert n["attr"]["mcdla.start_s"] == ("double", start)
            assert n["dur_us"] == round((end - start) * 1e6)
            assert n["start_us"] == round(start * 1e6)


def test_dependencies_form_a_dag_that_respects_the_simulated_order(exported) -> None:
    """Ids are 0..N-1 in file order, every dependency is an earlier node, and it ended before the node began."""
    _, _, _, _, result, paths, _ = exported
    for rank, path in enumerate(paths):
        spans = _spans_of(result, rank)
        _, nodes = read_rank(path)
        assert [n["id"] for n in nodes] == list(range(len(nodes)))
        comp = [n for n in nodes if n["type"] == COMP]
        for a, b in zip(comp, comp[1:]):
            assert a["id"] in b["deps"]  # the compute stream is a chain
        for n in nodes:
            start = spans[n["name"]][0]
            for dep in n["deps"]:
                assert dep < n["id"]
                assert spans[nodes[dep]["name"]][1] <= start, (nodes[dep]["name"], n["name"])
            if n["type"] == MEM_LOAD:  # a prefetch waits for its offload
                layer = n["name"].removeprefix("prefetch ")
                assert any(nodes[d]["name"] == f"offload {layer}" for d in n["deps"])
        colls = [n for n in nodes if n["type"] == COMM_COLL]
        for a, b in zip(colls, colls[1:]):
            assert a["id"] in b["deps"]  # one communicator: collectives in order


def test_attributes_use_chakras_names_and_types(exported) -> None:
    """The attribute names and value types Chakra's ETFeederNode reads (is_cpu_op: bool, num_ops: int64,
    tensor_size: uint64, comm_type / comm_size: int64)."""
    _, w, _, parallel, _, paths, programs = exported
    share = len(paths) if parallel == "model" else 1
    _, nodes = read_rank(paths[0])
    by_label = {op.label: op for op in programs[0].ops}
    colls = {op.coll_label: op for op in programs[0].ops if op.coll_bytes > 0}
    for n in nodes:
        assert n["attr"]["is_cpu_op"] == ("bool", False)
        if n["type"] == COMP:
            op = by_label[n["name"]]
            layer = w.layers[op.layer]
            flops = (layer.bwd_flops if n["name"].startswith("B ") else layer.fwd_flops) / share
            assert n["attr"]["num_ops"] == ("int64", round(flops))
            assert n["attr"]["tensor_size"][0] == "uint64"
        elif n["type"] in (MEM_LOAD, MEM_STORE):
            layer = n["name"].split(" ", 1)[1]
            assert n["attr"]["tensor_size"] == ("uint64", round(w.layers[w.index_of(layer)].saved_bytes))
        else:
            op = colls[n["name"]]
            assert n["attr"]["comm_type"] == ("int64", 0 if op.coll_label.startswith("all-reduce") else 2)
            assert n["attr"]["comm_size"] == ("int64", round(op.coll_bytes))


def test_the_generated_classes_read_the_same_files(exported) -> None:
    """Chakra's own way of reading (protolib.decodeMessage: varint size, then ParseFromString) agrees."""
    from mcdla.workload.et_def import et_def_pb2 as pb

    _, _, _, _, _, paths, _ = exported
    messages = split_messages(paths[-1].read_bytes())
    meta = pb.GlobalMetadata()
    meta.ParseFromString(messages[0])
    assert meta.version == "0.0.4"
    mine = [decode_node(m) for m in messages[1:]]
    for raw, expected in zip(messages[1:], mine):
        node = pb.Node()
        node.ParseFromString(raw)
        assert (node.id, node.name, node.type, list(node.data_deps), node.duration_micros) == (
            expected["id"], expected["name"], expected["type"], expected["deps"], expected["dur_us"])


def test_infeasible_or_unrecorded_results_are_refused() -> None:
    from mcdla.errors import SimError

    system = load_system("dc-dla")
    w = zoo.build("alexnet", batch=128)
    plan = policy_plan(w, "all")
    with pytest.raises(SimError, match="record_timeline"):
        chakra_ranks(system, w, plan, simulate(system, w, plan))
    big = zoo.build("vgg-e", batch=4096)
    bad = simulate(system, big, policy_plan(big, "none"), record_timeline=True)
    assert not bad.feasible
    with pytest.raises(SimError, match="infeasible") as info:
        chakra_ranks(system, big, policy_plan(big, "none"), bad)
    assert "\n" not in str(info.value)


def test_read_as_chakras_reader_loop_does(exported) -> None:
    """Chakra's Python tools (protolib.decodeMessage, used by its jsonizer and visualizer) read a varint
    size from the stream, stop at end of file or a zero size, and parse; this loop must see every node."""
    import io

    from google.protobuf.json_format import MessageToJson

    from mcdla.workload.et_def import et_def_pb2 as pb

    def decode_message(stream, message) -> bool:
        size, shift = 0, 0
        while True:
            c = stream.read(1)
            if not c:
                return False
            size |= (c[0] & 0x7F) << shift
            if c[0] < 0x80:
                break
            shift += 7
        if size == 0:
            return False
        message.ParseFromString(stream.read(size))
        return True

    _, _, _, _, _, paths, programs = exported
    stream = io.BytesIO(paths[0].read_bytes())
    meta = pb.GlobalMetadata()
    assert decode_message(stream, meta) and meta.version == "0.0.4"
    count = 0
    node = pb.Node()
    while decode_message(stream, node):
        assert MessageToJson(node)
        count += 1
    assert count == len(read_rank(paths[0])[1]) >= len(programs[0].ops)


def replay(nodes) -> float:
    """Each node starts when all its data_deps have ended and lasts its exact duration (what a dependency-driven
    replayer such as ASTRA-sim's feeder does, with recorded times); returns the makespan."""
    end = {}
    for n in nodes:  # ids are a topological order
        start = max((end[d] for d in n["deps"]), default=0.0)
        end[n["id"]] = start + n["attr"]["mcdla.duration_s"][1]
    return max(end.values())


def test_a_dependency_replay_never_exceeds_the_simulated_iteration(exported) -> None:
    """The dependencies omit only waits (for memory, for other ranks), so a replay is never slower."""
    _, _, _, _, result, paths, _ = exported
    for path in paths:
        assert replay(read_rank(path)[1]) <= result.iteration_time_s * (1 + 1e-12)


def test_a_dependency_replay_reproduces_an_iteration_without_memory_waits(tmp_path) -> None:
    """Without offloads nothing waits for memory and identical ranks launch collectives together, so the
    replay is the iteration (up to rounding of end - start)."""
    system = load_system("mc-dla")
    for parallel in ("data", "model"):
        w = zoo.build("alexnet", batch=256)
        result, paths = simulate_to_chakra(tmp_path / parallel, system, w, policy_plan(w, "none"), parallel=parallel)
        assert result.exposed_virtualization_s == 0
        assert replay(read_rank(paths[0])[1]) == pytest.approx(result.iteration_time_s, rel=1e-12)
