"""Per-iteration time and per-rank memory of LLM training under TP/PP/DP/CP, recomputation and offload.

An analytical per-rank model of one 1F1B (or interleaved 1F1B) iteration, not the event engine: the engine
simulates one device's layer chain with its copies; here the pipeline, the tensor-parallel collectives and
the data-parallel reduction are closed forms over per-layer costs, which is what the published Megatron runs
need and is cheap enough to sweep. The hardware is one generated :class:`~mcdla.hardware.cluster.Cluster` (the
GPU, its GEMM efficiency curve, the fabric dimensions, the offload link); the precision is the run's choice.
Ranks are laid out by :class:`~mcdla.workload.parallel_dims.ParallelDims` and each parallel group is priced by
:mod:`mcdla.sim.collective_models` on the fabric dimensions it spans (:meth:`Cluster.group_dims`).
NOTE [time model] (also ``docs/llm.md``):

* Per layer and micro-batch on one rank: GEMM FLOPs (projections, FFN) and attention-core FLOPs (``QK^T``,
  ``xV``) divided by ``tp * cp``, at ``peak * gemm_efficiency(h / tp, b s / cp)`` (the GEMMs at the precision's
  GEMM peak, times the curve's ``fp8_fraction`` in fp8, in bf16 the fp8 rate times ``bf16_over_fp8`` where the
  curve gives it, NOTE [bf16 from fp8]; the core and the logits at its other peak: NOTE [precision]; the routed
  experts' grouped GEMMs at the curve's point for their own tokens per local expert, NOTE [expert parallelism]);
  memory-bound elementwise kernels (norms, bias-dropout-add, activation function, and softmax and its dropout
  with ``attention="materialized"``, the fused kernel's Q/K/V/O traffic with ``flash``: NOTE [flash attention]
  in :mod:`mcdla.workload.transformer`) at ``Device.effective_hbm_bytes_per_s``, plus fp8's casts and, with
  ``flash``, the softmax's exponentials at the device's ``exp_per_s``;
  backward costs twice the forward, the GEMMs' ``backward_ratio`` x theirs and FlashAttention's core 2.5x; an MoE
  layer's token permutations move as many bytes each way, and its grouped GEMMs wait for the host's per-expert
  launches (GEMM calls and fp8 quantizations) where those outlast them (NOTE [expert parallelism]).
  NOTE [attention kernel build]: with ``execution.attention_kernel`` the fused attention core's forward and
  backward (FLOPs, bytes and exponentials together) take the named build's measured times over this pricing at
  the layer's sequence length (:class:`~mcdla.hardware.attention_kernel.AttentionKernel`, ``node.attention_kernels``:
  cuDNN 9.13.1's published SDPA times on the Blackwell presets, the build of NeMo Framework 25.11); the
  factors are measured on one head shape (Llama 3.1 405B's) and applied to every shape on the chip.
  ``fused_kernels: false`` counts those kernels as eager PyTorch runs them, one per op (NOTE [eager kernels] in
  :mod:`mcdla.sim.llm_eager`). Recompute adds a forward (``full``), the attention core with its softmax and
  dropout (``selective``; its other ``recompute_modules`` their GEMMs and kernels, NOTE [recompute modules] in
  :mod:`mcdla.workload.transformer`) or torchtitan's op policy's every second matrix product and the memory-bound
  kernels but the last residual add (``selective-op``, NOTE [op-level selective recompute] in
  :mod:`mcdla.workload.op_recompute`); with
  ``recompute_num_layers`` (and ``offload_num_layers``) a layer's figures are the mean over its model chunk of
  the recomputed (offloaded) and the plain layers (NOTE [partial recompute and offload] in
  :mod:`mcdla.workload.layer_counts`).
* Tensor parallelism: two all-reduces of the layer's ``b s h`` activation per forward and two per backward
  (with sequence parallelism an all-gather plus a reduce-scatter, the same ring traffic), on the TP group's
  dimensions (the NVLink domain, in-network where the switch reduces);
  full recomputation repeats the forward ones. Not overlapped with compute (Megatron-LM 2021-2022) unless
  ``tp_comm_overlap``: then hidden behind the GEMMs they pair with, up to those GEMMs' time (TE userbuffers:
  the QKV, projection and dense or shared FFN GEMMs, not the router nor the routed experts, NOTE [layer GEMMs]
  in :mod:`mcdla.workload.transformer`).
* NOTE [userbuffers ring exchange]: with ``tp_comm_overlap`` Transformer Engine's ring exchange (v2.9, 70f5366,
  ``common/comm_gemm_overlap/comm_gemm_overlap.cpp`` ``CommOverlapP2PBase::split_overlap_ag`` and
  ``split_overlap_rs``; Megatron-Bridge v0.2.1's fp8 userbuffers configurations, ``training/comm_overlap.py``, run
  ``qkv_fprop``, ``fc1_fprop``, ``proj_fprop``, ``fc2_fprop``, ``proj_dgrad`` and ``fc2_dgrad`` so) runs each of
  those GEMMs as ``tp`` GEMMs of ``b s / (cp tp)`` tokens, one per chunk the ring passes on, priced at the curve's
  point for that token count (:func:`ring_exchange_costs`; no slower than the whole GEMM while ``half_tokens`` is
  0): the GEMMs the userbuffers run (NOTE [layer GEMMs]: fc1 and fc2 of the dense layers and shared experts, not
  the routed experts' grouped GEMMs nor the router's), and closes each reduce-scatter ring (the projection's and
  a dense or shared fc2's forward) with ``reduce_bf16``, a kernel on
  the main stream that reads the ``tp`` partial outputs of ``b s / (cp tp) x h`` elements and writes their sum,
  at the HBM rate after the ring. Megatron-Bridge's bf16 configurations split ``proj_fprop`` and ``fc2_fprop`` in
  a pipeline that reduces inside the communication kernel; the model does not tell the two apart.
* Pipeline: per micro-batch a stage runs its ``layers / pp`` layers forward and backward plus, per virtual
  chunk, a point-to-point send of the activation and one of its gradient (``b s h / tp`` bytes with
  Megatron's scatter/gather) over the link its stage boundary crosses (NOTE [pipeline sends]; with
  ``pp_comm_overlap`` only what exceeds one chunk's forward compute, plus the hidden part on each of the
  ``2 (v p - 1)`` sends the fill and the drain wait for); the last stage adds the vocabulary projection and
  the loss. Iteration = ``m * T_last + (p - 1) / v * T_middle``, the exact length of the (interleaved) 1F1B
  schedule of these stages (the bubble ``(p - 1) / (m v)`` when balanced); ``mode="ranks"`` schedules every
  rank instead (``sim/llm_ranks.py``), as does an uneven split (``layers_first_stage``/``layers_last_stage``,
  or the embedding and the loss counted as layers), where the slowest stage sets the pace.
* NOTE [pipeline sends]: each send is priced on the link between its own two stages' ranks
  (:meth:`Cluster.dim_between` of data-parallel replica 0's TP x CP ranks and their peers in the
  :class:`~mcdla.workload.parallel_dims.ParallelDims` layout, the links the engine's sends cross): where stages
  fill part of a node (TP2 DP2 on an 8-GPU DGX: stages 0 and 1 on one node, 2 and 3 on the next) some boundaries
  are NVLink and some the network, and the interleaved schedule's send from the last stage to the first stage's
  next chunk crosses its own. A forward pass ends with the send to the next stage, a backward pass with the send
  to the previous one; where Megatron has no peer (the last chunk's forward on the last stage, the first chunk's
  backward on the first) the pass holds the slowest boundary's send (``StageCosts.p2p_s``, also what the first
  stage's last backward carries under ``dp_overlap``). With one chunk per stage and the last stage the slowest
  (it holds the slowest send), the last stage never waits once fed, so the bubble is the first micro-batch's
  forward through the other stages and its backward back, each pass with its own send. Interleaved, the fill
  and the drain also cross the last stage's send to the first and the stages' chunks differ in their sends, and
  no sum of stage or chunk times equals the schedule (its excess over the chunk-0 passes is a constant in
  ``m``), so the closed form runs the schedule of one replica (``sim/llm_ranks.py`` ``pipeline_s``, O(p m v)),
  as it does for a one-chunk pipeline whose slowest stage is not the last. Where every boundary's send takes
  the same time, ``StageCosts.boundary_p2p_s`` is () and the formula above applies.
* Context parallelism: the ring exchange (or all-gather) of K and V in every attention, overlapped with the
  attention of the block before (``sim/llm_cp.py``, NOTE [context parallel exchange]); the CP group maps onto
  the fabric like any group, inside a node or across nodes.
* Expert parallelism: the all-to-all dispatch and combine of every MoE layer, the capacity factor's expert
  FLOPs, ``1 / ep`` of the routed experts per rank (``sim/llm_moe.py``, NOTE [expert parallelism]).
* NOTE [layer kinds]: where a model's layers differ (``dense_layers``, DeepSeek's ``first_k_dense_replace``
  leading layers with a dense FFN) every model chunk is timed with the layers it holds: ``n_dense`` times a
  dense layer's figures plus ``n_moe`` times an MoE layer's (``StageCosts.layer_kinds``: forward, backward,
  recompute, TP, CP and EP each priced by the same per-layer functions on each kind's model,
  :meth:`~mcdla.workload.transformer.TransformerSpec.layer_kinds`, so the all-to-alls fall on the MoE layers
  only). Megatron-Core numbers the layers in order over the virtual stages, so the dense ones sit on the first
  chunks (:func:`~mcdla.workload.layer_counts.dense_chunk_layers`, ``StageCosts.chunk_dense``): the stages then
  differ and the pipeline is scheduled as an uneven split's is; the pacing stage, the bubble, the per-rank
  schedule, the lowered engine's chunks, the closed form's one stage (``pp = 1``), the first chunk's backward
  that ``dp_overlap`` hides the reduction behind and the smallest chunk's forward that bounds what
  ``pp_comm_overlap`` hides sum each kind. What ``StageCosts`` prices per stage with one layer's figures stays
  the mean layer's: the exposed offload and ZeRO-3 traffic, the CPU optimizer's overlap, and the memory
  (activations of the fullest stage are its layers times the mean layer's, its weights counted as MoE layers);
  the FLOP totals (model FLOPs, MFU) are exact either way.
* Data parallelism: one all-reduce of the rank's gradients over its replicas, the ``dp x cp`` ranks (the
  routed experts' over the ``dp cp / ep`` that hold them), on their dimensions (hierarchical over
  NVLink and the network when a node holds several members; ZeRO-1/2: reduce-scatter + all-gather, the same
  traffic) after the last backward, or overlapped with the last micro-batch's backward (``dp_overlap``); then
  the Adam step streams the rank's optimizer state through HBM.
* NOTE [overlapped reduction]: with ``dp_overlap`` the reduction starts with the first stage's last backward
  pass (the last pass of the pipeline) and hides behind that whole pass: its compute, its TP, CP and EP
  calls, its pipeline hold and, with one stage and one chunk, the logits' backward. The engine lowers the same
  rule. With interleaved stages that pass is one chunk's, so the rule is conservative there: Megatron starts each
  chunk's bucket reduction after that chunk's own last backward.
* NOTE [ZeRO-3 as run]: the shard group of each parameter group is its reduction group (the ``dp x cp`` replicas
  of the dense parameters, the ``dp cp / ep`` of the routed experts; under HSDP the ``dp / hsdp_shard`` replica
  groups split it, :func:`_shard_groups`). FSDP/ZeRO-3 gathers each layer's 16-bit weights (all-gather over the
  shard group) in every micro-batch's forward and again in its backward, and reduce-scatters the layer's gradients
  in that backward; a full recompute runs inside the layer's backward and uses the backward's gather (FSDP's
  pre-backward unshard, DeepSpeed's fetch of the sub-module, both before the recomputed forward). The gathers are
  prefetched ``fsdp_prefetch`` layers ahead and the collectives run one at a time in issue order on the group's
  links while the layers compute (:func:`fsdp_exposed_s`); what the compute does not hide is ``fsdp_comm_s``. Once
  per iteration the non-layer parameters are reduce-scattered and gathered, and under HSDP (``hsdp_shard``) each
  gradient shard is all-reduced across the replicas (``dp_comm_s``). Memory: the model state over the shard group
  plus ``fsdp_prefetch + 1`` whole layers' weights and gradients. With ``zero3_collectives="per-tensor"``
  (DeepSpeed ZeRO-3 0.3.12-0.5.4, which gathers and reduce-scatters one parameter at a time) a layer's gather
  and reduce-scatter are one collective per parameter tensor (``TransformerSpec.layer_tensors``), run one after
  the other, each with its own latency terms; tensors under ``zero3_persist_numel`` elements are not gathered
  per layer but once per iteration with the step's collectives, their gradients still reduce-scattered.
* NOTE [HSDP all-reduce as issued]: FSDP's hybrid sharding (PyTorch's FSDP1 ``_reduce_grad``) all-reduces each
  unit's gradient shard across the replicas right after that unit's reduce-scatter, on its own all-reduce stream,
  so with ``dp_overlap`` the all-reduce of the stage's layers but the last one the backward reaches starts with
  the backward (``Zero3Traffic.step``, hidden as NOTE [overlapped reduction] says) and that of the last layer and
  of the non-layer parameters (the root unit, whose gradients are complete only at the backward's end) is
  issued after it (``Zero3Traffic.after_backward``, ``StageCosts.dp_tail_s``, exposed whole). The layers'
  all-reduces are priced as one collective (their latency terms once); the non-layer parameters' reduce-scatter
  and gather over the shard group stay in ``step`` (a simplification: FSDP runs the root's after the backward).
  Without ``dp_overlap`` the whole all-reduce runs after the backward.
* CPU optimizer and NVMe tier (ZeRO-Offload, ZeRO-Infinity): :mod:`mcdla.sim.llm_offload`.
* Offload: activations go out during forward and come back during backward, weights are fetched for every
  forward and backward of a micro-batch, optimizer state crosses the link twice per step, at the offload
  bandwidth each GPU gets while every GPU of its node offloads; what the compute does not hide is exposed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple, TypeVar

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.hardware.gemm import GemmEfficiency
from mcdla.sim.collective_models import collective_time, p2p_time
from mcdla.sim.llm_cp import cp_exchange, kv_block_bytes, ring_attention_moved_s
from mcdla.sim.llm_eager import eager_block_bytes, foreach_adam_bytes
from mcdla.sim.llm_floor import link_floors
from mcdla.sim.llm_moe import (ParamGroup, a2a_overlap_hidden_s, all_to_all_bytes, ep_all_to_all_s,
                               expert_gemm_width, fp8_padding_bytes, grouped_gemm_issue_s, permutation_bytes,
                               rank_param_groups, routed_expert_flops,
                               source_permute_bytes, tokens_per_local_expert)
from mcdla.sim.llm_offload import (ADAM_TRAFFIC_BYTES, activation_out_bytes_per_s, cpu_optimizer_step,
                                   tier_bytes_per_s, tier_rejection)
from mcdla.workload.execution import Execution, check_execution, chunk_layers, stage_layers
from mcdla.workload.layer_counts import LayerShares, dense_chunk_layers, layer_shares
from mcdla.workload.op_recompute import OP_RECOMPUTE, op_recomputed_gemm_flops
from mcdla.workload.parallel_dims import ParallelDims, group_strides
from mcdla.workload.transformer import (Attention, TransformerSpec, activation_bytes_per_layer,
                                        attention_bwd_flops_ratio, flash_attention_bytes,
                                        flash_attention_exponentials, fp8_cast_bytes_per_layer,
                                        hardware_flops_per_iteration, layer_fwd_flops, layer_gemms, logits_fwd_flops,
                                        model_flops_per_iteration, recompute_module_costs)
from mcdla.workload.memo import HashOnce, hash_once, pure_cache, slot_init

__all__ = ["DEFAULT_PRECISION", "PRECISIONS", "Precision", "precision_of", "cluster_precision", "LayerCosts",
           "LlmStep", "RankTraffic", "ShardCollective", "StageCosts", "Zero3Traffic", "by_kind", "cluster_rejection",
           "elementwise_bytes_per_layer", "fsdp_exposed_s", "llm_step", "pacing_stage_parts", "rank_traffic",
           "ring_exchange_costs", "send_boundary", "stage_costs", "step_record", "zero3_traffic"]

DEFAULT_PRECISION = "bf16"
"""The number format of the GEMMs (a run choice, not hardware): the key of the device's ``peak_flops_per_s``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision(HashOnce):
    """What a run's precision choice means for time and memory (NOTE [precision]).

    Attributes:
        name: the choice (``bf16``, ``fp8``, ``fp16``, ``fp32``).
        gemm_peak: key of ``peak_flops_per_s`` the linear layers' GEMMs run at.
        other_peak: key the attention core and the logits run at.
        element_bytes: activation, weight and gradient element size.
        optimizer_bytes: Adam state per parameter (fp32 master copy, momentum, variance; no master in fp32).
        fp8_weight_bytes: extra bytes per parameter of the fp8 weight copy Transformer Engine keeps.
    """

    name: str
    gemm_peak: str
    other_peak: str
    element_bytes: int
    optimizer_bytes: int
    fp8_weight_bytes: int = 0

    __hash__ = hash_once  # a key of the memoised figures, hashed once

    @property
    def fp8(self) -> bool:
        """The linear layers' GEMMs run in fp8 (inputs cast, fp8 inputs saved)."""
        return self.gemm_peak == "fp8"


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision(name="bf16", gemm_peak="bf16", other_peak="bf16", element_bytes=2, optimizer_bytes=12),
    Precision(name="fp16", gemm_peak="fp16", other_peak="fp16", element_bytes=2, optimizer_bytes=12),
    Precision(name="fp8", gemm_peak="fp8", other_peak="bf16", element_bytes=2, optimizer_bytes=12,
              fp8_weight_bytes=1),
    Precision(name="fp32", gemm_peak="fp32", other_peak="fp32", element_bytes=4, optimizer_bytes=8),
)}
"""NOTE [precision] ``bf16``/``fp16``: mixed precision, everything at that peak (ZeRO's 2 + 2 + 12 bytes per
parameter: Rajbhandari et al. 2020, sec. 3.1). ``fp8``: Transformer Engine: the linear layers' GEMMs at the fp8
peak, the attention core (a bf16 FlashAttention kernel), the logits, elementwise kernels and the optimizer in
bf16/fp32; every GEMM input cast to fp8 (current scaling adds an amax pass,
:func:`~mcdla.workload.transformer.fp8_cast_bytes_per_layer`), an fp8 copy of the weights (1 byte per parameter), the linear layers' inputs saved in fp8 for backward
(one copy; MXFP8's with its E8M0 scales, :func:`~mcdla.workload.transformer.activation_bytes_per_layer`). ``fp32``: 4-byte
activations, weights and gradients, Adam's momentum and variance (no master copy)."""


def precision_of(name: str) -> Precision:
    """The :class:`Precision` of a name; one-line ConfigError listing the known ones otherwise."""
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"precision: got {brief(name)}; must be one of {', '.join(PRECISIONS)}") from None


def cluster_precision(cluster: Cluster, name: str) -> Precision:
    """The :class:`Precision` ``name`` after checking that ``cluster``'s GPU has the peaks it runs at; a one-line
    ConfigError naming the cluster and the precisions its GPU has otherwise."""
    prec = precision_of(name)
    peaks = cluster.device.peak_flops_per_s
    for key in (prec.gemm_peak, prec.other_peak):
        if key not in peaks:
            raise ConfigError(f"precision: got {brief(name)}; {cluster.name} gives no {key} peak for its GPU "
                              f"(has {', '.join(sorted(peaks))})")
    return prec


# The mixed-precision Adam step reads the gradient (2) and reads and writes master weight, momentum, variance
# (3 x 8) and writes the bf16 weight (2); in fp32 it reads the gradient (4) and reads and writes weight,
# momentum and variance (3 x 8): 28 bytes of HBM traffic per parameter either way (the CPU optimizer's too).
_ADAM_TRAFFIC_BYTES = ADAM_TRAFFIC_BYTES
# Vocabulary-parallel cross entropy works in fp32 over the b x s x V/tp logits: about four passes each way.
_LOSS_PASSES, _LOSS_ELEMENT_BYTES = 4, 4


@slot_init
@dataclass(frozen=True, slots=True, kw_only=True)
class LlmStep:
    """One iteration's predicted time (seconds) and its parts, and one rank's memory (bytes).

    The parts add up to ``iteration_s``: ``compute_s`` (forward and backward of the slowest stage over all
    micro-batches, logits included), ``recompute_s``, ``tp_comm_s``, ``pp_comm_s``, ``bubble_s``,
    ``dp_comm_s`` (exposed), ``fsdp_comm_s`` (ZeRO-3's exposed per-layer gathers and reduce-scatters),
    ``optimizer_s``, ``offload_s`` (exposed), ``cp_comm_s`` (the K/V exchange's exposed part), ``ep_comm_s``
    (the MoE all-to-alls). ``fits``: the rank's device bytes
    within the GPU's HBM AND what it offloads within its share of the pool (0 bytes without one), the one
    definition of fitting every command uses; with the ``nvme`` tier the offloaded weights and optimizer
    state must fit the GPU's share of the node's drives instead of the pool.
    """

    iteration_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float
    fsdp_comm_s: float
    optimizer_s: float
    offload_s: float
    model_flops: float
    hardware_flops: float
    mfu: float
    device_bytes: float
    offloaded_bytes: float
    fits: bool
    weight_bytes: float
    """One rank's parameters (bytes, before offload); with the next three, minus ``offloaded_bytes``, this is
    ``device_bytes``."""
    gradient_bytes: float
    optimizer_bytes: float
    """Optimizer state: master weights and both Adam moments."""
    activation_bytes: float
    """Activations saved for backward by the micro-batches in flight (with ``uniform`` recompute, plus one
    group's while it recomputes)."""
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    offloaded_activation_bytes: float = 0.0
    """The part of ``activation_bytes`` in the second tier (all of it but a ``uniform`` group's, or
    ``offload_num_layers``' share)."""
    offloaded_weight_bytes: float = 0.0
    """The part of ``weight_bytes`` in the second tier (the stored copy, or ``offload_num_layers``' layers)."""
    contention_s: float = 0.0
    """Time the shared links add over the same iteration on idle links (the per-link floor's stretch, NOTE [link
    floor]; counted inside ``offload_s``, without offload inside ``dp_comm_s``; not a separate part of the sum)."""

    def to_dict(self) -> dict[str, float | bool]:
        """Plain data for JSON."""
        return asdict(self)


@pure_cache(64, copy_dict=True)
def elementwise_bytes_per_layer(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, sp: bool = False,
                                cp: int = 1, attention: Attention = "materialized",
                                fused: bool = True, rope: str = "complex") -> dict[str, float]:
    """HBM bytes of a layer's memory-bound forward kernels on one rank: ``block`` (two norms read and write
    ``b s h``; two bias-dropout-adds read input and residual, write output and a 1-byte mask; the activation
    function reads its input(s) and writes ``b s f``) and ``scores`` (softmax reads and writes the ``a s^2 b``
    scores, their dropout reads, writes and stores a mask). Counted from the kernels Megatron-LM runs (fused
    bias-GELU, fused scale-mask-softmax, fused bias-dropout-add); no fitting. ``attention="flash"`` has no
    score kernels (``scores`` is 0; the fused kernel's traffic is
    :func:`~mcdla.workload.transformer.flash_attention_bytes`). ``last_add``: the second residual add's part of
    ``block``. ``fused=False``: ``block`` as eager PyTorch runs it, one kernel per op (NOTE [eager kernels] in
    :mod:`mcdla.sim.llm_eager`; ``rope``: its RoPE code, ``Execution.rope_kernels``)."""
    e = spec.bytes_per_element
    b, s, h = micro_batch, spec.seq_len / cp, spec.hidden
    mask = 1.0 if spec.dropout else 0.0
    sbh = s * b * h
    norms = 2 * 2 * e * sbh
    residual = 2 * (3 * e + mask) * sbh
    activation = spec.ffn_matrices * e * s * b * spec.ffn_width_per_token  # GELU: read f, write f; SwiGLU: read 2f
    scores = spec.heads * s * spec.seq_len * b * (2 * e + mask * (2 * e + 1)) if attention == "materialized" else 0.0
    if not fused:
        return {**eager_block_bytes(spec, micro_batch, tp=tp, sp=sp, cp=cp, rope=rope), "scores": scores / tp}
    return {"block": (norms + residual) / (tp if sp else 1) + activation / tp, "scores": scores / tp,
            "last_add": residual / 2 / (tp if sp else 1)}


@pure_cache(64)
def _param_groups(spec: TransformerSpec, e: Execution) -> tuple[ParamGroup, ...]:
    """Parameters on the rank of the first stage (the most layers any stage has, and the embedding), per TP
    rank (and per EP rank for the routed experts), by reduction group (:func:`rank_param_groups`)."""
    return rank_param_groups(spec, e, max(stage_layers(e, spec)))


T = TypeVar("T")

_MEMO_ENTRIES = 16384
"""Most entries :func:`_remember` lets a cluster's :attr:`~mcdla.hardware.cluster.Cluster.model_memo` hold
before emptying it (a search asks a few hundred)."""


def _group_collective_s(cluster: Cluster, kind: str, nbytes: float, size: int, stride: int) -> float:
    """:func:`collective_time` of ``kind`` on ``nbytes`` over the group of ``size`` ranks ``stride`` apart on
    ``cluster`` (:meth:`Cluster.group_dims`), memoised in the cluster's ``model_memo``: a search asks the same
    few groups and buffers for many executions."""
    key = (kind, nbytes, size, stride)
    got = cluster.model_memo.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    return _remember(cluster, key, collective_time(kind, nbytes, cluster.group_dims(size, stride)))


def _remember(cluster: Cluster, key: tuple[object, ...], value: T) -> T:
    """Keep ``value`` in ``cluster``'s ``model_memo`` under ``key`` (emptied past :data:`_MEMO_ENTRIES`);
    returns it."""
    memo = cluster.model_memo
    if len(memo) > _MEMO_ENTRIES:
        memo.clear()
    memo[key] = value
    return value


def _tp_allreduce_s(cluster: Cluster, tp: int, tp_stride: int, sequence_parallel: bool, nbytes: float) -> float:
    """One TP all-reduce (or its all-gather + reduce-scatter pair) of ``nbytes`` per rank, the pair's sum
    memoised under one key of the cluster's ``model_memo`` beside its two collectives'."""
    if not sequence_parallel:
        return _group_collective_s(cluster, "all-reduce", nbytes, tp, tp_stride)
    key = ("tp-pair", nbytes, tp, tp_stride)
    got = cluster.model_memo.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    return _remember(cluster, key, _group_collective_s(cluster, "all-gather", nbytes, tp, tp_stride)
                     + _group_collective_s(cluster, "reduce-scatter", nbytes, tp, tp_stride))


def _dp_reduce_s(cluster: Cluster, groups: tuple[ParamGroup, ...], grad_bytes: float) -> float:
    """The gradient all-reduces of ZeRO 0-2 (ZeRO-1/2's reduce-scatter + all-gather: the same traffic), each
    parameter group over its replicas, one group after the other; ``grad_bytes`` per parameter."""
    total = 0  # summed as sum() sums, from the integer 0
    for g in groups:
        total += _group_collective_s(cluster, "all-reduce", grad_bytes * g.params, g.size, g.stride)
    return total  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class ShardCollective:
    """One ZeRO-3 collective: ``kind`` of ``nbytes`` (the whole buffer, as :func:`collective_time` takes it) over
    the group of ``size`` ranks ``stride`` apart in rank order (:meth:`Cluster.group_dims`' arguments)."""

    kind: str
    nbytes: float
    size: int
    stride: int


@dataclass(frozen=True, slots=True)
class Zero3Traffic:
    """What ZeRO-3 runs (NOTE [ZeRO-3 as run]): per layer, micro-batch and pass the weights' all-gathers
    (``gathers``, one per parameter group, or per parameter tensor with ``zero3_collectives="per-tensor"``) and in
    the backward the gradients' reduce-scatters (``reduces``);
    once per iteration ``step``: the tensors under ``zero3_persist_numel`` gathered, the non-layer parameters
    reduce-scattered and gathered back over their shard group, then under HSDP each gradient shard all-reduced across the replicas (groups of one rank left out).
    ``after_backward``: under HSDP with ``dp_overlap``, the part of that all-reduce FSDP issues only once the
    backward has ended (NOTE [HSDP all-reduce as issued]); ``step`` then all-reduces the rest.
    The analytical model prices these, the engine lowering (:mod:`mcdla.sim.llm_lower_zero`) runs them."""

    gathers: tuple[ShardCollective, ...]
    reduces: tuple[ShardCollective, ...]
    step: tuple[ShardCollective, ...]
    after_backward: tuple[ShardCollective, ...] = ()


@pure_cache(64)
def zero3_traffic(spec: TransformerSpec, execution: Execution, element_bytes: int) -> Zero3Traffic:
    """The collectives of :class:`Zero3Traffic` for ``execution`` (``zero=3``) with ``element_bytes`` per
    parameter (the run's precision)."""
    e = execution
    layer = _layer_groups(spec, e)
    groups = _param_groups(spec, e)
    n_layers = max(stage_layers(e, spec))
    step: list[ShardCollective] = []
    if e.zero3_collectives == "per-tensor":  # one dense group (check_execution): one collective per tensor
        shard = _shard_groups(layer[0], e)[0]
        tensors = [numel / e.tp for _, numel in spec.layer_tensors()]
        kept = [n for n in tensors if n < e.zero3_persist_numel]
        gathers = tuple(ShardCollective("all-gather", element_bytes * n, *shard)
                        for n in tensors if n >= e.zero3_persist_numel)
        reduces = tuple(ShardCollective("reduce-scatter", element_bytes * n, *shard) for n in tensors)
        if kept and shard[0] > 1:  # the persisted tensors, gathered once after the step
            step.append(ShardCollective("all-gather", element_bytes * sum(kept) * n_layers, *shard))
    else:
        gathers = tuple(ShardCollective("all-gather", element_bytes * g.params, *_shard_groups(g, e)[0])
                        for g in layer)
        reduces = tuple(dataclasses.replace(c, kind="reduce-scatter") for c in gathers)
    other = groups[0].params - n_layers * layer[0].params  # the embedding
    after: list[ShardCollective] = []
    # NOTE [HSDP all-reduce as issued]: with dp_overlap the all-reduce of the layers that backward leaves before
    # its last one starts with the backward; that of its last layer and of the non-layer parameters after it
    per_unit = e.dp_overlap and len(layer) == len(groups)
    for k, g in enumerate(groups):
        shard, replicas = _shard_groups(g, e)
        if k == 0 and shard[0] > 1:
            step += [ShardCollective(kind, element_bytes * other, *shard) for kind in ("reduce-scatter", "all-gather")]
        if replicas[0] > 1:
            early = (n_layers - 1) * layer[k].params if per_unit else 0.0
            if early > 0:
                step.append(ShardCollective("all-reduce", element_bytes * early / shard[0], *replicas))
            (after if per_unit else step).append(
                ShardCollective("all-reduce", element_bytes * (g.params - early) / shard[0], *replicas))
    return Zero3Traffic(gathers=gathers, reduces=reduces, step=tuple(step), after_backward=tuple(after))


def _collectives_s(cluster: Cluster, collectives: tuple[ShardCollective, ...]) -> float:
    """The collectives one after the other on their groups' fabric dimensions."""
    return sum(_group_collective_s(cluster, c.kind, c.nbytes, c.size, c.stride) for c in collectives)


def _shard_groups(g: ParamGroup, e: Execution) -> tuple[tuple[int, int], tuple[int, int]]:
    """(size, stride) of the ZeRO shard group of parameter group ``g`` and of the replica group across shards
    (HSDP; size 1 without). Without HSDP the shard group is ``g``'s reduction group (the ``dp x cp`` replicas of
    the dense parameters, the ``dp cp / ep`` of the routed experts); with ``hsdp_shard = s`` the ``dp / s``
    replica groups of the DP dimension split it, each shard the ``g.size / replicas`` consecutive members
    (``s cp`` for the dense parameters); 1 rank without ZeRO."""
    if not e.zero:
        return (1, g.stride), (1, g.stride)
    replicas = math.gcd(g.size, e.dp // e.hsdp_shard) if e.hsdp_shard else 1
    shard = g.size // replicas
    return (shard, g.stride), (replicas, g.stride * shard)


def _sharded(groups: tuple[ParamGroup, ...], e: Execution, sharded: bool) -> float:
    """Parameters a rank keeps of ``groups`` when a state is sharded over each group's ZeRO shard group
    (:func:`_shard_groups`; else all)."""
    return sum(g.params / (_shard_groups(g, e)[0][0] if sharded else 1) for g in groups)


@pure_cache(64)
def _rank_params(spec: TransformerSpec, e: Execution) -> tuple[float, float]:
    """The rank's parameters (:func:`_param_groups`) kept whole and sharded (:func:`_sharded`), indexed by
    whether the state is sharded."""
    groups = _param_groups(spec, e)
    return _sharded(groups, e, False), _sharded(groups, e, True)


@pure_cache(64)
def _layer_groups(spec: TransformerSpec, e: Execution) -> tuple[ParamGroup, ...]:
    """One layer's parameters on a rank (per TP rank, the routed experts per EP rank) by reduction group: what
    ZeRO-3 gathers and reduce-scatters per layer."""
    one, none = rank_param_groups(spec, e, 1), rank_param_groups(spec, e, 0)
    return (replace(one[0], params=one[0].params - none[0].params), *one[1:])


def fsdp_exposed_s(gather_s: float, reduce_s: float, compute_s: float, layers: int, *, prefetch: int,
                   backward: bool) -> float:
    """Communication a chunk of ``layers`` identical layers exposes under FSDP/ZeRO-3 (NOTE [ZeRO-3 as run]):
    the chunk's length minus its compute, from the order FSDP's hooks issue the collectives on the group's
    links, one at a time in issue order, while the layers compute one after the other.

    Each layer waits for its weights' all-gather (``gather_s``) and then computes (``compute_s``); in backward
    its gradients' reduce-scatter (``reduce_s``) is issued when its compute ends. With ``prefetch = d >= 1``
    the gathers of the first ``d`` layers are issued at once and that of layer ``i + d`` when layer ``i``
    starts (FSDP's forward/backward prefetch); with 0 a layer's gather is issued when the previous layer ends.
    Closed forms at the ends (tests/sim/test_llm_zero.py): forward with prefetch ``g + (k - 1) max(0, g - c)``,
    without ``k g``; backward ``g + r`` when the compute hides the rest, ``k (g + r) - k c`` when the links
    never idle.
    """
    link = compute = rs_end = 0.0  # when the link and the compute are next free; the last reduce-scatter's end
    ahead: list[float] = []  # ends of the gathers already issued for the next layers, in layer order
    for _ in range(min(prefetch, layers)):
        link += gather_s
        ahead.append(link)
    regular = layers - prefetch - 1  # the last layer that still issues a prefetch: the pattern holds up to it
    seen: tuple[tuple[float, ...], float] | None = None
    i = 0
    while i < layers:
        if prefetch:
            gathered = ahead.pop(0)
        else:
            link = max(link, compute) + gather_s
            gathered = link
        start = max(compute, gathered)
        if prefetch and i + prefetch < layers:
            link = max(link, start) + gather_s
            ahead.append(link)
        compute = start + compute_s
        if backward:
            link = max(link, compute) + reduce_s
            rs_end = link
        i += 1
        if i < regular:
            # The rules are invariant under a shift in time: two layers in a row leaving the same state relative
            # to the compute means every further regular layer adds the same step; jump to the last of them.
            state = (link - compute, *(a - compute for a in ahead))
            if seen is not None and all(abs(x - y) <= 1e-12 * compute for x, y in zip(state, seen[0], strict=True)):
                shift = (compute - seen[1]) * (regular - i)
                link, compute, rs_end = link + shift, compute + shift, rs_end + shift if backward else 0.0
                ahead = [a + shift for a in ahead]
                i = regular
                seen = None
            else:
                seen = (state, compute)
    return max(compute, rs_end) - layers * compute_s


def _boundary_p2p_s(cluster: Cluster, e: Execution, nbytes: float) -> tuple[float, ...]:
    """One pipeline send across each stage boundary: stage ``b`` to ``b + 1`` for ``b < p - 1``, then the last
    stage to the first (the interleaved schedule's next chunk), each on the dimension its ranks cross
    (:meth:`Cluster.dim_between`, as the engine's sends cross it): the slowest of the TP x CP ranks of data-parallel
    replica 0 (:class:`~mcdla.workload.parallel_dims.ParallelDims`) and their peers. () with one stage; memoised
    per cluster as :func:`_group_collective_s` is."""
    if e.pp == 1:
        return ()
    key = ("p2p", nbytes, e.tp, e.cp, e.dp, e.pp)
    got = cluster.model_memo.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    layout = ParallelDims.of(e)
    sends = []
    for b in range(e.pp):
        dims = {cluster.dim_between(layout.rank(tp=t, cp=x, pp=b), layout.rank(tp=t, cp=x, pp=(b + 1) % e.pp))
                for x in range(e.cp) for t in range(e.tp)}
        sends.append(max(p2p_time(nbytes, dim) for dim in dims))
    return _remember(cluster, key, tuple(sends))


def _offload_bytes_per_s(cluster: Cluster, gpus: int) -> float:
    """Each GPU's offload bandwidth with every GPU of a job of ``gpus`` GPUs offloading (0 without a pool)."""
    return 0.0 if cluster.offload is None else cluster.pool_link_for_gpus(gpus).offload_bytes_per_s


def cluster_rejection(execution: Execution, cluster: Cluster) -> str | None:
    """Why ``cluster`` cannot run ``execution`` (TP beyond one NVLink domain, offload without a pool), or
    None; the message of :func:`stage_costs`' ConfigError. Context and expert parallel groups may span nodes."""
    e = execution
    if e.tp > cluster.gpus_per_node:
        return (f"execution.tp: got {e.tp}; must fit one NVLink domain "
                f"({cluster.gpus_per_node} GPUs per node)")
    if (e.offload_activations or e.offload_weights or e.offload_optimizer) and cluster.offload is None:
        return "execution.offload_*: offload asked but the cluster has no second tier (no pool memory)"
    if e.gpus > cluster.n_devices:
        return f"execution.gpus: got {e.gpus}; must be at most the {cluster.n_devices} GPUs of {cluster.name}"
    if e.attention_kernel is not None:
        if cluster.attention_kernel(e.attention_kernel) is None:
            known = ", ".join(k.name for k in cluster.attention_kernels) or "none"
            return (f"execution.attention_kernel: got {brief(e.attention_kernel)}; {cluster.name} measures "
                    f"{known} (node.attention_kernels)")
        if e.attention != "flash":
            return (f"execution.attention_kernel: got {brief(e.attention_kernel)} with attention "
                    f"{brief(e.attention)}; a measured build prices the fused kernel (attention: flash)")
    return tier_rejection(e, cluster)


def _uneven(layers: tuple[int, ...]) -> bool:
    """Whether the stages hold different numbers of layers (``len(set(layers)) > 1``, without the set)."""
    return bool(layers) and layers.count(layers[0]) != len(layers)


def send_boundary(stage: int, chunk: int, stages: int, virtual_stages: int, *, forward: bool) -> int | None:
    """The boundary (:attr:`StageCosts.boundary_p2p_s`'s index) the send ending a pass of ``chunk`` on ``stage``
    crosses in Megatron's (interleaved) schedule: a forward to the next stage, from the last stage to the first
    stage's next chunk (the last entry); a backward to the previous stage, from the first stage to the last
    stage's previous chunk; None where there is no peer (the last chunk's forward on the last stage, the first
    chunk's backward on the first)."""
    p, v = stages, virtual_stages
    if forward:
        return stage if stage < p - 1 else (p - 1 if chunk < v - 1 else None)
    return stage - 1 if stage else (p - 1 if chunk else None)


class LayerCosts(NamedTuple):
    """One layer's per-micro-batch durations on one rank (seconds), :class:`StageCosts`' ``layer_*`` fields: the
    mean layer's there, each kind's in :attr:`StageCosts.layer_kinds` (NOTE [layer kinds])."""

    layer_fwd_s: float
    layer_bwd_s: float
    layer_recompute_s: float
    layer_tp_fwd_s: float
    layer_tp_bwd_s: float
    layer_cp_fwd_s: float
    layer_cp_bwd_s: float
    layer_ep_fwd_s: float
    layer_ep_bwd_s: float
    layer_ep_hidden_fwd_s: float
    layer_ep_hidden_bwd_s: float
    layer_attention_fwd_s: float
    layer_tp_hide_fwd_s: float
    layer_tp_hide_bwd_s: float

    @property
    def layer_comm_fwd_s(self) -> float:
        """One layer's forward link time: TP collectives, exposed CP exchange, EP all-to-alls."""
        return self.layer_tp_fwd_s + self.layer_cp_fwd_s + self.layer_ep_fwd_s

    @property
    def layer_comm_bwd_s(self) -> float:
        """One layer's backward link time (:attr:`layer_comm_fwd_s`'s counterpart)."""
        return self.layer_tp_bwd_s + self.layer_cp_bwd_s + self.layer_ep_bwd_s


def by_kind(mean: T, kinds: tuple[LayerCosts, ...], layers: int, dense: int) -> tuple[tuple[T | LayerCosts, int], ...]:
    """``layers`` layers of which ``dense`` are dense leading layers as (per-layer figures, count) by kind
    (NOTE [layer kinds]): the MoE and the dense layer's ``kinds``, or the ``mean`` layer's for every layer
    when the layers are alike (``kinds`` empty)."""
    if not kinds:
        return ((mean, layers),)
    moe, dense_layer = kinds
    return ((moe, layers - dense), (dense_layer, dense))


@slot_init
@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Per-rank durations (seconds) of one micro-batch on one pipeline stage, shared by the closed form
    (:func:`llm_step`, ``mode="fast"``) and the per-rank schedule (:mod:`mcdla.sim.llm_ranks`), so the two
    differ only in how they compose them.

    ``compute`` parts scale with a rank's speed (a straggler); ``tp``, ``p2p`` and ``offload`` parts are
    link time. Layer figures are per layer; ``last_*`` is the last stage's vocabulary projection and loss.
    ``stage_layers``: the layers of each stage (:func:`~mcdla.workload.execution.stage_layers`);
    ``layers_per_stage`` the most of them.
    """

    layers_per_stage: int
    layer_fwd_s: float  # forward compute of one layer
    layer_bwd_s: float  # backward compute of one layer (2 x forward; FlashAttention's core 2.5 x)
    layer_recompute_s: float  # recomputation in the backward of one layer
    layer_tp_fwd_s: float  # TP collectives in one layer's forward, the part not hidden (``tp_comm_overlap``)
    layer_tp_bwd_s: float  # in its backward (+ the recomputed forward's with full recompute), likewise
    p2p_s: float  # one point-to-point transfer of a chunk's activation or its gradient on the slowest stage
    # boundary (its exposed part): what a pass holds where Megatron has no peer (the last stage's last forward,
    # the first stage's first backward); every send when ``boundary_p2p_s`` is ()
    last_fwd_s: float  # logits + loss forward on the last stage, per micro-batch
    last_bwd_s: float  # their backward (2 x)
    offload_fwd_s: float  # exposed offload traffic per micro-batch and stage, forward
    offload_bwd_s: float  # and backward
    fsdp_fwd_s: float = 0.0  # exposed ZeRO-3 weight gathers per micro-batch and stage, forward
    fsdp_bwd_s: float = 0.0  # and backward (gathers + gradient reduce-scatters)
    last_fsdp_s: float = 0.0  # what the last stage's (forward + backward) differs by: a CP ring's attention
    # comes out of its layers after its logits' (<= 0; 0 with one stage)
    dp_full_s: float  # the data-parallel gradient reduction, whole
    dp_hidden_s: float  # how much of it the last backward hides (``dp_overlap``), else 0
    optimizer_s: float  # the Adam step
    offload_step_s: float  # optimizer state to and from the second tier
    stage_layers: tuple[int, ...] = ()  # layers of each pipeline stage, first to last
    chunk_layers: tuple[tuple[int, ...], ...] = ()  # layers of each stage's virtual chunks
    layer_cp_fwd_s: float = 0.0  # exposed K/V exchange of context parallelism in one layer's forward
    layer_cp_bwd_s: float = 0.0  # and in its backward (+ the recomputed attention's)
    layer_ep_fwd_s: float = 0.0  # MoE all-to-alls in one (mean) layer's forward, less ``moe_a2a_overlap``'s hiding
    layer_ep_bwd_s: float = 0.0  # and in its backward (+ the recomputed forward's with full recompute)
    layer_ep_hidden_fwd_s: float = 0.0  # what ``moe_a2a_overlap`` hides of the forward's, per micro-batch on
    layer_ep_hidden_bwd_s: float = 0.0  # average, and of the backward's (NOTE [EP overlap] in mcdla.sim.llm_moe)
    recomputed_share: float = 0.0  # share of the layers fully recomputed (the TP calls their backward repeats)
    layer_attention_fwd_s: float = 0.0  # the attention core's forward in one layer (what a CP ring send overlaps)
    layer_tp_hide_fwd_s: float = 0.0  # GEMM time of one layer's forward its TP collectives overlap (``tp_comm_overlap``)
    layer_tp_hide_bwd_s: float = 0.0  # and of its backward (+ the recomputed forward's with full recompute)
    p2p_hidden_s: float = 0.0  # the part of a send the sender's next chunk hides (``pp_comm_overlap``); its
    # receiver still waits for it, so the fill and the drain of the schedule each cross v p - 1 of them
    dp_tail_s: float = 0.0  # the reduction's part issued only after the backward (HSDP's last units, ``dp_overlap``)
    boundary_p2p_s: tuple[float, ...] = ()  # the exposed part of one send across each stage boundary, on the link
    # it crosses: stage b to b + 1, then (the last entry) the last stage to the first, the interleaved schedule's
    # next chunk; () with one stage
    boundary_hidden_s: tuple[float, ...] = ()  # the part of each the sender's next chunk hides (``pp_comm_overlap``)
    layer_kinds: tuple[LayerCosts, ...] = ()  # with dense_layers: an MoE layer's figures and a dense layer's
    chunk_dense: tuple[tuple[int, ...], ...] = ()  # dense layers of each stage's chunks (with layer_kinds)

    def kinds(self, layers: int, dense: int = 0) -> tuple[tuple[LayerCosts | StageCosts, int], ...]:
        """``layers`` layers of which ``dense`` are dense leading layers as (per-layer figures, count) by kind
        (:func:`by_kind` of these costs)."""
        return by_kind(self, self.layer_kinds, layers, dense)

    def stage_dense(self, stage: int | None) -> int:
        """Dense leading layers on ``stage`` (None: the last, which the closed form's alike stages stand for)."""
        return sum(self.chunk_dense[-1 if stage is None else stage]) if self.chunk_dense else 0

    def send_s(self, stage: int, chunk: int, virtual_stages: int, *, forward: bool) -> float:
        """The exposed send that ends a pass of ``chunk`` on ``stage``, on the boundary it crosses
        (:func:`send_boundary`), :attr:`p2p_s` where Megatron has no peer."""
        if not self.boundary_p2p_s:
            return self.p2p_s
        b = send_boundary(stage, chunk, len(self.boundary_p2p_s), virtual_stages, forward=forward)
        return self.p2p_s if b is None else self.boundary_p2p_s[b]

    def pass_sends_s(self, stage: int | None, virtual_stages: int, *, forward: bool) -> float:
        """The exposed sends that end one micro-batch's forward (or backward) passes on ``stage``, one per chunk
        (``v`` :attr:`p2p_s` with ``stage`` None or one boundary time)."""
        if stage is None or not self.boundary_p2p_s:
            return virtual_stages * self.p2p_s
        return sum(self.send_s(stage, ch, virtual_stages, forward=forward) for ch in range(virtual_stages))

    def stage_sends_s(self, stage: int | None, virtual_stages: int) -> float:
        """The exposed sends of one micro-batch on ``stage``: a forward and a backward send per chunk
        (``2 v`` :attr:`p2p_s` with ``stage`` None or one boundary time)."""
        if stage is None or not self.boundary_p2p_s:
            return 2 * virtual_stages * self.p2p_s
        return (self.pass_sends_s(stage, virtual_stages, forward=True)
                + self.pass_sends_s(stage, virtual_stages, forward=False))

    layer_comm_fwd_s = LayerCosts.layer_comm_fwd_s  # the (mean) layer's link time, as each kind's
    layer_comm_bwd_s = LayerCosts.layer_comm_bwd_s

    @property
    def dp_exposed_s(self) -> float:
        """The reduction's part that is not hidden behind the last backward, then what waits for the
        backward's end (``dp_tail_s``)."""
        return max(0.0, self.dp_full_s - self.dp_hidden_s) + self.dp_tail_s

    def stage_s(self, layers: int, virtual_stages: int, *, last: bool = False, stage: int | None = None) -> float:
        """One micro-batch on a stage of ``layers`` layers over its ``virtual_stages`` chunks: compute,
        recompute, TP, the ``2 v`` pipeline transfers (:meth:`stage_sends_s` of ``stage``), exposed offload; the
        last stage adds the logits and loss."""
        kinds = self.kinds(layers, self.stage_dense(stage))
        return (sum(n * (x.layer_fwd_s + x.layer_bwd_s) + n * x.layer_recompute_s
                    + n * (x.layer_comm_fwd_s + x.layer_comm_bwd_s) for x, n in kinds)
                + self.stage_sends_s(stage, virtual_stages)
                + self.offload_fwd_s + self.offload_bwd_s + self.fsdp_fwd_s + self.fsdp_bwd_s
                + (self.last_fwd_s + self.last_bwd_s + self.last_fsdp_s if last else 0.0))

    def middle_stage_s(self, virtual_stages: int) -> float:
        """A middle stage's time per micro-batch (:meth:`stage_s` of ``layers_per_stage`` layers)."""
        return self.stage_s(self.layers_per_stage, virtual_stages)

    def stage_parts(self, layers: int, micro_batches: int, virtual_stages: int, *, last: bool = True,
                    stage: int | None = None) -> dict[str, float]:
        """A stage's busy time over ``micro_batches`` micro-batches by part (seconds; ``LlmStep`` field names):
        compute (with the logits and loss on the last stage), recompute, TP, PP (``stage``'s sends,
        :meth:`stage_sends_s`), offload with the optimizer state's round trip, CP and EP. Both the closed form and
        the per-rank schedule report these for the pacing stage."""
        m, kinds = micro_batches, self.kinds(layers, self.stage_dense(stage))
        last_extra = self.last_fwd_s + self.last_bwd_s if last else 0.0
        return dict(compute_s=m * (sum(n * (x.layer_fwd_s + x.layer_bwd_s) for x, n in kinds) + last_extra),
                    recompute_s=m * sum(n * x.layer_recompute_s for x, n in kinds),
                    tp_comm_s=m * sum(n * (x.layer_tp_fwd_s + x.layer_tp_bwd_s) for x, n in kinds),
                    pp_comm_s=m * self.stage_sends_s(stage, virtual_stages),
                    fsdp_comm_s=m * (self.fsdp_fwd_s + self.fsdp_bwd_s + (self.last_fsdp_s if last else 0.0)),
                    offload_s=m * (self.offload_fwd_s + self.offload_bwd_s) + self.offload_step_s,
                    cp_comm_s=m * sum(n * (x.layer_cp_fwd_s + x.layer_cp_bwd_s) for x, n in kinds),
                    ep_comm_s=m * sum(n * (x.layer_ep_fwd_s + x.layer_ep_bwd_s) for x, n in kinds))

    def iteration_parts(self, micro_batches: int, virtual_stages: int) -> dict[str, float]:
        """The steady-state parts of an evenly split iteration: the last stage's :meth:`stage_parts`."""
        return self.stage_parts(self.layers_per_stage, micro_batches, virtual_stages, last=True,
                                stage=len(self.boundary_p2p_s) - 1 if self.boundary_p2p_s else None)


class _LayerCompute(NamedTuple):
    """One layer's compute on one rank per micro-batch (seconds), and the rates the rest of :func:`stage_costs`
    prices with: the parts that depend on the layer's shape on the rank, not on the pipeline, the data-parallel
    layout, ZeRO or offload."""

    gemm_s: float  # the linear layers' GEMMs, forward
    overlapped_s: float  # those Transformer Engine's userbuffers run, forward (NOTE [layer GEMMs])
    attention_s: float  # the attention core's FLOPs, forward
    core_fwd_s: float  # the attention kernel's memory traffic (and exponentials), forward
    core_bwd_s: float  # the same, backward
    fwd_s: float  # the layer's forward
    bwd_s: float  # its backward
    op_recompute_s: float  # what ``selective-op``, or ``selective``'s modules but the core, recompute in backward
    logits_s: float  # the vocabulary projection, forward (on the last stage)
    loss_s: float  # the loss, forward
    hbm_per_s: float  # the HBM bandwidth the memory-bound kernels get
    gemm_bwd_ratio: float  # the GEMMs' backward over forward


def ring_exchange_costs(spec: TransformerSpec, e: Execution, curve: GemmEfficiency, gemm_rate: float,
                        efficiency: float) -> dict[str, float]:
    """What Transformer Engine's userbuffers ring exchange adds to one (mean) layer on one rank (NOTE [userbuffers
    ring exchange]): ``gemm_fwd`` and ``gemm_bwd``, the extra seconds of the GEMMs it splits into ``tp`` GEMMs of
    ``b s / (cp tp)`` tokens each over those GEMMs at the curve's point for the whole ``b s / cp`` tokens: in
    forward every GEMM the userbuffers run (:func:`~mcdla.workload.transformer.layer_gemms`: QKV, projection, the
    dense and shared experts' fc1 and fc2; not the router nor the routed experts), in backward the dgrad of the
    row-parallel ones (projection, fc2); ``reduce_bytes``, the HBM bytes of the kernel that sums the ``tp``
    partial outputs of each row-parallel GEMM's reduce-scatter ring (read ``tp`` chunks of ``b s / (cp tp)`` x
    ``h`` elements, write one), after the ring, not overlapped. ``gemm_rate``: the GEMMs' rate on the rank
    (``efficiency`` of the curve)."""
    tokens = e.micro_batch * spec.seq_len / e.cp
    chunk = curve.at(spec.hidden / e.tp, tokens=tokens / e.tp)
    slower = efficiency / chunk - 1.0  # a chunk's GEMM time over the whole GEMM's, less one
    ring, row, rings = _ring_weights(spec)
    per_weight = 2 * tokens / e.tp / gemm_rate  # seconds per weight of a GEMM on the rank's share of the tokens
    reduce_bytes = rings * spec.bytes_per_element * (tokens * spec.hidden + tokens / e.tp * spec.hidden)
    return {"gemm_fwd": slower * ring * per_weight, "gemm_bwd": slower * row * per_weight,
            "reduce_bytes": reduce_bytes}


@pure_cache(64)
def _ring_weights(spec: TransformerSpec) -> tuple[float, float, float]:
    """The mean layer's weights (multiply-adds per token) of the GEMMs Transformer Engine's userbuffers run with
    ``tp_comm_overlap``, of the row-parallel ones among them, and how many row-parallel ones a layer runs on
    average (NOTE [layer GEMMs])."""
    ring = row = rings = 0.0
    for g in layer_gemms(spec):
        if g.ring:
            ring += g.weights
        if g.ring == "rs":
            row += g.weights
            rings += g.share
    return ring, row, rings


def gemm_peak_flops_per_s(cluster: Cluster, key: str) -> float:
    """The peak a linear layer's GEMM at precision ``key`` is priced against on ``cluster``'s GPU, before the
    curve: the datasheet peak, times ``fp8_fraction`` in fp8 and, for bf16/fp16 on a curve with
    ``bf16_over_fp8``, the fp8 one times that ratio.

    NOTE [bf16 from fp8]: a preset's ``fp8_fraction`` is fitted on its chip's published FP8 runs (the Llama rows
    of ``validate-llm --family megatron-bridge-fp8``), so what a linear layer's fp8 GEMM sustains in such a run
    is measured; no fitting source publishes a dense bf16 run on these GPUs (``docs/llm.md`` "Megatron-Bridge
    MoE"). What the chip's bf16 GEMMs reach against its fp8 GEMMs is a property of its tensor cores that the
    Maximum Achievable Matmul FLOPS table measures (stas00/ml-engineering 744d01e,
    ``compute/accelerator/README.md``: at its best shape GB200 runs bf16 at 0.504 of its fp8 rate, B200 0.508,
    B300 0.528, H100 0.566). With ``bf16_over_fp8`` the linear layers' bf16 GEMMs (dense and routed experts)
    run at the fitted fp8 rate times that ratio: whatever keeps a training run's fp8 GEMMs below the best
    shape's rate is taken to slow its bf16 GEMMs alike. The attention core and the logits stay on the bf16 curve,
    priced as in fp8 runs, where the fit saw them (``python -m benchmarks.bench_bf16_rule`` measures the
    alternatives that move them too)."""
    dev, curve = cluster.device, cluster.gemm_efficiency
    if key == "fp8":
        return dev.flops_per_s("fp8") * curve.fp8_fraction
    if key in ("bf16", "fp16") and curve.bf16_over_fp8 is not None:
        return dev.flops_per_s("fp8") * curve.fp8_fraction * curve.bf16_over_fp8
    return dev.flops_per_s(key)


def _layer_compute(spec: TransformerSpec, e: Execution, cluster: Cluster, prec: Precision) -> _LayerCompute:
    """:class:`_LayerCompute` of ``spec`` at ``prec`` under ``e``'s micro-batch, TP, CP, EP, capacity factor,
    attention kernel, kernel fusion and fp8 scaling on ``cluster``'s GPU (NOTE [time model])."""
    op = e.recompute == OP_RECOMPUTE
    modules = e.recompute_modules if e.recompute == "selective" else ()
    key = ("layer", spec, prec, e.micro_batch, e.tp, e.cp, e.sequence_parallel, e.attention, e.fused_kernels,
           e.rope_kernels, e.capacity_factor, type(e.capacity_factor), e.ep, e.ep_dispatcher, e.fp8_scaling, op,
           modules, e.tp_comm_overlap, e.moe_router_graph, e.attention_kernel)
    got = cluster.model_memo.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    dev = cluster.device
    b, split = e.micro_batch, e.tp * e.cp
    hbm_per_s = dev.effective_hbm_bytes_per_s
    curve = cluster.gemm_efficiency
    efficiency = curve.at(spec.hidden / e.tp, tokens=b * spec.seq_len / e.cp)
    gemm_peak = gemm_peak_flops_per_s(cluster, prec.gemm_peak)
    gemm_rate = gemm_peak * efficiency
    # the routed experts' grouped GEMMs, each over its own expert's tokens and at its own narrowest dimension
    # (NOTE [expert parallelism])
    expert_rate = gemm_peak * curve.at(expert_gemm_width(spec, e), tokens=tokens_per_local_expert(spec, e))
    other_rate = dev.flops_per_s(prec.other_peak) * efficiency
    gemm_bwd_ratio = curve.backward_ratio
    flops = layer_fwd_flops(spec, b, attention=e.attention)
    ew = elementwise_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp, attention=e.attention,
                                     fused=e.fused_kernels, rope=e.rope_kernels)
    routed = routed_expert_flops(spec, e)
    dense_gemm = flops["gemm"] - routed / e.capacity_factor
    expert_f = routed / split / expert_rate if routed else 0.0
    gemm_f = dense_gemm / split / gemm_rate + expert_f
    # the host's MoE launches, where they outlast the GPU work they issue: the experts' GEMMs, the source-side
    # permute and the fp8 row padding (NOTE [expert parallelism])
    issue_f, issue_b = grouped_gemm_issue_s(spec, e, dev.host_call_s, fp8=prec.fp8)
    source_permute = source_permute_bytes(spec, e) / hbm_per_s
    pad_f = fp8_padding_bytes(spec, e, prec.fp8) / hbm_per_s  # the fp8 row padding, as many bytes backward
    issue_wait_f = max(0.0, issue_f - expert_f - source_permute - pad_f)
    issue_wait_b = max(0.0, issue_b - curve.backward_ratio * expert_f - source_permute - pad_f)
    attn_f = flops["attention"] / split / other_rate
    if e.attention == "flash":
        kernel = flash_attention_bytes(spec, b, tp=e.tp, cp=e.cp)
        core_fwd, core_bwd = kernel["fwd"] / hbm_per_s, kernel["bwd"] / hbm_per_s
        if dev.exp_per_s:  # the softmax's exponentials on the special-function units (NOTE [flash attention])
            exps = flash_attention_exponentials(spec, b, tp=e.tp, cp=e.cp)
            core_fwd += exps["fwd"] / dev.exp_per_s
            core_bwd += exps["bwd"] / dev.exp_per_s
    else:
        core_fwd = ew["scores"] / hbm_per_s
        core_bwd = 2 * core_fwd
    if e.attention_kernel is not None:  # NOTE [attention kernel build]
        kernel = cluster.attention_kernel(e.attention_kernel)
        assert kernel is not None  # cluster_rejection names an unknown build first
        kf, kb = kernel.scale(spec.seq_len)
        ratio = attention_bwd_flops_ratio(e.attention)  # the backward's FLOPs over the forward's
        core_bwd = kb * (ratio * attn_f + core_bwd) - ratio * kf * attn_f
        attn_f, core_fwd = kf * attn_f, kf * core_fwd
    cast_fwd = cast_bwd = 0.0
    if prec.fp8:
        cast = fp8_cast_bytes_per_layer(spec, b, tp=e.tp, cp=e.cp, scaling=e.fp8_scaling, sp=e.sequence_parallel,
                                        tn_only=curve.fp8_tn_only)
        cast_fwd, cast_bwd = cast["fwd"] / hbm_per_s, cast["bwd"] / hbm_per_s
    block_f = ew["block"] / hbm_per_s
    permute_f = permutation_bytes(spec, e) / hbm_per_s  # the MoE token permutations, as many bytes backward
    ring_f = ring_b = 0.0
    # the GEMMs the userbuffers run, forward: what the TP collectives overlap (``tp_comm_overlap``; not the router
    # nor the routed experts' grouped GEMMs, NOTE [layer GEMMs])
    overlapped_f = 2 * b * spec.seq_len / split * _ring_weights(spec)[0] / gemm_rate
    if e.tp_comm_overlap and e.tp > 1:  # NOTE [userbuffers ring exchange]
        ring = ring_exchange_costs(spec, e, curve, gemm_rate, efficiency)
        ring_f, ring_b = ring["gemm_fwd"] + ring["reduce_bytes"] / hbm_per_s, ring["gemm_bwd"]
    layer_fwd = gemm_f + attn_f + block_f + core_fwd + cast_fwd + permute_f + pad_f + issue_wait_f + ring_f
    layer_bwd = (gemm_bwd_ratio * gemm_f + 2 * block_f + attention_bwd_flops_ratio(e.attention) * attn_f + core_bwd
                 + cast_bwd + permute_f + pad_f + issue_wait_b + ring_b)
    op_recompute = (op_recomputed_gemm_flops(spec, b) / split / gemm_rate + block_f - ew["last_add"] / hbm_per_s
                    if op else 0.0)
    if modules and modules != ("core_attn",):  # NOTE [recompute modules]: the up projections at the dense GEMMs' rate
        again = recompute_module_costs(spec, b, modules, tp=e.tp, sp=e.sequence_parallel, cp=e.cp)
        op_recompute = again["gemm"] / gemm_rate + again["bytes"] / hbm_per_s
    logits = logits_fwd_flops(spec, b) / split / other_rate
    loss = _LOSS_PASSES * _LOSS_ELEMENT_BYTES * b * spec.seq_len / e.cp * spec.vocab / e.tp / hbm_per_s
    result = _LayerCompute(gemm_s=gemm_f, overlapped_s=overlapped_f, attention_s=attn_f, core_fwd_s=core_fwd,
                           core_bwd_s=core_bwd, fwd_s=layer_fwd, bwd_s=layer_bwd,
                           op_recompute_s=op_recompute, logits_s=logits, loss_s=loss, hbm_per_s=hbm_per_s,
                           gemm_bwd_ratio=gemm_bwd_ratio)
    return _remember(cluster, key, result)


def stage_costs(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                precision: str = DEFAULT_PRECISION) -> StageCosts:
    """The per-layer and per-stage costs of one rank (module docstring, NOTE [time model]); checks the
    execution against the model and the cluster (:func:`cluster_rejection`)."""
    prec, fig = _checked(spec, execution, cluster, precision)
    return _stage_costs(execution, cluster, prec, fig)


def _checked(spec: TransformerSpec, e: Execution, cluster: Cluster, precision: str) -> tuple[Precision, _Figures]:
    """The checks of :func:`stage_costs` (the execution against the model, then the cluster, then the
    precision against the GPU: the first failing one's ConfigError), and the :class:`Precision` and the
    :func:`_figures` every part of one evaluation reads."""
    check_execution(e, spec)
    why = cluster_rejection(e, cluster)
    if why is not None:
        raise ConfigError(why)
    group_strides(e.tp, e.cp, e.dp, e.pp, e.ep)  # checks the degrees
    prec = cluster_precision(cluster, precision)
    return prec, _figures(spec, e, prec)


def _stage_costs(e: Execution, cluster: Cluster, prec: Precision, fig: _Figures) -> StageCosts:
    """:func:`stage_costs` of an execution :func:`_checked` passed, at ``prec``, from its figures ``fig``."""
    offload_bytes_per_s = _offload_bytes_per_s(cluster, e.gpus)
    spec = fig.spec
    b = e.micro_batch
    lc = _layer_compute(spec, e, cluster, prec)
    attn_f, core_fwd = lc.attention_s, lc.core_fwd_s
    hbm_per_s, gemm_bwd_ratio = lc.hbm_per_s, lc.gemm_bwd_ratio
    shares = fig.shares
    full = shares.recomputed  # the mean layer of a chunk under partial recompute (NOTE [partial recompute and offload])
    mean = _layer_costs(spec, e, cluster, prec, full)
    layer_fwd, layer_bwd, layer_recompute = mean.layer_fwd_s, mean.layer_bwd_s, mean.layer_recompute_s
    kinds = spec.layer_kinds()
    layer_kinds = () if kinds is None else tuple(_layer_costs(k, e, cluster, prec, full) for k in kinds)
    chunk_dense = dense_chunk_layers(fig.chunks, spec.dense_layers) if layer_kinds else ()

    def chunk_kinds(stage: int, ch: int) -> tuple[tuple[LayerCosts, int], ...]:
        """The chunk's layers by kind (NOTE [layer kinds])."""
        return by_kind(mean, layer_kinds, fig.chunks[stage][ch], chunk_dense[stage][ch] if chunk_dense else 0)

    act_bytes = spec.bytes_per_element * b * spec.seq_len / e.cp * spec.hidden

    split_layers, n_layers = fig.split_layers, fig.n_layers
    chunks = fig.chunks
    logits, loss = lc.logits_s, lc.loss_s
    last_fwd, last_bwd = logits + loss, gemm_bwd_ratio * logits + 2 * loss  # the last stage's head, each pass
    # a single stage's pass holds its head: what runs beside that pass (copies, gradients out) hides behind it too
    head_fwd, head_bwd = (last_fwd, last_bwd) if e.pp == 1 else (0.0, 0.0)
    p2p_bytes = act_bytes / e.tp
    sends = _boundary_p2p_s(cluster, e, p2p_bytes)
    hidden = (0.0,) * len(sends)
    if e.pp_comm_overlap:  # each send runs while the next chunk computes: exposed past the smallest chunk's forward
        smallest = min(sum(n * x.layer_fwd_s for x, n in chunk_kinds(st, ch))
                       for st, row in enumerate(chunks) for ch in range(len(row)))
        hidden = tuple(min(t, smallest) for t in sends)
    # the slowest boundary's send (of those the schedule crosses: the last stage's to the first with virtual
    # stages) is what a pass with no peer holds; every send's where the boundaries' are the same
    crossed = range(len(sends) if e.virtual_stages > 1 else len(sends) - 1)
    slowest = max(crossed, key=lambda b: sends[b], default=None)
    boundary = tuple(t - h for t, h in zip(sends, hidden, strict=True))
    p2p = 0.0 if slowest is None else boundary[slowest]
    p2p_hidden = 0.0 if slowest is None else hidden[slowest]
    if all(sends[b] == sends[slowest] for b in crossed):
        boundary = hidden = ()

    off_fwd = off_bwd = 0.0
    act_stage, groups = fig.act_stage, fig.groups
    # overlapped copies run beside the stage's pass, its head's on a single stage (the last of several stages is
    # charged as the others; where the copies are exposed the engine is below: docs/llm.md, "memory per rank")
    if e.offload_activations:  # back at the link's rate, out at it or the host's first-touch one
        move = shares.offloaded * act_stage / offload_bytes_per_s
        move_out = shares.offloaded * act_stage / activation_out_bytes_per_s(e, cluster, offload_bytes_per_s)
        if e.activation_offload_sync:  # each copy waits on the compute stream: exposed whole
            off_fwd += move_out
            off_bwd += move
        else:  # what the compute does not hide: max(0.0, x) as x if x > 0.0 else 0.0
            exposed_move = move_out - n_layers * layer_fwd - head_fwd
            off_fwd += exposed_move if exposed_move > 0.0 else 0.0
            exposed_move = move - n_layers * (layer_bwd + layer_recompute) - head_bwd
            off_bwd += exposed_move if exposed_move > 0.0 else 0.0
    if e.offload_weights:  # under ZeRO-3 each rank fetches its shard, the all-gathers bring the rest
        stored = _offloaded_weight_params(spec, e, groups, n_layers)
        move = prec.element_bytes * stored / tier_bytes_per_s(cluster, e.offload_tier, e.gpus)[1]
        off_fwd += max(0.0, move - n_layers * layer_fwd - head_fwd)
        off_bwd += max(0.0, move - n_layers * layer_bwd - head_bwd)

    fsdp_fwd = fsdp_bwd = last_fsdp = dp_tail = 0.0
    if e.zero >= 3:
        z3 = zero3_traffic(spec, e, prec.element_bytes)
        gather, reduce = _collectives_s(cluster, z3.gathers), _collectives_s(cluster, z3.reduces)
        chunk = max(1, n_layers // e.virtual_stages)
        # a CP ring's steps take the attention out of the layers the gathers hide behind, the last chunk's
        # logits and loss giving theirs up first: the first stage's chunks are priced (the only one's with one
        # stage), the last stage's differs by last_fsdp_s
        logits_fb = (last_fwd, last_bwd)
        ring = e.cp > 1 and e.cp_comm == "p2p"

        def exposed(moved: tuple[float, float]) -> tuple[float, float]:
            return (fsdp_exposed_s(gather, reduce, layer_fwd - moved[0] / chunk, chunk, prefetch=e.fsdp_prefetch,
                                   backward=False),
                    fsdp_exposed_s(gather, reduce, layer_bwd + layer_recompute - moved[1] / chunk, chunk,
                                   prefetch=e.fsdp_prefetch, backward=True))

        one = e.pp == 1 and e.virtual_stages == 1
        first_fb = exposed(ring_attention_moved_s(spec, e, cluster, layers=chunk, attention_fwd_s=attn_f + core_fwd,
                                                  recomputed=full, act_bytes=act_bytes,
                                                  last=logits_fb if one else (0.0, 0.0)) if ring else (0.0, 0.0))
        fsdp_fwd, fsdp_bwd = e.virtual_stages * first_fb[0], e.virtual_stages * first_fb[1]
        if ring and not one:
            last_fb = exposed(ring_attention_moved_s(spec, e, cluster, layers=chunk, attention_fwd_s=attn_f + core_fwd,
                                                     recomputed=full, act_bytes=act_bytes, last=logits_fb))
            last_fsdp = sum(last_fb) - sum(first_fb)
        dp_full = _collectives_s(cluster, z3.step)
        dp_tail = _collectives_s(cluster, z3.after_backward)
    else:
        dp_full = _dp_reduce_s(cluster, groups, prec.element_bytes)
    hidden_by = 0.0
    if e.dp_overlap:  # the first stage's last backward pass (NOTE [overlapped reduction])
        hidden_by = (sum(n * (x.layer_bwd_s + x.layer_recompute_s + x.layer_tp_bwd_s + x.layer_cp_bwd_s
                              + x.layer_ep_bwd_s) for x, n in chunk_kinds(0, 0))
                     + (fsdp_bwd / e.virtual_stages if e.zero >= 3 else 0.0)
                     + (p2p if e.pp > 1 else 0.0)
                     + head_bwd)

    opt_params = fig.params[e.zero >= 1]
    offload_step = 0.0
    adam_bytes = (foreach_adam_bytes(2 if prec.element_bytes < 4 else 4) if e.optimizer_kernels == "foreach"
                  else _ADAM_TRAFFIC_BYTES)  # NOTE [foreach optimizer]
    optimizer = opt_params * adam_bytes / hbm_per_s
    if e.cpu_optimizer:  # the gradients leave beside the first stage's last backward, its head's with one stage
        cpu = cpu_optimizer_step(e, cluster, opt_params,
                                 last_backward_s=n_layers * (layer_bwd + layer_recompute) + head_bwd,
                                 iteration_compute_s=e.micro_batches * n_layers * (layer_fwd + layer_bwd
                                                                                   + layer_recompute),
                                 element_bytes=prec.element_bytes, optimizer_bytes=prec.optimizer_bytes)
        optimizer, offload_step = cpu.optimizer_s, cpu.transfer_s
    elif e.offload_optimizer:
        out, back = tier_bytes_per_s(cluster, e.offload_tier, e.gpus)
        offload_step = prec.optimizer_bytes * opt_params * (1 / out + 1 / back)
    return StageCosts(
        layers_per_stage=n_layers, **mean._asdict(), p2p_s=p2p,
        last_fwd_s=last_fwd, last_bwd_s=last_bwd, offload_fwd_s=off_fwd,
        offload_bwd_s=off_bwd, fsdp_fwd_s=fsdp_fwd, fsdp_bwd_s=fsdp_bwd, last_fsdp_s=last_fsdp,
        dp_full_s=dp_full, dp_hidden_s=hidden_by, dp_tail_s=dp_tail, optimizer_s=optimizer,
        offload_step_s=offload_step, stage_layers=split_layers, chunk_layers=chunks, recomputed_share=full,
        p2p_hidden_s=p2p_hidden, boundary_p2p_s=boundary, boundary_hidden_s=hidden, layer_kinds=layer_kinds,
        chunk_dense=chunk_dense)


def _layer_costs(spec: TransformerSpec, e: Execution, cluster: Cluster, prec: Precision, full: float) -> LayerCosts:
    """The :class:`LayerCosts` of ``spec``'s (mean) layer under ``e`` at ``prec`` on ``cluster``, ``full`` the
    share of the layers fully recomputed (NOTE [time model])."""
    tp_stride = group_strides(e.tp, e.cp, e.dp, e.pp, e.ep)[0]
    lc = _layer_compute(spec, e, cluster, prec)
    attn_f, core_fwd, layer_fwd, layer_bwd = lc.attention_s, lc.core_fwd_s, lc.fwd_s, lc.bwd_s
    gemm_bwd_ratio = lc.gemm_bwd_ratio
    if e.recompute == "full":
        layer_recompute = full * layer_fwd
    elif e.recompute == OP_RECOMPUTE:  # NOTE [op-level selective recompute]: checkpoint stops before the last add
        layer_recompute = lc.op_recompute_s
    elif e.recompute == "selective":  # NOTE [recompute modules]
        layer_recompute = (attn_f + core_fwd if e.recomputes_attention else 0.0) + lc.op_recompute_s
    else:
        layer_recompute = 0.0
    cp = cp_exchange(spec, e, cluster, attention_fwd_s=attn_f + core_fwd)
    ep_fwd, ep_bwd = ep_all_to_all_s(spec, e, cluster)
    ep_hidden = a2a_overlap_hidden_s(e, (ep_fwd, ep_bwd), (layer_fwd, layer_bwd + layer_recompute))
    ep_fwd, ep_bwd = ep_fwd - ep_hidden[0], ep_bwd - ep_hidden[1]

    act_bytes = spec.bytes_per_element * e.micro_batch * spec.seq_len / e.cp * spec.hidden
    tp_one = _tp_allreduce_s(cluster, e.tp, tp_stride, e.sequence_parallel, act_bytes)
    tp_fwd, tp_bwd_plain, tp_bwd_full = 2 * tp_one, 2 * tp_one, 4 * tp_one
    hide_fwd = hide_bwd = 0.0
    if e.tp_comm_overlap:
        # each collective overlaps the GEMM it pairs with (userbuffers): hidden up to those GEMMs' time
        ub = lc.overlapped_s
        tp_fwd = max(0.0, tp_fwd - ub)
        tp_bwd_plain = max(0.0, tp_bwd_plain - gemm_bwd_ratio * ub)
        tp_bwd_full = max(0.0, tp_bwd_full - gemm_bwd_ratio * ub - ub)
        hide_fwd, hide_bwd = ub, gemm_bwd_ratio * ub + full * ub
    tp_bwd = full * tp_bwd_full + (1.0 - full) * tp_bwd_plain if full else tp_bwd_plain
    return LayerCosts(
        layer_fwd_s=layer_fwd, layer_bwd_s=layer_bwd, layer_recompute_s=layer_recompute, layer_tp_fwd_s=tp_fwd,
        layer_tp_bwd_s=tp_bwd, layer_cp_fwd_s=cp.fwd_exposed_s, layer_cp_bwd_s=cp.bwd_exposed_s,
        layer_ep_fwd_s=ep_fwd, layer_ep_bwd_s=ep_bwd, layer_ep_hidden_fwd_s=ep_hidden[0],
        layer_ep_hidden_bwd_s=ep_hidden[1], layer_attention_fwd_s=attn_f + core_fwd, layer_tp_hide_fwd_s=hide_fwd,
        layer_tp_hide_bwd_s=hide_bwd)


def _at_precision(spec: TransformerSpec, prec: Precision) -> TransformerSpec:
    """``spec`` with the activation element size of ``prec``."""
    if spec.bytes_per_element == prec.element_bytes:
        return spec
    return replace(spec, bytes_per_element=prec.element_bytes)


class _Figures(NamedTuple):
    """What :func:`stage_costs`, :func:`rank_traffic` and :func:`step_record` each derive from the model, the
    execution and the precision alone, derived once (:func:`_figures`)."""

    spec: TransformerSpec  # the model at the precision's element size
    split_layers: tuple[int, ...]  # layers of each pipeline stage
    chunks: tuple[tuple[int, ...], ...]  # layers of each stage's model chunks
    n_layers: int  # the most of them
    shares: LayerShares  # the layers' recompute and offload shares
    act_stage: float  # activation bytes one micro-batch stashes on the fullest stage
    groups: tuple[ParamGroup, ...]  # the first stage's parameters by reduction group
    params: tuple[float, float]  # the rank's parameters whole and sharded


@pure_cache(64)
def _figures(spec: TransformerSpec, e: Execution, prec: Precision) -> _Figures:
    """The :class:`_Figures` of ``spec`` run as ``e`` at ``prec``."""
    spec = _at_precision(spec, prec)
    split_layers = stage_layers(e, spec)
    n_layers = max(split_layers)
    return _Figures(spec=spec, split_layers=split_layers, chunks=chunk_layers(e, spec), n_layers=n_layers,
                    shares=layer_shares(e, spec),
                    act_stage=n_layers * _activation_bytes(spec, e, prec), groups=_param_groups(spec, e),
                    params=_rank_params(spec, e))


@pure_cache(64)
def _activation_bytes(spec: TransformerSpec, e: Execution, prec: Precision) -> float:
    """One (mean) layer's stashed bytes per micro-batch on one rank under ``e`` and ``prec``: with a recompute
    count, the chunk's stored inputs and its plain layers' activations over its layers (NOTE [partial recompute
    and offload])."""
    def per_layer(recompute: str) -> float:
        return activation_bytes_per_layer(spec, e.micro_batch, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                          recompute=recompute, attention=e.attention,  # type: ignore[arg-type]
                                          fp8_gemm_inputs=prec.fp8, fp8_scaling=e.fp8_scaling,
                                          recompute_modules=e.recompute_modules)
    if e.recompute_num_layers is None:
        return per_layer(e.recompute)
    shares = layer_shares(e, spec)
    return shares.stored_inputs * per_layer("full") + (1.0 - shares.recomputed) * per_layer("none")


@pure_cache(64)
def _recompute_group_bytes(spec: TransformerSpec, e: Execution, prec: Precision) -> float:
    """Activations ``uniform`` recompute holds beyond full recompute's while one group runs its backward: the
    group's other ``N - 1`` layers' (one micro-batch; full recompute's one live layer is not counted either)."""
    if e.recompute_num_layers is None or e.recompute_method != "uniform":
        return 0.0
    plain = activation_bytes_per_layer(spec, e.micro_batch, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                       recompute="none", attention=e.attention, fp8_gemm_inputs=prec.fp8,
                                       fp8_scaling=e.fp8_scaling)
    return (layer_shares(e, spec).group - 1) * plain


@pure_cache(64)
def _offloaded_weight_params(spec: TransformerSpec, e: Execution, groups: tuple[ParamGroup, ...],
                             n_layers: int) -> float:
    """Parameters of the rank's stored weights that ``offload_weights`` keeps in the second tier: all of them
    (its shard under ZeRO-3), or with ``offload_num_layers`` only those layers' (NOTE [partial recompute and
    offload])."""
    if e.offload_num_layers is None:
        return _sharded(groups, e, e.zero >= 3)
    layers = layer_shares(e, spec).offloaded * n_layers
    return layers * _sharded(_layer_groups(spec, e), e, e.zero >= 3)


def llm_step(spec: TransformerSpec, execution: Execution, cluster: Cluster, *, mode: str = "fast",
             precision: str = DEFAULT_PRECISION, **ranks_options: object) -> LlmStep:
    """Predict one training iteration of ``spec`` run as ``execution`` on ``cluster`` (module docstring).

    ``mode="fast"`` (default) is the closed form over one representative rank per pipeline role (every
    stage's ranks are symmetric; the last stage adds the logits): O(1) in the number of GPUs.
    ``mode="ranks"`` schedules every rank's micro-batches explicitly (:func:`mcdla.sim.llm_ranks.simulate_ranks`,
    which takes ``ranks_options`` such as a per-rank ``slowdown`` or ``layers_per_stage``) for asymmetric
    systems; it returns the same record with ``iteration_s`` and ``bubble_s`` from the schedule.
    """
    if mode == "ranks":
        from mcdla.sim.llm_ranks import ranks_step  # the per-rank engine builds on this module

        return ranks_step(spec, execution, cluster, precision=precision, **ranks_options)  # type: ignore[arg-type]
    if mode != "fast":
        raise ConfigError(f"llm_step.mode: got {brief(mode)}; must be fast or ranks")
    if ranks_options:
        raise ConfigError(f"llm_step: got {', '.join(sorted(ranks_options))} with mode=fast; "
                          "per-rank options need mode=ranks")
    e = execution
    prec, fig = _checked(spec, e, cluster, precision)
    c = _stage_costs(e, cluster, prec, fig)
    # chunks of one stage differ when the embedding or the loss counts as a layer or a layout names them, and
    # stages differ where some hold dense leading layers (NOTE [layer kinds])
    if (_uneven(c.stage_layers) or len({n for row in c.chunk_layers for n in row}) > 1
            or len({n for row in c.chunk_dense for n in row}) > 1):
        # An uneven split: the slowest stage sets the pace, but how long the others fill, drain and hold it
        # up depends on where it sits, so the schedule itself is the closed form (O(dp p m v) ops).
        from mcdla.sim.llm_ranks import ranks_step

        return ranks_step(spec, execution, cluster, precision=precision)
    p, v = e.pp, e.virtual_stages
    sends = c.boundary_p2p_s  # () where every boundary's send takes the same time
    stage_mid = c.stage_s(c.layers_per_stage, v, stage=p - 1 if sends else None)  # the last stage's, no logits
    # no shared link priced as idle (NOTE [link floor] in sim/llm_floor.py): the stretches are exposed offload
    zero3 = zero3_traffic(spec, e, prec.element_bytes) if e.zero >= 3 else None
    floors = link_floors(e, cluster, c, _rank_traffic(e, prec, fig), zero3)
    stretch = floors.stage_s - stage_mid
    stretch = stretch if stretch > 0.0 else 0.0  # max(0.0, stretch), max's own comparison
    stage_mid += stretch
    dp_exposed = c.dp_exposed_s
    dp_stretch = max(0.0, floors.dp_exposed_s - dp_exposed) + (e.pp - 1) * floors.last_backward_s
    stage_last = stage_mid + c.last_fwd_s + c.last_bwd_s + c.last_fsdp_s
    m = e.micro_batches
    # The exact length of Megatron's (interleaved) 1F1B schedule when every stage but the last costs
    # stage_mid and the last is the slowest: the last stage never waits once fed, the fill and the drain are
    # (p - 1) / v of a middle stage (NOTE [rank schedule] in sim/llm_ranks.py; tested equal to the per-rank
    # schedule in tests/sim/test_llm_ranks.py).
    if not sends:
        bubble = (p - 1) / v * stage_mid
        # pp_comm_overlap: the hidden part of each send still delays its receiver: the fill passes v p - 1 chunk
        # boundaries before the last stage runs the last chunk, and the drain as many back (NOTE [rank schedule])
        bubble += 2 * (v * p - 1) * c.p2p_hidden_s
    else:
        # NOTE [pipeline sends]: stage boundaries on different links
        if v == 1 and all(c.stage_s(c.layers_per_stage, v, stage=s) + stretch <= stage_last for s in range(p - 1)):
            # the last stage paces and never waits once fed: the fill is the first micro-batch's forward through
            # the other stages, the drain the last one's backward back, each pass with its own send
            bubble = (p - 1) * (stage_mid - c.stage_sends_s(p - 1, v))
            bubble += sum(c.send_s(s, 0, v, forward=True) + c.send_s(s, 0, v, forward=False) for s in range(p - 1))
            bubble += 2 * sum(c.boundary_hidden_s[:p - 1])
        else:  # interleaved: the schedule itself, one replica (O(p m v))
            from mcdla.sim.llm_ranks import pipeline_s

            bubble = pipeline_s(c, e, stretch_s=stretch) - m * stage_last
    iteration = m * stage_last + bubble + dp_exposed + dp_stretch + c.optimizer_s + c.offload_step_s
    dp_shared = 0.0 if floors.stage_s else dp_stretch  # without offload: the shared links slow the reduction
    contention = m * stretch + dp_stretch  # what rounds away against the iteration is no contention
    parts = c.iteration_parts(m, e.virtual_stages)
    parts["offload_s"] += m * stretch + dp_stretch - dp_shared
    return _record(e, cluster, c, prec, fig, iteration, bubble, dp_shared_s=dp_shared,
                   contention_s=contention if contention > 1e-12 * iteration else 0.0, **parts)


def pacing_stage_parts(c: StageCosts, e: Execution) -> tuple[int, dict[str, float]]:
    """The slowest pipeline stage (the last among equals) and its :meth:`StageCosts.stage_parts` over the
    iteration's micro-batches, the steady-state parts both modes report (an uneven split may pace elsewhere)."""
    layers = c.stage_layers or (c.layers_per_stage,) * e.pp
    times = [c.stage_s(layers[s], e.virtual_stages, last=s == e.pp - 1, stage=s) for s in range(e.pp)]
    pace = max(range(e.pp), key=lambda s: (times[s], s))
    return pace, c.stage_parts(layers[pace], e.micro_batches, e.virtual_stages, last=pace == e.pp - 1, stage=pace)


def step_record(spec: TransformerSpec, e: Execution, cluster: Cluster, c: StageCosts, *, precision: str,
                iteration: float, bubble: float, compute_s: float, recompute_s: float, tp_comm_s: float,
                pp_comm_s: float, offload_s: float, fsdp_comm_s: float = 0.0, cp_comm_s: float = 0.0,
                ep_comm_s: float = 0.0, dp_shared_s: float | None = None, contention_s: float = 0.0) -> LlmStep:
    """The :class:`LlmStep` of a predicted iteration: FLOPs, MFU and one rank's memory (both modes, so the
    per-rank schedule of :mod:`mcdla.sim.llm_ranks` reports the same record). ``dp_shared_s``: what the shared
    links add to the exposed reduction (the closed form's link floor), ``contention_s`` the record's field."""
    prec = precision_of(precision)
    return _record(e, cluster, c, prec, _figures(spec, e, prec), iteration, bubble, compute_s, recompute_s,
                   tp_comm_s, pp_comm_s, offload_s, fsdp_comm_s, cp_comm_s, ep_comm_s, dp_shared_s, contention_s)


def _record(e: Execution, cluster: Cluster, c: StageCosts, prec: Precision, fig: _Figures, iteration: float,
            bubble: float, compute_s: float, recompute_s: float, tp_comm_s: float, pp_comm_s: float,
            offload_s: float, fsdp_comm_s: float, cp_comm_s: float, ep_comm_s: float, dp_shared_s: float | None,
            contention_s: float) -> LlmStep:
    """:func:`step_record` on the precision ``prec`` and the figures ``fig`` (:func:`_figures`) already looked
    up (:func:`llm_step` calls it once per evaluation)."""
    dev = cluster.device
    spec = fig.spec
    flops_per_s = dev.flops_per_s(prec.gemm_peak)
    m = e.micro_batches
    n_layers = c.layers_per_stage
    act_stage = fig.act_stage if n_layers == fig.n_layers else n_layers * _activation_bytes(spec, e, prec)
    shares = fig.shares
    dp_exposed, optimizer = c.dp_exposed_s, c.optimizer_s
    model_flops = model_flops_per_iteration(spec, e.global_batch)

    in_flight = min(m, e.pp) * (1 + (e.pp - 1) / (e.pp * e.virtual_stages)) if e.virtual_stages > 1 else min(m, e.pp)
    activations = act_stage * in_flight
    if _uneven(c.stage_layers):  # uneven split: the stage holding the most layers in flight (1F1B: p - s)
        per_layer = act_stage / n_layers
        activations = per_layer * max(n * min(m, e.pp - s) * in_flight / min(m, e.pp)
                                      for s, n in enumerate(c.stage_layers))
    group_bytes = _recompute_group_bytes(spec, e, prec) if e.recompute_num_layers is not None else 0.0
    weight_bytes = prec.element_bytes + prec.fp8_weight_bytes  # with Transformer Engine's fp8 copy
    params = fig.params
    weights = weight_bytes * params[e.zero >= 3]
    grads = prec.element_bytes * params[e.zero >= 2]
    if e.cpu_optimizer and e.zero < 3:  # NOTE [ZeRO-Offload]: each bucket leaves, then is freed
        grads = min(grads, prec.element_bytes * (2.0 if e.dp_overlap else 1.0) * e.reduce_bucket_numel)
    if e.zero >= 3:  # the layer computing and the ones prefetched, whole, with their gradients
        gathered = min(e.fsdp_prefetch + 1, n_layers) * sum(g.params for g in _layer_groups(spec, e))
        weights += weight_bytes * gathered
        grads += prec.element_bytes * gathered
    opt = prec.optimizer_bytes * params[e.zero >= 1]
    # offloaded weights: the stored copy (the shard); the gathered layers are in HBM while they compute
    offloaded_weights = (weight_bytes * _offloaded_weight_params(spec, e, fig.groups, n_layers)
                         if e.offload_weights else 0.0)
    on_tier = offloaded_weights + (opt if e.offload_optimizer else 0.0)
    offloaded_activations = shares.offloaded * activations if e.offload_activations else 0.0
    offloaded = offloaded_activations + on_tier
    device_bytes = activations + group_bytes + weights + grads + opt - offloaded
    pool_bytes = 0.0 if cluster.offload is None else cluster.pool_link_for_gpus(e.gpus).pool_bytes
    in_pool = offloaded - (on_tier if e.offload_tier == "nvme" else 0.0)
    nvme = cluster.nvme if e.offload_tier == "nvme" else None
    nvme_fits = e.offload_tier != "nvme" or (nvme is not None
                                            and on_tier <= nvme.capacity_bytes / min(e.gpus, cluster.gpus_per_node))
    return LlmStep(
        iteration_s=iteration,
        compute_s=compute_s,
        recompute_s=recompute_s,
        tp_comm_s=tp_comm_s,
        pp_comm_s=pp_comm_s,
        bubble_s=bubble,
        dp_comm_s=dp_exposed if dp_shared_s is None else dp_exposed + dp_shared_s,
        fsdp_comm_s=fsdp_comm_s,
        optimizer_s=optimizer,
        offload_s=offload_s,
        model_flops=model_flops,
        hardware_flops=hardware_flops_per_iteration(spec, e.global_batch, e.recompute, attention=e.attention,
                                                    recompute_share=shares.recomputed,
                                                    recompute_modules=e.recompute_modules),
        mfu=model_flops / (e.gpus * flops_per_s * iteration),
        device_bytes=device_bytes,
        offloaded_bytes=offloaded,
        fits=device_bytes <= dev.hbm_bytes and in_pool <= pool_bytes and nvme_fits,
        weight_bytes=weights,
        gradient_bytes=grads,
        optimizer_bytes=opt,
        activation_bytes=activations + group_bytes,
        cp_comm_s=cp_comm_s,
        ep_comm_s=ep_comm_s,
        offloaded_activation_bytes=offloaded_activations,
        offloaded_weight_bytes=offloaded_weights,
        contention_s=contention_s,
    )


@slot_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RankTraffic:
    """The bytes one rank moves, as :func:`stage_costs` prices them, for the lowering onto the program IR
    (:mod:`mcdla.sim.llm_lower`) and the per-link floor (:mod:`mcdla.sim.llm_floor`).

    ``activation_bytes``: one TP all-reduce's buffer (``b s h / cp``); ``p2p_bytes``: one pipeline send;
    ``stage_activation_bytes``: what one micro-batch leaves on the stage (offloaded in forward, back in backward);
    ``weight_bytes``: the rank's stored weights (its shard under ZeRO-3; fetched for each forward and backward
    when offloaded);
    ``optimizer_bytes``: its optimizer-state shard (crosses the offload link twice per step); ``gradient_bytes``:
    the buffer of the data-parallel reduction, ``gradient_groups`` the same bytes by reduction group, ``(bytes,
    size, stride)`` each (:func:`~mcdla.sim.llm_moe.rank_param_groups`: the dense gradients over the ``dp x cp``
    replicas, the routed experts' over the ``dp cp / ep`` ranks holding them); ``offload_activation_bytes`` and
    ``offload_weight_bytes``: what ``offload_activations`` and ``offload_weights`` move per micro-batch (all of
    ``stage_activation_bytes`` and ``weight_bytes``, or ``offload_num_layers``' share of them); ``kv_block_bytes``:
    one layer's K/V block a context-parallel rank exchanges (:func:`~mcdla.sim.llm_cp.kv_block_bytes`);
    ``all_to_all_bytes``: one MoE dispatch's (or combine's) send buffer
    (:func:`~mcdla.sim.llm_moe.all_to_all_bytes`), run ``moe_layer_share`` times per mean layer (the share of the
    model's layers that are MoE layers).
    """

    activation_bytes: float
    p2p_bytes: float
    stage_activation_bytes: float
    weight_bytes: float
    optimizer_bytes: float
    gradient_bytes: float
    offload_activation_bytes: float = 0.0
    offload_weight_bytes: float = 0.0
    gradient_groups: tuple[tuple[float, int, int], ...] = ()
    kv_block_bytes: float = 0.0
    all_to_all_bytes: float = 0.0
    moe_layer_share: float = 0.0


def rank_traffic(spec: TransformerSpec, execution: Execution, precision: str = DEFAULT_PRECISION) -> RankTraffic:
    """The bytes of :class:`RankTraffic` for ``execution`` at ``precision`` (the figures :func:`stage_costs`
    divides by bandwidths)."""
    prec = precision_of(precision)
    return _rank_traffic(execution, prec, _figures(spec, execution, prec))


def _rank_traffic(e: Execution, prec: Precision, fig: _Figures) -> RankTraffic:
    """:func:`rank_traffic` on the precision ``prec`` and the figures ``fig`` (:func:`_figures`) already looked
    up."""
    spec, groups, n_layers, stage_act, params = fig.spec, fig.groups, fig.n_layers, fig.act_stage, fig.params
    act = spec.bytes_per_element * e.micro_batch * spec.seq_len / e.cp * spec.hidden
    params_rank = 0  # all parameters on the rank of the first stage, summed as sum() sums
    for g in groups:
        params_rank += g.params
    return RankTraffic(
        activation_bytes=act, p2p_bytes=act / e.tp,
        stage_activation_bytes=stage_act,
        weight_bytes=prec.element_bytes * params[e.zero >= 3],
        optimizer_bytes=prec.optimizer_bytes * params[e.zero >= 1],
        gradient_bytes=prec.element_bytes * params_rank,
        offload_activation_bytes=fig.shares.offloaded * stage_act if e.offload_activations else 0.0,
        offload_weight_bytes=(prec.element_bytes * _offloaded_weight_params(spec, e, groups, n_layers)
                              if e.offload_weights else 0.0),
        kv_block_bytes=kv_block_bytes(spec, e.micro_batch, tp=e.tp, cp=e.cp) if e.cp > 1 else 0.0,
        gradient_groups=tuple([(prec.element_bytes * g.params, g.size, g.stride) for g in groups]),
        all_to_all_bytes=all_to_all_bytes(spec, e) if e.ep > 1 and spec.moe_layers else 0.0,
        moe_layer_share=spec.moe_layers / spec.layers)
