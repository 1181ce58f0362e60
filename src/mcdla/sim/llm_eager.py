"""HBM bytes of a layer's memory-bound kernels in eager PyTorch, one kernel per op (``fused_kernels: false``).

NOTE [eager kernels] The time model counts the memory-bound kernels of a layer as Megatron-LM runs them, fused
(:func:`mcdla.sim.llm.elementwise_bytes_per_layer`: one read and one write per norm, the fused activation, the
residual adds, no RoPE). Eager PyTorch runs each op of the model's code as its own kernel, which reads its
inputs from and writes its output to HBM. Counted from torchtitan's Llama code at 9dec370 (the commit of its
published H100 runs; ``torchtitan/models/norms.py`` ``RMSNorm``, ``torchtitan/models/llama/model.py``
``apply_rotary_emb``, ``repeat_kv``, ``FeedForward``), per element, ``e`` the activation element size, fp32
intermediates 4 bytes:

* RMSNorm ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``: the cast (``e + 4``),
  ``pow`` (``4 + 4``), ``mean`` (``4``), the product with the row's ``rsqrt`` (``4 + 4``), the cast back
  (``4 + e``), the gain (``2 e``): ``28 + 4 e`` per element of ``b s h``, two per layer (the fused kernel: ``2 e``;
  a LayerNorm, the norm of the biased models, is one kernel in eager PyTorch too: ``2 e``);
* RoPE on Q and K (``position: rope``): the fp32 cast (``e + 4``), the complex product (``4 + 4``; the frequency
  table is shared by the batch and the heads and counted as cached), the cast back (``4 + e``): ``16 + 2 e`` per
  element of the Q and K widths (the fused count has none). ``rope_kernels: rotation`` is foundation-model-stack's
  ``adjusted_qk`` (``fms/modules/positions.py`` at 6440fee8, the code fms-fsdp ran): the fp32 cast (``e + 4``), the
  product with the 2 x 2 rotation tables into a tensor twice the input's size (``4 + 8``), its ``sum`` over the
  pair (``8 + 4``), the cast back (``4 + e``): ``32 + 2 e``;
* ``repeat_kv`` with ``n = heads / kv_heads > 1``: ``expand().reshape()`` copies K and V to every query head
  (read once, written ``n`` times), and SDPA reads the expanded copies, ``n - 1`` times more than the
  FlashAttention count's K and V: ``2 n e`` per element of the K and V widths;
* SwiGLU ``silu(w1 x) * w3 x``: SiLU (``2 e``) and the product (``3 e``), ``5 e`` per FFN element (fused:
  ``3 e``); a GELU FFN is one kernel either way (``2 e``);
* the residual adds as the fused count (``3 e`` each); with dropout, its own kernel before each add (read ``e``,
  write ``e`` and a 1-byte mask), then the add: ``5 e + 1`` each; the attention output's
  ``transpose(1, 2).contiguous()`` copies nothing (SDPA writes that layout); the loss as the fused count.

Backward is charged twice the forward, the time model's rule for memory-bound kernels. Only the time changes:
the extra tensors eager autograd keeps (the norms' fp32 input copies) are not added to the activation memory.

NOTE [foreach optimizer] ``optimizer_kernels: foreach`` is PyTorch's AdamW built with neither ``foreach`` nor
``fused`` given (fms-fsdp's ``optim.AdamW(model.parameters(), ...)``), which on CUDA runs ``_multi_tensor_adamw``:
the ops of ``_single_tensor_adamw`` over lists of the fp32 shards, each a kernel reading its inputs from and writing
its output to HBM, in bytes per parameter: the decay ``mul_`` (8), the momentum's ``lerp_`` (12), the variance's
``mul_`` and ``addcmul_`` (8 + 12), ``sqrt`` (8), the bias correction's ``div_`` (8), ``add_`` of eps (8), the
``addcdiv_`` update (16): 80; with ``clip_grad_norm_`` (the norm reads the gradient, 4; the scaling ``mul_``, 8)
and FSDP's cast of the reduced 16-bit gradient shard to the fp32 parameter's dtype (``e + 4``): ``92 + e + 4``
with 16-bit gradients, 92 with fp32 ones (no cast), against the fused step's 28.
"""

from __future__ import annotations

from mcdla.workload.transformer import TransformerSpec

__all__ = ["FOREACH_ADAM_BYTES", "eager_block_bytes", "foreach_adam_bytes"]

FOREACH_ADAM_BYTES = 80 + 4 + 8
"""HBM bytes per parameter of the foreach AdamW and ``clip_grad_norm_`` (NOTE [foreach optimizer])."""


def foreach_adam_bytes(gradient_bytes: int) -> float:
    """HBM bytes per parameter of the foreach Adam step (NOTE [foreach optimizer]) with gradients reduced in
    ``gradient_bytes``-byte elements (4: no cast)."""
    return FOREACH_ADAM_BYTES + (gradient_bytes + 4 if gradient_bytes < 4 else 0)


def eager_block_bytes(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, sp: bool = False,
                      cp: int = 1, rope: str = "complex") -> dict[str, float]:
    """HBM bytes of one layer's memory-bound forward kernels on one rank in eager mode (NOTE [eager kernels]):
    ``block`` (norms and residual adds split over ``tp`` with sequence parallelism, the rest over ``tp``) and
    ``last_add``, the second residual add's share of it; ``rope``: ``complex`` or ``rotation`` (the RoPE code)."""
    e = spec.bytes_per_element
    tokens = float(micro_batch) * spec.seq_len / cp
    h, f = spec.hidden, spec.ffn_width_per_token
    mask = 1.0 if spec.dropout else 0.0
    norms = 2 * (2 * e if spec.bias else 28 + 4 * e) * tokens * h  # LayerNorm (biased models) is one kernel
    add = (3 * e + mask * (2 * e + 1)) * tokens * h  # with dropout: its kernel, then the add
    per_qk = (32 if rope == "rotation" else 16) + 2 * e
    rope_bytes = per_qk * tokens * (spec.q_width + spec.kv_hidden) if spec.position == "rope" else 0.0
    n = spec.heads // int(spec.kv_heads)  # type: ignore[arg-type]
    repeat = 2 * n * e * tokens * (spec.kv_hidden + spec.v_width) if n > 1 else 0.0
    activation = (5 * e if spec.ffn_matrices == 3 else 2 * e) * tokens * f
    outside = (norms + 2 * add) / (tp if sp else 1)
    return {"block": outside + (rope_bytes + repeat + activation) / tp, "last_add": add / (tp if sp else 1)}
