"""Decoder-only transformers described by a few numbers: parameters, FLOPs and activation bytes per layer.

The LLM counterpart of the layer-chain zoo: instead of listing layers, a :class:`TransformerSpec` gives the
shape (layers, hidden, heads, kv-heads for GQA, FFN size and GELU/SwiGLU, vocabulary, sequence length,
optionally MoE experts with top-k routing) and the functions here derive, per layer and per micro-batch,
what the time model (:mod:`mcdla.sim.llm`) and memory planning need. Units: FLOP (a multiply-add is 2 FLOP),
bytes, elements of ``bytes_per_element`` (2 for fp16/bf16).

NOTE [formulas] For a GPT layer (MHA, FFN 4h GELU, dropout) the counts reduce exactly to the published
closed forms, which the tests check: forward FLOPs ``24 b s h^2 + 4 b s^2 h`` per layer and model FLOPs
``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` per iteration (Korthikanti et al. 2022, sec. 6; Narayanan et al.
SC21, appendix, which with full recomputation gives ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``); activation
bytes per layer ``s b h (34 + 5 a s / h)`` and its tensor/sequence-parallel and recompute variants
(Korthikanti et al. 2022, sec. 4, Table 2). With ``attention="materialized"`` (Megatron's fused softmax, the
default of these functions) the attention core is counted over the full ``s x s`` score matrix (no causal
halving), as both papers do. Biases and norms are counted in parameters but their FLOPs are ignored (both
papers ignore them).

NOTE [flash attention] ``attention="flash"`` is a fused FlashAttention-2 kernel (Dao 2023, "FlashAttention-2",
sec. 3): the ``s x s`` scores live in on-chip memory only, so a layer stashes no scores, only the softmax
statistics (logsumexp, fp32, ``b x a x s``); with a causal mask the kernel skips the blocks above the diagonal,
halving the attention-core FLOPs (``2 b s^2 h`` forward instead of ``4 b s^2 h``); the backward recomputes
``S = Q K^T`` and ``P`` from Q, K and the logsumexp, five matrix products against the forward's two: 2.5x the
forward core FLOPs (sec. 3.2). Its compulsory HBM traffic is Q, K, V read and O (and the logsumexp) written in
forward; Q, K, V, O, dO and the logsumexp read and dQ, dK, dV written in backward. Re-reads of K and V across
query blocks are counted as served by the L2 cache (a head's K and V fit in it at the lengths trained today).
Its softmax evaluates one exponential per score, in forward and again in backward, on the special-function
units (``MUFU.EX2``), whose rate is far below the tensor cores' (H100: 3.9 T/s against 989 TFLOP/s, Shah et al.
2024, "FlashAttention-3"; Blackwell Ultra doubles Blackwell's): a device that gives that rate
(``Device.exp_per_s``) charges them after the matrix products, not overlapped (the softmax of a block sits between
its two products, NVIDIA's "Making Softmax More Efficient with Blackwell Ultra").
Model FLOPs (the MFU numerator) keep the full-matrix count of the published formulas either way.

NOTE [model families] The shape also covers today's open models read from a Hugging Face ``config.json``
(:mod:`mcdla.workload.hf_config`): an explicit ``attention_head_dim`` (Qwen3: heads x head size != hidden),
biases on Q, K and V only (``qkv_bias``, Qwen2), RMSNorm on each Q and K head (``qk_norm``, Qwen3), MoE with
``shared_experts`` every token runs besides its ``top_k`` routed ones and ``dense_layers`` leading layers with
a dense FFN of ``dense_ffn_hidden`` (DeepSeek), and DeepSeek's multi-head latent attention (:class:`MlaAttention`).
Parameters are counted exactly for all of them. The per-layer FLOP and byte functions give the mean layer
when ``dense_layers`` makes layers differ, so a model's totals are exact; each kind's own layer is what they give
for :meth:`TransformerSpec.layer_kinds`, with which the time model prices every model chunk by the dense and MoE
layers it holds (NOTE [layer kinds] in :mod:`mcdla.sim.llm`). Projection FLOPs are ``2 x tokens x`` the
projection weights, which is the GPT count above for plain attention and MLA's down/up projections for MLA.

NOTE [layer GEMMs] The mean layer's linear layers by kind (:func:`layer_gemms`): the QKV projection (MLA's down
and up projections), the output projection, the dense FFN's fc1 and fc2 (a dense model's, the leading dense
layers', the shared experts'), the router's gating GEMM and the routed experts' fc1 and fc2, and which of them
Transformer Engine's userbuffers run with ``tp_comm_overlap``. Megatron-Core (Megatron-LM 0d8e0714,
``megatron/core/extensions/transformer_engine.py``) passes the userbuffers flags (``ub_overlap_ag``,
``ub_overlap_rs``, ``ub_name``) to ``TELayerNormColumnParallelLinear``, ``TEColumnParallelLinear`` and
``TERowParallelLinear`` under the buffer names ``qkv``, ``proj``, ``fc1`` and ``fc2``, the shared experts' too
(an ``MLP`` of those layers: ``moe/shared_experts.py``, ``models/gpt/moe_module_specs.py``; its
``moe_shared_expert_overlap``, not modelled, turns theirs off), but clears them
for expert layers (``TELinear``'s ``is_expert``) and gives none to ``TEGroupedLinear``, the routed experts'
grouped GEMM, which Transformer Engine 2.9 refuses them anyway ("GroupedLinear doesn't support Userbuffer
overlap", NVIDIA/TransformerEngine 70f5366 ``pytorch/module/grouped_linear.py``); MLA's projections' buffer
names (``q_proj``, ``kv_down_proj``, ...) are not among the four, and ``TELinear`` turns the overlap off for
them. The router's gating GEMM is no tensor-parallel layer.

NOTE [recompute modules] ``recompute="selective"`` is Megatron-Core's ``--recompute-granularity selective`` with
its ``--recompute-modules`` (``TransformerConfig.recompute_modules``, default ``["core_attn"]``; Megatron-LM
0d8e0714, ``megatron/core/transformer/transformer_config.py``), of which these are modelled
(:data:`RECOMPUTE_MODULES`): ``core_attn``, the attention core checkpointed from Q, K and V (Korthikanti et al.
2022, sec. 5: the ``s x s`` terms not stored; with the flash kernel its forward re-run, nothing less stored);
``mla_up_proj``, MLA's query and key/value up projections with their latent norms and RoPE
(``multi_latent_attention.py`` ``qkv_up_proj_and_rope_apply`` under ``CheckpointWithoutOutput``; a direct query
projection ``linear_q_proj`` when there is no ``q_lora_rank``), whose outputs Q, K and V are freed once the
attention core has run and recomputed before its backward; ``moe_act``, the routed experts' activation function
(``moe/experts.py`` ``TEGroupedMLP``: its output, the fc2 input, freed after fc2 and recomputed); ``layernorm``,
the input and pre-MLP norms where they run as their own module (``transformer_layer.py``: not where Transformer
Engine fuses the norm into the next linear layer, ``IdentityOp``; ``models/gpt/gpt_layer_specs.py`` fuses it for
plain attention and for a dense MLP, not for MLA nor before an MoE layer), their outputs freed and recomputed.
The last three are Megatron's output-discarding checkpoints: the module's input stays stored, its output is not.
The time model re-runs each recomputed module's forward in the backward at the rates it prices that kernel at
(the up projections as GEMMs, the norms and the activation as HBM bytes, :func:`recompute_module_costs`); the
latent norms and RoPE are not priced in the forward either. ``mlp``, ``moe`` and ``shared_experts`` (whole
blocks checkpointed) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from mcdla.errors import WorkloadError, brief
from mcdla.workload.memo import HashOnce, hash_once, pure_cache

__all__ = [
    "MlaAttention",
    "TransformerSpec",
    "Recompute",
    "PRESETS",
    "preset",
    "preset_names",
    "LayerGemm",
    "layer_fwd_flops",
    "layer_gemms",
    "recompute_module_costs",
    "RECOMPUTE_MODULES",
    "logits_fwd_flops",
    "model_flops_per_iteration",
    "hardware_flops_per_iteration",
    "activation_bytes_per_layer",
    "Attention",
    "ATTENTIONS",
    "attention_bwd_flops_ratio",
    "flash_attention_bytes",
    "flash_attention_exponentials",
    "fp8_cast_bytes_per_layer",
    "FP8_SCALINGS",
]

Recompute = Literal["none", "selective", "selective-op", "full"]
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mla_up_proj", "moe_act", "layernorm")
"""Megatron-Core's ``recompute_modules`` the model prices with ``recompute="selective"`` (NOTE [recompute
modules]); ``("core_attn",)`` is Megatron-Core's default."""
Attention = Literal["flash", "materialized"]
ATTENTIONS: tuple[str, ...] = ("flash", "materialized")
"""``flash``: a fused FlashAttention-2 kernel; ``materialized``: the ``s x s`` scores written to HBM (Megatron's
fused scale-mask-softmax), the accounting of the published A100 runs (NOTE [flash attention])."""
_FLASH_BWD_RATIO = 2.5  # FA2 backward: 5 matmuls (S, dP, dV, dQ, dK) against the forward's 2 (Dao 2023, sec. 3.2)
_LSE_BYTES = 4  # logsumexp statistics are fp32
_MLPS = ("gelu", "swiglu")
_POSITIONS = ("learned", "rope")


def _positive_int(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{owner}.{name}: got {brief(value)}; must be an integer >= 1")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaAttention:
    """DeepSeek's multi-head latent attention (DeepSeek-V2 paper, sec. 2.1): Q through a ``q_lora_rank``
    latent (None = a direct projection), K and V from one ``kv_lora_rank`` latent plus a shared RoPE key of
    ``qk_rope_head_dim``; per head a query/key of ``qk_nope_head_dim + qk_rope_head_dim`` and a value of
    ``v_head_dim``.

    The time model runs it as multi-head attention over these expanded per-head Q, K and V (what training
    kernels materialise; the latent is only smaller at inference's KV cache): the attention core and the
    stored Q, K, V use the expanded widths, the projection FLOPs the real down/up matrices.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _positive_int("mla", name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive_int("mla", "q_lora_rank", self.q_lora_rank)

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key, ``nope + rope``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params(self, hidden: int, heads: int) -> int:
        """Weights of the attention block: Q (direct, or down + norm + up), the joint KV down projection with
        the RoPE key, its norm, the K/V up projection and the output projection."""
        q_out = heads * self.qk_head_dim
        q = hidden * q_out if self.q_lora_rank is None else (
            hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out)
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden

    def up_weights(self, hidden: int, heads: int) -> int:
        """Weights of the up projections (NOTE [recompute modules]): the query's from its latent (or the direct
        query projection) and the keys' and values' from the kv latent."""
        return ((self.q_lora_rank or hidden) * heads * self.qk_head_dim
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerSpec(HashOnce):
    """A decoder-only transformer.

    Attributes:
        name: preset or user name.
        layers, hidden, heads: ``l``, ``h``, ``a``.
        kv_heads: key/value heads (GQA; None = ``heads``, i.e. multi-head attention).
        ffn_hidden: FFN inner size ``f`` (None = ``4 h``).
        mlp: ``gelu`` (two matrices) or ``swiglu`` (three: gate, up, down).
        vocab: ``V``; seq_len: ``s`` (tokens per sample).
        experts, top_k: MoE FFN (1, 1 = dense); each token runs ``top_k`` expert FFNs.
        dropout: whether the layer has dropout (masks are saved for backward: GPT yes, Llama no).
        bias: linear layers carry biases (GPT yes, Llama no); parameters only.
        position: ``learned`` (an ``s x h`` table) or ``rope`` (no parameters).
        tied_embeddings: the output projection reuses the input embedding.
        causal: the attention mask is causal (decoder LMs): a FlashAttention kernel skips the upper blocks.
        bytes_per_element: activation/weight element size (2 for fp16 or bf16).
        source: where the shape comes from.
        attention_head_dim: size of one head when it is not ``hidden / heads`` (None = ``hidden / heads``).
        qkv_bias: biases on the Q, K and V projections only (Qwen2); ``bias`` puts them everywhere.
        qk_norm: an RMSNorm gain on each Q and K head (Qwen3).
        shared_experts: MoE experts of ``ffn_hidden`` every token runs besides its ``top_k`` routed ones.
        dense_layers, dense_ffn_hidden: the first ``dense_layers`` layers have one dense FFN of
            ``dense_ffn_hidden`` instead of the experts (DeepSeek's ``first_k_dense_replace``).
        mla: multi-head latent attention (DeepSeek) instead of (grouped-query) attention.
        (NOTE [model families].)
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    mlp: Literal["gelu", "swiglu"] = "gelu"
    experts: int = 1
    top_k: int = 1
    dropout: bool = True
    bias: bool = True
    position: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = True
    causal: bool = True
    bytes_per_element: int = 2
    source: str = ""
    attention_head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    shared_experts: int = 0
    dense_layers: int = 0
    dense_ffn_hidden: int | None = None
    mla: MlaAttention | None = None

    __hash__ = hash_once  # a key of the model's memoised figures, hashed once (mcdla.workload.memo)

    def __post_init__(self) -> None:
        owner = f"transformer {self.name!r}"
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "experts", "top_k", "bytes_per_element"):
            _positive_int(owner, name, getattr(self, name))
        if not isinstance(self.causal, bool):
            raise WorkloadError(f"{owner}.causal: got {brief(self.causal)}; must be true or false")
        self._check_families(owner)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _positive_int(owner, "kv_heads", self.kv_heads)
        _positive_int(owner, "ffn_hidden", self.ffn_hidden)
        if self.hidden % self.heads and self.attention_head_dim is None and self.mla is None:
            raise WorkloadError(f"{owner}.heads: got {self.heads}; must divide hidden ({self.hidden})")
        if self.heads % self.kv_heads:  # type: ignore[operator]
            raise WorkloadError(f"{owner}.kv_heads: got {self.kv_heads}; must divide heads ({self.heads})")
        if self.top_k > self.experts:
            raise WorkloadError(f"{owner}.top_k: got {self.top_k}; must be <= experts ({self.experts})")
        if self.mlp not in _MLPS:
            raise WorkloadError(f"{owner}.mlp: got {brief(self.mlp)}; must be one of {', '.join(_MLPS)}")
        if self.position not in _POSITIONS:
            raise WorkloadError(f"{owner}.position: got {brief(self.position)}; must be one of {', '.join(_POSITIONS)}")

    def _check_families(self, owner: str) -> None:
        """The fields of NOTE [model families]."""
        for name in ("shared_experts", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"{owner}.{name}: got {brief(value)}; must be an integer >= 0")
        for name in ("attention_head_dim", "dense_ffn_hidden"):
            if getattr(self, name) is not None:
                _positive_int(owner, name, getattr(self, name))
        for name in ("qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise WorkloadError(f"{owner}.{name}: got {brief(getattr(self, name))}; must be true or false")
        if self.dense_layers >= self.layers:
            raise WorkloadError(f"{owner}.dense_layers: got {self.dense_layers}; must be < layers ({self.layers})")
        if self.dense_layers and (self.experts == 1 or self.dense_ffn_hidden is None):
            raise WorkloadError(f"{owner}.dense_layers: got {self.dense_layers}; "
                                "needs experts > 1 and dense_ffn_hidden")
        if self.shared_experts and self.experts == 1:
            raise WorkloadError(f"{owner}.shared_experts: got {self.shared_experts}; needs experts > 1")
        if self.mla is not None and not isinstance(self.mla, MlaAttention):
            raise WorkloadError(f"{owner}.mla: got {brief(self.mla)}; must be an MlaAttention")

    @property
    def head_dim(self) -> int:
        """Size of one attention head's query and key: ``h / a``, ``attention_head_dim``, or MLA's nope + rope."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.attention_head_dim or self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): ``kv_heads * head_dim`` (= h without GQA; MLA: the expanded key's)."""
        return int(self.kv_heads) * self.head_dim  # type: ignore[arg-type]

    @property
    def q_width(self) -> int:
        """Width of Q (all heads), ``heads * head_dim`` (= h for GPT and Llama)."""
        return self.heads * self.head_dim

    @property
    def v_width(self) -> int:
        """Width of V over the kv-heads (= ``kv_hidden``; MLA: ``heads * v_head_dim``)."""
        return self.heads * self.mla.v_head_dim if self.mla is not None else self.kv_hidden

    @property
    def attention_out_width(self) -> int:
        """Width of the attention output (every head's value), the output projection's input (= h for GPT)."""
        return self.heads * (self.mla.v_head_dim if self.mla is not None else self.head_dim)

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is the experts (all but ``dense_layers``; 0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts > 1 else 0

    @property
    def ffn_width_per_token(self) -> float:
        """FFN inner width one token runs through, mean over the layers: ``(top_k + shared_experts) x
        ffn_hidden`` in an MoE layer, ``dense_ffn_hidden`` in a dense leading layer (= ``ffn_hidden`` dense)."""
        moe = (self.top_k + self.shared_experts) * int(self.ffn_hidden)  # type: ignore[arg-type]
        dense = int(self.dense_ffn_hidden or 0)
        return (self.dense_layers * dense + (self.layers - self.dense_layers) * moe) / self.layers

    @pure_cache(1024)
    def attention_params(self) -> int:
        """Weights of one attention block: Q, K, V and output projections (or MLA's), their biases, QK norms."""
        h = self.hidden
        if self.mla is not None:
            proj = self.mla.params(h, self.heads)
        else:
            proj = h * (self.q_width + self.kv_hidden + self.v_width) + self.attention_out_width * h
        qkv_biases = self.q_width + self.kv_hidden + self.v_width if self.bias or self.qkv_bias else 0
        out_bias = h if self.bias else 0
        return proj + qkv_biases + out_bias + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of one expert FFN: 2 for GELU, 3 for SwiGLU."""
        return 3 if self.mlp == "swiglu" else 2

    @pure_cache(1024)
    def params_per_layer(self) -> int:
        """Parameters of one transformer layer (all experts, biases and the two norms included); with
        ``dense_layers``, of one of the repeated MoE layers (:meth:`dense_layer_params` for the others)."""
        h, f = self.hidden, int(self.ffn_hidden)  # type: ignore[arg-type]
        ffn = (self.experts + self.shared_experts) * self.ffn_matrices * h * f
        router = h * self.experts if self.experts > 1 else 0
        norms = 4 * h if self.bias else 2 * h  # LayerNorm has gain and bias, RMSNorm a gain
        biases = self.experts * ((self.ffn_matrices - 1) * f + h) if self.bias else 0
        return self.attention_params() + ffn + router + norms + biases

    @pure_cache(1024)
    def layer_tensors(self) -> tuple[tuple[str, int], ...]:
        """The parameter tensors of one layer of a dense model without MLA, ``(name, elements)`` in the order
        the layer's modules run: the first norm, the fused QKV projection (one tensor, as Megatron-LM's
        ``query_key_value``) and its bias, the QK norms, the output projection and its bias, the second norm,
        then each FFN matrix and its bias; their sum is :meth:`params_per_layer`. What a framework that gathers
        and reduces one tensor at a time issues one collective for (NOTE [ZeRO-3 as run] in
        :mod:`mcdla.sim.llm`). WorkloadError for an MoE or MLA model, whose tensors this list does not name."""
        if self.experts > 1 or self.mla is not None:
            raise WorkloadError(f"transformer {self.name!r}: layer_tensors names the tensors of a dense model "
                                "without MLA; this one has " + ("experts" if self.experts > 1 else "MLA"))
        h, f = self.hidden, int(self.ffn_hidden)  # type: ignore[arg-type]
        qkv = self.q_width + self.kv_hidden + self.v_width

        def norm(label: str) -> list[tuple[str, int]]:
            return [(f"{label}.weight", h), *([(f"{label}.bias", h)] if self.bias else [])]

        tensors = [*norm("norm1"), ("qkv.weight", h * qkv)]
        if self.bias or self.qkv_bias:
            tensors.append(("qkv.bias", qkv))
        if self.qk_norm:
            tensors += [("q_norm.weight", self.head_dim), ("k_norm.weight", self.head_dim)]
        tensors.append(("proj.weight", self.attention_out_width * h))
        if self.bias:
            tensors.append(("proj.bias", h))
        tensors += norm("norm2")
        ffn = ("fc1", "fc2") if self.ffn_matrices == 2 else ("gate", "up", "down")
        for k, label in enumerate(ffn):
            tensors.append((f"{label}.weight", h * f))
            if self.bias:
                tensors.append((f"{label}.bias", h if k == len(ffn) - 1 else f))
        return tuple(tensors)

    def dense_layer_params(self) -> int:
        """Parameters of one of the ``dense_layers`` leading layers (attention, one FFN of
        ``dense_ffn_hidden``, norms); equals :meth:`params_per_layer` for a dense model."""
        if not self.dense_layers:
            return self.params_per_layer()
        h, f = self.hidden, int(self.dense_ffn_hidden)  # type: ignore[arg-type]
        biases = (self.ffn_matrices - 1) * f + h if self.bias else 0
        return self.attention_params() + self.ffn_matrices * h * f + (4 * h if self.bias else 2 * h) + biases

    @pure_cache(1024)
    def embedding_params(self) -> int:
        """Input embedding, position table, final norm and (untied) output projection."""
        h = self.hidden
        table = self.vocab * h * (1 if self.tied_embeddings else 2)
        positions = self.seq_len * h if self.position == "learned" else 0
        return table + positions + (2 * h if self.bias else h)

    def params(self) -> int:
        """All parameters."""
        moe = self.layers - self.dense_layers
        return moe * self.params_per_layer() + self.dense_layers * self.dense_layer_params() + self.embedding_params()

    def active_params(self) -> int:
        """Parameters a token touches (MoE: ``top_k`` of the ``experts`` FFNs)."""
        if self.experts == 1:
            return self.params()
        idle = (self.experts - self.top_k) * self.ffn_matrices * self.hidden * int(self.ffn_hidden)  # type: ignore[arg-type]
        return self.params() - self.moe_layers * idle

    @pure_cache(64)
    def layer_kinds(self) -> tuple[TransformerSpec, TransformerSpec] | None:
        """With ``dense_layers``: the model whose every layer is one of the repeated MoE layers, and the dense
        model whose every layer is one of the leading dense layers (one FFN of ``dense_ffn_hidden``), whose
        per-layer functions give each kind's layer (NOTE [model families]); None when the layers are alike."""
        if not self.dense_layers or self.experts == 1:
            return None
        moe = replace(self, dense_layers=0, dense_ffn_hidden=None)
        dense = replace(self, experts=1, top_k=1, shared_experts=0, ffn_hidden=self.dense_ffn_hidden,
                        dense_layers=0, dense_ffn_hidden=None)
        return moe, dense

    def with_seq_len(self, seq_len: int) -> TransformerSpec:
        """The same model at another sequence length."""
        return replace(self, seq_len=seq_len)


def _check_attention(attention: str) -> None:
    if attention not in ATTENTIONS:
        raise WorkloadError(f"attention: got {brief(attention)}; must be one of {', '.join(ATTENTIONS)}")


@pure_cache(1024, copy_dict=True)
def layer_fwd_flops(spec: TransformerSpec, batch: int, *, attention: Attention = "materialized") -> dict[str, float]:
    """Forward FLOPs of one layer for ``batch`` samples: ``gemm`` (projections, FFN, router: ``2 b s`` times the
    weights of :func:`layer_gemms`) and ``attention`` (``Q K^T`` and ``attention x V``), kept apart because they
    run at different efficiencies and precisions. ``attention="flash"`` with a causal mask halves the core (NOTE
    [flash attention])."""
    _check_attention(attention)
    b, s = batch, spec.seq_len
    gemm = 2.0 * b * s * sum(g.weights for g in layer_gemms(spec))
    core = 2.0 * b * s * s * (spec.q_width + spec.attention_out_width)
    if attention == "flash" and spec.causal:
        core /= 2.0
    return {"gemm": gemm, "attention": core}


def attention_bwd_flops_ratio(attention: Attention) -> float:
    """Backward over forward FLOPs of the attention core: 2 for the materialised scores (four matrix products
    against the forward's two), 2.5 for FlashAttention-2, whose backward recomputes the scores (NOTE [flash
    attention])."""
    _check_attention(attention)
    return _FLASH_BWD_RATIO if attention == "flash" else 2.0


@pure_cache(1024, copy_dict=True)
def flash_attention_bytes(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, cp: int = 1) -> dict[str, float]:
    """HBM bytes of one layer's fused FlashAttention-2 kernel on one rank, ``fwd`` and ``bwd`` (NOTE [flash
    attention]): Q, K, V in and O and the fp32 logsumexp out; backward reads Q, K, V, O, dO and the logsumexp
    and writes dQ, dK, dV. Heads split over ``tp``, the sequence over ``cp``."""
    e = spec.bytes_per_element
    tokens = micro_batch * spec.seq_len / cp
    qkv = e * tokens * (spec.q_width + spec.kv_hidden + spec.v_width) / tp
    out = e * tokens * spec.attention_out_width / tp
    lse = _LSE_BYTES * tokens * spec.heads / tp
    return {"fwd": qkv + out + lse, "bwd": qkv + 2 * out + lse + qkv}


def flash_attention_exponentials(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, cp: int = 1,
                                 ) -> dict[str, float]:
    """Exponentials one layer's fused FlashAttention-2 kernel evaluates on one rank, ``fwd`` and ``bwd`` (NOTE
    [flash attention]): one per score it computes, ``b a s^2`` halved by a causal mask, in forward for the
    softmax and again in backward, which recomputes ``P = exp(S - logsumexp)``. Heads split over ``tp``, the
    queries over ``cp`` (each rank's against all the keys, over the ring)."""
    scores = micro_batch * spec.heads * spec.seq_len * spec.seq_len / (tp * cp)
    if spec.causal:
        scores /= 2.0
    return {"fwd": scores, "bwd": scores}


@pure_cache(1024)
def _projection_weights(spec: TransformerSpec) -> float:
    """Weights of the attention block's matrices (Q, K, V, output; MLA's down/up projections), norms and
    biases left out: a token's projection FLOPs are twice this."""
    if spec.mla is not None:
        mla, h = spec.mla, spec.hidden
        vectors = mla.kv_lora_rank + (mla.q_lora_rank or 0)  # the two latent norms' gains
        return float(mla.params(h, spec.heads) - vectors)
    return float(spec.hidden * (spec.q_width + spec.kv_hidden + spec.v_width) + spec.attention_out_width * spec.hidden)


@dataclass(frozen=True, slots=True)
class LayerGemm:
    """One linear layer of the mean layer (NOTE [layer GEMMs]): ``name``; ``weights``, its multiply-adds per token
    (its weights, before any split), mean over the layers; ``share``, the share of the layers that run it;
    ``ring``, how Megatron-Core's tensor-parallel GEMM runs with ``tp_comm_overlap``: ``"ag"`` (column-parallel:
    Transformer Engine's userbuffers all-gather its input in forward), ``"rs"`` (row-parallel: reduce-scatter its
    output in forward, all-gather its output gradient for the dgrad GEMM), ``""`` (no userbuffers)."""

    name: str
    weights: float
    share: float
    ring: str


@pure_cache(1024)
def layer_gemms(spec: TransformerSpec) -> tuple[LayerGemm, ...]:
    """The mean layer's linear layers (NOTE [layer GEMMs]); their ``weights`` sum to the GEMM FLOPs of
    :func:`layer_fwd_flops` over ``2 b s``."""
    h = spec.hidden
    out = spec.attention_out_width * h
    if spec.mla is None:
        attention = [LayerGemm("qkv", float(h * (spec.q_width + spec.kv_hidden + spec.v_width)), 1.0, "ag")]
    else:  # MLA's down and up projections: no userbuffers name in Transformer Engine
        up = float(spec.mla.up_weights(h, spec.heads))
        attention = [LayerGemm("mla_down", _projection_weights(spec) - out - up, 1.0, ""),
                     LayerGemm("mla_up", up, 1.0, "")]
    gemms = [*attention, LayerGemm("proj", float(out), 1.0, "rs")]
    ffn = int(spec.ffn_hidden)  # type: ignore[arg-type]
    fc1 = spec.ffn_matrices - 1  # fc1 (SwiGLU: gate and up, one GEMM) against fc2
    if spec.experts == 1:
        widths = [("fc", float(ffn), 1.0, "ag")]
    else:
        moe = spec.moe_layers / spec.layers
        dense = spec.dense_layers / spec.layers
        widths = [("fc", (dense * int(spec.dense_ffn_hidden or 0) + moe * spec.shared_experts * ffn),
                   dense + (moe if spec.shared_experts else 0.0), "ag"),
                  ("expert_fc", moe * spec.top_k * ffn, moe, "")]
        gemms.append(LayerGemm("router", moe * h * spec.experts, moe, ""))
    for name, width, share, ring in widths:
        if width:
            gemms += [LayerGemm(f"{name}1", fc1 * h * width, share, ring),
                      LayerGemm(f"{name}2", h * width, share, "rs" if ring else "")]
    return tuple(gemms)


def logits_fwd_flops(spec: TransformerSpec, batch: int) -> float:
    """Forward FLOPs of the output projection onto the vocabulary, ``2 b s h V``."""
    return 2.0 * batch * spec.seq_len * spec.hidden * spec.vocab


@pure_cache(1024)
def model_flops_per_iteration(spec: TransformerSpec, global_batch: int) -> float:
    """Model FLOPs of one iteration (forward + backward = 3x forward), no recomputation counted and the attention
    core over the full score matrix: the numerator of model FLOPs utilisation, as the papers count it."""
    layer = layer_fwd_flops(spec, global_batch)
    return 3.0 * (spec.layers * (layer["gemm"] + layer["attention"]) + logits_fwd_flops(spec, global_batch))


@pure_cache(1024)
def hardware_flops_per_iteration(spec: TransformerSpec, global_batch: int, recompute: Recompute, *,
                                 attention: Attention = "materialized", recompute_share: float = 1.0,
                                 recompute_modules: tuple[str, ...] = ("core_attn",)) -> float:
    """FLOPs the devices execute, recomputation included: ``full`` re-runs every layer's forward (the
    ``recompute_share`` of the layers that a recompute count leaves recomputed), ``selective`` its
    ``recompute_modules`` (NOTE [recompute modules]: ``core_attn`` the attention core, Korthikanti et al. 2022,
    sec. 5; ``mla_up_proj`` MLA's up projections), ``selective-op`` every second matrix product (NOTE [op-level
    selective recompute] in :mod:`mcdla.workload.op_recompute`); with ``attention="flash"`` the core is the kernel's (causal halving, a
    2.5x backward: NOTE [flash attention])."""
    from mcdla.workload.op_recompute import op_recomputed_gemm_flops  # built on this module

    layer = layer_fwd_flops(spec, global_batch, attention=attention)
    selective = layer["attention"] if "core_attn" in recompute_modules else 0.0
    if recompute == "selective" and recompute_modules != ("core_attn",):
        selective += recompute_module_costs(spec, global_batch, recompute_modules)["gemm"]
    extra = {"none": 0.0, "selective": selective,
             "selective-op": op_recomputed_gemm_flops(spec, global_batch),
             "full": recompute_share * (layer["gemm"] + layer["attention"])}[recompute]
    per_layer = 3.0 * layer["gemm"] + (1.0 + attention_bwd_flops_ratio(attention)) * layer["attention"]
    return spec.layers * (per_layer + extra) + 3.0 * logits_fwd_flops(spec, global_batch)


FP8_SCALINGS: tuple[str, ...] = ("delayed", "current", "mxfp8")
"""Transformer Engine's fp8 recipes: ``delayed`` scales by an amax history (the amax comes out of the cast
kernel), ``current`` by the tensor's own amax, a separate reduction pass before the cast, ``mxfp8`` (Blackwell's
MXFP8) by one scale per 32-element block, computed in the cast kernel's one pass."""


_MXFP8_BLOCK = 32
"""Elements per MXFP8 block scale (one E8M0 byte): ``SCALE_DIM_X``/``SCALE_DIM_Y`` of Transformer Engine 2.9's
``transformer_engine/common/util/cast_kernels.cuh``, the OCP Microscaling block size."""


@pure_cache(1024, copy_dict=True)
def fp8_cast_bytes_per_layer(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, cp: int = 1,
                             scaling: str = "current", sp: bool = False,
                             tn_only: bool = False) -> dict[str, float]:
    """HBM bytes of one layer's fp8 quantisation on one rank, ``fwd`` and ``bwd``, as Transformer Engine 2.9 runs
    it (`docs/llm.md` "Precision per GEMM"): every GEMM input is cast (read at ``bytes_per_element``, written at 1 byte) before its
    fp8 GEMM; ``current`` scaling first reads it once more for its amax, except where the norm in front of the
    QKV and (dense) fc1 GEMMs takes that amax while it writes the input; ``delayed`` casts those two inside the
    norm and takes every amax from the cast; with ``sp`` (sequence parallelism) the QKV and fc1 inputs and the
    projection and fc2 output gradients are cast on the rank's shard before their all-gather; ``tn_only`` (a GPU
    whose fp8 GEMMs take only the TN layout, Hopper) writes a transposed copy of each tensor a backward GEMM
    reads the other way: in the cast where the tensor is whole, as a transpose of the gathered fp8 tensor (read
    and write 1 byte) where it was cast on its shard. Forward inputs: QKV and fc1 inputs (``b s h``, fc1's once
    per expert FFN a token runs), projection and fc2 inputs (split over ``tp``); backward: the output gradients of
    the four GEMMs. ``mxfp8`` writes two fp8 copies in each cast, each with its E8M0 block scales (a byte per
    32 elements): its scales run along one dimension, so the backward GEMM that reads a tensor the other way needs
    its own copy. Every tensor counted here feeds a GEMM each way: an input the fprop GEMM (rowwise) and the wgrad
    GEMM (columnwise), an output gradient the dgrad GEMM (rowwise) and the wgrad GEMM (columnwise); TE 2.9
    (NVIDIA/TransformerEngine 70f5366) sets ``MXFP8Quantizer`` usages so in ``pytorch/module/linear.py`` and
    ``layernorm_linear.py`` (``set_usage(rowwise=True, columnwise=backward_needs_input)`` on the input, on the
    local shard before an all-gather too, which gathers both copies (``distributed.py`` ``_all_gather_mxfp8``);
    ``set_usage(rowwise=True, columnwise=True)`` on the output gradient) and ``grouped_linear.py`` (inputs
    ``columnwise`` when the weights need gradients, output gradients the quantizer's default both usages), and
    ``common/util/cast_kernels.cuh`` ``cast_mxfp8_2D_kernel`` writes both copies and their scales in one pass over
    the input. MXFP8's GEMMs take any layout (``tn_only`` does not apply). Weights are cast once per iteration and
    kept (their fp8 copy is memory, not per-layer traffic)."""
    if scaling not in FP8_SCALINGS:
        raise WorkloadError(f"fp8_scaling: got {brief(scaling)}; must be one of {', '.join(FP8_SCALINGS)}")
    e = spec.bytes_per_element
    amax = e if scaling == "current" else 0  # the separate amax pass of current scaling
    mx = scaling == "mxfp8"
    tn_only = tn_only and not mx
    write = 2 * (1 + 1 / _MXFP8_BLOCK) if mx else 1.0  # MXFP8: rowwise and columnwise copies with their scales
    cast = e + write + (1 if tn_only else 0)  # a whole tensor cast, with its transposed copy on a TN-only GPU
    tokens = micro_batch * spec.seq_len / cp
    h, f = spec.hidden, spec.ffn_width_per_token
    ffns = f / float(spec.ffn_hidden)  # type: ignore[arg-type]  # expert FFNs a token runs (1 dense)
    qkv_out = spec.q_width + spec.kv_hidden + spec.v_width
    sp = sp and tp > 1
    shard = tp if sp else 1
    # the QKV input and a dense layer's fc1 input come out of a norm (TE's LayerNormLinear): its amax is the
    # norm's (current), or the norm writes fp8 itself (delayed); MXFP8 casts after the norm
    normed = 0.0 if scaling == "delayed" else e + write
    normed_inputs = 1.0 if spec.experts == 1 else 0.0
    gathered = 2.0 if tn_only and sp else 0.0  # transpose of a gathered fp8 tensor for the wgrad GEMM
    whole_normed = 0.0 if sp or not tn_only else 1.0  # the transpose written by a whole tensor's cast
    fwd = (tokens * h / shard * (1 + normed_inputs) * (normed + whole_normed)  # QKV, dense fc1 inputs
           + tokens * (ffns - normed_inputs) * h * (amax + cast)  # routed experts' fc1 inputs
           + tokens * (spec.attention_out_width + f) / tp * (amax + cast))  # projection, fc2 inputs
    grad_shard = (amax + e + write) / shard + gathered if sp else amax + cast
    bwd = (tokens * h * (1 + ffns) * grad_shard  # projection and fc2 output gradients
           + tokens * (qkv_out + f * (spec.ffn_matrices - 1)) / tp * (amax + cast)  # QKV, fc1 output gradients
           + tokens * h * (1 + normed_inputs) * gathered)  # the gathered QKV and fc1 inputs, for the wgrad
    return {"fwd": fwd, "bwd": bwd}


@pure_cache(1024, copy_dict=True)
def recompute_module_costs(spec: TransformerSpec, micro_batch: int, modules: tuple[str, ...], *, tp: int = 1,
                           sp: bool = False, cp: int = 1, stored_bytes: float | None = None) -> dict[str, float]:
    """What ``mla_up_proj``, ``moe_act`` and ``layernorm`` of ``modules`` cost one layer (the mean layer) on one rank
    per micro-batch (NOTE [recompute modules]; ``core_attn`` is the attention core's, priced apart): ``gemm``, the
    forward FLOPs re-run in the backward (the up projections, ``2 b s`` times their weights); ``bytes``, the HBM
    bytes of the memory-bound kernels re-run (each norm reads and writes ``b s h``; the SwiGLU/GELU reads its
    ``ffn_matrices - 1`` inputs and writes one output of the routed width ``top_k x ffn_hidden``); ``saved``, the
    stashed bytes not kept: Q, K and V (expanded widths, split over ``tp``), the norms' outputs (the QKV and fc1
    inputs, split over ``tp`` with ``sp``), the routed experts' fc2 input, at ``stored_bytes`` an element
    (``bytes_per_element`` when None: the GEMM inputs' stored copy, fp8 with Transformer Engine's fp8). The input
    norm is its own module only with MLA and the pre-MLP norm only before an MoE layer (the mean layer's share of
    those)."""
    unknown = sorted(set(modules) - set(RECOMPUTE_MODULES))
    if unknown:
        raise WorkloadError(f"recompute_modules: got {unknown[0]!r}; must be among {', '.join(RECOMPUTE_MODULES)}")
    e = spec.bytes_per_element
    g = e if stored_bytes is None else stored_bytes
    tokens = micro_batch * spec.seq_len / cp
    moe = spec.moe_layers / spec.layers
    routed = moe * spec.top_k * int(spec.ffn_hidden)  # type: ignore[arg-type]  # mean routed width a token runs
    gemm = moved = saved = 0.0
    if "mla_up_proj" in modules and spec.mla is not None:
        gemm = 2.0 * tokens * spec.mla.up_weights(spec.hidden, spec.heads) / tp
        saved += e * tokens * (spec.q_width + spec.kv_hidden + spec.v_width) / tp
    if "moe_act" in modules:
        moved += spec.ffn_matrices * e * tokens * routed / tp
        saved += g * tokens * routed / tp
    if "layernorm" in modules:
        norms = (1.0 if spec.mla is not None else 0.0) + moe
        moved += norms * 2 * e * tokens * spec.hidden / (tp if sp else 1)
        saved += norms * g * tokens * spec.hidden / (tp if sp else 1)
    return {"gemm": gemm, "bytes": moved, "saved": saved}


@pure_cache(1024)
def activation_bytes_per_layer(
    spec: TransformerSpec, micro_batch: int, *, tp: int = 1, sp: bool = False, cp: int = 1,
    recompute: Recompute = "none", attention: Attention = "materialized", fp8_gemm_inputs: bool = False,
    fp8_scaling: str = "current", recompute_modules: tuple[str, ...] = ("core_attn",),
) -> float:
    """Bytes one layer stashes for backward per micro-batch on one rank (Korthikanti et al. 2022, sec. 4).

    Attention block: norm input, QKV input, Q, K, V, softmax output (``a s^2 b`` elements), its dropout mask (1
    byte each) and output, projection input, dropout mask; FFN block: norm input, fc1 input, activation
    input(s), fc2 input, dropout mask. Tensor parallelism splits what lies between the two collectives by
    ``tp``; sequence parallelism also splits the rest. Context parallelism splits the sequence by ``cp``.
    ``selective`` with ``recompute_modules`` ``core_attn`` drops the ``s x s`` terms (recomputed), with the others
    what :func:`recompute_module_costs` says they do not keep; ``full`` keeps only the layer input; ``selective-op``
    keeps what torchtitan's op policy saves (:func:`~mcdla.workload.op_recompute.op_saved_bytes_per_layer`, at
    ``tp=1`` only).
    ``attention="flash"`` stores no ``s x s`` terms but the fp32 logsumexp, ``4 a s b`` bytes (NOTE [flash
    attention]). ``fp8_gemm_inputs``: Transformer Engine saves the fp8 copy of each linear layer's input (QKV,
    projection, fc1, fc2 inputs: 1 byte an element) instead of the bf16 one; with ``fp8_scaling="mxfp8"`` that
    copy carries its E8M0 block scales, one byte per 32 elements: ``1 + 1/32`` bytes an element. Transformer
    Engine 2.9 (70f5366) keeps one copy of a saved input: ``pytorch/module/linear.py`` (``layernorm_linear.py``
    alike) discards the rowwise data of the quantized input before saving it
    (``update_usage(rowwise_usage=False, columnwise_usage=True)``) unless it must be all-gathered rowwise in
    backward, which ``MXFP8Quantizer`` does not need (``supports_only_rowwise_all_gather`` is only true for the
    per-tensor fp8 quantizers), and ``grouped_linear.py`` saves the routed experts' inputs columnwise only; a
    ``MXFP8Tensor``'s columnwise copy holds its fp8 data and its ``columnwise_scale_inv``, one E8M0 byte per 32
    elements. The per-tensor recipes' scale is one fp32 per tensor, not counted.
    """
    _check_attention(attention)
    e = spec.bytes_per_element
    if fp8_scaling not in FP8_SCALINGS:
        raise WorkloadError(f"fp8_scaling: got {brief(fp8_scaling)}; must be one of {', '.join(FP8_SCALINGS)}")
    # bytes of a saved GEMM input: one fp8 copy, MXFP8's with its E8M0 scales
    g = (1 + (1 / _MXFP8_BLOCK if fp8_scaling == "mxfp8" else 0)) if fp8_gemm_inputs else e
    b, s, h, a = micro_batch, spec.seq_len / cp, spec.hidden, spec.heads
    kv = spec.kv_hidden
    sbh = s * b * h
    mask = 1.0 if spec.dropout else 0.0
    if recompute == "full":
        return e * sbh / (tp if sp else 1)
    if recompute == "selective-op":
        from mcdla.workload.op_recompute import op_saved_bytes_per_layer  # built on this module

        if tp > 1:
            raise WorkloadError(f"tp: got {tp} with recompute=selective-op; its saved bytes are modelled at tp=1")
        return op_saved_bytes_per_layer(spec, micro_batch, cp=cp)
    # outside the tensor-parallel region: two norm inputs, QKV and fc1 inputs, two dropout masks
    outside = 2 * e * sbh + 2 * g * sbh + 2 * mask * sbh
    ffn_width = spec.ffn_width_per_token
    inside = (e * s * b * (spec.q_width + kv + spec.v_width)  # Q, K, V
              + g * s * b * spec.attention_out_width         # projection input (attention x V)
              + e * s * b * ffn_width * (spec.ffn_matrices - 1) + g * s * b * ffn_width)  # act input(s), fc2 input
    if attention == "flash":
        inside += _LSE_BYTES * a * s * b
    elif recompute == "none" or "core_attn" not in recompute_modules:
        # softmax output, dropout mask and dropout output over the a x s x s scores (the full sequence of keys)
        inside += (e + mask + e * mask) * a * s * spec.seq_len * b
    stored = outside / (tp if sp else 1) + inside / tp
    if recompute == "selective" and recompute_modules != ("core_attn",):
        stored -= recompute_module_costs(spec, micro_batch, recompute_modules, tp=tp, sp=sp, cp=cp,
                                         stored_bytes=g)["saved"]
    return stored


def _spec(**kw: object) -> TransformerSpec:
    return TransformerSpec(**kw)  # type: ignore[arg-type]


_MEGATRON = "Megatron-LM GPT: vocab 51200, seq 2048 (Narayanan et al. SC21, sec. 5.1; Korthikanti et al. 2022, Table 3)"
_LLAMA3 = "Llama 3 Herd of Models (Dubey et al. 2024), Table 3: GQA 8 kv-heads, SwiGLU, vocab 128256, RoPE"
_MIXTRAL = ("Mixtral of Experts (Jiang et al. 2024), its config.json (examples/hf-mixtral-8x7b.json): 8 experts, "
            "top-2, GQA 8 kv-heads; training sequence 4096 (NeMo/Megatron-Bridge Mixtral 8x7B pre-training recipe)")
_DEEPSEEK_V3 = ("DeepSeek-V3 Technical Report (DeepSeek-AI 2024), its config.json (examples/hf-deepseek-v3.json): "
                "256 routed experts top-8 + 1 shared, 3 dense leading layers, MLA (run as expanded multi-head "
                "attention, MlaAttention), no MTP module; pre-training sequence 4096 (report, sec. 4.2)")
_QWEN3_MOE = ("Qwen3 MoE as Megatron-Bridge defines it (NVIDIA-NeMo/Megatron-Bridge "
              "src/megatron/bridge/models/qwen/qwen_provider.py, Qwen3MoEModelProvider, commit 5776a6d90b4d): 128 "
              "experts top-8, head dim 128, QK-norm, vocab 151936, untied; pre-training sequence 4096 (its "
              "performance-summary.md)")
_LLAMA2 = ("Llama 2 as fms-fsdp trains it (foundation-model-stack/fms-fsdp fms_fsdp/utils/config_utils.py, "
           "commit 4ffb9bdf: 13B 5120 x 40 heads x 40 layers, FFN 13824; 34B and 70B 8192 x 64 heads, 8 kv-heads, 48 "
           "and 80 layers, FFN 22016 and 28672; 7B the LLaMAConfig defaults 4096 x 32 x 32, FFN 11008 [Llama 2 "
           "paper, Touvron et al. 2023, not re-read]); SwiGLU, RoPE, vocab 32000, untied; sequence 4096 (its "
           "train_config.seq_length)")
_GPT2_10B = ("DeepSpeed's ZeRO-Offload tutorial model, Megatron-LM GPT-2 (microsoft/DeepSpeedExamples commit ece5e0e0, "
             "Megatron-LM/scripts/ds_zero-offload_10B_pretrain_gpt2_model_parallel.sh: 50 layers, hidden 4096, 32 "
             "heads, seq-length 1024; GPT2BPETokenizer's 50257 tokens padded to 50304 by arguments.py's "
             "make-vocab-size-divisible-by 128), learned positions, GeLU MLP 4h, tied embeddings")
PRESETS: dict[str, TransformerSpec] = {
    s.name: s for s in (
        _spec(name="gpt3-175b", layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048,
              source="GPT-3 (Brown et al. 2020, Table 2.1) with Megatron's padded vocab 51200 " + _MEGATRON),
        _spec(name="megatron-22b", layers=48, hidden=6144, heads=64, vocab=51200, seq_len=2048, source=_MEGATRON),
        _spec(name="megatron-530b", layers=105, hidden=20480, heads=128, vocab=51200, seq_len=2048, source=_MEGATRON),
        _spec(name="megatron-1t", layers=128, hidden=25600, heads=160, vocab=51200, seq_len=2048, source=_MEGATRON),
        _spec(name="megatron-1.7b", layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-3.6b", layers=30, hidden=3072, heads=32, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-7.5b", layers=36, hidden=4096, heads=32, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-18.4b", layers=40, hidden=6144, heads=48, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-39.1b", layers=48, hidden=8192, heads=64, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-76.1b", layers=60, hidden=10240, heads=80, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-145.6b", layers=80, hidden=12288, heads=96, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="megatron-310.1b", layers=96, hidden=16384, heads=128, vocab=51200, seq_len=2048,
              source="Narayanan et al. SC21, Table 1"),
        _spec(name="gpt2-10b", layers=50, hidden=4096, heads=32, vocab=50304, seq_len=1024, source=_GPT2_10B),
        _spec(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu",
              vocab=128256, seq_len=8192, dropout=False, bias=False, position="rope", tied_embeddings=False,
              source=_LLAMA3),
        _spec(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, mlp="swiglu",
              vocab=128256, seq_len=8192, dropout=False, bias=False, position="rope", tied_embeddings=False,
              source=_LLAMA3),
        _spec(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, mlp="swiglu",
              vocab=128256, seq_len=8192, dropout=False, bias=False, position="rope", tied_embeddings=False,
              source=_LLAMA3),
        *(_spec(name=f"llama2-{size}", layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                mlp="swiglu", vocab=32000, seq_len=4096, dropout=False, bias=False, position="rope",
                tied_embeddings=False, source=_LLAMA2)
          for size, layers, hidden, heads, kv, ffn in (("7b", 32, 4096, 32, None, 11008),
                                                      ("13b", 40, 5120, 40, None, 13824),
                                                      ("34b", 48, 8192, 64, 8, 22016),
                                                      ("70b", 80, 8192, 64, 8, 28672))),
        _spec(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu",
              experts=8, top_k=2, vocab=32000, seq_len=4096, dropout=False, bias=False, position="rope",
              tied_embeddings=False, source=_MIXTRAL),
        _spec(name="deepseek-v3-671b", layers=61, hidden=7168, heads=128, ffn_hidden=2048, mlp="swiglu",
              experts=256, top_k=8, shared_experts=1, dense_layers=3, dense_ffn_hidden=18432, vocab=129280,
              seq_len=4096, dropout=False, bias=False, position="rope", tied_embeddings=False,
              mla=MlaAttention(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                               q_lora_rank=1536), source=_DEEPSEEK_V3),
        _spec(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, attention_head_dim=128,
              ffn_hidden=768, mlp="swiglu", experts=128, top_k=8, qk_norm=True, vocab=151936, seq_len=4096,
              dropout=False, bias=False, position="rope", tied_embeddings=False, source=_QWEN3_MOE),
        _spec(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, attention_head_dim=128,
              ffn_hidden=1536, mlp="swiglu", experts=128, top_k=8, qk_norm=True, vocab=151936, seq_len=4096,
              dropout=False, bias=False, position="rope", tied_embeddings=False, source=_QWEN3_MOE),
    )
}


def preset_names() -> list[str]:
    """The preset names, sorted."""
    return sorted(PRESETS)


def preset(name: str) -> TransformerSpec:
    """A preset by name; one-line WorkloadError listing the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkloadError(f"transformer: got {brief(name)}; must be one of {', '.join(preset_names())}") from None

