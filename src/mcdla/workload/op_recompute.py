"""torchtitan's per-op selective activation checkpointing, ``recompute: selective-op``.

NOTE [op-level selective recompute] torchtitan's op policy (``selective_ac_option = "op"``;
``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370, the commit of its published H100 runs: ``_save_list``
and ``_custom_policy``; the same rule in ``torchtitan/distributed/activation_checkpoint.py`` today) wraps every
transformer block in a checkpoint whose policy keeps the outputs of the ops on its save list (matrix products
``aten.mm``, the SDPA kernels, reduce-scatters, ``abs``/``max``) except every second matrix product of the block's
forward, counted per block from 1 (the even ones are recomputed), and recomputes every other op. A Llama layer
runs its products in the order ``wq, wk, wv, wo, w1, w3, w2`` (``w2(silu(w1(x)) * w3(x))`` evaluates ``w1``
before ``w3``), so the outputs of ``wq``, ``wv``, ``w1``, ``w2`` and of the attention kernel are kept and ``wk``,
``wo`` and ``w3`` are re-run in backward, with every memory-bound kernel (both norms, the residual adds, the
activation function and the gate product; RoPE and the key/value expansion in eager mode); the attention
kernel is not. A GELU FFN (``fc1, fc2``) keeps ``wq, wv, fc1``.

Stored per layer and micro-batch: the block's input (the checkpoint's input), the kept products' outputs, the
attention kernel's output and its fp32 logsumexp (the statistics FlashAttention-2 saves, NOTE [flash attention]
in :mod:`mcdla.workload.transformer`). Recomputed: the FLOPs of the recomputed products, plus the block's
memory-bound kernels (their bytes are the time model's). The recomputed layer's own activations live only
during its backward, one layer at a time (full recompute's live layer is not counted either).

Modelled for what torchtitan runs with this policy in its published tables: a dense layer with plain
(grouped-query) attention through a fused SDPA kernel (``attention: flash``), no biases (a biased projection is ``aten.addmm``, off the save list, and MoE layers
add a router and grouped products), and no tensor parallelism (with it the policy also re-runs the TP
all-gathers or all-reduces, which the time model does not count); anything else is refused in one line.
"""

from __future__ import annotations

from mcdla.errors import ConfigError
from mcdla.workload.transformer import _LSE_BYTES, TransformerSpec
from mcdla.workload.memo import pure_cache

__all__ = ["OP_RECOMPUTE", "check_op_recompute", "layer_matmuls", "op_recompute_rejection", "op_recomputed_gemm_flops",
           "op_saved_bytes_per_layer"]

OP_RECOMPUTE = "selective-op"
"""The ``recompute`` value of torchtitan's op policy."""


def layer_matmuls(spec: TransformerSpec) -> tuple[tuple[str, float, float], ...]:
    """A dense layer's matrix products in forward order, each ``(name, input width, output width)`` per token
    (Llama's names; a GELU FFN has ``w1, w2``)."""
    h, f = float(spec.hidden), spec.ffn_width_per_token
    attention = (("wq", h, spec.q_width), ("wk", h, spec.kv_hidden), ("wv", h, spec.v_width),
                 ("wo", spec.attention_out_width, h))
    ffn = (("w1", h, f), ("w3", h, f), ("w2", f, h)) if spec.ffn_matrices == 3 else (("w1", h, f), ("w2", f, h))
    return tuple((name, float(i), float(o)) for name, i, o in attention + ffn)


def _recomputed(index: int) -> bool:
    """torchtitan's rule: the products counted 2, 4, 6, ... in a block's forward are recomputed."""
    return (index + 1) % 2 == 0


@pure_cache(1024)
def op_recomputed_gemm_flops(spec: TransformerSpec, batch: int) -> float:
    """FLOPs the op policy re-runs per layer for ``batch`` samples: ``2 b s x in x out`` of each recomputed
    product (NOTE [op-level selective recompute])."""
    tokens = float(batch) * spec.seq_len
    return sum(2.0 * tokens * i * o for k, (_, i, o) in enumerate(layer_matmuls(spec)) if _recomputed(k))


def op_saved_bytes_per_layer(spec: TransformerSpec, micro_batch: int, *, cp: int = 1) -> float:
    """Bytes one layer keeps for backward per micro-batch on one rank under the op policy: the layer input, the
    kept products' outputs, the attention output and its logsumexp (NOTE [op-level selective recompute]);
    the sequence split over ``cp``."""
    tokens = float(micro_batch) * spec.seq_len / cp
    kept = sum(o for k, (_, _, o) in enumerate(layer_matmuls(spec)) if not _recomputed(k))
    widths = spec.hidden + kept + spec.attention_out_width
    return tokens * (spec.bytes_per_element * widths + _LSE_BYTES * spec.heads)


def op_recompute_rejection(spec: TransformerSpec, tp: int, attention: str = "flash") -> str | None:
    """Why the op policy is not modelled for ``spec`` at tensor-parallel degree ``tp`` with ``attention``
    (module docstring), or None."""
    why = [text for text, bad in (
        ("MoE layers", spec.experts > 1), ("multi-head latent attention", spec.mla is not None),
        ("biased projections", spec.bias or spec.qkv_bias), (f"tp={tp} (its re-run TP collectives)", tp > 1),
        (f"attention={attention} (the policy keeps a fused SDPA kernel's output)", attention != "flash"))
        if bad]
    if not why:
        return None
    return (f"execution.recompute: got {OP_RECOMPUTE} for {spec.name} with {', '.join(why)}; torchtitan's op "
            "policy is modelled for dense layers without biases at tp=1 with flash attention (use selective or "
            "full)")


def check_op_recompute(spec: TransformerSpec, tp: int, attention: str = "flash") -> None:
    """One-line ConfigError when :func:`op_recompute_rejection` refuses."""
    why = op_recompute_rejection(spec, tp, attention)
    if why is not None:
        raise ConfigError(why)
