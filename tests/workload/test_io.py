"""Workload files: round trips, the documented example, and one-line errors naming field, value and allowed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mcdla.errors import WorkloadError
from mcdla.workload import Layer, LayerKind, Workload, load_workload, save_workload, zoo
from mcdla.workload.io import FORMAT, load_workload_file, workload_from_dict, workload_to_dict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "tiny-mlp.yaml"


def _tiny() -> Workload:
    return Workload(
        name="tiny",
        batch=4,
        precision="fp32",
        optimizer_bytes_per_param_byte=2.0,
        description="two layers",
        layers=(
            Layer(name="a", kind=LayerKind.FC, fwd_flops=1.5e6, bwd_flops=3e6, param_bytes=1024, saved_bytes=0.1),
            Layer(name="b", kind="elementwise", fwd_flops=0, bwd_flops=0, output_bytes=64, inputs=("a",)),
        ),
    )


def _doc(**layer_overrides: object) -> dict:
    layer = {"name": "fc1", "kind": "fc", "fwd_flops": 10, "bwd_flops": 20} | layer_overrides
    return {"format": FORMAT, "name": "w", "batch": 2, "layers": [layer]}


def _error(data: object) -> str:
    with pytest.raises(WorkloadError) as info:
        workload_from_dict(data, source="f")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip_is_equal(tmp_path: Path, suffix: str) -> None:
    """Saving then loading gives back an equal workload in every supported format."""
    w = _tiny()
    assert load_workload_file(save_workload(w, tmp_path / f"w{suffix}")) == w


@pytest.mark.parametrize("name", ["googlenet", "seq-lstm"])
def test_zoo_workload_round_trips_through_yaml(tmp_path: Path, name: str) -> None:
    """A zoo workload with non-chain inputs survives YAML unchanged, field for field."""
    w = zoo.build(name, batch=3)
    back = load_workload_file(save_workload(w, tmp_path / "z.yaml"))
    assert back == w
    assert [layer.inputs for layer in back] == [layer.inputs for layer in w]


_names = st.text(alphabet="abcdefgh.0123456789", min_size=1, max_size=8)
_numbers = st.floats(min_value=0, max_value=1e18, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(_names, st.sampled_from(list(LayerKind)), st.lists(_numbers, min_size=8, max_size=8)),
             min_size=1, max_size=6, unique_by=lambda t: t[0]),  # fmt: skip
    st.integers(min_value=1, max_value=10**6),
)
def test_any_workload_round_trips_through_json(layers: list, batch: int) -> None:
    """Every finite non-negative workload survives the JSON document exactly (floats included)."""
    built = []
    for i, (name, kind, nums) in enumerate(layers):
        fields = dict(zip(("fwd_flops", "bwd_flops", "fwd_bytes_moved", "bwd_bytes_moved", "param_bytes",
                           "output_bytes", "saved_bytes", "workspace_bytes"), nums))  # fmt: skip
        inputs = (built[0].name,) if i > 1 else ()
        built.append(Layer(name=name, kind=kind, inputs=inputs, **fields))
    w = Workload(name="h", batch=batch, layers=tuple(built))
    assert workload_from_dict(json.loads(json.dumps(workload_to_dict(w)))) == w


def test_example_file_parses_unit_strings() -> None:
    """The documented example loads, and its "1.5GiB"-style sizes become bytes."""
    w = load_workload_file(EXAMPLE)
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert w.name == raw["name"] and len(w) == len(raw["layers"])
    fc1 = w.layers[w.index_of("fc1")]
    assert fc1.param_bytes == 1024 * 4096 * 2 + 4096 * 2  # "8200KiB" = 8,396,800 bytes
    assert fc1.fwd_flops == 2 * raw["batch"] * 1024 * 4096


def test_byte_field_accepts_unit_string() -> None:
    """A byte field given as "1.5GiB" is 1.5 * 2**30 bytes."""
    w = workload_from_dict(_doc(saved_bytes="1.5GiB"))
    assert w.layers[0].saved_bytes == 1.5 * 2**30


def test_flop_field_accepts_numeric_string() -> None:
    """YAML 1.1 reads 2.5e9 as a string; a FLOP field accepts it as the number."""
    assert workload_from_dict(_doc(fwd_flops="2.5e9")).layers[0].fwd_flops == 2.5e9


def test_negative_flops_error_names_path_value_and_rule() -> None:
    """A negative FLOP count is rejected with its path, value and the allowed range."""
    message = _error(_doc(fwd_flops=-3))
    assert message.startswith("f: layers[0].fwd_flops: got -3;") and ">= 0" in message


def test_bad_byte_string_error() -> None:
    """An unparsable size names the field and shows an example of what is allowed."""
    message = _error(_doc(param_bytes="lots"))
    assert "layers[0].param_bytes: got 'lots'" in message and "1.5GiB" in message


def test_flop_unit_string_is_rejected() -> None:
    """FLOP fields take plain numbers only; a unit string is named in the error."""
    assert "layers[0].bwd_flops: got '2GFLOP'" in _error(_doc(bwd_flops="2GFLOP"))


def test_unknown_kind_lists_allowed_kinds() -> None:
    """An unknown layer kind lists every allowed kind."""
    message = _error(_doc(kind="dense"))
    assert "layers[0].kind: got 'dense'" in message
    assert all(k.value in message for k in LayerKind)


def test_missing_field_is_named() -> None:
    """A missing required field is named by its path."""
    doc = _doc()
    del doc["layers"][0]["bwd_flops"]
    assert _error(doc) == "f: layers[0].bwd_flops: required field is missing"


def test_unknown_field_is_named() -> None:
    """A misspelt field is reported as unknown, not silently ignored."""
    assert "layers[0].saved_byte: got 5; unknown field" in _error(_doc(saved_byte=5))


def test_wrong_format_tag() -> None:
    """A document without the format tag says which tag is required."""
    doc = _doc()
    doc["format"] = "mcdla-workload/2"
    assert _error(doc) == f"f: format: got 'mcdla-workload/2'; must be {FORMAT!r}"


@pytest.mark.parametrize("batch", [0, 1.5, True])
def test_bad_batch(batch: object) -> None:
    """Batch must be an integer >= 1 (not a float, not a bool)."""
    doc = _doc()
    doc["batch"] = batch
    assert _error(doc).startswith(f"f: batch: got {batch!r};")


def test_duplicate_layer_name_is_reported_with_source() -> None:
    """Model-level checks (duplicate names) come through with the file prefix."""
    doc = _doc()
    doc["layers"].append(dict(doc["layers"][0]))
    message = _error(doc)
    assert message.startswith("f: ") and "duplicate 'fc1'" in message


def test_input_naming_a_later_layer_is_rejected() -> None:
    """``inputs`` must name earlier layers (the list order is the execution order)."""
    assert "must name an earlier layer" in _error(_doc(inputs=["later"]))


def test_non_mapping_document() -> None:
    """A YAML list instead of a mapping is rejected naming the format."""
    assert FORMAT in _error([1, 2])


def test_bad_suffix(tmp_path: Path) -> None:
    """Only .json/.yaml/.yml are accepted, for saving and loading."""
    with pytest.raises(WorkloadError, match=r"suffix '.txt' is not supported; must be one of .json, .yaml, .yml"):
        save_workload(_tiny(), tmp_path / "w.txt")


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is named."""
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload_file(tmp_path / "nope.yaml")


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    """A YAML syntax error gives one line with the line number."""
    path = tmp_path / "bad.yaml"
    path.write_text("format: mcdla-workload/1\nlayers: [\n")
    with pytest.raises(WorkloadError) as info:
        load_workload_file(path)
    assert "not valid YAML" in str(info.value) and "line" in str(info.value) and "\n" not in str(info.value)


def test_invalid_json(tmp_path: Path) -> None:
    """A JSON syntax error gives one line with the line number."""
    path = tmp_path / "bad.json"
    path.write_text('{"format": }')
    with pytest.raises(WorkloadError, match=r"not valid JSON .* at line 1\)$"):
        load_workload_file(path)


def test_load_workload_by_zoo_name_and_batch() -> None:
    """A zoo name builds the zoo workload at the requested batch."""
    assert load_workload("alexnet", batch=16) == zoo.build("alexnet", batch=16)


def test_load_workload_by_path_rescales(tmp_path: Path) -> None:
    """A path loads the file; a batch rescales it with with_batch."""
    path = save_workload(_tiny(), tmp_path / "t.json")
    assert load_workload(path) == _tiny()
    assert load_workload(str(path), batch=8).layers[0].fwd_flops == 2 * _tiny().layers[0].fwd_flops


def test_load_workload_unknown_name_lists_zoo() -> None:
    """Neither a zoo name nor a workload file: the error lists the zoo names."""
    with pytest.raises(WorkloadError) as info:
        load_workload("vgg19")
    assert "got 'vgg19'" in str(info.value) and all(n in str(info.value) for n in zoo.names())


def test_saved_numbers_are_base_units(tmp_path: Path) -> None:
    """Files store plain numbers in bytes and FLOP (integral values as integers)."""
    data = json.loads(save_workload(_tiny(), tmp_path / "t.json").read_text())
    first = data["layers"][0]
    assert first["param_bytes"] == 1024 and isinstance(first["param_bytes"], int)
    assert math.isclose(first["saved_bytes"], 0.1)


def test_non_utf8_directory_and_device_files_are_refused(tmp_path: Path) -> None:
    """Binary bytes, a directory and /dev/zero are one-line WorkloadErrors naming what is allowed."""
    (tmp_path / "bin.yaml").write_bytes(b"format: \xff\xfe")
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    for name, needle in (("bin.yaml", "not UTF-8 text (byte 0xff"), ("dir.yaml", "directory, must be a regular file"),
                         ("zero.yaml", "FIFO or socket, must be a regular file")):
        with pytest.raises(WorkloadError, match=needle.replace("(", r"\(")) as info:
            load_workload_file(tmp_path / name)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("field", ["optimizer_bytes_per_param_byte", "batch"])
def test_non_finite_and_huge_numbers_are_refused(field: str) -> None:
    """inf, NaN and a 400-digit integer are refused with a short message (the value is not printed whole)."""
    for bad in (math.inf, math.nan, 10**400):
        message = _error(_doc() | {field: bad})
        assert field in message and len(message) < 200


def test_json_nan_constant_and_deep_nesting_are_refused(tmp_path: Path) -> None:
    """NaN/Infinity tokens are not JSON; 100k-deep nesting is refused without a RecursionError."""
    (tmp_path / "nan.json").write_text(json.dumps(_doc(fwd_flops=math.nan)))
    with pytest.raises(WorkloadError, match="NaN is not allowed"):
        load_workload_file(tmp_path / "nan.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(WorkloadError, match="nested too deeply"):
        load_workload_file(tmp_path / "deep.json")
