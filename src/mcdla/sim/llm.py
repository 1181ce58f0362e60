"""Per-iteration time and per-rank memory of LLM training under TP/PP/DP/CP, recomputation and offload.

An analytical per-rank model of one 1F1B (or interleaved 1F1B) iteration, not the event engine: the engine
simulates one device's layer chain with its copies; here the pipeline, the tensor-parallel collectives and
the data-parallel reduction are closed forms over per-layer costs, which is what the published Megatron runs
need and is cheap enough to sweep. NOTE [time model] (also ``docs/llm.md``):

* Per layer and micro-batch on one rank: GEMM FLOPs (projections, FFN) and attention-core FLOPs (``QK^T``,
  ``xV``) divided by ``tp * cp``, at ``peak * efficiency``; memory-bound elementwise kernels (norms,
  bias-dropout-add, activation function, softmax and its dropout) at ``hbm_bytes_per_s *
  memory_efficiency``; backward costs twice the forward. Recompute adds a forward (``full``) or the
  attention core with its softmax and dropout (``selective``).
* Tensor parallelism: two all-reduces of the layer's ``b s h`` activation per forward and two per backward
  (with sequence parallelism an all-gather plus a reduce-scatter, the same ring traffic), on the NVLink domain;
  full recomputation repeats the forward ones. Not overlapped with compute (Megatron-LM 2021-2022).
* Pipeline: per micro-batch a stage runs its ``layers / pp`` layers forward and backward plus, per virtual
  chunk, a point-to-point send of the activation and one of its gradient (``b s h / tp`` bytes with
  Megatron's scatter/gather) over the inter-node network; the last stage adds the vocabulary projection and
  the loss. Iteration = ``m * T_last + (p - 1) / v * T_middle``, the exact length of the (interleaved) 1F1B
  schedule of these stages (the bubble ``(p - 1) / (m v)`` when balanced); ``mode="ranks"`` schedules every
  rank instead (``sim/llm_ranks.py``).
* Data parallelism: one ring all-reduce of the rank's gradients (ZeRO-1/2: reduce-scatter + all-gather, the
  same traffic; ZeRO-3: one more all-gather of weights) after the last backward, or overlapped with the last
  micro-batch's backward (``dp_overlap``); then the Adam step streams the rank's optimizer state through HBM.
* Offload: activations go out during forward and come back during backward, weights are fetched for every
  forward and backward of a micro-batch, optimizer state crosses the link twice per step; what the compute
  does not hide is exposed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

from mcdla.errors import ConfigError, brief
from mcdla.hardware.cluster import Cluster, FabricDim
from mcdla.hardware.model import Device
from mcdla.sim.collective_models import collective_time, p2p_time
from mcdla.workload.execution import Execution, check_execution
from mcdla.workload.transformer import (TransformerSpec, activation_bytes_per_layer, hardware_flops_per_iteration,
                                        layer_fwd_flops, logits_fwd_flops, model_flops_per_iteration)

__all__ = ["GemmEfficiency", "GpuCluster", "LlmStep", "StageCosts", "llm_step", "stage_costs",
           "elementwise_bytes_per_layer"]

# Adam with mixed precision, per parameter: fp16/bf16 weight and gradient, fp32 master weight, momentum and
# variance (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: 2 + 2 + 12 bytes).
_WEIGHT_BYTES, _GRAD_BYTES, _OPTIMIZER_BYTES = 2, 2, 12
# The Adam step reads the gradient (2) and reads and writes master weight, momentum, variance (3 x 8) and
# writes the fp16 weight (2): 28 bytes of HBM traffic per parameter.
_ADAM_TRAFFIC_BYTES = 28
# Vocabulary-parallel cross entropy works in fp32 over the b x s x V/tp logits: about four passes each way.
_LOSS_PASSES, _LOSS_ELEMENT_BYTES = 4, 4


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmEfficiency:
    """Fraction of peak a GEMM reaches as a function of its per-rank width ``x = hidden / tp`` (elements):
    ``peak_fraction * x / (x + half_width)``. Narrow per-rank matrices (small models, wide TP) fill fewer
    tiles and waves of the GPU; this is the only fitted part of the model (``docs/llm.md``)."""

    peak_fraction: float
    half_width: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.peak_fraction <= 1:
            raise ConfigError(f"gemm_efficiency.peak_fraction: got {self.peak_fraction!r}; must be in (0, 1]")
        if not 0 <= self.half_width < float("inf"):
            raise ConfigError(f"gemm_efficiency.half_width: got {self.half_width!r}; must be finite and >= 0")

    def at(self, width: float) -> float:
        """Efficiency for a per-rank GEMM width (elements)."""
        return self.peak_fraction * width / (width + self.half_width)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCluster:
    """Nodes of ``gpus_per_node`` devices: an NVLink domain inside a node, a network between nodes.

    Bandwidths are per GPU and per direction (bytes/s); ``offload_bytes_per_s`` is each GPU's link to the
    second memory tier (host or memory-node), 0 when there is none.
    """

    device: Device
    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    nvlink_latency_s: float = 5e-6
    network_latency_s: float = 10e-6
    offload_bytes_per_s: float = 0.0
    precision: str = "fp16"
    gemm_efficiency: GemmEfficiency = field(default_factory=lambda: GemmEfficiency(peak_fraction=0.7, half_width=0.0))
    source: str = ""
    # A preset's fabric (mcdla.hardware.cluster.Cluster): when set, TP/DP collectives and pipeline sends are
    # priced by sim/collective_models.py on its dimensions (in-network, hierarchical) instead of the rings
    # below; built by mcdla.sim.llm_systems.gpu_cluster_from_preset.
    fabric: Cluster | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"cluster.gpus_per_node: got {self.gpus_per_node!r}; must be an integer >= 1")
        for name in ("nvlink_bytes_per_s", "network_bytes_per_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"cluster.{name}: got {getattr(self, name)!r}; must be finite and > 0")
        for name in ("nvlink_latency_s", "network_latency_s", "offload_bytes_per_s"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ConfigError(f"cluster.{name}: got {getattr(self, name)!r}; must be finite and >= 0")
        self.device.flops_per_s(self.precision)  # raises for an unknown precision


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmStep:
    """One iteration's predicted time (seconds) and its parts, and one rank's memory (bytes).

    The parts add up to ``iteration_s``: ``compute_s`` (forward and backward of the slowest stage over all
    micro-batches, logits included), ``recompute_s``, ``tp_comm_s``, ``pp_comm_s``, ``bubble_s``,
    ``dp_comm_s`` (exposed), ``optimizer_s``, ``offload_s`` (exposed).
    """

    iteration_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float
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
    b, s, h, f = micro_batch, spec.seq_len / cp, spec.hidden, float(spec.ffn_hidden)  # type: ignore[arg-type]
    mask = 1.0 if spec.dropout else 0.0
    sbh = s * b * h
    norms = 2 * 2 * e * sbh
    residual = 2 * (3 * e + mask) * sbh
    activation = spec.top_k * spec.ffn_matrices * e * s * b * f  # GELU: read f, write f; SwiGLU: read 2f
    scores = spec.heads * s * spec.seq_len * b * (2 * e + mask * (2 * e + 1))
    return {"block": (norms + residual) / (tp if sp else 1) + activation / tp, "scores": scores / tp}


def _ring_s(size_bytes: float, ranks: int, bytes_per_s: float, latency_s: float, passes: float = 2.0) -> float:
    """A ring collective moving ``passes * (n - 1) / n * size`` bytes per rank (2 = all-reduce, 1 = all-gather
    or reduce-scatter)."""
    if ranks == 1:
        return 0.0
    return passes * (ranks - 1) / ranks * size_bytes / bytes_per_s + passes * (ranks - 1) * latency_s


def _stage_params(spec: TransformerSpec, e: Execution) -> float:
    """Parameters on the rank of the first stage (its layers and the embedding), per TP rank."""
    per_stage = spec.layers // e.pp * spec.params_per_layer() + spec.embedding_params()
    return per_stage / e.tp


def _dp_ring_bytes_per_s(cluster: GpuCluster, e: Execution) -> float:
    """Bus bandwidth of a data-parallel ring: NVLink inside one node, else the network cards of the group's
    ranks in a node (ranks are ordered tp, cp, dp, pp, so a node holds ``gpus_per_node / (tp cp)`` of them)."""
    per_node = max(1, cluster.gpus_per_node // (e.tp * e.cp))
    if e.dp <= per_node:
        return cluster.nvlink_bytes_per_s
    return min(cluster.nvlink_bytes_per_s, per_node * cluster.network_bytes_per_s)


def _group_dims(fabric: Cluster, size: int, stride: int) -> tuple[FabricDim, ...]:
    """The dimensions a group of ``size`` ranks ``stride`` apart spans (:meth:`Cluster.group_dims`); when the
    group does not tile the nodes evenly (a DP group of 128 over 9 TP groups per NVL72 rack) it is taken as
    ``gcd`` members per node and the rest across nodes, which prices more scale-out traffic than the layout has."""
    if size == 1:
        return ()
    k = fabric.gpus_per_node
    per_node = math.gcd(size, k // stride) if stride < k and k % stride == 0 else 1
    dims: list[FabricDim] = []
    if per_node > 1 and fabric.scale_up is not None:
        dims.append(dataclasses.replace(fabric.scale_up, size=per_node))
    if size // per_node > 1:
        if fabric.scale_out is None:
            raise ConfigError(f"cluster {fabric.name!r}: a group of {size} ranks spans nodes but the system has no scale_out")
        dims.append(dataclasses.replace(fabric.scale_out, size=size // per_node))
    return tuple(dims)


def _tp_allreduce_s(cluster: GpuCluster, e: Execution, nbytes: float) -> float:
    """One TP all-reduce (or its all-gather + reduce-scatter pair) of ``nbytes`` per rank."""
    if cluster.fabric is None:
        return _ring_s(nbytes, e.tp, cluster.nvlink_bytes_per_s, cluster.nvlink_latency_s)
    if e.sequence_parallel:
        dims = _group_dims(cluster.fabric, e.tp, 1)
        return collective_time("all-gather", nbytes, dims) + collective_time("reduce-scatter", nbytes, dims)
    return collective_time("all-reduce", nbytes, _group_dims(cluster.fabric, e.tp, 1))


def _dp_reduce_s(cluster: GpuCluster, e: Execution, nbytes: float) -> float:
    """The data-parallel gradient reduction (ZeRO-1/2: the same traffic; ZeRO-3: one more all-gather)."""
    if cluster.fabric is None:
        passes = {0: 2.0, 1: 2.0, 2: 2.0, 3: 3.0}[e.zero]
        return _ring_s(nbytes, e.dp, _dp_ring_bytes_per_s(cluster, e), cluster.network_latency_s, passes)
    dims = _group_dims(cluster.fabric, e.dp, e.tp * e.cp)
    extra = collective_time("all-gather", nbytes, dims) if e.zero >= 3 else 0.0
    return collective_time("all-reduce", nbytes, dims) + extra


def _p2p_s(cluster: GpuCluster, e: Execution, nbytes: float) -> float:
    """One pipeline send between neighbouring stages (``tp cp dp`` ranks apart)."""
    if e.pp == 1:
        return 0.0
    if cluster.fabric is None:
        return nbytes / cluster.network_bytes_per_s + cluster.network_latency_s
    fabric, stride = cluster.fabric, e.tp * e.cp * e.dp
    dim = fabric.scale_up if stride < fabric.gpus_per_node and fabric.scale_up is not None else fabric.scale_out
    if dim is None:
        raise ConfigError(f"cluster {fabric.name!r}: pipeline stages span nodes but the system has no scale_out")
    return p2p_time(nbytes, dim)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Per-rank durations (seconds) of one micro-batch on one pipeline stage, shared by the closed form
    (:func:`llm_step`, ``mode="fast"``) and the per-rank schedule (:mod:`mcdla.sim.llm_ranks`), so the two
    differ only in how they compose them.

    ``compute`` parts scale with a rank's speed (a straggler); ``tp``, ``p2p`` and ``offload`` parts are
    link time. Layer figures are per layer; ``last_*`` is the last stage's vocabulary projection and loss.
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
    dp_full_s: float  # the data-parallel gradient reduction, whole
    dp_hidden_s: float  # how much of it the last backward hides (``dp_overlap``), else 0
    optimizer_s: float  # the Adam step
    offload_step_s: float  # optimizer state to and from the second tier

    @property
    def stage_mid_s(self) -> float:
        """A middle stage's time per micro-batch, all its chunks: compute, recompute, TP, 2 v transfers,
        offload."""
        n = self.layers_per_stage
        return (n * (self.layer_fwd_s + self.layer_bwd_s + self.layer_recompute_s + self.layer_tp_fwd_s
                     + self.layer_tp_bwd_s) + self.offload_fwd_s + self.offload_bwd_s)

    @property
    def dp_exposed_s(self) -> float:
        """The reduction's part that is not hidden behind the last backward."""
        return max(0.0, self.dp_full_s - self.dp_hidden_s)


def stage_costs(spec: TransformerSpec, execution: Execution, cluster: GpuCluster) -> StageCosts:
    """The per-layer and per-stage costs of one rank (module docstring, NOTE [time model]); checks the
    execution against the model and the cluster."""
    check_execution(execution, spec)
    e, dev = execution, cluster.device
    if e.tp * e.cp > cluster.gpus_per_node:
        raise ConfigError(f"execution.tp: got tp*cp = {e.tp * e.cp}; must fit one NVLink domain "
                          f"({cluster.gpus_per_node} GPUs per node)")
    if (e.offload_activations or e.offload_weights or e.offload_optimizer) and cluster.offload_bytes_per_s == 0:
        raise ConfigError("execution.offload_*: offload asked but the cluster has no second tier "
                          "(offload_bytes_per_s = 0)")
    b, split = e.micro_batch, e.tp * e.cp
    flops_per_s = dev.flops_per_s(cluster.precision)
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
    tp_one = _tp_allreduce_s(cluster, e, act_bytes)

    n_layers = spec.layers // e.pp
    logits = logits_fwd_flops(spec, b) / split / gemm_rate
    loss = _LOSS_PASSES * _LOSS_ELEMENT_BYTES * b * spec.seq_len / e.cp * spec.vocab / e.tp / hbm_per_s
    p2p_bytes = act_bytes / e.tp
    p2p = _p2p_s(cluster, e, p2p_bytes)

    off_fwd = off_bwd = 0.0
    act_stage = n_layers * activation_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                                      recompute=e.recompute)
    params_rank = _stage_params(spec, e)
    if e.offload_activations:
        move = act_stage / cluster.offload_bytes_per_s
        off_fwd += max(0.0, move - n_layers * layer_fwd)
        off_bwd += max(0.0, move - n_layers * (2 * layer_fwd + layer_recompute))
    if e.offload_weights:
        move = _WEIGHT_BYTES * params_rank / cluster.offload_bytes_per_s
        off_fwd += max(0.0, move - n_layers * layer_fwd)
        off_bwd += max(0.0, move - n_layers * 2 * layer_fwd)

    dp_bytes = _GRAD_BYTES * params_rank
    dp_full = _dp_reduce_s(cluster, e, dp_bytes)
    hidden_by = n_layers * (2 * layer_fwd + layer_recompute) if e.dp_overlap else 0.0

    shard = e.dp if e.zero >= 1 else 1
    offload_step = 0.0
    if e.offload_optimizer:
        offload_step = 2 * _OPTIMIZER_BYTES * params_rank / shard / cluster.offload_bytes_per_s
    return StageCosts(
        layers_per_stage=n_layers, layer_fwd_s=layer_fwd, layer_bwd_s=2 * layer_fwd,
        layer_recompute_s=layer_recompute, layer_tp_fwd_s=2 * tp_one,
        layer_tp_bwd_s=2 * tp_one + (2 * tp_one if e.recompute == "full" else 0.0), p2p_s=p2p,
        last_fwd_s=logits + loss, last_bwd_s=2 * (logits + loss), offload_fwd_s=off_fwd, offload_bwd_s=off_bwd,
        dp_full_s=dp_full, dp_hidden_s=hidden_by, optimizer_s=params_rank / shard * _ADAM_TRAFFIC_BYTES / hbm_per_s,
        offload_step_s=offload_step)


def llm_step(spec: TransformerSpec, execution: Execution, cluster: GpuCluster, *, mode: str = "fast",
             **ranks_options: object) -> LlmStep:
    """Predict one training iteration of ``spec`` run as ``execution`` on ``cluster`` (module docstring).

    ``mode="fast"`` (default) is the closed form over one representative rank per pipeline role (every
    stage's ranks are symmetric; the last stage adds the logits): O(1) in the number of GPUs.
    ``mode="ranks"`` schedules every rank's micro-batches explicitly (:func:`mcdla.sim.llm_ranks.simulate_ranks`,
    which takes ``ranks_options`` such as a per-rank ``slowdown`` or ``layers_per_stage``) for asymmetric
    systems; it returns the same record with ``iteration_s`` and ``bubble_s`` from the schedule.
    """
    if mode == "ranks":
        from mcdla.sim.llm_ranks import ranks_step  # the per-rank engine builds on this module

        return ranks_step(spec, execution, cluster, **ranks_options)  # type: ignore[arg-type]
    if mode != "fast":
        raise ConfigError(f"llm_step.mode: got {brief(mode)}; must be fast or ranks")
    if ranks_options:
        raise ConfigError(f"llm_step: got {', '.join(sorted(ranks_options))} with mode=fast; "
                          "per-rank options need mode=ranks")
    c = stage_costs(spec, execution, cluster)
    e = execution
    n_layers = c.layers_per_stage
    compute_mb = n_layers * (c.layer_fwd_s + c.layer_bwd_s)
    recompute_mb = n_layers * c.layer_recompute_s
    tp_mb = n_layers * (c.layer_tp_fwd_s + c.layer_tp_bwd_s)
    pp_mb = 2 * e.virtual_stages * c.p2p_s
    off_mb = c.offload_fwd_s + c.offload_bwd_s
    last_extra = c.last_fwd_s + c.last_bwd_s

    stage_mid = compute_mb + recompute_mb + tp_mb + pp_mb + off_mb
    stage_last = stage_mid + last_extra
    m = e.micro_batches
    # The exact length of Megatron's (interleaved) 1F1B schedule when every stage but the last costs
    # stage_mid and the last is the slowest: the last stage never waits once fed, the fill and the drain are
    # (p - 1) / v of a middle stage (NOTE [rank schedule] in sim/llm_ranks.py; tested equal to the per-rank
    # schedule in tests/sim/test_llm_ranks.py).
    bubble = (e.pp - 1) / e.virtual_stages * stage_mid
    dp_exposed, optimizer, offload_step = c.dp_exposed_s, c.optimizer_s, c.offload_step_s
    return _step_record(spec, e, cluster, c, iteration=m * stage_last + bubble + dp_exposed + optimizer + offload_step,
                        bubble=bubble, compute_s=m * (compute_mb + last_extra), recompute_s=m * recompute_mb,
                        tp_comm_s=m * tp_mb, pp_comm_s=m * pp_mb, offload_s=m * off_mb + offload_step)


def _step_record(spec: TransformerSpec, e: Execution, cluster: GpuCluster, c: StageCosts, *, iteration: float,
                 bubble: float, compute_s: float, recompute_s: float, tp_comm_s: float, pp_comm_s: float,
                 offload_s: float) -> LlmStep:
    """The :class:`LlmStep` of a predicted iteration: FLOPs, MFU and one rank's memory (both modes)."""
    dev = cluster.device
    flops_per_s = dev.flops_per_s(cluster.precision)
    b = e.micro_batch
    m = e.micro_batches
    n_layers = c.layers_per_stage
    params_rank = _stage_params(spec, e)
    shard = e.dp if e.zero >= 1 else 1
    act_stage = n_layers * activation_bytes_per_layer(spec, b, tp=e.tp, sp=e.sequence_parallel, cp=e.cp,
                                                      recompute=e.recompute)
    dp_exposed, optimizer = c.dp_exposed_s, c.optimizer_s
    model_flops = model_flops_per_iteration(spec, e.global_batch)

    in_flight = min(m, e.pp) * (1 + (e.pp - 1) / (e.pp * e.virtual_stages)) if e.virtual_stages > 1 else min(m, e.pp)
    activations = act_stage * in_flight
    weights = _WEIGHT_BYTES * params_rank / (e.dp if e.zero >= 3 else 1)
    grads = _GRAD_BYTES * params_rank / (e.dp if e.zero >= 2 else 1)
    opt = _OPTIMIZER_BYTES * params_rank / shard
    offloaded = (activations if e.offload_activations else 0.0) + (weights if e.offload_weights else 0.0) + (
        opt if e.offload_optimizer else 0.0)
    device_bytes = activations + weights + grads + opt - offloaded
    return LlmStep(
        iteration_s=iteration,
        compute_s=compute_s,
        recompute_s=recompute_s,
        tp_comm_s=tp_comm_s,
        pp_comm_s=pp_comm_s,
        bubble_s=bubble,
        dp_comm_s=dp_exposed,
        optimizer_s=optimizer,
        offload_s=offload_s,
        model_flops=model_flops,
        hardware_flops=hardware_flops_per_iteration(spec, e.global_batch, e.recompute),
        mfu=model_flops / (e.gpus * flops_per_s * iteration),
        device_bytes=device_bytes,
        offloaded_bytes=offloaded,
        fits=device_bytes <= dev.hbm_bytes,
        weight_bytes=weights,
        gradient_bytes=grads,
        optimizer_bytes=opt,
        activation_bytes=activations,
    )
