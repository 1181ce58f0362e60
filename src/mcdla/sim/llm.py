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
  ``xV``) divided by ``tp * cp``, at ``peak * gemm_efficiency(h / tp)``; memory-bound elementwise kernels (norms,
  bias-dropout-add, activation function, softmax and its dropout) at ``hbm_bytes_per_s *
  memory_efficiency``; backward costs twice the forward. Recompute adds a forward (``full``) or the
  attention core with its softmax and dropout (``selective``).
* Tensor parallelism: two all-reduces of the layer's ``b s h`` activation per forward and two per backward
  (with sequence parallelism an all-gather plus a reduce-scatter, the same ring traffic), on the TP group's
  dimensions (the NVLink domain, in-network where the switch reduces);
  full recomputation repeats the forward ones. Not overlapped with compute (Megatron-LM 2021-2022).
* Pipeline: per micro-batch a stage runs its ``layers / pp`` layers forward and backward plus, per virtual
  chunk, a point-to-point send of the activation and one of its gradient (``b s h / tp`` bytes with
  Megatron's scatter/gather) over the dimension neighbouring stages are apart on; the last stage adds the vocabulary projection and
  the loss. Iteration = ``m * T_last + (p - 1) / v * T_middle``, the exact length of the (interleaved) 1F1B
  schedule of these stages (the bubble ``(p - 1) / (m v)`` when balanced); ``mode="ranks"`` schedules every
  rank instead (``sim/llm_ranks.py``), as does an uneven split (``layers_first_stage``/``layers_last_stage``,
  or the embedding and the loss counted as layers), where the slowest stage sets the pace.
* Data parallelism: one all-reduce of the rank's gradients on the DP group's dimensions (hierarchical over
  NVLink and the network when a node holds several members; ZeRO-1/2: reduce-scatter + all-gather, the same
  traffic) after the last backward, or overlapped with the last micro-batch's backward (``dp_overlap``); then
  the Adam step streams the rank's optimizer state through HBM.
* NOTE [ZeRO-3 as run]: FSDP/ZeRO-3 gathers each layer's 16-bit weights (all-gather over the shard group) in
  every micro-batch's forward and again in its backward, and reduce-scatters the layer's gradients in that
  backward; a full recompute runs inside the layer's backward and uses the backward's gather (FSDP's
  pre-backward unshard, DeepSpeed's fetch of the sub-module, both before the recomputed forward). The gathers
  are prefetched ``fsdp_prefetch`` layers ahead and the collectives run one at a time in issue order on the
  group's links while the layers compute (:func:`fsdp_exposed_s`); what the compute does not hide is
  ``fsdp_comm_s``. Once per iteration the non-layer parameters are reduce-scattered and gathered, and under
  HSDP (``hsdp_shard``) each gradient shard is all-reduced across the replicas (``dp_comm_s``). Memory: the
  model state over the shard group plus ``fsdp_prefetch + 1`` whole layers' weights and gradients.
* CPU optimizer and NVMe tier (ZeRO-Offload, ZeRO-Infinity): :mod:`mcdla.sim.llm_offload`.
* Offload: activations go out during forward and come back during backward, weights are fetched for every
  forward and backward of a micro-batch, optimizer state crosses the link twice per step, at the offload
  bandwidth each GPU gets while every GPU of its node offloads; what the compute does not hide is exposed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster
from mcdla.sim.collective_models import collective_time, p2p_time
from mcdla.sim.llm_offload import (ADAM_TRAFFIC_BYTES, GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, cpu_optimizer_step,
                                   tier_bytes_per_s, tier_rejection)
from mcdla.workload.execution import Execution, check_execution, chunk_layers, stage_layers
from mcdla.workload.parallel_dims import ParallelDims
from mcdla.workload.transformer import (TransformerSpec, activation_bytes_per_layer, hardware_flops_per_iteration,
                                        layer_fwd_flops, logits_fwd_flops, model_flops_per_iteration)

__all__ = ["DEFAULT_PRECISION", "LlmStep", "StageCosts", "cluster_rejection", "elementwise_bytes_per_layer",
           "fsdp_exposed_s", "llm_step", "pacing_stage_parts", "stage_costs", "step_record"]

DEFAULT_PRECISION = "bf16"
"""The number format of the GEMMs (a run choice, not hardware): the key of the device's ``peak_flops_per_s``."""

# Bytes per parameter of mixed-precision Adam and of its step (defined with the CPU optimizer that shares them).
_WEIGHT_BYTES, _GRAD_BYTES, _OPTIMIZER_BYTES, _ADAM_TRAFFIC_BYTES = (WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES,
                                                                     ADAM_TRAFFIC_BYTES)
# Vocabulary-parallel cross entropy works in fp32 over the b x s x V/tp logits: about four passes each way.
_LOSS_PASSES, _LOSS_ELEMENT_BYTES = 4, 4


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmStep:
    """One iteration's predicted time (seconds) and its parts, and one rank's memory (bytes).

    The parts add up to ``iteration_s``: ``compute_s`` (forward and backward of the slowest stage over all
    micro-batches, logits included), ``recompute_s``, ``tp_comm_s``, ``pp_comm_s``, ``bubble_s``,
    ``dp_comm_s`` (exposed), ``fsdp_comm_s`` (ZeRO-3's exposed per-layer gathers and reduce-scatters),
    ``optimizer_s``, ``offload_s`` (exposed). ``fits``: the rank's device bytes
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
    """Activations saved for backward by the micro-batches in flight."""

    def to_dict(self) -> dict[str, float | bool]:
        """Plain data for JSON."""
        return asdict(self)


def elementwise_bytes_per_layer(spec: TransformerSpec, micro_batch: int, *, tp: int = 1, sp: bool = False,
                                cp: int = 1) -> dict[str, float]:
    """HBM bytes of a layer's memory-bound forward kernels on one rank: ``block`` (two norms read and write
    ``b s h``; two bias-dropout-adds read input and residual, write output and a 1-byte mask; the activation
    function reads its input(s) and writes ``b s f``) and ``scores`` (softmax reads and writes the ``a s^2 b``
    scores, their dropout reads, writes and stores a mask). Counted from the kernels Megatron-LM runs (fused
    bias-GELU, fused scale-mask-softmax, fused bias-dropout-add); no fitting."""
    e = spec.bytes_per_element
    b, s, h = micro_batch, spec.seq_len / cp, spec.hidden
    mask = 1.0 if spec.dropout else 0.0
    sbh = s * b * h
    norms = 2 * 2 * e * sbh
    residual = 2 * (3 * e + mask) * sbh
    activation = spec.ffn_matrices * e * s * b * spec.ffn_width_per_token  # GELU: read f, write f; SwiGLU: read 2f
    scores = spec.heads * s * spec.seq_len * b * (2 * e + mask * (2 * e + 1))
    return {"block": (norms + residual) / (tp if sp else 1) + activation / tp, "scores": scores / tp}


def _stage_params(spec: TransformerSpec, e: Execution) -> float:
    """Parameters on the rank of the first stage (the most layers any stage has, and the embedding), per TP
    rank."""
    per_stage = max(stage_layers(e, spec)) * spec.params_per_layer() + spec.embedding_params()
    return per_stage / e.tp


def _tp_allreduce_s(cluster: Cluster, layout: ParallelDims, sequence_parallel: bool, nbytes: float) -> float:
    """One TP all-reduce (or its all-gather + reduce-scatter pair) of ``nbytes`` per rank."""
    dims = cluster.group_dims(layout.tp, layout.stride("tp"))
    if sequence_parallel:
        return collective_time("all-gather", nbytes, dims) + collective_time("reduce-scatter", nbytes, dims)
    return collective_time("all-reduce", nbytes, dims)


def _dp_reduce_s(cluster: Cluster, layout: ParallelDims, nbytes: float) -> float:
    """The data-parallel gradient all-reduce of ZeRO 0-2 (ZeRO-1/2's reduce-scatter + all-gather: the same
    traffic)."""
    return collective_time("all-reduce", nbytes, cluster.group_dims(layout.dp, layout.stride("dp")))


def _zero3_step_s(cluster: Cluster, layout: ParallelDims, e: Execution, other_bytes: float,
                  shard_grad_bytes: float) -> float:
    """What ZeRO-3 reduces once per iteration: the parameters outside the layers (embedding; ``other_bytes``)
    reduce-scattered and gathered back over the shard group, and under HSDP the all-reduce of each rank's
    gradient shard (``shard_grad_bytes``) across the replicas."""
    (shard, stride), (replicas, rstride) = _shard_groups(layout, e)
    dims = cluster.group_dims(shard, stride)
    step = collective_time("reduce-scatter", other_bytes, dims) + collective_time("all-gather", other_bytes, dims)
    return step + collective_time("all-reduce", shard_grad_bytes, cluster.group_dims(replicas, rstride))


def _shard_groups(layout: ParallelDims, e: Execution) -> tuple[tuple[int, int], tuple[int, int]]:
    """(size, stride) of the ZeRO shard group and of the replica group across shards (HSDP; size 1 without):
    the shard group is ``shard_ranks`` consecutive members of the DP group."""
    stride, shard = layout.stride("dp"), e.shard_ranks
    return (shard, stride), (e.dp // shard, stride * shard)


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


def _p2p_s(cluster: Cluster, layout: ParallelDims, nbytes: float) -> float:
    """One pipeline send between neighbouring stages: rank 0 of stage 0 to its peer ``stride("pp")`` ranks on,
    across the dimension that separates them (:meth:`Cluster.dim_between`)."""
    if layout.pp == 1:
        return 0.0
    return p2p_time(nbytes, cluster.dim_between(0, layout.stride("pp")))


def _offload_bytes_per_s(cluster: Cluster) -> float:
    """Each GPU's offload bandwidth with every GPU offloading (0 without a pool)."""
    return 0.0 if cluster.offload is None else cluster.offload.offload_bytes_per_s


def cluster_rejection(execution: Execution, cluster: Cluster) -> str | None:
    """Why ``cluster`` cannot run ``execution`` (TP x CP beyond one NVLink domain, offload without a pool), or
    None; the message of :func:`stage_costs`' ConfigError."""
    e = execution
    if e.tp * e.cp > cluster.gpus_per_node:
        return (f"execution.tp: got tp*cp = {e.tp * e.cp}; must fit one NVLink domain "
                f"({cluster.gpus_per_node} GPUs per node)")
    if (e.offload_activations or e.offload_weights or e.offload_optimizer) and cluster.offload is None:
        return "execution.offload_*: offload asked but the cluster has no second tier (no pool memory)"
    if e.gpus > cluster.n_devices:
        return f"execution.gpus: got {e.gpus}; must be at most the {cluster.n_devices} GPUs of {cluster.name}"
    return tier_rejection(e, cluster)


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
    layer_bwd_s: float  # backward compute of one layer (2 x forward)
    layer_recompute_s: float  # recomputation in the backward of one layer
    layer_tp_fwd_s: float  # TP collectives in one layer's forward
    layer_tp_bwd_s: float  # TP collectives in its backward (+ the recomputed forward's with full recompute)
    p2p_s: float  # one point-to-point transfer of a chunk's activation or its gradient
    last_fwd_s: float  # logits + loss forward on the last stage, per micro-batch
    last_bwd_s: float  # their backward (2 x)
    offload_fwd_s: float  # exposed offload traffic per micro-batch and stage, forward
    offload_bwd_s: float  # and backward
    fsdp_fwd_s: float = 0.0  # exposed ZeRO-3 weight gathers per micro-batch and stage, forward
    fsdp_bwd_s: float = 0.0  # and backward (gathers + gradient reduce-scatters)
    dp_full_s: float  # the data-parallel gradient reduction, whole
    dp_hidden_s: float  # how much of it the last backward hides (``dp_overlap``), else 0
    optimizer_s: float  # the Adam step
    offload_step_s: float  # optimizer state to and from the second tier
    stage_layers: tuple[int, ...] = ()  # layers of each pipeline stage, first to last
    chunk_layers: tuple[tuple[int, ...], ...] = ()  # layers of each stage's virtual chunks

    @property
    def dp_exposed_s(self) -> float:
        """The reduction's part that is not hidden behind the last backward."""
        return max(0.0, self.dp_full_s - self.dp_hidden_s)

    def stage_s(self, layers: int, virtual_stages: int, *, last: bool = False) -> float:
        """One micro-batch on a stage of ``layers`` layers over its ``virtual_stages`` chunks: compute,
        recompute, TP, the ``2 v`` pipeline transfers, exposed offload; the last stage adds the logits and loss."""
        n = layers
        return (n * (self.layer_fwd_s + self.layer_bwd_s) + n * self.layer_recompute_s
                + n * (self.layer_tp_fwd_s + self.layer_tp_bwd_s) + 2 * virtual_stages * self.p2p_s
                + self.offload_fwd_s + self.offload_bwd_s + self.fsdp_fwd_s + self.fsdp_bwd_s
                + (self.last_fwd_s + self.last_bwd_s if last else 0.0))

    def middle_stage_s(self, virtual_stages: int) -> float:
        """A middle stage's time per micro-batch (:meth:`stage_s` of ``layers_per_stage`` layers)."""
        return self.stage_s(self.layers_per_stage, virtual_stages)

    def stage_parts(self, layers: int, micro_batches: int, virtual_stages: int, *, last: bool = True) -> dict[str, float]:
        """A stage's busy time over ``micro_batches`` micro-batches by part (seconds; ``LlmStep`` field names):
        compute (with the logits and loss on the last stage), recompute, TP, PP, and offload with the optimizer
        state's round trip. Both the closed form and the per-rank schedule report these for the pacing stage."""
        n, m = layers, micro_batches
        last_extra = self.last_fwd_s + self.last_bwd_s if last else 0.0
        return dict(compute_s=m * (n * (self.layer_fwd_s + self.layer_bwd_s) + last_extra),
                    recompute_s=m * (n * self.layer_recompute_s),
                    tp_comm_s=m * (n * (self.layer_tp_fwd_s + self.layer_tp_bwd_s)),
                    pp_comm_s=m * (2 * virtual_stages * self.p2p_s),
                    fsdp_comm_s=m * (self.fsdp_fwd_s + self.fsdp_bwd_s),
                    offload_s=m * (self.offload_fwd_s + self.offload_bwd_s) + self.offload_step_s)

    def iteration_parts(self, micro_batches: int, virtual_stages: int) -> dict[str, float]:
        """The steady-state parts of an evenly split iteration: the last stage's :meth:`stage_parts`."""
        return self.stage_parts(self.layers_per_stage, micro_batches, virtual_stages, last=True)


def stage_costs(spec: TransformerSpec, execution: Execution, cluster: Cluster, *,
                precision: str = DEFAULT_PRECISION) -> StageCosts:
    """The per-layer and per-stage costs of one rank (module docstring, NOTE [time model]); checks the
    execution against the model and the cluster (:func:`cluster_rejection`)."""
    check_execution(execution, spec)
    e, dev = execution, cluster.device
    why = cluster_rejection(e, cluster)
    if why is not None:
        raise ConfigError(why)
    layout = ParallelDims.of(e)
    offload_bytes_per_s = _offload_bytes_per_s(cluster)
    b, split = e.micro_batch, e.tp * e.cp
    flops_per_s = dev.flops_per_s(precision)
    hbm_per_s = dev.hbm_bytes_per_s * dev.memory_efficiency
    gemm_rate = flops_per_s * cluster.gemm_efficiency.at(spec.hidden / e.tp)

    flops = layer_fwd_flops(spec, b)
    ew = elementwise_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp)
    gemm_f = flops["gemm"] / split / gemm_rate
    attn_f = flops["attention"] / split / gemm_rate
    elem_f = (ew["block"] + ew["scores"]) / hbm_per_s
    layer_fwd = gemm_f + attn_f + elem_f
    layer_recompute = {"none": 0.0, "selective": attn_f + ew["scores"] / hbm_per_s, "full": layer_fwd}[e.recompute]

    act_bytes = spec.bytes_per_element * b * spec.seq_len / e.cp * spec.hidden
    tp_one = _tp_allreduce_s(cluster, layout, e.sequence_parallel, act_bytes)

    split_layers = stage_layers(e, spec)
    n_layers = max(split_layers)
    logits = logits_fwd_flops(spec, b) / split / gemm_rate
    loss = _LOSS_PASSES * _LOSS_ELEMENT_BYTES * b * spec.seq_len / e.cp * spec.vocab / e.tp / hbm_per_s
    p2p_bytes = act_bytes / e.tp
    p2p = _p2p_s(cluster, layout, p2p_bytes)

    off_fwd = off_bwd = 0.0
    act_stage = n_layers * activation_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                                      recompute=e.recompute)
    params_rank = _stage_params(spec, e)
    if e.offload_activations:
        move = act_stage / offload_bytes_per_s
        off_fwd += max(0.0, move - n_layers * layer_fwd)
        off_bwd += max(0.0, move - n_layers * (2 * layer_fwd + layer_recompute))
    if e.offload_weights:  # under ZeRO-3 each rank fetches its shard, the all-gathers bring the rest
        stored = params_rank / (e.shard_ranks if e.zero >= 3 else 1)
        move = _WEIGHT_BYTES * stored / tier_bytes_per_s(cluster, e.offload_tier)[1]
        off_fwd += max(0.0, move - n_layers * layer_fwd)
        off_bwd += max(0.0, move - n_layers * 2 * layer_fwd)

    shard = e.shard_ranks
    fsdp_fwd = fsdp_bwd = 0.0
    if e.zero >= 3:
        layer_params = spec.params_per_layer() / e.tp
        (size, stride), _ = _shard_groups(layout, e)
        dims = cluster.group_dims(size, stride)
        gather = collective_time("all-gather", _WEIGHT_BYTES * layer_params, dims)
        reduce = collective_time("reduce-scatter", _GRAD_BYTES * layer_params, dims)
        chunk = max(1, n_layers // e.virtual_stages)
        fsdp_fwd = e.virtual_stages * fsdp_exposed_s(gather, reduce, layer_fwd, chunk, prefetch=e.fsdp_prefetch,
                                                     backward=False)
        fsdp_bwd = e.virtual_stages * fsdp_exposed_s(gather, reduce, 2 * layer_fwd + layer_recompute, chunk,
                                                     prefetch=e.fsdp_prefetch, backward=True)
        dp_full = _zero3_step_s(cluster, layout, e, _GRAD_BYTES * (params_rank - n_layers * layer_params),
                                _GRAD_BYTES * params_rank / shard)
    else:
        dp_full = _dp_reduce_s(cluster, layout, _GRAD_BYTES * params_rank)
    hidden_by = n_layers * (2 * layer_fwd + layer_recompute) if e.dp_overlap else 0.0

    offload_step = 0.0
    optimizer = params_rank / shard * _ADAM_TRAFFIC_BYTES / hbm_per_s
    if e.cpu_optimizer:
        cpu = cpu_optimizer_step(e, cluster, params_rank / shard,
                                 last_backward_s=n_layers * (2 * layer_fwd + layer_recompute),
                                 iteration_compute_s=e.micro_batches * n_layers * (3 * layer_fwd + layer_recompute))
        optimizer, offload_step = cpu.optimizer_s, cpu.transfer_s
    elif e.offload_optimizer:
        out, back = tier_bytes_per_s(cluster, e.offload_tier)
        offload_step = _OPTIMIZER_BYTES * params_rank / shard * (1 / out + 1 / back)
    return StageCosts(
        layers_per_stage=n_layers, layer_fwd_s=layer_fwd, layer_bwd_s=2 * layer_fwd,
        layer_recompute_s=layer_recompute, layer_tp_fwd_s=2 * tp_one,
        layer_tp_bwd_s=2 * tp_one + (2 * tp_one if e.recompute == "full" else 0.0), p2p_s=p2p,
        last_fwd_s=logits + loss, last_bwd_s=2 * (logits + loss), offload_fwd_s=off_fwd, offload_bwd_s=off_bwd,
        fsdp_fwd_s=fsdp_fwd, fsdp_bwd_s=fsdp_bwd, dp_full_s=dp_full, dp_hidden_s=hidden_by,
        optimizer_s=optimizer, offload_step_s=offload_step, stage_layers=split_layers,
        chunk_layers=chunk_layers(e, spec))


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
    c = stage_costs(spec, execution, cluster, precision=precision)
    if len(set(c.stage_layers)) > 1 or len({n for row in c.chunk_layers for n in row}) > 1:
        # An uneven split: the slowest stage sets the pace, but how long the others fill, drain and hold it
        # up depends on where it sits, so the schedule itself is the closed form (O(dp p m v) ops).
        from mcdla.sim.llm_ranks import ranks_step

        return ranks_step(spec, execution, cluster, precision=precision)
    e = execution
    stage_mid = c.middle_stage_s(e.virtual_stages)
    stage_last = stage_mid + c.last_fwd_s + c.last_bwd_s
    m = e.micro_batches
    # The exact length of Megatron's (interleaved) 1F1B schedule when every stage but the last costs
    # stage_mid and the last is the slowest: the last stage never waits once fed, the fill and the drain are
    # (p - 1) / v of a middle stage (NOTE [rank schedule] in sim/llm_ranks.py; tested equal to the per-rank
    # schedule in tests/sim/test_llm_ranks.py).
    bubble = (e.pp - 1) / e.virtual_stages * stage_mid
    iteration = m * stage_last + bubble + c.dp_exposed_s + c.optimizer_s + c.offload_step_s
    return step_record(spec, e, cluster, c, precision=precision, iteration=iteration, bubble=bubble,
                       **c.iteration_parts(m, e.virtual_stages))


def pacing_stage_parts(c: StageCosts, e: Execution) -> tuple[int, dict[str, float]]:
    """The slowest pipeline stage (the last among equals) and its :meth:`StageCosts.stage_parts` over the
    iteration's micro-batches, the steady-state parts both modes report (an uneven split may pace elsewhere)."""
    layers = c.stage_layers or (c.layers_per_stage,) * e.pp
    times = [c.stage_s(layers[s], e.virtual_stages, last=s == e.pp - 1) for s in range(e.pp)]
    pace = max(range(e.pp), key=lambda s: (times[s], s))
    return pace, c.stage_parts(layers[pace], e.micro_batches, e.virtual_stages, last=pace == e.pp - 1)


def step_record(spec: TransformerSpec, e: Execution, cluster: Cluster, c: StageCosts, *, precision: str,
                iteration: float, bubble: float, compute_s: float, recompute_s: float, tp_comm_s: float,
                pp_comm_s: float, fsdp_comm_s: float, offload_s: float) -> LlmStep:
    """The :class:`LlmStep` of a predicted iteration: FLOPs, MFU and one rank's memory (both modes, so the
    per-rank schedule of :mod:`mcdla.sim.llm_ranks` reports the same record)."""
    dev = cluster.device
    flops_per_s = dev.flops_per_s(precision)
    b = e.micro_batch
    m = e.micro_batches
    n_layers = c.layers_per_stage
    params_rank = _stage_params(spec, e)
    shard = e.shard_ranks
    act_stage = n_layers * activation_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                                      recompute=e.recompute)
    dp_exposed, optimizer = c.dp_exposed_s, c.optimizer_s
    model_flops = model_flops_per_iteration(spec, e.global_batch)

    in_flight = min(m, e.pp) * (1 + (e.pp - 1) / (e.pp * e.virtual_stages)) if e.virtual_stages > 1 else min(m, e.pp)
    activations = act_stage * in_flight
    if len(set(c.stage_layers)) > 1:  # uneven split: the stage holding the most layers in flight (1F1B: p - s)
        per_layer = act_stage / n_layers
        activations = per_layer * max(n * min(m, e.pp - s) * in_flight / min(m, e.pp)
                                      for s, n in enumerate(c.stage_layers))
    weights = stored_weights = _WEIGHT_BYTES * params_rank / (shard if e.zero >= 3 else 1)
    grads = _GRAD_BYTES * params_rank / (shard if e.zero >= 2 else 1)
    if e.zero >= 3:  # the layer computing and the ones prefetched, whole, with their gradients
        gathered = min(e.fsdp_prefetch + 1, n_layers) * spec.params_per_layer() / e.tp
        weights += _WEIGHT_BYTES * gathered
        grads += _GRAD_BYTES * gathered
    opt = _OPTIMIZER_BYTES * params_rank / shard
    # offloaded weights: the stored copy (the shard); the gathered layers are in HBM while they compute
    on_tier = (stored_weights if e.offload_weights else 0.0) + (opt if e.offload_optimizer else 0.0)
    offloaded = (activations if e.offload_activations else 0.0) + on_tier
    device_bytes = activations + weights + grads + opt - offloaded
    pool_bytes = 0.0 if cluster.offload is None else cluster.offload.pool_bytes
    in_pool = offloaded - (on_tier if e.offload_tier == "nvme" else 0.0)
    nvme = cluster.nvme
    nvme_fits = e.offload_tier != "nvme" or (nvme is not None
                                            and on_tier <= nvme.capacity_bytes / cluster.gpus_per_node)
    return LlmStep(
        iteration_s=iteration,
        compute_s=compute_s,
        recompute_s=recompute_s,
        tp_comm_s=tp_comm_s,
        pp_comm_s=pp_comm_s,
        bubble_s=bubble,
        dp_comm_s=dp_exposed,
        fsdp_comm_s=fsdp_comm_s,
        optimizer_s=optimizer,
        offload_s=offload_s,
        model_flops=model_flops,
        hardware_flops=hardware_flops_per_iteration(spec, e.global_batch, e.recompute),
        mfu=model_flops / (e.gpus * flops_per_s * iteration),
        device_bytes=device_bytes,
        offloaded_bytes=offloaded,
        fits=device_bytes <= dev.hbm_bytes and in_pool <= pool_bytes and nvme_fits,
        weight_bytes=weights,
        gradient_bytes=grads,
        optimizer_bytes=opt,
        activation_bytes=activations,
    )
