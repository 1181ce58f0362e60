"""The execution record of LLM training: how a model is split and scheduled, apart from the model and the system.

Like Calculon's execution JSON, one record says tensor (TP), pipeline (PP, 1F1B or interleaved with virtual
stages), data (DP), context (CP) and expert (EP) parallelism, sequence parallelism, ZeRO stage (3 = FSDP),
micro-batch and global batch, activation recomputation and what is offloaded to a second memory tier. Keeping it
separate lets one model be judged under many executions and one execution on many systems. Expert parallelism splits
an MoE model's experts over ``ep`` ranks of the ``dp x cp`` group (Megatron-Core), so it adds no GPUs:
``ep`` divides ``dp * cp`` here and the model's experts in :func:`check_execution`.

:class:`Execution` checks what it can alone (``tp * pp * dp * cp == gpus``, SP needs TP, the global batch
splits into whole micro-batches per replica); :func:`check_execution` adds the checks that need the model
(layers per virtual stage, heads and kv-heads per TP rank, sequence per CP rank). A pipeline split may be
uneven as Megatron-LM's ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
make it: ``layers_first_stage`` and ``layers_last_stage`` fix the end stages and the middle stages share the
rest equally (:func:`stage_layers`); or, as ``--account-for-embedding-in-pipeline-split`` /
``--account-for-loss-in-pipeline-split`` do, the embedding and the loss count as one layer each, so the first
and the last model chunk hold one layer fewer (:func:`chunk_layers`); or, as Megatron-Core's
``pipeline_model_parallel_layout`` does, a layout string names the layers of every model chunk
(``pipeline_layout``, :func:`layout_chunks`). Files are read with
pydantic at the boundary (:func:`load_execution`), extra fields and non-finite numbers refused.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcdla._io_safety import read_document
from mcdla.errors import ConfigError, brief, validation_line
from mcdla.workload.op_recompute import OP_RECOMPUTE, check_op_recompute
from mcdla.workload.transformer import (ATTENTIONS, FP8_SCALINGS, RECOMPUTE_MODULES, Attention, Recompute,
                                        TransformerSpec)
from mcdla.workload.memo import HashOnce, hash_once, pure_cache

__all__ = ["CP_COMM_TYPES", "EP_DISPATCHERS", "OFFLOAD_TIERS", "OPTIMIZER_KERNELS", "RECOMPUTE_METHODS", "ROPE_KERNELS", "ZERO3_COLLECTIVES",
           "Execution", "check_execution",
           "chunk_layers", "layout_chunks", "stage_layers", "execution_from_dict", "load_execution", "execution_to_dict"]

_RECOMPUTE = ("none", "selective", "selective-op", "full")
RECOMPUTE_METHODS = ("block", "uniform")
"""Megatron-LM's ``--recompute-method`` with a layer count (NOTE [partial recompute and offload] in
:mod:`mcdla.workload.layer_counts`)."""
OFFLOAD_TIERS = ("host", "nvme")
"""Second tiers offloaded state can live in: host memory (ZeRO-Offload) or NVMe (ZeRO-Infinity)."""
OffloadTier = Literal["host", "nvme"]
ZERO3_COLLECTIVES = ("per-layer", "per-tensor")
"""What one ZeRO-3 gather or reduce-scatter moves: a layer's weights, or one parameter tensor
(``Execution.zero3_collectives``)."""
Zero3Collectives = Literal["per-layer", "per-tensor"]
_INT_FIELDS = ("gpus", "tp", "pp", "dp", "cp", "ep", "virtual_stages", "micro_batch", "global_batch")
ROPE_KERNELS = ("complex", "rotation")
"""How eager PyTorch applies RoPE (``Execution.rope_kernels``): a complex product (torchtitan) or the 2 x 2 rotation
tables multiplied and summed in fp32 (foundation-model-stack's ``adjusted_qk``); NOTE [eager kernels]."""
OPTIMIZER_KERNELS = ("fused", "foreach")
"""How the GPU's Adam step runs (``Execution.optimizer_kernels``): one pass over the state, or PyTorch's foreach
AdamW one kernel per op (NOTE [foreach optimizer] in :mod:`mcdla.sim.llm_eager`)."""
CP_COMM_TYPES = ("p2p", "all_gather")
"""How context-parallel attention exchanges K and V (Megatron-Core's ``--cp-comm-type``): a ring of
point-to-point sends overlapped with the attention of the block before, or one all-gather before it."""
EP_DISPATCHERS = ("alltoall", "hybridep")
"""How Megatron-Core's MoE layer moves tokens to their experts (``Execution.ep_dispatcher``): the ``alltoall``
token dispatcher (``--moe-token-dispatcher-type alltoall``), or the ``flex`` dispatcher with DeepEP's HybridEP
backend (``--moe-flex-dispatcher-backend hybridep``); NOTE [expert parallelism] in :mod:`mcdla.sim.llm_moe`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution(HashOnce):
    """How one training iteration runs on ``gpus`` devices.

    Attributes:
        gpus: devices in total, ``tp * pp * dp * cp``.
        tp, pp, dp, cp: tensor, pipeline, data and context parallel degrees.
        ep: expert parallel degree, inside ``dp x cp`` (each rank holds ``experts / ep`` experts).
        capacity_factor: each expert's token capacity over its mean load (tokens x top_k / experts); the
            expert GEMMs and the all-to-all move this many times the routed tokens (> 1 pads, < 1 drops).
        cp_comm: ``p2p`` (ring, overlapped) or ``all_gather`` (not overlapped), :data:`CP_COMM_TYPES`.
        ep_dispatcher: ``alltoall`` or ``hybridep``, the MoE token dispatcher (:data:`EP_DISPATCHERS`).
        virtual_stages: model chunks per pipeline rank (1 = plain 1F1B; > 1 = interleaved 1F1B).
        sequence_parallel: split norms and dropouts along the sequence inside the TP group (needs ``tp > 1``).
        zero: ZeRO stage over the DP group: 0 none, 1 optimizer state, 2 + gradients, 3 + weights (FSDP).
        micro_batch: samples per micro-batch; global_batch: samples per iteration over all replicas.
        recompute: ``none``, ``selective`` (attention core), ``selective-op`` (torchtitan's op policy: every
            second matrix product and the memory-bound kernels, NOTE [op-level selective recompute] in
            :mod:`mcdla.workload.op_recompute`) or ``full`` (every layer from its input).
        recompute_modules: with ``selective``, Megatron-Core's ``--recompute-modules`` (NOTE [recompute modules]
            in :mod:`mcdla.workload.transformer`): any of ``core_attn`` (the attention core, the default),
            ``mla_up_proj``, ``moe_act``, ``layernorm``; left at the default with the other recompute choices.
        recompute_method, recompute_num_layers: with ``full``, Megatron-LM's ``--recompute-method block|uniform
            --recompute-num-layers N`` per model chunk (:mod:`mcdla.workload.layer_counts`); None recomputes
            every layer from its own input.
        offload_num_layers: with ``offload_activations`` or ``offload_weights``, only the first N layers of each
            model chunk offload theirs (Megatron-Core/Transformer Engine's ``--cpu-offloading-num-layers``);
            None offloads every layer's.
        offload_activations, offload_weights, offload_optimizer: keep these in the second memory tier.
        dp_overlap: overlap the gradient reduction with backward (else it runs after the last backward).
        fused_kernels: the memory-bound kernels are fused as Megatron-LM runs them (true) or run as eager
            PyTorch's one kernel per op (false; NOTE [eager kernels] in :mod:`mcdla.sim.llm_eager`).
        rope_kernels: with ``fused_kernels: false``, the model code's RoPE: ``complex`` (torchtitan's complex
            product) or ``rotation`` (foundation-model-stack's fp32 product with the rotation tables and its sum).
        optimizer_kernels: the GPU's Adam step fused (one pass over the state) or ``foreach`` (PyTorch's
            default AdamW, one kernel per op, with ``clip_grad_norm_`` and FSDP's cast of the reduced gradient).
        attention: ``flash`` (fused FlashAttention-2, no stored scores) or ``materialized`` (the ``s x s``
            scores in HBM, Megatron's fused softmax of the published A100 runs); NOTE [flash attention] in
            :mod:`mcdla.workload.transformer`.
        fp8_scaling: Transformer Engine's recipe when the GEMMs run in fp8: ``current``, ``delayed`` or
            ``mxfp8`` (block scales, Blackwell's FP8-MX).
        tp_comm_overlap: hide the TP collectives behind the GEMMs they pair with, up to those GEMMs' time
            (Transformer Engine's userbuffers).
        pp_comm_overlap: with an interleaved schedule (``virtual_stages > 1``), each pipeline send and receive
            runs while the next model chunk computes, exposing only what exceeds that chunk's forward compute
            (Megatron-Core's ``overlap_p2p_comm``, on by default in Megatron-LM for interleaving).
        fsdp_prefetch: with ``zero=3``, layers whose weights are gathered ahead of the one computing (FSDP's
            forward/backward prefetch, DeepSpeed's prefetch bucket); 0 gathers each layer when it is needed.
        hsdp_shard: with ``zero=3``, the size of the shard group (FSDP2 HSDP: shard inside, replicate across the
            ``dp / hsdp_shard`` groups); 0 shards over the whole DP group.
        zero3_collectives: with ``zero=3``, what one gather or reduce-scatter moves: ``per-layer`` (one
            collective for a layer's weights, FSDP's flat parameter per wrapped block) or ``per-tensor`` (one per
            parameter tensor, :meth:`~mcdla.workload.transformer.TransformerSpec.layer_tensors`: DeepSpeed
            ZeRO-3 from 0.3.12 to 0.5.4, ``_allgather_param`` per parameter, ``_reduce_scatter_gradients`` per
            parameter of a bucket); NOTE [ZeRO-3 as run] in :mod:`mcdla.sim.llm`.
        zero3_persist_numel: with ``per-tensor``, tensors of fewer elements (per TP rank) stay gathered on every
            rank and are not gathered per layer (DeepSpeed's ``stage3_param_persistence_threshold``); their
            gradients are still reduce-scattered, and they are gathered once after the optimizer step. 0: none.
        cpu_optimizer: ZeRO-Offload: the Adam step runs on the host CPU over optimizer state in the second tier;
            fp32 gradients go out (DeepSpeed casts each reduced bucket to the master dtype) and 16-bit
            parameters come back over the offload link (NOTE [ZeRO-Offload] in :mod:`mcdla.sim.llm_offload`).
        activation_offload_sync: with ``offload_activations``, each layer's checkpoint is copied to the pool
            before the layer runs and back before its backward, on the compute stream, waiting for the copy
            (DeepSpeed's ``cpu_checkpointing``: ``copy_`` into a pageable CPU tensor and back,
            ``runtime/activation_checkpointing/checkpointing.py``): exposed whole, where Megatron-Core's
            offloading overlaps the compute (false).
        offload_first_touch: with ``offload_activations``, each forward's copies to the pool land in pageable host
            pages the process has not touched before (DeepSpeed v0.3.0's ``cpu_checkpointing`` allocates its CPU
            tensors with ``new_empty`` every iteration; later versions write each page first): each such copy takes
            the slower of the link and the host's first-touch rate (``node.sockets.first_touch_copy``), the host
            thread faulting in every destination page as it copies out of the driver's staging buffers (NOTE
            [first-touch copies] in :mod:`mcdla.sim.llm_offload`).
        moe_router_graph: the pre-MLP norm, the router and the MoE dispatcher's preprocess captured in a CUDA graph
            (Megatron-Core ``cuda_graph_scope`` ``moe_router`` and ``moe_preprocess``): one graph launch each
            way per MoE layer instead of their kernels' launches (NOTE [expert parallelism] in
            :mod:`mcdla.sim.llm_moe`).
        attention_kernel: the attention kernel build the run used, one the system measures
            (``node.attention_kernels``, e.g. ``cudnn-9.13.1``): the attention core's forward and backward take
            that build's measured times over the model's own pricing (NOTE [attention kernel build] in
            :mod:`mcdla.sim.llm`); None: the model's pricing.
        moe_a2a_overlap: Megatron-Core's EP communication overlap (``overlap_moe_expert_parallel_comm`` with
            ``delay_wgrad_compute``, Megatron-Bridge's ``moe_a2a_overlap``): the combined 1F1B schedule runs one
            micro-batch's forward beside another's backward, each one's all-to-alls hidden behind the other's
            compute (NOTE [EP overlap] in :mod:`mcdla.sim.llm_moe`); its host cost is not priced.
        reduce_bucket_numel: with ``cpu_optimizer`` under ZeRO-1/2, the elements of DeepSpeed's gradient reduce
            bucket (``reduce_bucket_size``, default 5e8): the GPU holds that bucket (two with ``dp_overlap``,
            DeepSpeed's ``overlap_comm`` double buffer) instead of the whole gradients, each bucket going to the
            host as it fills.
        offload_tier: where offloaded optimizer state (and weights) live: ``host`` memory or ``nvme``
            (ZeRO-Infinity).
        delayed_param_update: with ``cpu_optimizer``, the CPU step and the parameters' return overlap the next
            iteration (ZeRO-Offload's one-step delayed parameter update, DPU).
        layers_first_stage, layers_last_stage: layers of the first and of the last pipeline stage (None = an
            equal share); the middle stages split the remaining layers equally (:func:`stage_layers`).
        account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split: count the embedding (the
            loss) as a layer of the first (last) model chunk, Megatron-LM's other uneven split (:func:`chunk_layers`).
        pipeline_layout: Megatron-Core's ``pipeline_model_parallel_layout`` string (``E`` embedding, ``t`` a
            decoder layer, ``L`` the loss, ``|`` between model chunks, ``x*n`` and ``(...)*n`` repeats), the
            chunks in virtual-stage order (:func:`layout_chunks`); None = the other fields' split.
    """

    gpus: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    micro_batch: int = 1
    global_batch: int = 1
    recompute: Recompute = "none"
    offload_activations: bool = False
    offload_weights: bool = False
    offload_optimizer: bool = False
    dp_overlap: bool = False
    attention: Attention = "flash"
    fp8_scaling: Literal["delayed", "current", "mxfp8"] = "current"
    tp_comm_overlap: bool = False
    pp_comm_overlap: bool = False
    fsdp_prefetch: int = 1
    hsdp_shard: int = 0
    zero3_collectives: Zero3Collectives = "per-layer"
    zero3_persist_numel: int = 0
    cpu_optimizer: bool = False
    offload_tier: OffloadTier = "host"
    delayed_param_update: bool = False
    layers_first_stage: int | None = None
    layers_last_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    ep: int = 1
    capacity_factor: float = 1.0
    cp_comm: Literal["p2p", "all_gather"] = "p2p"
    ep_dispatcher: Literal["alltoall", "hybridep"] = "alltoall"
    recompute_method: Literal["block", "uniform"] = "block"
    recompute_num_layers: int | None = None
    offload_num_layers: int | None = None
    fused_kernels: bool = True
    rope_kernels: Literal["complex", "rotation"] = "complex"
    optimizer_kernels: Literal["fused", "foreach"] = "fused"
    reduce_bucket_numel: int = 500_000_000
    activation_offload_sync: bool = False
    offload_first_touch: bool = False
    moe_router_graph: bool = False
    pipeline_layout: str | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    moe_a2a_overlap: bool = False
    attention_kernel: str | None = None

    __hash__ = hash_once  # a key of the model's memoised figures, hashed once (mcdla.workload.memo)

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"execution.{name}: got {brief(value)}; must be an integer >= 1")
        for name in ("sequence_parallel", "offload_activations", "offload_weights", "offload_optimizer",
                     "dp_overlap", "tp_comm_overlap", "pp_comm_overlap", "cpu_optimizer", "delayed_param_update",
                     "account_for_embedding_in_pipeline_split",
                     "account_for_loss_in_pipeline_split", "fused_kernels", "activation_offload_sync",
                     "offload_first_touch", "moe_router_graph", "moe_a2a_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"execution.{name}: got {brief(getattr(self, name))}; must be true or false")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"execution.zero: got {brief(self.zero)}; must be 0, 1, 2 or 3 (3 = FSDP)")
        factor = self.capacity_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < float("inf"):
            raise ConfigError(f"execution.capacity_factor: got {brief(factor)}; must be a finite number > 0")
        if self.cp_comm not in CP_COMM_TYPES:
            raise ConfigError(f"execution.cp_comm: got {brief(self.cp_comm)}; "
                              f"must be one of {', '.join(CP_COMM_TYPES)}")
        if self.ep_dispatcher not in EP_DISPATCHERS:
            raise ConfigError(f"execution.ep_dispatcher: got {brief(self.ep_dispatcher)}; "
                              f"must be one of {', '.join(EP_DISPATCHERS)}")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"execution.ep: got {self.ep}; must divide dp*cp = {self.dp}*{self.cp} = "
                              f"{self.dp * self.cp} (experts are split inside the data x context parallel group)")
        if self.ep > 1 and self.tp > 1 and not self.sequence_parallel:
            raise ConfigError(f"execution.sequence_parallel: got false with tp={self.tp} and ep={self.ep}; "
                              "expert parallelism with tensor parallelism needs sequence parallelism (Megatron-Core)")
        if self.attention_kernel is not None and (not isinstance(self.attention_kernel, str)
                                                  or not self.attention_kernel.strip()):
            raise ConfigError(f"execution.attention_kernel: got {brief(self.attention_kernel)}; must be the name of "
                              "a measured attention kernel build of the system (node.attention_kernels) or null")
        if self.recompute not in _RECOMPUTE:
            raise ConfigError(f"execution.recompute: got {brief(self.recompute)}; must be one of {', '.join(_RECOMPUTE)}")
        self._check_recompute_modules()
        self._check_a2a_overlap()
        if self.rope_kernels not in ROPE_KERNELS:
            raise ConfigError(f"execution.rope_kernels: got {brief(self.rope_kernels)}; "
                              f"must be one of {', '.join(ROPE_KERNELS)}")
        if self.rope_kernels != "complex" and self.fused_kernels:
            raise ConfigError(f"execution.rope_kernels: got {self.rope_kernels!r} with fused_kernels true; it says "
                              "how eager PyTorch runs RoPE, needs fused_kernels false")
        if self.optimizer_kernels not in OPTIMIZER_KERNELS:
            raise ConfigError(f"execution.optimizer_kernels: got {brief(self.optimizer_kernels)}; "
                              f"must be one of {', '.join(OPTIMIZER_KERNELS)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"execution.attention: got {brief(self.attention)}; "
                              f"must be one of {', '.join(ATTENTIONS)}")
        if self.fp8_scaling not in FP8_SCALINGS:
            raise ConfigError(f"execution.fp8_scaling: got {brief(self.fp8_scaling)}; "
                              f"must be one of {', '.join(FP8_SCALINGS)}")
        self._check_zero_options()
        self._check_layer_counts()
        for name in ("layers_first_stage", "layers_last_stage"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"execution.{name}: got {brief(value)}; must be an integer >= 1 or absent")
            if value is not None and self.pp == 1:
                raise ConfigError(f"execution.{name}: got {value} with pp=1; an uneven split needs pp > 1")
        accounting = self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split
        if accounting and (self.layers_first_stage is not None or self.layers_last_stage is not None):
            raise ConfigError("execution.layers_first_stage: got it with account_for_*_in_pipeline_split; "
                              "choose one way of splitting unevenly")
        if self.pipeline_layout is not None:
            if accounting or self.layers_first_stage is not None or self.layers_last_stage is not None:
                raise ConfigError("execution.pipeline_layout: got it with layers_first/last_stage or "
                                  "account_for_*_in_pipeline_split; Megatron-Core takes the layout alone")
            layout_chunks(self.pipeline_layout, self.pp, self.virtual_stages)
        product = self.tp * self.pp * self.dp * self.cp
        if product != self.gpus:
            raise ConfigError(f"execution.gpus: got {self.gpus}; must equal tp*pp*dp*cp = "
                              f"{self.tp}*{self.pp}*{self.dp}*{self.cp} = {product}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("execution.sequence_parallel: got true with tp=1; sequence parallelism needs tp > 1")
        if self.pp_comm_overlap and self.virtual_stages == 1:
            raise ConfigError("execution.pp_comm_overlap: got true with virtual_stages=1; the pipeline sends overlap "
                              "the next model chunk, which needs an interleaved schedule (virtual_stages > 1)")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ConfigError(f"execution.virtual_stages: got {self.virtual_stages} with pp=1; interleaving needs pp > 1")
        if self.zero and self.dp == 1:
            raise ConfigError(f"execution.zero: got {self.zero} with dp=1; ZeRO shards over data-parallel ranks, needs dp > 1")
        per_step = self.micro_batch * self.dp
        if self.global_batch % per_step:
            raise ConfigError(f"execution.global_batch: got {self.global_batch}; must be a multiple of "
                              f"micro_batch*dp = {self.micro_batch}*{self.dp} = {per_step}")
        if self.virtual_stages > 1 and self.micro_batches % self.pp:
            raise ConfigError(f"execution.global_batch: got {self.global_batch}, i.e. {self.micro_batches} micro-batches "
                              f"per replica; the interleaved schedule needs a multiple of pp ({self.pp})")

    def _check_zero_options(self) -> None:
        """The FSDP/HSDP and ZeRO-Offload/Infinity fields: integers in range, each only with what it needs."""
        for name, low in (("fsdp_prefetch", 0), ("hsdp_shard", 0), ("zero3_persist_numel", 0),
                          ("reduce_bucket_numel", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"execution.{name}: got {brief(value)}; must be an integer >= {low}")
        if self.hsdp_shard:
            if self.zero != 3:
                raise ConfigError(f"execution.hsdp_shard: got {self.hsdp_shard} with zero={self.zero}; "
                                  "HSDP shards weights, needs zero=3")
            if self.dp % self.hsdp_shard:
                raise ConfigError(f"execution.hsdp_shard: got {self.hsdp_shard}; must divide dp = {self.dp}")
        if self.zero3_collectives not in ZERO3_COLLECTIVES:
            raise ConfigError(f"execution.zero3_collectives: got {brief(self.zero3_collectives)}; must be one of "
                              f"{', '.join(ZERO3_COLLECTIVES)}")
        if self.zero3_collectives != "per-layer" and self.zero != 3:
            raise ConfigError(f"execution.zero3_collectives: got {self.zero3_collectives!r} with zero={self.zero}; "
                              "it says how ZeRO-3 gathers weights, needs zero=3")
        if self.zero3_persist_numel and self.zero3_collectives != "per-tensor":
            raise ConfigError(f"execution.zero3_persist_numel: got {self.zero3_persist_numel} with "
                              f"zero3_collectives={self.zero3_collectives!r}; it keeps small tensors gathered, "
                              "needs zero3_collectives='per-tensor'")
        if self.offload_tier not in OFFLOAD_TIERS:
            raise ConfigError(f"execution.offload_tier: got {brief(self.offload_tier)}; must be one of "
                              f"{', '.join(OFFLOAD_TIERS)}")
        if self.cpu_optimizer and not self.offload_optimizer:
            raise ConfigError("execution.cpu_optimizer: got true with offload_optimizer=false; the CPU's Adam "
                              "works on optimizer state in the second tier, set offload_optimizer")
        if self.activation_offload_sync and not self.offload_activations:
            raise ConfigError("execution.activation_offload_sync: got true with offload_activations=false; it says "
                              "how the activations go to the pool, set offload_activations")
        if self.offload_first_touch and not self.offload_activations:
            raise ConfigError("execution.offload_first_touch: got true with offload_activations=false; it says "
                              "where the activations' copies land, set offload_activations")
        if self.delayed_param_update and not self.cpu_optimizer:
            raise ConfigError("execution.delayed_param_update: got true with cpu_optimizer=false; the delayed "
                              "update overlaps the CPU's Adam step, set cpu_optimizer")

    def _check_a2a_overlap(self) -> None:
        """Megatron-Core's refusals of ``overlap_moe_expert_parallel_comm`` (Megatron-LM 0d8e0714
        ``megatron/core/transformer/transformer_config.py``): EP > 1, no full recompute, a virtual pipeline with
        PP > 1 (both dispatchers here are ``alltoall`` or ``flex``, which it takes)."""
        if not self.moe_a2a_overlap:
            return
        if self.ep == 1:
            raise ConfigError("execution.moe_a2a_overlap: got true with ep=1; it needs expert parallelism (ep > 1)")
        if self.recompute == "full":
            raise ConfigError("execution.moe_a2a_overlap: got true with recompute=full; Megatron-Core refuses full "
                              "recompute with it (none, selective or selective-op)")
        if self.pp > 1 and self.virtual_stages == 1:
            raise ConfigError(f"execution.moe_a2a_overlap: got true with pp={self.pp} and virtual_stages=1; with "
                              "pp > 1 it needs an interleaved schedule (virtual_stages > 1)")

    def _check_recompute_modules(self) -> None:
        """``recompute_modules``: a non-empty tuple (or list, kept as a tuple) of distinct :data:`RECOMPUTE_MODULES`,
        other than the default only with ``recompute="selective"``."""
        if isinstance(self.recompute_modules, list):  # as JSON gives it
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        modules = self.recompute_modules
        if not isinstance(modules, tuple) or not modules or len(set(modules)) < len(modules):
            raise ConfigError(f"execution.recompute_modules: got {brief(modules)}; must be a non-empty list of "
                              f"distinct names among {', '.join(RECOMPUTE_MODULES)}")
        for name in modules:
            if name not in RECOMPUTE_MODULES:
                raise ConfigError(f"execution.recompute_modules: got {brief(name)}; must be among "
                                  f"{', '.join(RECOMPUTE_MODULES)} (Megatron-Core's mlp, moe and shared_experts "
                                  "are not modelled)")
        if modules != ("core_attn",) and self.recompute != "selective":
            raise ConfigError(f"execution.recompute_modules: got {','.join(modules)} with recompute="
                              f"{self.recompute}; it names what selective recompute re-runs, needs "
                              "recompute=selective")

    @property
    def recomputes_attention(self) -> bool:
        """Whether backward re-runs the attention core: ``full``, or ``selective`` with ``core_attn``."""
        return self.recompute == "full" or (self.recompute == "selective" and "core_attn" in self.recompute_modules)

    def _check_layer_counts(self) -> None:
        """Partial recompute and offload: counts >= 0 (>= 1 for ``uniform``), each only with what it counts."""
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ConfigError(f"execution.recompute_method: got {brief(self.recompute_method)}; must be one of "
                              f"{', '.join(RECOMPUTE_METHODS)}")
        low = 1 if self.recompute_method == "uniform" else 0
        for name, least in (("recompute_num_layers", low), ("offload_num_layers", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigError(f"execution.{name}: got {brief(value)}; must be an integer >= {least} or absent")
        if self.recompute_num_layers is not None and self.recompute != "full":
            raise ConfigError(f"execution.recompute_num_layers: got {self.recompute_num_layers} with recompute="
                              f"{self.recompute}; it counts fully recomputed layers, needs recompute=full")
        if self.offload_num_layers is not None and not (self.offload_activations or self.offload_weights):
            raise ConfigError(f"execution.offload_num_layers: got {self.offload_num_layers} with neither "
                              "offload_activations nor offload_weights; it counts offloaded layers")
        if self.offload_num_layers is not None and self.recompute_num_layers is not None:
            raise ConfigError("execution.offload_num_layers: got it with recompute_num_layers; Megatron-LM refuses "
                              "CPU offloading with recomputation, choose one layer count")

    @property
    def shard_ranks(self) -> int:
        """Data-parallel ranks one copy of the ZeRO-sharded state is split over: ``hsdp_shard`` under HSDP, else
        ``dp`` (1 without ZeRO); the dense parameters' shard group also spans the ``cp`` ranks, which hold the same
        weights (the time model's ``_shard_groups``)."""
        if not self.zero:
            return 1
        return self.hsdp_shard or self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per replica per iteration, ``m = global_batch / (micro_batch * dp)``."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def bubble_fraction(self) -> float:
        """Pipeline bubble over ideal time, ``(p - 1) / (m v)`` (Narayanan et al. SC21, sec. 2.2)."""
        return (self.pp - 1) / (self.micro_batches * self.virtual_stages)


@pure_cache(64)
def stage_layers(execution: Execution, spec: TransformerSpec) -> tuple[int, ...]:
    """The layers of each pipeline stage, first to last; one-line ConfigError unless every stage gets a
    positive multiple of ``virtual_stages`` layers (each of its chunks the same size, as Megatron-LM requires).

    Without ``layers_first_stage``/``layers_last_stage`` the split is even (``layers / pp`` each); with them
    the end stages take what they say and the ``pp - 2`` (or ``pp - 1``) others share the rest equally.
    """
    e, layers = execution, spec.layers
    first, last = e.layers_first_stage, e.layers_last_stage
    if e.account_for_embedding_in_pipeline_split or e.account_for_loss_in_pipeline_split or e.pipeline_layout:
        return tuple(sum(row) for row in chunk_layers(e, spec))
    if first is None and last is None:
        chunks = e.pp * e.virtual_stages
        if layers % chunks:
            raise ConfigError(f"execution.pp: got pp*virtual_stages = {e.pp}*{e.virtual_stages} = {chunks}; "
                              f"must divide the {layers} layers of {spec.name} (or set layers_first_stage/"
                              "layers_last_stage for an uneven split)")
        return (layers // e.pp,) * e.pp
    fixed = [n for n in (first, last) if n is not None]
    middle_stages = e.pp - len(fixed)
    rest = layers - sum(fixed)
    if middle_stages == 0 and rest != 0 or middle_stages and (rest < middle_stages or rest % middle_stages):
        field = "layers_first_stage" if first is not None else "layers_last_stage"
        raise ConfigError(f"execution.{field}: got first={first}, last={last}; the other "
                          f"{middle_stages} stages must share the remaining {rest} of the {layers} layers of "
                          f"{spec.name} equally, at least one each")
    share = rest // middle_stages if middle_stages else 0
    split = [share] * e.pp
    if first is not None:
        split[0] = first
    if last is not None:
        split[-1] = last
    bad = [n for n in split if n % e.virtual_stages]
    if bad:
        raise ConfigError(f"execution.virtual_stages: got {e.virtual_stages}; must divide the layers of every "
                          f"stage, here {split}")
    return tuple(split)


@pure_cache(64)
def chunk_layers(execution: Execution, spec: TransformerSpec) -> tuple[tuple[int, ...], ...]:
    """The layers of each pipeline stage's ``virtual_stages`` model chunks, ``[stage][chunk]``; one-line
    ConfigError unless they split evenly.

    Without the accounting options each chunk of a stage holds ``stage_layers / virtual_stages``. With them,
    ``layers`` plus the embedding and/or the loss, as one layer each, split equally over the ``pp *
    virtual_stages`` chunks, and the first model chunk (stage 0, chunk 0) and/or the last (stage ``pp - 1``,
    chunk ``virtual_stages - 1``) hold one real layer fewer (Megatron-LM's
    ``account_for_embedding/loss_in_pipeline_split``).
    """
    e = execution
    v = e.virtual_stages
    if e.pipeline_layout is not None:
        flat = layout_chunks(e.pipeline_layout, e.pp, v)
        if sum(flat) != spec.layers:
            raise ConfigError(f"execution.pipeline_layout: got {brief(e.pipeline_layout)}, {sum(flat)} decoder "
                              f"layers; must hold the {spec.layers} layers of {spec.name}")
        return tuple(tuple(flat[c * e.pp + s] for c in range(v)) for s in range(e.pp))
    embedding, loss = e.account_for_embedding_in_pipeline_split, e.account_for_loss_in_pipeline_split
    if not (embedding or loss):
        return tuple((n // v,) * v for n in stage_layers(e, spec))
    total, chunks = spec.layers + int(embedding) + int(loss), e.pp * v
    if total % chunks or total // chunks < 2:
        raise ConfigError(f"execution.pp: got pp*virtual_stages = {e.pp}*{v} = {chunks}; must divide the "
                          f"{spec.layers} layers of {spec.name} plus the embedding/loss counted as layers "
                          f"({total}), at least 2 per chunk")
    grid = [[total // chunks] * v for _ in range(e.pp)]
    if embedding:
        grid[0][0] -= 1
    if loss:
        grid[-1][-1] -= 1
    return tuple(tuple(row) for row in grid)


_LAYOUT_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
_MAX_LAYOUT = 1_000_000  # characters a layout may expand to: far past any model's layers


@pure_cache(64)
def layout_chunks(layout: str, pp: int, virtual_stages: int) -> tuple[int, ...]:
    """The decoder layers of each model chunk of a Megatron-Core layout string, in its order (chunk ``c`` of
    stage ``s`` is entry ``c * pp + s``); one-line ConfigError unless it is such a layout for ``pp x
    virtual_stages`` chunks.

    Expanded as ``PipelineParallelLayerLayout.parse_str_to_list`` does (Megatron-LM 0d8e0714,
    ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: commas dropped, ``(...)*n`` then ``x*n``
    unrolled, ``|`` between chunks) and checked as its ``validate_layer_layout`` does: the embedding ``E`` once,
    first, the loss ``L`` once, last. Left out here: ``m`` (multi-token prediction, not modelled) and a chunk with
    no decoder layer.
    """
    if not isinstance(layout, str) or len(layout) > 10_000:
        raise ConfigError(f"execution.pipeline_layout: got {brief(layout)}; must be a layout string such as "
                          "'Et*4|(t*4|)*14tL'")
    def unroll(match: re.Match[str]) -> str:
        if len(match.group(1)) * int(match.group(2)) > _MAX_LAYOUT:
            raise ConfigError(f"execution.pipeline_layout: got {brief(layout)}; expands past {_MAX_LAYOUT:,} "
                              "characters")
        return match.group(1) * int(match.group(2))

    text = layout.replace(",", "")
    for pattern in _LAYOUT_REPEATS:
        text = pattern.sub(unroll, text)
        if len(text) > _MAX_LAYOUT:
            raise ConfigError(f"execution.pipeline_layout: got {brief(layout)}; expands past {_MAX_LAYOUT:,} "
                              "characters")
    chunks = text.split("|")
    flat = "".join(chunks)
    bad = sorted(set(flat) - set("EtL"))
    if bad or not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        what = (f"character {bad[0]!r}" + (" (multi-token prediction is not modelled)" if "m" in bad else "")
                if bad else "not the embedding E once first and the loss L once last")
        raise ConfigError(f"execution.pipeline_layout: got {brief(layout)}, {what}; must use E, t, L, | and "
                          "repeats x*n, (...)*n")
    if len(chunks) != pp * virtual_stages:
        raise ConfigError(f"execution.pipeline_layout: got {len(chunks)} model chunks; must be pp*virtual_stages "
                          f"= {pp}*{virtual_stages} = {pp * virtual_stages}")
    counts = tuple(chunk.count("t") for chunk in chunks)
    if 0 in counts:
        raise ConfigError(f"execution.pipeline_layout: got a model chunk with no decoder layer (chunk "
                          f"{counts.index(0)}); every chunk must hold at least one 't'")
    return counts


def check_execution(execution: Execution, spec: TransformerSpec) -> None:
    """Raise one-line ConfigError unless ``execution`` can run ``spec``: layers split into stages of whole
    chunks (:func:`stage_layers`), heads and kv-heads (and experts' FFN) split over ``tp``, the sequence over
    ``cp`` (and over ``tp`` with sequence parallelism), the experts over ``ep``; ``selective-op`` only where it
    is modelled (:func:`~mcdla.workload.op_recompute.op_recompute_rejection`)."""
    e = execution
    stage_layers(e, spec)
    if e.recompute_num_layers is not None or e.offload_num_layers is not None:
        from mcdla.workload.layer_counts import layer_shares  # built on this module's chunk_layers

        layer_shares(e, spec)
    if e.recompute == OP_RECOMPUTE:
        check_op_recompute(spec, e.tp, e.attention)
    for module, needs, has in (("mla_up_proj", "multi-head latent attention", spec.mla is not None),
                               ("moe_act", "experts", spec.experts > 1)):
        if module in e.recompute_modules and not has:
            raise ConfigError(f"execution.recompute_modules: got {module} for {spec.name}; it needs {needs} "
                              "(Megatron-Core refuses it otherwise)")
    if e.zero3_collectives == "per-tensor" and (spec.experts > 1 or spec.mla is not None):
        raise ConfigError(f"execution.zero3_collectives: got 'per-tensor' for {spec.name}; the per-tensor "
                          "collectives are named for a dense model without MLA, use 'per-layer'")
    if e.ep > 1 and (spec.experts == 1 or spec.experts % e.ep):
        raise ConfigError(f"execution.ep: got {e.ep}; must divide the {spec.experts} experts of {spec.name}"
                          + (" (a dense model: ep must be 1)" if spec.experts == 1 else ""))
    if spec.heads % e.tp:
        raise ConfigError(f"execution.tp: got {e.tp}; must divide the {spec.heads} attention heads of {spec.name}")
    if int(spec.kv_heads) % e.tp:  # type: ignore[arg-type]
        raise ConfigError(f"execution.tp: got {e.tp}; must divide the {spec.kv_heads} kv-heads of {spec.name} (GQA)")
    if int(spec.ffn_hidden) % e.tp:  # type: ignore[arg-type]
        raise ConfigError(f"execution.tp: got {e.tp}; must divide the FFN size {spec.ffn_hidden} of {spec.name}")
    if spec.seq_len % (e.cp * (e.tp if e.sequence_parallel else 1)):
        split = "cp*tp" if e.sequence_parallel else "cp"
        raise ConfigError(f"execution.cp: got {split} = {e.cp * (e.tp if e.sequence_parallel else 1)}; "
                          f"must divide the sequence length {spec.seq_len} of {spec.name}")


#: Largest count (GPUs, a parallel degree, a batch) an execution file may give: past it a record describes no
#: machine, and its products would print as hundreds of digits.
_MAX_COUNT = 2**31 - 1


class _ExecutionFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    gpus: int = Field(ge=1, le=_MAX_COUNT)
    tp: int = Field(default=1, ge=1, le=_MAX_COUNT)
    pp: int = Field(default=1, ge=1, le=_MAX_COUNT)
    dp: int = Field(default=1, ge=1, le=_MAX_COUNT)
    cp: int = Field(default=1, ge=1, le=_MAX_COUNT)
    virtual_stages: int = Field(default=1, ge=1, le=_MAX_COUNT)
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    micro_batch: int = Field(default=1, ge=1, le=_MAX_COUNT)
    global_batch: int = Field(default=1, ge=1, le=_MAX_COUNT)
    recompute: Literal["none", "selective", "selective-op", "full"] = "none"
    offload_activations: bool = False
    offload_weights: bool = False
    offload_optimizer: bool = False
    dp_overlap: bool = False
    attention: Literal["flash", "materialized"] = "flash"
    fp8_scaling: Literal["delayed", "current", "mxfp8"] = "current"
    tp_comm_overlap: bool = False
    pp_comm_overlap: bool = False
    fsdp_prefetch: int = Field(default=1, ge=0, le=_MAX_COUNT)
    hsdp_shard: int = Field(default=0, ge=0, le=_MAX_COUNT)
    zero3_collectives: Literal["per-layer", "per-tensor"] = "per-layer"
    zero3_persist_numel: int = Field(default=0, ge=0, le=_MAX_COUNT)
    cpu_optimizer: bool = False
    offload_tier: Literal["host", "nvme"] = "host"
    delayed_param_update: bool = False
    layers_first_stage: int | None = Field(default=None, ge=1)
    layers_last_stage: int | None = Field(default=None, ge=1)
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    ep: int = Field(default=1, ge=1, le=_MAX_COUNT)
    capacity_factor: float = Field(default=1.0, gt=0, le=1000.0)  # 1000 pads past any expert count's need
    cp_comm: Literal["p2p", "all_gather"] = "p2p"
    ep_dispatcher: Literal["alltoall", "hybridep"] = "alltoall"
    recompute_method: Literal["block", "uniform"] = "block"
    recompute_num_layers: int | None = Field(default=None, ge=0, le=_MAX_COUNT)
    offload_num_layers: int | None = Field(default=None, ge=0, le=_MAX_COUNT)
    fused_kernels: bool = True
    rope_kernels: Literal["complex", "rotation"] = "complex"
    optimizer_kernels: Literal["fused", "foreach"] = "fused"
    reduce_bucket_numel: int = Field(default=500_000_000, ge=1, le=_MAX_COUNT)
    activation_offload_sync: bool = False
    offload_first_touch: bool = False
    moe_router_graph: bool = False
    pipeline_layout: str | None = Field(default=None, min_length=1, max_length=10_000)
    recompute_modules: list[Literal["core_attn", "mla_up_proj", "moe_act", "layernorm"]] = Field(
        default=["core_attn"], min_length=1, max_length=len(RECOMPUTE_MODULES))
    moe_a2a_overlap: bool = False
    attention_kernel: str | None = Field(default=None, min_length=1, max_length=200)


def _one_line(exc: ValidationError, source: str) -> str:
    return validation_line(exc.errors()[0], source, "execution", _ExecutionFile.model_fields)


def execution_from_dict(data: Any, source: str = "execution") -> Execution:
    """An :class:`Execution` from a mapping (a parsed file); one-line ConfigError naming the field otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: got {brief(data)}; must be a mapping of execution fields")
    try:
        parsed = _ExecutionFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, source)) from None
    fields = parsed.model_dump()
    fields["recompute_modules"] = tuple(fields["recompute_modules"])
    return Execution(**fields)


def load_execution(path: str | Path) -> Execution:
    """Read an execution record from a ``.json``, ``.yaml`` or ``.yml`` file."""
    data = read_document(path, what="execution file", error=ConfigError)
    return execution_from_dict(data, source=f"execution file {str(path)[:200]!r}")


def execution_to_dict(execution: Execution) -> dict[str, Any]:
    """The record as plain data (the file format); an even split's absent end-stage layer counts are left out."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(execution).items() if v is not None}
