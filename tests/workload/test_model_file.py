"""Model files (YAML/JSON with the TransformerSpec fields) and the --model resolver the commands share."""

import dataclasses
import json

import pytest
from mcdla.errors import WorkloadError
from mcdla.workload.model_file import load_model_file, model_from_dict, resolve_model
from mcdla.workload.transformer import MlaAttention, TransformerSpec, preset


def _fields(spec: TransformerSpec) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_preset_written_as_a_file_loads_back_equal(tmp_path, suffix):
    """The llama3-70b preset's fields written as YAML or JSON load back as the same spec."""
    spec = preset("llama3-70b")
    fields = {k: v for k, v in _fields(spec).items() if v is not None}
    path = tmp_path / f"m{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(fields))
    else:
        path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()))
    assert load_model_file(path) == spec


def test_mla_is_a_nested_mapping(tmp_path):
    """``mla`` in a file becomes an MlaAttention; parameters follow the MLA count of its matrices."""
    path = tmp_path / "tiny-mla.yaml"
    path.write_text("name: tiny\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 32\nmlp: swiglu\n"
                    "bias: false\ndropout: false\nposition: rope\ntied_embeddings: false\nffn_hidden: 128\n"
                    "mla: {kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4, v_head_dim: 8}\n")
    spec = load_model_file(path)
    assert spec.mla == MlaAttention(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    attention = 64 * 4 * 12 + 64 * (16 + 4) + 16 + 16 * 4 * (8 + 8) + 4 * 8 * 64  # q, kv down + norm, kv up, out
    per_layer = attention + 3 * 64 * 128 + 2 * 64
    assert spec.params() == 2 * per_layer + 2 * 100 * 64 + 64


@pytest.mark.parametrize("change, needle", [
    ({"hidden_size": 4096}, "model.hidden_size: unknown field; allowed: name, layers"),
    ({"layers": "32"}, "model.layers: got '32'"),
    ({"layers": 0}, "model.layers: got 0"),
    ({"mlp": "relu"}, "model.mlp: got 'relu'"),
    ({"mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "rank": 2}},
     "model.mla.rank: unknown field; allowed: kv_lora_rank"),
    ({"mla": {"kv_lora_rank": 8}}, "model.mla.qk_nope_head_dim: missing; required"),
    ({"heads": 48}, "heads: got 48; must divide hidden"),
])
def test_bad_model_file_is_one_line_naming_the_field(change, needle):
    """Unknown fields, wrong types, out-of-range values and inconsistent shapes: one line naming the field."""
    base = {"name": "m", "layers": 2, "hidden": 256, "heads": 8, "vocab": 100, "seq_len": 64}
    with pytest.raises(WorkloadError) as err:
        model_from_dict({**base, **change})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_resolver_takes_presets_and_refuses_unknown_names():
    """A preset name resolves to the preset (with seq_len replaced when given); an unknown name or a missing
    file is one line listing the presets."""
    assert resolve_model("gpt3-175b") is preset("gpt3-175b")
    assert resolve_model("gpt3-175b", seq_len=4096).seq_len == 4096
    with pytest.raises(WorkloadError, match=r"^transformer: got 'gpt9'; must be one of .*gpt3-175b.* config\.json$"):
        resolve_model("gpt9")
    with pytest.raises(WorkloadError, match=r"^transformer: got 'missing\.yaml'; no such file"):
        resolve_model("missing.yaml")
