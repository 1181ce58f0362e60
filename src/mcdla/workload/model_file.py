"""Transformer models from files: a YAML/JSON model file, a Hugging Face ``config.json``, or a preset name.

A model file holds the :class:`~mcdla.workload.transformer.TransformerSpec` fields themselves (``mla`` as a
nested mapping of :class:`~mcdla.workload.transformer.MlaAttention`'s), read strictly with pydantic: unknown
fields, wrong types and non-finite numbers are refused in one line naming the field. A JSON document with a
``model_type`` is a Hugging Face config (:mod:`mcdla.workload.hf_config`). :func:`resolve_model` is the one
place the commands turn their ``--model`` into a spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcdla._io_safety import read_document
from mcdla.errors import WorkloadError, brief, validation_line
from mcdla.workload.hf_config import hf_model_name, is_hf_config, spec_from_hf_config
from mcdla.workload.transformer import PRESETS, MlaAttention, TransformerSpec, preset_names

__all__ = ["load_model_file", "model_from_dict", "resolve_model"]

_SUFFIXES = (".json", ".yaml", ".yml")


class _MlaFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)
    q_lora_rank: int | None = Field(default=None, ge=1)


class _ModelFile(BaseModel):
    """The :class:`TransformerSpec` fields as a file holds them (its docstring gives their meaning)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=200)
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    vocab: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    ffn_hidden: int | None = Field(default=None, ge=1)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    experts: int = Field(default=1, ge=1)
    top_k: int = Field(default=1, ge=1)
    dropout: bool = True
    bias: bool = True
    position: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = True
    causal: bool = True
    bytes_per_element: int = Field(default=2, ge=1)
    source: str = ""
    attention_head_dim: int | None = Field(default=None, ge=1)
    qkv_bias: bool = False
    qk_norm: bool = False
    shared_experts: int = Field(default=0, ge=0)
    dense_layers: int = Field(default=0, ge=0)
    dense_ffn_hidden: int | None = Field(default=None, ge=1)
    mla: _MlaFile | None = None


def _one_line(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    allowed = _MlaFile.model_fields if err["loc"][:1] == ("mla",) else _ModelFile.model_fields
    return validation_line(err, source, "model", allowed)


def model_from_dict(data: Any, source: str = "model") -> TransformerSpec:
    """A spec from a parsed model file; one-line WorkloadError naming the field otherwise."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: got {brief(data)}; must be a mapping of transformer fields")
    try:
        parsed = _ModelFile.model_validate(data)
    except ValidationError as exc:
        raise WorkloadError(_one_line(exc, source)) from None
    fields = parsed.model_dump()
    if fields["mla"] is not None:
        fields["mla"] = MlaAttention(**fields["mla"])
    fields["source"] = fields["source"] or source
    try:
        return TransformerSpec(**fields)
    except WorkloadError as exc:
        raise WorkloadError(f"{source}: {exc}") from None


def load_model_file(path: str | Path, *, seq_len: int | None = None) -> TransformerSpec:
    """A spec from a ``.yaml``/``.yml``/``.json`` model file or a Hugging Face ``config.json``; ``seq_len``
    replaces the file's (or the config's pre-training context)."""
    p = Path(path)
    source = f"model file {str(p)[:200]!r}"
    data = read_document(p, what="model file", error=WorkloadError)
    if p.suffix.lower() == ".json" and is_hf_config(data):
        return spec_from_hf_config(data, name=hf_model_name(p), seq_len=seq_len, source=f"config {str(p)[:200]!r}")
    spec = model_from_dict(data, source=source)
    return spec if seq_len is None else spec.with_seq_len(seq_len)


def resolve_model(model: str, *, seq_len: int | None = None) -> TransformerSpec:
    """What a command's ``--model`` names: a preset (``llama3-70b``) or the path of a model file or a Hugging
    Face ``config.json``; one-line WorkloadError listing the presets otherwise."""
    if model in PRESETS:
        spec = PRESETS[model]
        return spec if seq_len is None else spec.with_seq_len(seq_len)
    path = Path(model)
    if path.suffix.lower() in _SUFFIXES and path.is_file():
        return load_model_file(path, seq_len=seq_len)
    if path.suffix.lower() in _SUFFIXES:
        raise WorkloadError(f"transformer: got {brief(model)}; no such file (a model file or a Hugging Face "
                            "config.json)")
    raise WorkloadError(f"transformer: got {brief(model)}; must be one of {', '.join(preset_names())} or the path "
                        f"of a model file ({', '.join(_SUFFIXES)}) or a Hugging Face config.json")
