"""The committed et_def_pb2.py matches et_def.proto (Chakra's schema, copied into mcdla)."""

import re
from pathlib import Path

import pytest

from mcdla.workload.et_def import et_def_pb2 as pb

HERE = Path(pb.__file__).resolve().parent
PROTO = HERE / "et_def.proto"


def _blocks(text: str) -> list[tuple[str, str, str]]:
    """Top-level ``(message|enum, name, body)`` of a .proto text without comments."""
    out, pos = [], 0
    pattern = re.compile(r"\b(message|enum)\s+(\w+)\s*\{")
    while (m := pattern.search(text, pos)):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.group(1), m.group(2), text[m.end():i - 1]))
        pos = i
    return out


def _declared(body: str) -> set[tuple[str, int]]:
    """Every ``name = number;`` in a block: fields, oneof members, nested enum values."""
    return {(name, int(num)) for name, num in re.findall(r"(\w+)\s*=\s*(\d+)\s*;", body)}


def _described(desc) -> set[tuple[str, int]]:
    found = {(f.name, f.number) for f in desc.fields}
    for enum in desc.enum_types:
        found |= {(v.name, v.number) for v in enum.values}
    for nested in desc.nested_types:
        found |= _described(nested)
    return found


def test_every_message_and_enum_of_the_proto_is_generated_with_the_same_numbers() -> None:
    text = re.sub(r"//[^\n]*", "", PROTO.read_text())
    assert 'package ChakraProtoMsg;' in text
    blocks = _blocks(text)
    assert {name for _, name, _ in blocks} == set(pb.DESCRIPTOR.message_types_by_name) | set(
        pb.DESCRIPTOR.enum_types_by_name)
    for kind, name, body in blocks:
        if kind == "enum":
            enum = pb.DESCRIPTOR.enum_types_by_name[name]
            assert _declared(body) == {(v.name, v.number) for v in enum.values}, name
        else:
            assert _declared(body) == _described(pb.DESCRIPTOR.message_types_by_name[name]), name


def test_the_fields_chakra_tools_rely_on() -> None:
    """Node and GlobalMetadata field numbers as in Chakra's schema (what its feeder and converters use)."""
    node = {f.name: f.number for f in pb.Node.DESCRIPTOR.fields}
    assert node == {"id": 1, "name": 2, "type": 3, "ctrl_deps": 4, "data_deps": 5, "start_time_micros": 6,
                    "duration_micros": 7, "inputs": 8, "outputs": 9, "attr": 10, "storage": 11}
    assert {f.name: f.number for f in pb.GlobalMetadata.DESCRIPTOR.fields} == {"version": 1, "attr": 2}
    assert (pb.COMP_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE, pb.COMM_COLL_NODE) == (4, 2, 3, 7)
    assert (pb.ALL_REDUCE, pb.ALL_GATHER) == (0, 2)


def test_the_schema_lives_in_a_private_pool() -> None:
    """So another copy of Chakra's schema (Chakra's own et_def_pb2) can be imported beside it."""
    from google.protobuf import descriptor_pool

    assert pb.DESCRIPTOR.pool is pb.POOL
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("ChakraProtoMsg.Node")


def test_the_committed_module_is_what_the_generator_writes() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (protoc) is not installed; it is only needed to regenerate")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_et_generate", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generate_text(PROTO) == (HERE / "et_def_pb2.py").read_text()
