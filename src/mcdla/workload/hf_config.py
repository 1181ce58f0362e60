"""A :class:`~mcdla.workload.transformer.TransformerSpec` from a Hugging Face ``config.json``, read, never downloaded.

The families the LLM time model can run, each mapped field by field (NOTE [hf mapping]); any other
``model_type`` is refused in one line that lists these. Fields outside the mapping (token ids, RoPE theta,
initialisation, dtype) do not change the shape and are ignored; a field that would change it in a way the
model cannot express (a non-SiLU activation, attention biases on Llama, sparse-step MoE) is refused.

NOTE [hf mapping] Every family: ``num_hidden_layers`` -> layers, ``hidden_size`` -> hidden,
``num_attention_heads`` -> heads, ``num_key_value_heads`` (default: heads) -> kv_heads, ``vocab_size`` -> vocab,
``tie_word_embeddings`` (default false) -> tied_embeddings, ``head_dim`` -> attention_head_dim when it is not
``hidden / heads``, ``hidden_act: silu`` -> SwiGLU; RMSNorm, RoPE, no dropout, no linear biases. The sequence
length is the caller's, else the pre-training context: ``rope_scaling.original_max_position_embeddings`` when
the config extends RoPE, else ``max_position_embeddings``.

* ``llama`` (Llama 1/2/3), ``mistral``: dense, ``intermediate_size`` -> ffn_hidden.
* ``mixtral``: ``num_local_experts`` -> experts, ``num_experts_per_tok`` -> top_k, ffn_hidden per expert.
* ``qwen2``: biases on Q, K and V (Qwen2's attention always has them) -> qkv_bias.
* ``qwen3``: RMSNorm on each Q and K head -> qk_norm; ``qwen3_moe`` adds ``num_experts``,
  ``num_experts_per_tok`` and ``moe_intermediate_size`` (every layer sparse: ``decoder_sparse_step`` 1, no
  ``mlp_only_layers``).
* ``deepseek_v2``, ``deepseek_v3``: ``n_routed_experts``, ``num_experts_per_tok``, ``n_shared_experts`` ->
  shared_experts, ``moe_intermediate_size`` -> ffn_hidden, ``first_k_dense_replace`` -> dense_layers of
  ``intermediate_size``; MLA from ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim`` (:class:`~mcdla.workload.transformer.MlaAttention`: parameters exact,
  time as multi-head attention over the expanded per-head Q, K, V), kv_heads = heads. Left out: the
  multi-token-prediction layers (``num_nextn_predict_layers``, not part of the 671B of DeepSeek-V3) and V3's
  per-expert router score bias (256 numbers a layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcdla._io_safety import read_document
from mcdla.errors import WorkloadError, brief, field_path
from mcdla.workload.transformer import MlaAttention, TransformerSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "hf_model_name", "is_hf_config", "load_hf_config", "spec_from_hf_config"]

SUPPORTED_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe")
_MOE_FIELDS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
}
_MOE_FIELDS["deepseek_v3"] = _MOE_FIELDS["deepseek_v2"]


class _HfConfig(BaseModel):
    """The fields of a ``config.json`` the mapping reads (NOTE [hf mapping]); the others are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model_type: str
    num_hidden_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int | None = Field(default=None, ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    hidden_act: Literal["silu"] = "silu"
    attention_bias: Literal[False] = False
    head_dim: int | None = Field(default=None, ge=1)
    num_local_experts: int | None = Field(default=None, ge=1)
    num_experts: int | None = Field(default=None, ge=1)
    num_experts_per_tok: int | None = Field(default=None, ge=1)
    moe_intermediate_size: int | None = Field(default=None, ge=1)
    decoder_sparse_step: Literal[1] = 1
    mlp_only_layers: list[int] = Field(default_factory=list, max_length=0)
    n_routed_experts: int | None = Field(default=None, ge=1)
    n_shared_experts: int | None = Field(default=None, ge=0)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_freq: Literal[1] = 1
    q_lora_rank: int | None = Field(default=None, ge=1)
    kv_lora_rank: int | None = Field(default=None, ge=1)
    qk_nope_head_dim: int | None = Field(default=None, ge=1)
    qk_rope_head_dim: int | None = Field(default=None, ge=1)
    v_head_dim: int | None = Field(default=None, ge=1)


def is_hf_config(data: Any) -> bool:
    """Whether a parsed JSON document is a Hugging Face model config (it names a ``model_type``)."""
    return isinstance(data, dict) and "model_type" in data


def _seq_len(c: _HfConfig) -> int:
    """The pre-training context (NOTE [hf mapping])."""
    original = (c.rope_scaling or {}).get("original_max_position_embeddings")
    if isinstance(original, int) and not isinstance(original, bool) and original >= 1:
        return original
    return c.max_position_embeddings


def spec_from_hf_config(data: Any, *, name: str, seq_len: int | None = None,
                        source: str = "config.json") -> TransformerSpec:
    """The spec of a parsed ``config.json`` (NOTE [hf mapping]); one-line WorkloadError naming the field
    otherwise. ``seq_len``: tokens per sample (None = the pre-training context)."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: got {brief(data)}; must be a JSON object (a Hugging Face config)")
    model_type = data.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise WorkloadError(f"{source}: model_type: got {brief(model_type)}; must be one of "
                            f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    try:
        c = _HfConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = str(err["msg"]).removeprefix("Value error, ")
        raise WorkloadError(f"{source}: {field_path(err['loc'])}: got {brief(err.get('input'))}; "
                            f"{message[:1].lower()}{message[1:]}") from None
    for field in _MOE_FIELDS.get(c.model_type, ()):
        if getattr(c, field) is None:
            raise WorkloadError(f"{source}: {field}: missing; a {c.model_type} config must give it")
    heads = c.num_attention_heads
    head_dim = c.head_dim if c.head_dim is not None and c.head_dim * heads != c.hidden_size else None
    shape: dict[str, Any] = dict(
        name=name, layers=c.num_hidden_layers, hidden=c.hidden_size, heads=heads,
        kv_heads=c.num_key_value_heads or heads, ffn_hidden=c.intermediate_size, mlp="swiglu", vocab=c.vocab_size,
        seq_len=seq_len if seq_len is not None else _seq_len(c), dropout=False, bias=False, position="rope",
        tied_embeddings=c.tie_word_embeddings, attention_head_dim=head_dim, source=source,
        qkv_bias=c.model_type == "qwen2", qk_norm=c.model_type.startswith("qwen3"))
    if c.model_type == "mixtral":
        shape.update(experts=c.num_local_experts, top_k=c.num_experts_per_tok)
    elif c.model_type == "qwen3_moe":
        shape.update(experts=c.num_experts, top_k=c.num_experts_per_tok, ffn_hidden=c.moe_intermediate_size)
    elif c.model_type.startswith("deepseek"):
        dense = c.first_k_dense_replace
        shape.update(experts=c.n_routed_experts, top_k=c.num_experts_per_tok, shared_experts=c.n_shared_experts or 0,
                     ffn_hidden=c.moe_intermediate_size, dense_layers=dense,
                     dense_ffn_hidden=c.intermediate_size if dense else None, kv_heads=heads,
                     attention_head_dim=None,
                     mla=MlaAttention(q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,  # type: ignore[arg-type]
                                      qk_nope_head_dim=c.qk_nope_head_dim,  # type: ignore[arg-type]
                                      qk_rope_head_dim=c.qk_rope_head_dim,  # type: ignore[arg-type]
                                      v_head_dim=c.v_head_dim))  # type: ignore[arg-type]
    try:
        return TransformerSpec(**shape)
    except WorkloadError as exc:
        raise WorkloadError(f"{source}: {exc}") from None


def hf_model_name(path: Path) -> str:
    """A config's model name: its folder's when the file is ``config.json`` (``Meta-Llama-3-8B/config.json``
    -> ``Meta-Llama-3-8B``), else the file's stem."""
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def load_hf_config(path: str | Path, *, seq_len: int | None = None) -> TransformerSpec:
    """Read a Hugging Face ``config.json`` from disk (never from the network)."""
    p = Path(path)
    data = read_document(p, what="Hugging Face config", error=WorkloadError, json_format=True)
    return spec_from_hf_config(data, name=hf_model_name(p), seq_len=seq_len, source=f"config {str(p)[:200]!r}")
