"""The execution record: consistency checks, model checks, and files (YAML/JSON, strict)."""

import json

import pytest

from mcdla.errors import ConfigError
from mcdla.workload.execution import (Execution, check_execution, execution_from_dict, execution_to_dict,
                                      load_execution)
from mcdla.workload.transformer import preset

GOOD = dict(gpus=64, tp=8, pp=8, dp=1, virtual_stages=3, sequence_parallel=True, micro_batch=1, global_batch=64,
            recompute="selective")


def test_micro_batches_and_bubble():
    """m = B / (b dp) and the interleaved bubble (p - 1) / (m v) (SC21, sec. 2.2.2)."""
    e = Execution(**GOOD)
    assert e.micro_batches == 64
    assert e.bubble_fraction == pytest.approx(7 / (64 * 3))


@pytest.mark.parametrize("change, field", [
    (dict(dp=2), "gpus"),                                  # tp*pp*dp*cp != gpus
    (dict(tp=1, gpus=8, sequence_parallel=True), "sequence_parallel"),
    (dict(global_batch=65), "global_batch"),               # not a multiple of micro_batch * dp
    (dict(global_batch=60, micro_batch=1), "global_batch"),  # interleaving needs m % pp == 0
    (dict(pp=1, gpus=8, virtual_stages=2), "virtual_stages"),
    (dict(zero=2), "zero"),                                # ZeRO without data parallelism
    (dict(recompute="some"), "recompute"),
    (dict(tp=0), "tp"),
    (dict(micro_batch=True), "micro_batch"),
])
def test_inconsistent_record_one_line_error(change, field):
    """Each impossible combination raises one line naming the field."""
    with pytest.raises(ConfigError, match=rf"^execution\.{field}: got ") as info:
        Execution(**{**GOOD, **change})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("model, change, needle", [
    ("gpt3-175b", dict(pp=5, gpus=40, global_batch=40), "must divide the 96 layers"),
    ("gpt3-175b", dict(pp=4, gpus=32, virtual_stages=5, global_batch=64), "must divide the 96 layers"),
    ("megatron-1.7b", dict(tp=16, pp=4, gpus=64, virtual_stages=1), "24 attention heads"),
    ("llama3-8b", dict(tp=16, pp=4, gpus=64, virtual_stages=1), "8 kv-heads"),
    ("gpt3-175b", dict(cp=3, pp=1, gpus=24, virtual_stages=1, global_batch=8), "sequence length 2048"),
])
def test_execution_must_fit_the_model(model, change, needle):
    """Layers per virtual stage, heads and kv-heads per TP rank and sequence per CP rank must be whole."""
    with pytest.raises(ConfigError, match=needle):
        check_execution(Execution(**{**GOOD, **change}), preset(model))


def test_valid_record_fits_its_model():
    """Korthikanti's 175B configuration (TP8 PP8 v3) passes the model checks."""
    check_execution(Execution(**GOOD), preset("gpt3-175b"))


def test_yaml_and_json_round_trip(tmp_path):
    """A record saved as JSON or written as YAML loads back equal."""
    e = Execution(**GOOD, zero=0)
    (tmp_path / "e.json").write_text(json.dumps(execution_to_dict(e)))
    (tmp_path / "e.yaml").write_text("\n".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
                                               for k, v in execution_to_dict(e).items()))
    assert load_execution(tmp_path / "e.json") == e == load_execution(tmp_path / "e.yaml")


@pytest.mark.parametrize("data, needle", [
    ({**GOOD, "tensor_parallel": 8}, "execution.tensor_parallel: unknown field"),
    ({**GOOD, "tp": "8"}, "execution.tp: got '8'"),
    ({**GOOD, "tp": 8.0}, "execution.tp: got 8.0"),
    ({**GOOD, "zero": 4}, "execution.zero: got 4"),
    ({**GOOD, "recompute": "most"}, "execution.recompute: got 'most'"),
    ({**GOOD, "dp": 2}, "execution.gpus: got 64"),
    ({k: v for k, v in GOOD.items() if k != "gpus"}, "execution.gpus: missing; required"),
    ([1, 2], "must be a mapping"),
])
def test_bad_file_content_one_line(data, needle):
    """Unknown fields, wrong types, out-of-range values and inconsistent degrees are one-line errors."""
    with pytest.raises(ConfigError, match=needle) as info:
        execution_from_dict(data)
    assert "\n" not in str(info.value)


def test_unknown_field_names_the_closest_fields_in_a_short_line():
    """A misspelt field among the record's many: the line counts the fields and names the ones closest to the
    misspelling instead of spelling out all of them (about 600 characters, which with a file's path would pass
    the CLI's 600-character bound)."""
    from dataclasses import fields

    names = [f.name for f in fields(Execution)]
    assert len(", ".join(names)) > 500
    with pytest.raises(ConfigError) as info:
        execution_from_dict({**GOOD, "optimizer_kernel": "foreach"})
    line = str(info.value)
    assert line.startswith("execution: execution.optimizer_kernel: unknown field; allowed: ")
    assert f"{len(names)} fields" in line and "closest: optimizer_kernels" in line and len(line) < 300


def test_non_finite_number_refused(tmp_path):
    """`.inf` in a YAML file is refused, not coerced."""
    path = tmp_path / "e.yaml"
    path.write_text("gpus: .inf\n")
    with pytest.raises(ConfigError, match="execution.gpus"):
        load_execution(path)
