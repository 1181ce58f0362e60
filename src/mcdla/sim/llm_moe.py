"""Mixture-of-experts with expert parallelism: the all-to-all, the capacity factor and the expert weights per rank.

An MoE layer routes each token to ``top_k`` of ``experts`` FFNs. With expert parallelism the experts are split
over ``ep`` ranks of the ``dp x cp`` group (Megatron-Core; the layout of
:class:`~mcdla.workload.parallel_dims.ParallelDims`), each rank holding ``experts / ep`` of them, and the tokens
travel to their experts and back by all-to-all on the fabric dimensions the EP group spans.
NOTE [expert parallelism] (also ``docs/llm.md``):

* Per MoE layer and micro-batch, one rank dispatches and combines ``tokens x top_k x hidden x capacity``
  elements, ``tokens = b s / (cp tp)`` (sequence parallelism splits the tokens over TP, which Megatron-Core
  requires with TP and EP together): one all-to-all each way in forward, two in backward, two more with full
  recomputation (:func:`all_to_all_bytes`). Not overlapped, but with ``moe_a2a_overlap`` (NOTE [EP overlap]).
* The capacity factor ``C`` pads (``C > 1``) or drops (``C < 1``) every expert's tokens to ``C`` times its
  mean load, so a rank's routed expert GEMMs run ``C`` times the routed tokens: the routed FFN FLOPs scale by
  ``C`` (:func:`routed_expert_flops`). Shared experts and dense layers are not routed.
* The routed experts run as grouped GEMMs (Megatron-Core's ``moe_grouped_gemm``), one per local expert, each
  over its own tokens, ``b s / cp x top_k x C x ep / experts`` per micro-batch
  (:func:`tokens_per_local_expert`): far fewer than a dense GEMM's ``b s / cp`` when experts are many and
  small (Qwen3-30B-A3B on EP 8: ``b s / 2``), so the GEMM curve's token term
  (:meth:`~mcdla.hardware.gemm.GemmEfficiency.at`) prices them at their own count, and its width term at
  their own narrowest dimension, ``min(hidden, ffn_hidden) / tp`` (:func:`expert_gemm_width`; Qwen3-30B-A3B's
  768-wide experts against its 2048 hidden), where a dense layer's GEMMs take ``hidden / tp``.
* The host issues a grouped GEMM as a loop over the local experts (Transformer Engine's ``GroupedLinear``): per
  expert its GEMM calls and, in fp8, the quantization kernels of its split of each input, as the recipe
  launches them (:func:`grouped_gemm_launches`). Outside a CUDA graph it also issues each kernel of the pre-MLP
  norm, the router and the dispatcher's preprocess (token counts, source-side permute), inside one
  (``moe_router_graph``) the graph's replay and its buffers' copies (:func:`router_preprocess_launches`). Each launch costs the
  device's ``host_call_s``, and the GPU waits for the host where a layer's launches outlast the work they issue,
  the expert GEMMs and the source-side permute (:func:`grouped_gemm_issue_s`, :func:`source_permute_bytes`).
* The token permutations (Megatron-Core's ``MoEAlltoAllTokenDispatcher`` with ``moe_permute_fusion``, the
  Transformer Engine kernels): each token's hidden vector is copied to its ``r = top_k x C`` expert rows
  (``permute``: read ``t h``, write ``r t h`` elements, ``t = b s / (cp tp)``), the rows received are sorted by
  local expert (``sort_chunks_by_idxs``: read and write ``r t' h``, ``t' = b s / cp`` after sequence
  parallelism's gather) and sorted back after the experts, and the rows return to their token, summed
  (``unpermute``: read ``r t h``, write ``t h``); the two sorts only with more than one local expert. Each
  kernel touches a row once: the permute loads a token once and stores its ``r`` rows, the unpermute loads the
  rows and stores their sum, a sort loads and stores each row (``_permute_kernel``, ``_unpermute_kernel``,
  ``_sort_chunks_by_map_kernel`` of Transformer Engine's ``transformer_engine/common/triton/permutation.py``;
  their routing-map passes over ``t x experts`` int32s are left out). The backward runs the same kernels
  transposed (a permute's gradient is an unpermute and the reverse), so the same bytes (the routing
  probabilities, one fp32 per row, are left out; the experts apply them). Memory-bound, at the HBM rate
  (:func:`permutation_bytes`).
* The flex dispatcher with DeepEP's HybridEP backend (``ep_dispatcher: hybridep``; Megatron-Core's
  ``_HybridEPManager``, ``fused_a2a.py`` ``HybridEPDispatch``/``HybridEPCombine``, Megatron-LM 0d8e0714, the
  submodule of Megatron-Bridge v0.2.0) sends a token once to each rank that holds one of its experts, not once
  per expert, in bf16 (``fp8_dispatch`` is refused there), and permutes the rows it received on the destination
  (DeepEP hybrid-ep ``executor.cu``: ``permute_launcher`` after the dispatch kernel, ``unpermute_launcher`` before
  the combine kernel). With every token's ``top_k`` experts drawn uniformly without replacement (forced balance),
  a token reaches ``D = ep (1 - C(E - L, k) / C(E, k))`` ranks on average (:func:`ep_ranks_per_token`; ``E``
  experts, ``L = E / ep`` local, ``k = top_k``), so a rank receives ``D t`` rows per dispatch. The dispatch and
  the combine each take ``D t h`` bytes at HybridEP's algorithm bandwidth as measured on GB200 NVL72 through its
  torch API at the 32 SMs Megatron-Bridge gives it (:data:`HYBRIDEP_ALGBW`), scaled by the EP group's scale-up
  bandwidth over GB200's 900 GB/s, less the measured calls' copy of the received rows out of, or into,
  HybridEP's buffer (``2 D t h`` bytes at the HBM rate; DeepEP hybrid-ep 6ad6896 ``csrc/hybrid_ep.cu``
  ``dispatch`` and ``combine``), which Megatron-Core's permuting calls replace by the destination permute and
  unpermute (``executor.cu``: "Use permute kernel to avoid standalone D2D memory copy") charged below
  (:func:`ep_all_to_all_s`); a group that leaves its scale-up domain, or one of fewer ranks than the 8 DeepEP
  measured (HybridEP runs there, unmeasured: :data:`HYBRIDEP_MIN_RANKS`), has its dispatch and combine priced as
  the all-to-all, its permutations and launches still HybridEP's. Its permutations move ``2 (D t + r t) h`` elements forward (the permute reads the ``D t``
  rows and writes the ``r t`` expert rows, the unpermute the reverse; no source-side permute, no sorts), as many
  backward (:func:`permutation_bytes`).
* In fp8 Megatron-Core's ``TEGroupedMLP.forward`` pads each local expert's rows to a multiple of 16 (32 with
  MXFP8) before the grouped GEMMs and unpads the fc2 output after (Transformer Engine's ``Fp8Padding`` and
  ``Fp8Unpadding``, bf16 copies before quantization), unless every split is aligned: with the alltoall
  dispatcher's dropless random counts they are not; HybridEP's permute pads them itself (``pad_multiple``). Per
  MoE layer and micro-batch the hidden states' pad and the output's unpad read and write the ``R = r t'`` rows the
  rank's experts take, and their gradients the reverse (:func:`fp8_padding_bytes`, at the HBM rate), in three
  launches each way (:func:`fp8_padding_launches`, issued with the experts' loop).
* Weights: a rank holds ``1 / ep`` of the routed experts (with expert TP = TP) and all the rest
  (:func:`rank_param_groups`); the expert gradients are reduced, and with ZeRO the expert optimizer state
  sharded, over the ``dp cp / ep`` ranks that hold the same experts, the rest over all ``dp cp`` replicas.

NOTE [EP overlap] (``Execution.moe_a2a_overlap``; also ``docs/llm.md``): Megatron-Core's
``overlap_moe_expert_parallel_comm`` (Megatron-LM 0d8e0714, ``megatron/core/pipeline_parallel/combined_1f1b.py``,
``megatron/core/models/common/model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run``) runs one
micro-batch's forward and another's backward layer by layer on a compute and a communication stream: "EP A2A in
forward step is hidden by the attention/mlp computation in the backward step, and vice versa". Per mean layer of
such a combined step the forward's all-to-alls hide up to the backward's compute (with its recompute) and the
backward's up to the forward's: ``min(a_f, c_b)`` and ``min(a_b, c_f)``. The steps that run one pass alone do
not hide: without pipelining the first micro-batch's forward and the last one's backward (``m - 1`` of ``m``
combined); interleaved, the warm-up's forward passes, ``(pp - r - 1) 2 + (v - 1) pp + 1`` on rank ``r`` (the
one extra forward the overlap schedules, ``get_pp_rank_microbatches`` in ``schedules.py``, with the default
``microbatch_group_size_per_vp_stage = pp``), and as many cool-down backward passes, of ``m v``. The time model
takes the last stage's share (``r = pp - 1``) as the mean over its micro-batches (:func:`a2a_overlap_hidden_s`).
The host's cost of the schedule (each layer split into schedule nodes, Megatron-Bridge turning the overlap off
"due to CPU overhead") has no source that prices it and is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.sim.collective_models import collective_time
from mcdla.workload.execution import Execution
from mcdla.workload.layer_counts import layer_shares
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import TransformerSpec, layer_gemms
from mcdla.workload.memo import pure_cache

__all__ = ["FP8_ALIGN", "FP8_PADDING_LAUNCHES", "GROUPED_GEMM_CALLS", "HYBRIDEP_ALGBW", "HYBRIDEP_MIN_RANKS",
           "HYBRIDEP_REFERENCE_BYTES_PER_S", "MXFP8_SWIZZLES",
           "PERMUTE_LAUNCHES", "PRE_MLP_NORM_LAUNCHES", "QUANTIZE_LAUNCHES", "ROUTER_GRAPH_LAUNCHES",
           "ROUTER_LAUNCHES", "TOKEN_COUNT_LAUNCHES", "ParamGroup", "a2a_overlap_hidden_s", "all_to_all_bytes",
           "ep_all_to_all_s", "ep_ranks_per_token",
           "expert_gemm_width", "expert_params_per_layer", "fp8_padding_applies", "fp8_padding_bytes",
           "fp8_padding_launches", "grouped_gemm_issue_s", "grouped_gemm_launches",
           "hybridep_bytes_per_s", "hybridep_priced", "permutation_bytes", "rank_param_groups",
           "routed_expert_flops", "router_preprocess_launches", "source_permute_bytes", "tokens_per_local_expert"]


def expert_params_per_layer(spec: TransformerSpec) -> int:
    """Weights of one MoE layer's routed experts (their matrices and biases; shared experts and the router
    excluded); 0 for a dense model."""
    if spec.experts == 1:
        return 0
    h, f = spec.hidden, int(spec.ffn_hidden)  # type: ignore[arg-type]
    biases = spec.experts * ((spec.ffn_matrices - 1) * f + h) if spec.bias else 0
    return spec.experts * spec.ffn_matrices * h * f + biases


def all_to_all_bytes(spec: TransformerSpec, execution: Execution) -> float:
    """One rank's send buffer of one dispatch (or combine) all-to-all: ``tokens x top_k x hidden x capacity``
    elements, ``tokens = b s / (cp tp)``."""
    e = execution
    tokens = e.micro_batch * spec.seq_len / (e.cp * e.tp)
    return tokens * spec.top_k * spec.hidden * spec.bytes_per_element * e.capacity_factor


HYBRIDEP_ALGBW: tuple[tuple[int, float, float], ...] = (
    (8, 545.71e9, 568.94e9), (16, 523.48e9, 521.55e9), (24, 507.32e9, 483.76e9), (32, 484.22e9, 464.54e9),
    (36, 479.02e9, 447.89e9))
"""HybridEP's measured algorithm bandwidth (bytes a rank receives per dispatch, or sends per combine, over the
call's time) by EP ranks: (ranks, bf16 dispatch, combine) bytes/s, GB200 NVL72, 4096 tokens of hidden 7168 per
rank, top-8 of 8 local experts per rank, uniform random routing, 32 SMs, through the torch API (the kernels with
their copies and bookkeeping, as Megatron-Core calls them). Source: deepseek-ai/DeepEP, branch hybrid-ep, commit
6ad6896 (25 Sep 2025), ``Hybrid-EP_Intra-node_Implementation.md``, "GB200 Platform" table, SM Count 32 rows;
its benchmark, ``tests/test_mnnvlink_hybridep.py``, divides ``dispatched_hidden.numel() * 2`` bytes by the
time. Megatron-Bridge v0.2.0 ``scripts/performance/utils/helpers.py`` sets ``moe_hybridep_num_sms = 32`` for
every HybridEP recipe."""

HYBRIDEP_REFERENCE_BYTES_PER_S = 900e9
"""The NVLink 5 bandwidth per direction per GPU of the GB200 NVL72 that :data:`HYBRIDEP_ALGBW` was measured on
(the ``gb200-nvl72`` preset's scale-up figure, 1.8 TB/s bidirectional)."""


HYBRIDEP_MIN_RANKS = HYBRIDEP_ALGBW[0][0]
"""The fewest EP ranks DeepEP publishes HybridEP rates for: 8 (hybrid-ep 6ad6896's GB200 and B200 tables; the
branch's later ``docs/README_Hybrid-EP.md``, 94a9f8f, adds H100 rows at 16 to 64, none below 8). HybridEP runs on
fewer: the ``HybridEPBuffer`` Megatron-Core 0d8e0714 builds (``fused_a2a.py``; DeepEP hybrid-ep 1242eb4
``deep_ep/hybrid_ep_buffer.py``) asserts only ``group_size > 1`` and takes a group inside one NVLink domain as one
node of ``group_size`` ranks. Unmeasured there, such a group's dispatch and combine are priced as the
all-to-all's (:func:`hybridep_priced`, NOTE [expert parallelism])."""


def hybridep_bytes_per_s(ranks: int, scale_up_bytes_per_s: float) -> tuple[float, float]:
    """HybridEP's dispatch and combine algorithm bandwidth for ``ranks`` EP ranks in one scale-up domain of
    ``scale_up_bytes_per_s`` per direction: :data:`HYBRIDEP_ALGBW` interpolated linearly in the rank count (the
    36-rank figures above 36), scaled by the domain's bandwidth over :data:`HYBRIDEP_REFERENCE_BYTES_PER_S`; a
    one-line ConfigError below :data:`HYBRIDEP_MIN_RANKS` (no measured rate)."""
    table = HYBRIDEP_ALGBW
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < HYBRIDEP_MIN_RANKS:
        raise ConfigError(f"hybridep ranks: got {brief(ranks)}; HybridEP's measured rates start at "
                          f"{HYBRIDEP_MIN_RANKS} ranks (an EP group under {HYBRIDEP_MIN_RANKS} is priced as the "
                          "all-to-all)")
    scale = scale_up_bytes_per_s / HYBRIDEP_REFERENCE_BYTES_PER_S
    if ranks == table[0][0]:
        return table[0][1] * scale, table[0][2] * scale
    for (r0, d0, c0), (r1, d1, c1) in zip(table, table[1:]):
        if ranks <= r1:
            w = (ranks - r0) / (r1 - r0)
            return (d0 + w * (d1 - d0)) * scale, (c0 + w * (c1 - c0)) * scale
    return table[-1][1] * scale, table[-1][2] * scale


def hybridep_priced(execution: Execution, cluster: Cluster) -> bool:
    """Whether the EP groups' dispatch and combine are priced as HybridEP's (NOTE [expert parallelism]):
    ``ep_dispatcher: hybridep`` with each group inside one scale-up domain (its measured rates are intra-domain)
    and of at least :data:`HYBRIDEP_MIN_RANKS` ranks (the fewest measured); otherwise they are the all-to-all
    dispatcher's collectives."""
    e = execution
    if e.ep < HYBRIDEP_MIN_RANKS or e.ep_dispatcher != "hybridep" or cluster.gpus_per_node == 1 or not cluster.dims:
        return False  # one GPU per node: no scale-up domain (dims[0] is the network)
    dims = cluster.group_dims(e.ep, ParallelDims.of(e).stride("ep"))
    return len(dims) == 1 and dims[0].name == cluster.dims[0].name


def ep_ranks_per_token(spec: TransformerSpec, execution: Execution) -> float:
    """The EP ranks one token's ``top_k`` experts lie on, on average, with the experts drawn uniformly without
    replacement (forced balance): ``ep (1 - C(E - L, k) / C(E, k))``, ``L = E / ep`` local experts per rank."""
    ep, experts, k = execution.ep, spec.experts, spec.top_k
    return ep * (1.0 - math.comb(experts - experts // ep, k) / math.comb(experts, k))


def a2a_overlap_hidden_s(execution: Execution, ep_s: tuple[float, float], compute_s: tuple[float, float],
                         ) -> tuple[float, float]:
    """The all-to-all time ``moe_a2a_overlap`` hides per mean layer and micro-batch, forward and backward
    (seconds; NOTE [EP overlap]): ``ep_s`` the layer's all-to-alls and ``compute_s`` its compute, each
    (forward, backward with its recompute); in a combined step the forward's hide behind the backward's compute
    and the reverse, over the share of the last stage's passes that run combined. Zero without the overlap."""
    e = execution
    if not e.moe_a2a_overlap:
        return 0.0, 0.0
    total = e.micro_batches * e.virtual_stages
    alone = 1 if e.pp == 1 else (e.virtual_stages - 1) * e.pp + 1
    share = max(0, total - alone) / total
    (ep_f, ep_b), (fwd, bwd) = ep_s, compute_s
    return share * min(ep_f, bwd), share * min(ep_b, fwd)


def ep_all_to_all_s(spec: TransformerSpec, execution: Execution, cluster: Cluster) -> tuple[float, float]:
    """The all-to-all time of one mean layer's forward and backward (seconds, per micro-batch): two
    all-to-alls per MoE layer each way, two more in backward with full recomputation (in the recomputed share
    of the layers, NOTE [partial recompute and offload]), weighted by the share of
    MoE layers (the mean layer, as the FLOP counts are); with ``ep_dispatcher: hybridep`` inside one scale-up
    domain a dispatch and a combine of ``D t h`` bytes at HybridEP's bandwidth instead (NOTE [expert
    parallelism]): the measured time less the calls' copy of the ``D t h`` received bytes (read and written at the
    device's HBM rate), scaled by the domain's bandwidth. Zero without expert parallelism."""
    e = execution
    if e.ep == 1 or spec.moe_layers == 0:
        return 0.0, 0.0
    dims = cluster.group_dims(e.ep, ParallelDims.of(e).stride("ep"))
    share = spec.moe_layers / spec.layers
    if hybridep_priced(e, cluster):
        tokens = e.micro_batch * spec.seq_len / (e.cp * e.tp)
        received = tokens * ep_ranks_per_token(spec, e) * spec.hidden * spec.bytes_per_element
        dispatch, combine = hybridep_bytes_per_s(e.ep, HYBRIDEP_REFERENCE_BYTES_PER_S)
        # the measured calls' copy of the received rows out of (into) HybridEP's buffer, read and written at the
        # HBM rate, which Megatron-Core's permuting calls replace by the permutations charged apart; the rest
        # scales with the domain's bandwidth
        copy = 2 * received / cluster.device.effective_hbm_bytes_per_s
        scale = HYBRIDEP_REFERENCE_BYTES_PER_S / dims[0].bytes_per_s
        pair = (max(0.0, received / dispatch - copy) + max(0.0, received / combine - copy)) * scale * share
        return pair, (1 + layer_shares(e, spec).recomputed) * pair
    one = collective_time("all-to-all", all_to_all_bytes(spec, e), dims) * share
    return 2 * one, (2 + 2 * layer_shares(e, spec).recomputed) * one


def permutation_bytes(spec: TransformerSpec, execution: Execution) -> float:
    """HBM bytes of one mean layer's token permutations on one rank per micro-batch, in forward (the backward
    moves as many; NOTE [expert parallelism]): ``e h (2 t (1 + r) + 4 r t')`` with ``r = top_k x C`` rows per
    token, ``t = b s / (cp tp)``, ``t' = b s / cp`` (the sorts only with more than one local expert), over the
    share of MoE layers; with ``ep_dispatcher: hybridep`` ``2 e h (D t + r t)``, ``D`` the ranks a token reaches
    (:func:`ep_ranks_per_token`); 0 for a dense model."""
    if spec.moe_layers == 0:
        return 0.0
    e = execution
    rows = spec.top_k * e.capacity_factor
    tokens = e.micro_batch * spec.seq_len / (e.cp * e.tp)
    if e.ep_dispatcher == "hybridep" and e.ep > 1:
        elements = 2 * tokens * (ep_ranks_per_token(spec, e) + rows) * spec.hidden
        return spec.bytes_per_element * elements * spec.moe_layers / spec.layers
    sorts = 4 * rows * tokens * e.tp if spec.experts // e.ep > 1 else 0.0
    elements = (2 * tokens * (1 + rows) + sorts) * spec.hidden
    return spec.bytes_per_element * elements * spec.moe_layers / spec.layers


def routed_expert_flops(spec: TransformerSpec, execution: Execution) -> float:
    """Forward FLOPs of one mean layer's routed expert GEMMs for a micro-batch (before the TP x CP split), with
    each expert running ``capacity_factor`` times its mean load: ``C x 2 b s`` times the weights of
    :func:`~mcdla.workload.transformer.layer_gemms`' expert entries (``top_k x ffn_matrices x h f`` over the
    share of MoE layers); 0 for a dense model. The rest of
    :func:`~mcdla.workload.transformer.layer_fwd_flops`' GEMMs (projections, router, shared experts, dense
    FFNs) is counted there at ``C = 1``."""
    weights = sum(g.weights for g in layer_gemms(spec) if g.name.startswith("expert_"))
    return execution.capacity_factor * 2.0 * execution.micro_batch * spec.seq_len * weights


def expert_gemm_width(spec: TransformerSpec, execution: Execution) -> float:
    """The per-rank width the GEMM curve prices a routed expert's GEMMs at (NOTE [expert parallelism]): their
    narrowest dimension, ``min(hidden, ffn_hidden) / tp`` (fc1 multiplies ``h`` by ``f``-wide weights, fc2 sums
    over ``f``; expert TP = TP). A dense layer's narrowest per-rank dimension is ``hidden / tp`` (the projection
    sums over it, and its FFN is wider), the curve's width for its GEMMs; an expert narrower than the hidden size
    (Qwen3-30B-A3B: 768 against 2048) fills fewer tiles along its ``f``."""
    return min(spec.hidden, int(spec.ffn_hidden)) / execution.tp  # type: ignore[arg-type]


GROUPED_GEMM_CALLS: tuple[int, int] = (2, 4)
"""GEMM calls per local expert of one MoE layer and micro-batch, forward and backward: fc1 and fc2 forward (the
SwiGLU's gate and up projections are one fused fc1), the data gradient and the weight gradient of each backward."""

QUANTIZE_LAUNCHES: dict[str, tuple[int, int]] = {"current": (3, 0), "delayed": (0, 1), "mxfp8": (1, 0)}
"""Kernel launches of one quantization of a grouped GEMM's input by fp8 recipe, per local expert's split and per
grouped call: current scaling launches an amax, a scale and a cast kernel per split
(``Float8CurrentScalingQuantizer::quantize_impl``), MXFP8 one cast per split (``MXFP8Quantizer::quantize``),
delayed scaling one fused cast of every split (``nvte_multi_cast_transpose``): ``tex.split_quantize``,
``multi_tensor_quantize_impl`` in Transformer Engine 2.9's ``transformer_engine/pytorch/csrc/extensions/cast.cpp``
and ``quantizer.cpp``."""

MXFP8_SWIZZLES = 2
"""Launches per grouped GEMM call with MXFP8 operands: one fused swizzle of each operand list's block scales
(``multi_tensor_swizzle_scaling_factors`` in Transformer Engine 2.9's ``te_general_grouped_gemm``)."""


def grouped_gemm_launches(spec: TransformerSpec, execution: Execution, fp8: bool) -> tuple[int, int]:
    """Launches the host issues for one MoE layer's grouped GEMMs on one rank per micro-batch, forward and
    backward (NOTE [expert parallelism]): per local expert its GEMM calls (:data:`GROUPED_GEMM_CALLS`) and, in
    fp8, the quantizations of its split of each GEMM's input, two forward (fc1's and fc2's inputs) and two
    backward (their output gradients; the weight gradients reuse the forward's casts), at
    :data:`QUANTIZE_LAUNCHES` of the execution's ``fp8_scaling`` each, and with MXFP8 :data:`MXFP8_SWIZZLES` per
    grouped call (two forward, four backward). ``(0, 0)`` for a dense model."""
    if spec.moe_layers == 0:
        return 0, 0
    local = spec.experts // execution.ep
    fwd, bwd = GROUPED_GEMM_CALLS[0] * local, GROUPED_GEMM_CALLS[1] * local
    if fp8:
        per_split, per_call = QUANTIZE_LAUNCHES[execution.fp8_scaling]
        swizzles = MXFP8_SWIZZLES if execution.fp8_scaling == "mxfp8" else 0
        quantize = 2 * (per_split * local + per_call)
        fwd += quantize + swizzles * GROUPED_GEMM_CALLS[0]
        bwd += quantize + swizzles * GROUPED_GEMM_CALLS[1]
    return fwd, bwd


PRE_MLP_NORM_LAUNCHES: tuple[int, int] = (1, 3)
"""Launches of an MoE layer's pre-MLP RMSNorm outside a CUDA graph, forward and backward: Transformer Engine 2.9's
``rmsnorm_fwd``, its ``rmsnorm_bwd`` (the kernel and the ``rmsnorm_bwd_finalize`` kernel of the weight's
gradient, ``transformer_engine/common/normalization/rmsnorm``) and the sum of the two gradients of its output
(the router's and the dispatcher's)."""

ROUTER_LAUNCHES: tuple[int, int] = (9, 8)
"""Launches of Megatron-Core's ``TopKRouter`` outside a CUDA graph, forward and backward, as Megatron-Bridge's
Qwen3 MoE recipes run it (``moe_router_fusion``, ``moe_router_force_load_balancing``, the ``aux_loss`` load
balancing; Megatron-LM 0d8e0714 ``megatron/core/transformer/moe/router.py`` and ``moe_utils.py``, Transformer
Engine 2.9 ``transformer_engine/pytorch/router.py``). Forward: the gating GEMM (``te_general_gemm``), the
forced balance's random logits (``RandomSTE``: ``clone`` and ``normal_``), the fused top-k, the fused aux-loss
scores, the routing map's per-expert sum, the fused aux loss and the loss tracker's division and in-place add.
Backward: ``MoEAuxLossAutoScaler``'s ``ones_like`` and product, the three fused kernels' backwards, the sum of the
logits' two gradients, the gating GEMM's data and weight gradients."""

TOKEN_COUNT_LAUNCHES = 7
"""Launches of the alltoall token dispatcher's token counts outside a CUDA graph, dropless, forward, with EP or TP
> 1 (Megatron-LM 0d8e0714 ``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher.preprocess``): the routing map's per-expert sum, the per-rank split sum, the counts'
all-gather over the EP x TP group, the local experts' slice copied contiguous and three sums (the routing map's
sum alone without EP and TP). Their device-to-host copies run outside the graph either way and are not counted."""

PERMUTE_LAUNCHES: tuple[int, int] = (4, 1)
"""Launches of the alltoall dispatcher's source-side fused permute (Transformer Engine 2.9
``moe_permute_with_probs``, ``transformer_engine/pytorch/permutation.py`` and ``triton/permutation.py``), forward
and backward: the row-id map's three Triton passes and the permute kernel; its gradient, one unpermute kernel."""


ROUTER_GRAPH_LAUNCHES: tuple[int, int] = (2, 4)
"""Launches of the pre-MLP norm, router and preprocess in a CUDA graph (Transformer Engine 2.9
``transformer_engine/pytorch/graph.py``, ``Graphed``), forward and backward: the copy of the input into the graph's
static buffer and the replay; the copies of the three outputs' gradients (the dispatcher's tokens, their
probabilities, the residual) into the static buffers and the replay."""


def router_preprocess_launches(execution: Execution) -> tuple[int, int]:
    """Launches the host issues for one MoE layer's pre-MLP norm, router and dispatcher preprocess on one rank
    per micro-batch, forward and backward (NOTE [expert parallelism]): :data:`ROUTER_GRAPH_LAUNCHES` with
    ``moe_router_graph``, else :data:`PRE_MLP_NORM_LAUNCHES` and :data:`ROUTER_LAUNCHES` plus, with the alltoall
    dispatcher, :data:`TOKEN_COUNT_LAUNCHES` and :data:`PERMUTE_LAUNCHES`; the flex dispatcher
    (``ep_dispatcher: hybridep``, ``MoEFlexTokenDispatcher._initialize_metadata``) expands the routing map and the
    probabilities over TP, views at TP 1, a copy of each (and a summed gradient backward) with TP > 1."""
    e = execution
    if e.moe_router_graph:
        return ROUTER_GRAPH_LAUNCHES
    if e.ep > 1 and e.ep_dispatcher == "hybridep":
        pre_f, pre_b = (2, 1) if e.tp > 1 else (0, 0)
    else:
        counts = TOKEN_COUNT_LAUNCHES if e.ep * e.tp > 1 else 1
        pre_f, pre_b = counts + PERMUTE_LAUNCHES[0], PERMUTE_LAUNCHES[1]
    return (PRE_MLP_NORM_LAUNCHES[0] + ROUTER_LAUNCHES[0] + pre_f,
            PRE_MLP_NORM_LAUNCHES[1] + ROUTER_LAUNCHES[1] + pre_b)


def source_permute_bytes(spec: TransformerSpec, execution: Execution) -> float:
    """HBM bytes of one mean layer's source-side permute on one rank per micro-batch (the last kernel of the
    dispatcher's preprocess; its gradient moves as many): ``(1 + r) t h`` elements, ``r = top_k x C``,
    ``t = b s / (cp tp)``, over the share of MoE layers; 0 with ``ep_dispatcher: hybridep`` (it permutes on the
    destination) and for a dense model."""
    e = execution
    if spec.moe_layers == 0 or (e.ep_dispatcher == "hybridep" and e.ep > 1):
        return 0.0
    tokens = e.micro_batch * spec.seq_len / (e.cp * e.tp)
    elements = tokens * (1 + spec.top_k * e.capacity_factor) * spec.hidden
    return spec.bytes_per_element * elements * spec.moe_layers / spec.layers


FP8_ALIGN: dict[str, int] = {"delayed": 16, "current": 16, "mxfp8": 32}
"""Rows an fp8 grouped GEMM's split must be a multiple of, by fp8 recipe: 32 with MXFP8 (its 32-row block
scales), 16 otherwise (Megatron-LM 0d8e0714 ``megatron/core/fp8_utils.py`` ``get_fp8_align_size``; Transformer
Engine 2.9 ``Fp8Padding``'s default, ``32 if ... mxfp8() else 16``)."""

FP8_PADDING_LAUNCHES: tuple[int, int] = (3, 3)
"""Launches of one MoE layer's fp8 row padding per micro-batch, forward and backward, per 64 local experts
(``kMaxTensorsPerKernel``, Transformer Engine 2.9 ``transformer_engine/common/util/padding.cu``: one
``multi_padding_kernel`` or ``multi_unpadding_kernel`` over up to 64 splits): ``TEGroupedMLP.forward`` pads the
hidden states and the probabilities (``Fp8Padding``) and unpads the fc2 output (``Fp8Unpadding``); backward each
gradient the reverse (``_Fp8Padding.backward`` unpads, ``_Fp8Unpadding.backward`` pads)."""


def fp8_padding_applies(spec: TransformerSpec, execution: Execution, fp8: bool) -> bool:
    """Whether a MoE layer's fp8 grouped GEMMs pad their splits (NOTE [expert parallelism]): in fp8 (Megatron-Core
    ``TEGroupedMLP``'s ``Fp8Padding``, skipped when every split is already a multiple of :data:`FP8_ALIGN`) with
    the alltoall dispatcher: dropless (``capacity_factor`` 1) its per-expert counts are random, so almost never
    all aligned; padded to capacity (``capacity_factor`` other than 1, ``moe_pad_expert_input_to_capacity``) each
    local expert gets ``ceil(t top_k / E x C) x tp x ep`` rows (``MoEAlltoAllTokenDispatcher.preprocess``,
    ``get_capacity``; ``t = b s / (cp tp)``), padded only when that is unaligned. HybridEP (``ep_dispatcher:
    hybridep`` with EP > 1) rounds each expert's rows up in its permute (``pad_multiple``), so never."""
    e = execution
    if not fp8 or spec.moe_layers == 0 or (e.ep_dispatcher == "hybridep" and e.ep > 1):
        return False
    if e.capacity_factor == 1:
        return True
    tokens = e.micro_batch * spec.seq_len // (e.cp * e.tp)
    rows = math.ceil(tokens * spec.top_k / spec.experts * e.capacity_factor) * e.tp * e.ep
    return rows % FP8_ALIGN[e.fp8_scaling] != 0


def fp8_padding_bytes(spec: TransformerSpec, execution: Execution, fp8: bool) -> float:
    """HBM bytes of one mean layer's fp8 row padding on one rank per micro-batch, forward (the backward moves as
    many; NOTE [expert parallelism]): the hidden states' pad and the fc2 output's unpad each read and write the
    ``R = top_k x C x b s / cp`` rows the rank's experts take, ``h`` elements each: ``4 R h`` elements, over the
    share of MoE layers (the pad rows, under :data:`FP8_ALIGN` per expert, and the probabilities' pad, one element
    a row, are left out); 0 where :func:`fp8_padding_applies` does not."""
    if not fp8_padding_applies(spec, execution, fp8):
        return 0.0
    e = execution
    rows = spec.top_k * e.capacity_factor * e.micro_batch * spec.seq_len / e.cp
    return 4 * rows * spec.hidden * spec.bytes_per_element * spec.moe_layers / spec.layers


def fp8_padding_launches(spec: TransformerSpec, execution: Execution, fp8: bool) -> tuple[int, int]:
    """Launches of one MoE layer's fp8 row padding on one rank per micro-batch, forward and backward:
    :data:`FP8_PADDING_LAUNCHES` per 64 local experts where :func:`fp8_padding_applies`, else ``(0, 0)``."""
    if not fp8_padding_applies(spec, execution, fp8):
        return 0, 0
    kernels = math.ceil(spec.experts // execution.ep / 64)
    return FP8_PADDING_LAUNCHES[0] * kernels, FP8_PADDING_LAUNCHES[1] * kernels


def grouped_gemm_issue_s(spec: TransformerSpec, execution: Execution, call_s: float, *,
                         fp8: bool = False) -> tuple[float, float]:
    """Host time to issue one mean layer's MoE launches on one rank per micro-batch, forward and backward (NOTE
    [expert parallelism]): the grouped GEMMs' (:func:`grouped_gemm_launches`), the fp8 row padding's
    (:func:`fp8_padding_launches`) and the pre-MLP norm's, router's and preprocess's
    (:func:`router_preprocess_launches`), times ``call_s`` (the device's ``host_call_s``), over the share of MoE
    layers. Zero for a dense model."""
    if spec.moe_layers == 0:
        return 0.0, 0.0
    fwd, bwd = grouped_gemm_launches(spec, execution, fp8)
    pad_f, pad_b = fp8_padding_launches(spec, execution, fp8)
    route_f, route_b = router_preprocess_launches(execution)
    share = call_s * spec.moe_layers / spec.layers
    return (fwd + pad_f + route_f) * share, (bwd + pad_b + route_b) * share


@pure_cache(64)
def tokens_per_local_expert(spec: TransformerSpec, execution: Execution) -> float:
    """Tokens one routed expert's GEMM multiplies per micro-batch on one rank (NOTE [expert parallelism]): the
    EP group's ``ep x b s / cp`` tokens, each sent to ``top_k`` experts and padded to ``C`` times the mean
    load, shared by the ``experts`` experts: ``b s / cp x top_k x C x ep / experts`` (the rank's own
    ``b s / cp x top_k x C`` routed tokens over its ``experts / ep`` local experts). Expert TP = TP, so the TP
    ranks of an expert multiply the same tokens. ``inf`` for a dense model (no grouped GEMM)."""
    if spec.moe_layers == 0:
        return float("inf")
    e = execution
    return e.micro_batch * spec.seq_len / e.cp * spec.top_k * e.capacity_factor * e.ep / spec.experts


@dataclass(frozen=True, slots=True)
class ParamGroup:
    """Parameters one rank holds (per TP rank) that are reduced together, and the ranks of that reduction:
    ``size`` ranks ``stride`` apart (:meth:`~mcdla.hardware.cluster.Cluster.group_dims`)."""

    params: float
    size: int
    stride: int


@pure_cache(64)
def rank_param_groups(spec: TransformerSpec, execution: Execution, stage_layers: int) -> tuple[ParamGroup, ...]:
    """The first stage's parameters on one rank (``stage_layers`` layers and the embedding, per TP rank) in
    their reduction groups: the routed experts' ``1 / ep`` over the ``dp cp / ep`` ranks holding the same
    experts, the rest over the ``dp cp`` replicas (NOTE [expert parallelism]); one group for a dense model."""
    e = execution
    experts = stage_layers * expert_params_per_layer(spec)
    dense = stage_layers * spec.params_per_layer() - experts + spec.embedding_params()
    replicas = e.dp * e.cp
    groups = [ParamGroup(dense / e.tp, replicas, e.tp)]
    if experts:
        groups.append(ParamGroup(experts / (e.ep * e.tp), replicas // e.ep, e.tp * e.ep))
    return tuple(groups)
