"""A searched :class:`~mcdla.workload.execution.Execution` as the launch configuration of a training framework:
Megatron-LM command-line arguments and a torchtitan TOML, so that ``mcdla search``'s winner can be run.

Every argument and key is one the framework's own parser defines, with a value it accepts: Megatron-LM's
``add_megatron_arguments`` (``megatron/training/arguments.py``) and torchtitan's ``JobConfig``
(``torchtitan/config/job_config.py`` of release v0.2.2, the last that reads a TOML job file), as vendored with
their commits in ``tests/report/data/framework_args.json``; ``docs/llm.md`` names the commits.

Megatron-LM (``pretrain_gpt.py`` arguments):

- ``tp``, ``pp``, ``cp``, ``ep``: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size`` (with ``--cp-comm-type p2p`` or ``all_gather``, the values Transformer Engine
  takes), ``--expert-model-parallel-size`` (the expert TP is Megatron's default, the TP size, as here); the
  data-parallel degree is what remains of the GPUs, so Megatron has no argument for it.
- ``virtual_stages`` > 1: ``--num-virtual-stages-per-pipeline-rank`` (model chunks per pipeline rank; the one
  of Megatron's three interleaving arguments that also works with an uneven split), and
  ``--no-overlap-p2p-communication`` unless ``pp_comm_overlap`` (Megatron-LM overlaps the sends by default).
- uneven pipeline: ``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
  ``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``.
- ``sequence_parallel``: ``--sequence-parallel``; ``tp_comm_overlap``: ``--tp-comm-overlap`` (which Megatron
  allows only with sequence parallelism).
- ``micro_batch``, ``global_batch``, the model's ``seq_len``: ``--micro-batch-size``, ``--global-batch-size``,
  ``--seq-length``.
- ``recompute``: ``selective`` is ``--recompute-granularity selective`` (the attention core; other
  ``recompute_modules`` add ``--recompute-modules`` with their names; ``selective-op``,
  torchtitan's op policy, has no argument: a ``#`` note); ``full`` is
  ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every layer from its
  input); with ``recompute_num_layers`` N, ``--recompute-method block|uniform --recompute-num-layers N`` (block
  with N = 0 recomputes nothing and writes no recompute argument).
- ``offload_num_layers`` N with ``offload_activations``: ``--cpu-offloading-num-layers N``, where Megatron-Core
  accepts it: ``0 < N < layers``, no pipeline parallelism, no recomputation, weights kept (its
  ``cpu_offloading_weights`` has no argument); otherwise a ``#`` note says which condition fails.
- ``zero``: 1 is ``--use-distributed-optimizer``; 2 and 3 are Megatron-FSDP (``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads`` or ``optim_grads_params``, with the distributed optimizer
  its version 1 needs and the ``fsdp_dtensor`` checkpoints it requires); ``hsdp_shard`` is
  ``--num-distributed-optimizer-instances dp / hsdp_shard`` (the weights replicated over that many groups).
  Torch FSDP2 (``--use-torch-fsdp2``) is not used: Megatron refuses it with pipeline or expert parallelism and
  it needs untied embeddings.
- ``dp_overlap``: ``--overlap-grad-reduce``, and with ZeRO-3 and ``fsdp_prefetch`` also ``--overlap-param-gather``
  (Megatron-FSDP's prefetched all-gathers); ``cpu_optimizer`` on the host: ``--optimizer-cpu-offload
  --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer`` (Megatron-Core's hybrid CPU optimizer, as
  its ``cpu_offloading`` README sets it).
- ``attention``: ``flash`` is ``--attention-backend flash``, ``materialized`` is ``unfused`` (Transformer
  Engine's attention over stored scores; Megatron takes ``local`` only with its ``--spec local`` layers).
- MoE ``capacity_factor`` other than 1: ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``
  (every expert runs its full capacity, as modelled); 1 is Megatron's default dropless routing.
- MoE ``ep_dispatcher``: ``hybridep`` is ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend
  hybridep``; ``alltoall`` is ``--moe-token-dispatcher-type alltoall``.
- MoE ``moe_a2a_overlap``: ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute`` (Megatron-Bridge's
  ``set_moe_a2a_overlap_overrides`` sets both).
- MoE ``moe_router_graph``: ``--cuda-graph-impl transformer_engine --cuda-graph-modules moe_router moe_preprocess``
  (``--cuda-graph-scope`` in Megatron-LM 0d8e0714).
- precision: ``bf16`` is ``--bf16``, ``fp16`` is ``--fp16``, ``fp8`` is ``--bf16 --fp8-format hybrid`` (E4M3
  forward, E5M2 backward) with ``--fp8-recipe tensorwise`` (current scaling), ``delayed`` or ``mxfp8``.

Not expressible in Megatron-LM's arguments, written as ``#`` comment lines of the file: offloading activations
of every layer or weights to a second memory tier, optimizer state offloaded but stepped on the GPU, the NVMe tier,
ZeRO-Offload's one-step delayed parameter update, DeepSpeed's blocking activation copies
(``activation_offload_sync``) and its freeing of each gradient bucket once copied to the host (``cpu_optimizer``
below ZeRO-3, ``reduce_bucket_numel``: Megatron's CPU optimizer keeps its gradient buffer on the GPU), TP
communication overlap without sequence parallelism and FSDP prefetch without ``dp_overlap``.

torchtitan (TOML sections of ``JobConfig``):

- ``[parallelism]``: ``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``context_parallel_degree``
  (``context_parallel_rotate_method = "allgather"`` for ``cp_comm = all_gather``), ``expert_parallel_degree``
  with ``expert_tensor_parallel_degree`` = TP; the data-parallel degree is ``data_parallel_shard_degree`` (FSDP2,
  ZeRO 1-3) or ``data_parallel_replicate_degree`` (DDP, ZeRO 0, which torchtitan runs only without TP, PP or
  CP: beside them ZeRO 0 is written as ZeRO 2), the other being 1, or both with HSDP (``hsdp_shard``);
  ``fsdp_reshard_after_forward`` is ``never`` for ZeRO 1 and 2 (FSDP2's ZeRO-2) and ``always`` for ZeRO 3.
  The pipeline schedule is ``1F1B`` or, with virtual stages, ``Interleaved1F1B``, with
  ``pipeline_parallel_microbatch_size``; the split is ``pipeline_parallel_layers_per_stage`` with
  ``pipeline_parallel_first/last_stage_less_layers`` 1 where the embedding (the loss) counts as a layer and 0
  otherwise, or, for an uneven first/last stage, ``module_fqns_per_model_part`` (torchtitan's module names).
  ``tp_comm_overlap`` is ``enable_async_tensor_parallel`` with ``[compile] enable = true`` (async TP runs
  compiled only).
- ``[training]``: ``global_batch_size``, ``seq_len`` and ``local_batch_size``, the samples one data-parallel
  rank runs per optimizer step with a pipeline (``global_batch / dp``, split into micro-batches by the
  schedule) and the micro-batch without one (torchtitan then accumulates ``global_batch / (micro_batch * dp)``
  gradient steps); ``mixed_precision_param`` ``bfloat16`` (``float32`` for fp32); ``enable_cpu_offload`` for
  ZeRO-3 with weights and optimizer on the host and the CPU optimizer (FSDP2's CPU offload policy).
- ``[activation_checkpoint]`` ``mode``: ``none``, ``selective`` with ``selective_ac_option = "op"`` for
  ``selective-op`` (and for ``selective``, with a ``#`` note: torchtitan has no attention-core policy) or ``full``;
  ``block`` recompute of N of a model chunk's ``L`` layers is ``selective`` with ``selective_ac_option = "f"``,
  torchtitan's checkpoint of every f-th layer of each model part (its counter restarts with each part's
  ``apply_ac``), for an ``f`` with ``floor(L / f) = N`` (the same number of layers, spread over the chunk instead
  of its first N; a ``#`` note says so, and says when no ``f`` exists).
- fp8: ``[model] converters = ["quantize.linear.float8"]`` with ``[quantize.linear.float8] recipe_name =
  "tensorwise"``.

Not expressible in torchtitan's TOML, written as ``#`` comments: other offloading (by layer count or not),
``uniform`` recompute groups of more than one layer (written as ``full``), sequence parallelism off
with TP > 1 (torchtitan's TP always shards the norms along the sequence), ZeRO-1's replicated gradients, fp8
delayed and MXFP8 scaling (written as tensorwise), DeepSpeed's offload details as for Megatron-LM, fp16,
``dp_overlap`` off (FSDP2 always overlaps its reduce-scatter), the ring (``p2p``)
context-parallel exchange, a capacity factor, an FSDP prefetch depth other than one layer, expert parallelism
wider than the context-parallel group without ZeRO (torchtitan's experts borrow sharded data-parallel ranks),
ZeRO 0 beside TP/PP/CP and ZeRO 0's unsharded weights beside CP (torchtitan's FSDP2 spans the CP
group); ``selective``, Megatron's attention-core recompute (written as torchtitan's op policy, noted).
"""

from __future__ import annotations

from mcdla.workload.execution import Execution, chunk_layers
from mcdla.workload.transformer import TransformerSpec

__all__ = ["megatron_args", "megatron_file", "torchtitan_toml"]

_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP's ``--data-parallel-sharding-strategy`` per ZeRO stage."""


def _offload_notes(e: Execution, expressed_optimizer: bool) -> list[str]:
    kinds = [k for k, on in (("activations", e.offload_activations), ("weights", e.offload_weights),
                             ("optimizer state", e.offload_optimizer and not expressed_optimizer)) if on]
    count = "" if e.offload_num_layers is None else (f", activations/weights of the first {e.offload_num_layers} "
                                                     "layers of each model chunk")
    notes = [f"offloads {', '.join(kinds)} to the second memory tier ({e.offload_tier}{count})"] if kinds else []
    if e.delayed_param_update:
        notes.append("delayed parameter update: the CPU optimizer step overlapping the next iteration")
    if e.activation_offload_sync:
        notes.append("activation_offload_sync: DeepSpeed's cpu_checkpointing copies, each waited for on the "
                     "compute stream")
    if e.offload_first_touch:
        notes.append("offload_first_touch: the forward's checkpoint copies land in fresh pageable host pages "
                     "(DeepSpeed v0.3.0's cpu_checkpointing), at the host's first-touch rate")
    if e.cpu_optimizer and e.zero < 3:
        notes.append(f"reduce_bucket_numel {e.reduce_bucket_numel}: DeepSpeed's ZeRO-Offload frees each gradient "
                     "once its bucket is copied to the host, keeping one bucket (two with dp_overlap) on the GPU")
    return notes


def _megatron_cpu_optimizer(e: Execution) -> bool:
    return e.cpu_optimizer and e.offload_tier == "host"


def _megatron_recompute(e: Execution) -> list[str]:
    """``--recompute-*`` arguments (module docstring)."""
    if e.recompute == "selective":
        modules = [] if e.recompute_modules == ("core_attn",) else ["--recompute-modules", *e.recompute_modules]
        return ["--recompute-granularity", "selective", *modules]
    if e.recompute != "full":
        return []
    if e.recompute_num_layers is None:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if e.recompute_method == "block" and e.recompute_num_layers == 0:
        return []
    return ["--recompute-granularity", "full", "--recompute-method", e.recompute_method,
            "--recompute-num-layers", str(e.recompute_num_layers)]


def _megatron_offload(e: Execution, spec: TransformerSpec, cpu_optimizer: bool) -> tuple[list[str], list[str]]:
    """``--cpu-offloading-num-layers`` where Megatron-Core accepts the count (module docstring), and the notes
    (``cpu_optimizer``: the optimizer's offload is expressed by Megatron's CPU optimizer)."""
    n = e.offload_num_layers
    notes = _offload_notes(e, cpu_optimizer)
    if n is None or not e.offload_activations:
        return [], notes
    why = [text for text, bad in (
        (f"Megatron-Core needs 0 < cpu_offloading_num_layers < {spec.layers}", not 0 < n < spec.layers),
        ("Megatron-Core refuses CPU offloading with pipeline parallelism", e.pp > 1),
        ("Megatron-Core refuses CPU offloading with recomputation", e.recompute != "none"))
        if bad]
    if why:
        return [], [f"{notes[0]}: {'; '.join(why)}", *notes[1:]]
    rest = [k for k, on in (("weights", e.offload_weights),
                            ("optimizer state", e.offload_optimizer and not cpu_optimizer)) if on]
    moved = [f"offloads {', '.join(rest)} to the second memory tier (--cpu-offloading-num-layers moves activations "
             "only)"] if rest else []
    return ["--cpu-offloading-num-layers", str(n)], moved + notes[1:]


def megatron_args(e: Execution, spec: TransformerSpec, precision: str) -> tuple[list[str], list[str]]:
    """Megatron-LM's arguments for ``e`` (module docstring) and the notes on what they cannot express."""
    args = ["--tensor-model-parallel-size", str(e.tp), "--pipeline-model-parallel-size", str(e.pp),
            "--context-parallel-size", str(e.cp), "--expert-model-parallel-size", str(e.ep)]
    if e.cp > 1:
        args += ["--cp-comm-type", e.cp_comm]
    if e.virtual_stages > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(e.virtual_stages)]
        if not e.pp_comm_overlap:
            args.append("--no-overlap-p2p-communication")
    for option, value in (("--decoder-first-pipeline-num-layers", e.layers_first_stage),
                          ("--decoder-last-pipeline-num-layers", e.layers_last_stage)):
        if value is not None:
            args += [option, str(value)]
    if e.pipeline_layout is not None:
        args += ["--pipeline-model-parallel-layout", e.pipeline_layout]
    if e.account_for_embedding_in_pipeline_split:
        args.append("--account-for-embedding-in-pipeline-split")
    if e.account_for_loss_in_pipeline_split:
        args.append("--account-for-loss-in-pipeline-split")
    if e.sequence_parallel:
        args.append("--sequence-parallel")
    notes: list[str] = []
    if e.tp_comm_overlap and e.sequence_parallel:
        args.append("--tp-comm-overlap")
    elif e.tp_comm_overlap:
        notes.append("tp_comm_overlap without sequence parallelism: Megatron's --tp-comm-overlap needs "
                     "--sequence-parallel")
    args += ["--micro-batch-size", str(e.micro_batch), "--global-batch-size", str(e.global_batch),
             "--seq-length", str(spec.seq_len)]
    args += _megatron_recompute(e)
    if e.recompute == "selective-op":
        notes.append("recompute selective-op: torchtitan's op policy (every second matrix product) has no Megatron-LM "
                     "argument, no recompute written")
    if e.zero:
        args.append("--use-distributed-optimizer")
    if e.zero >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _FSDP_STRATEGY[e.zero],
                 "--ckpt-format", "fsdp_dtensor"]
    if e.hsdp_shard:
        args += ["--num-distributed-optimizer-instances", str(e.dp // e.hsdp_shard)]
    if e.dp_overlap:
        args.append("--overlap-grad-reduce")
    if e.zero == 3 and e.fsdp_prefetch:
        if e.dp_overlap:
            args.append("--overlap-param-gather")
        else:
            notes.append("FSDP prefetch without dp_overlap: Megatron's --overlap-param-gather needs "
                         "--overlap-grad-reduce")
    if e.zero3_collectives == "per-tensor":
        notes.append("zero3_collectives per-tensor: Megatron's distributed optimizer gathers and reduces buckets of "
                     "parameters, not one tensor at a time")
    cpu_optimizer = _megatron_cpu_optimizer(e)
    if cpu_optimizer:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    offload, offload_notes = _megatron_offload(e, spec, cpu_optimizer)
    args += offload
    args += ["--attention-backend", "flash" if e.attention == "flash" else "unfused"]
    if spec.experts > 1 and e.ep > 1:
        args += (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]
                 if e.ep_dispatcher == "hybridep" else ["--moe-token-dispatcher-type", "alltoall"])
    if spec.experts > 1 and e.moe_a2a_overlap:
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if spec.experts > 1 and e.moe_router_graph:
        args += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "moe_router", "moe_preprocess"]
    if spec.experts > 1 and e.capacity_factor != 1:
        args += ["--moe-expert-capacity-factor", repr(float(e.capacity_factor)), "--moe-pad-expert-input-to-capacity"]
    if precision == "fp8":
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                 {"current": "tensorwise", "delayed": "delayed", "mxfp8": "mxfp8"}[e.fp8_scaling]]
    elif precision in ("bf16", "fp16"):
        args.append(f"--{precision}")
    return args, offload_notes + notes


def megatron_file(e: Execution, spec: TransformerSpec, precision: str) -> str:
    """The text ``--export-megatron`` writes: ``#`` notes, then the arguments on one line."""
    args, notes = megatron_args(e, spec, precision)
    head = [f"# Megatron-LM arguments for {spec.name}, {e.gpus} GPUs (mcdla search)"]
    return "\n".join([*head, *(f"# not expressed: {n}" for n in notes), " ".join(args)]) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _model_parts(e: Execution, spec: TransformerSpec) -> list[list[str]]:
    """torchtitan's module names per model chunk, in virtual-stage order (chunk ``c`` of stage ``s`` is part
    ``c * pp + s``, the looped placement of both frameworks)."""
    grid = chunk_layers(e, spec)
    parts: list[list[str]] = []
    first = 0
    for c in range(e.virtual_stages):
        for s in range(e.pp):
            parts.append([f"layers.{i}" for i in range(first, first + grid[s][c])])
            first += grid[s][c]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _torchtitan_parallelism(e: Execution, spec: TransformerSpec, notes: list[str]) -> dict[str, object]:
    # torchtitan's DDP (replicate only) refuses any other parallelism: ZeRO-0 beside TP/PP/CP becomes FSDP2
    as_fsdp = e.zero == 0 and e.dp > 1 and e.tp * e.pp * e.cp > 1
    sharded = e.zero > 0 or as_fsdp
    shard = (e.hsdp_shard or e.dp) if sharded else 1
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": e.dp // shard, "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": e.tp, "pipeline_parallel_degree": e.pp,
        "context_parallel_degree": e.cp, "expert_parallel_degree": e.ep}
    if e.ep > 1:
        parallelism["expert_tensor_parallel_degree"] = e.tp
        if (shard * e.cp) % e.ep:
            notes.append(f"expert parallelism {e.ep} over replicated data-parallel ranks: torchtitan's experts "
                         f"borrow data_parallel_shard_degree x context_parallel_degree = {shard * e.cp} ranks")
    if e.cp > 1:
        if e.cp_comm == "all_gather":
            parallelism["context_parallel_rotate_method"] = "allgather"
        else:
            notes.append("cp_comm p2p: torchtitan's context parallelism exchanges K and V by all-gather or all-to-all")
    if sharded:
        parallelism["fsdp_reshard_after_forward"] = "always" if e.zero == 3 else "never"
        if e.zero == 1:
            notes.append("ZeRO-1: FSDP2 shards the gradients too (written as ZeRO-2)")
        if as_fsdp:
            notes.append("ZeRO-0 with TP/PP/CP: torchtitan's DDP runs only without other parallelism "
                         "(written as FSDP2 keeping the gathered weights, ZeRO-2)")
    elif e.cp > 1:
        notes.append("ZeRO-0 with context parallelism: torchtitan's FSDP2 shards the weights over the CP group")
    if e.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if e.virtual_stages > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = e.micro_batch
        if e.layers_first_stage is None and e.layers_last_stage is None and e.pipeline_layout is None:
            embedding, loss = e.account_for_embedding_in_pipeline_split, e.account_for_loss_in_pipeline_split
            parallelism["pipeline_parallel_layers_per_stage"] = (
                (spec.layers + int(embedding) + int(loss)) // (e.pp * e.virtual_stages))
            parallelism["pipeline_parallel_first_stage_less_layers"] = int(embedding)
            parallelism["pipeline_parallel_last_stage_less_layers"] = int(loss)
        else:
            parallelism["module_fqns_per_model_part"] = _model_parts(e, spec)
    return parallelism


def _torchtitan_checkpoint(e: Execution, spec: TransformerSpec) -> tuple[dict[str, object], list[str]]:
    """The ``[activation_checkpoint]`` table (module docstring) and the notes on what it does not express."""
    n = e.recompute_num_layers
    if e.recompute == "selective-op":
        return {"mode": "selective", "selective_ac_option": "op"}, []
    if e.recompute == "selective":
        what = "the attention core" if e.recompute_modules == ("core_attn",) else ", ".join(e.recompute_modules)
        return {"mode": "selective", "selective_ac_option": "op"}, [
            f"recompute selective ({what}): torchtitan has no such policy, written as its op policy (recompute "
            "selective-op)"]
    if e.recompute != "full" or n is None:
        return {"mode": e.recompute}, []
    if e.recompute_method == "uniform":
        notes = [] if n == 1 else [f"uniform recompute in groups of {n} layers: written as full (every layer)"]
        return {"mode": "full"}, notes
    layers = spec.layers // (e.pp * e.virtual_stages)  # one model chunk's (a layer count needs an even split)
    if n == 0:
        return {"mode": "none"}, []
    if n == layers:
        return {"mode": "full"}, []
    every = [f for f in range(1, layers + 1) if layers // f == n]
    if not every:
        return {"mode": "full"}, [f"block recompute of {n} of each model chunk's {layers} layers: no every-f-th-layer "
                                  f"count gives {n}, written as full"]
    f = every[0]
    return ({"mode": "selective", "selective_ac_option": str(f)},
            [f"block recompute of the first {n} layers of each model chunk: torchtitan checkpoints every {f}-th "
             f"layer of it instead ({layers // f} layers, spread over the chunk)"])


def torchtitan_toml(e: Execution, spec: TransformerSpec, precision: str) -> str:
    """A torchtitan job TOML for ``e`` (module docstring), the unexpressed fields as ``#`` comments."""
    cpu_offload = (e.zero == 3 and e.offload_weights and e.offload_optimizer and e.cpu_optimizer
                   and e.offload_tier == "host" and not e.offload_activations)
    notes = [] if cpu_offload else _offload_notes(e, False)
    parallelism = _torchtitan_parallelism(e, spec, notes)
    sharded = parallelism["data_parallel_shard_degree"] != 1
    if e.tp > 1 and not e.sequence_parallel:
        notes.append("sequence parallelism off: torchtitan's tensor parallelism always shards along the sequence")
    if e.tp_comm_overlap:  # torchtitan's async TP, which runs compiled only
        parallelism["enable_async_tensor_parallel"] = True
    if e.zero == 3 and e.fsdp_prefetch != 1:
        notes.append(f"fsdp_prefetch {e.fsdp_prefetch}: FSDP2 prefetches one layer's gather ahead")
    if e.zero3_collectives == "per-tensor":
        notes.append("zero3_collectives per-tensor: FSDP2 gathers and reduce-scatters each block's parameters in "
                     "one collective")
    if not e.dp_overlap and e.dp > 1 and sharded:
        notes.append("dp_overlap off: FSDP2 always overlaps its gradient reduce-scatter")
    if spec.experts > 1 and e.ep > 1 and e.ep_dispatcher == "hybridep":
        notes.append("ep_dispatcher hybridep: torchtitan dispatches MoE tokens with its own all-to-all")
    if spec.experts > 1 and e.capacity_factor != 1:
        notes.append(f"capacity factor {e.capacity_factor:g}: torchtitan's MoE routing has no capacity option")
    training: dict[str, object] = {
        "local_batch_size": e.global_batch // e.dp if e.pp > 1 else e.micro_batch,
        "global_batch_size": e.global_batch, "seq_len": spec.seq_len,
        "mixed_precision_param": "float32" if precision == "fp32" else "bfloat16"}
    if precision == "fp16":
        notes.append("fp16: torchtitan's mixed precision is bfloat16 or float32 (written as bfloat16)")
    if cpu_offload:
        training["enable_cpu_offload"] = True
    checkpoint, recompute_notes = _torchtitan_checkpoint(e, spec)
    notes += recompute_notes
    sections: list[tuple[str, dict[str, object]]] = [("parallelism", parallelism), ("training", training),
                                                     ("activation_checkpoint", checkpoint)]
    if e.tp_comm_overlap:
        sections.append(("compile", {"enable": True}))
    if precision == "fp8":
        sections += [("model", {"converters": ["quantize.linear.float8"]}),
                     ("quantize.linear.float8", {"recipe_name": "tensorwise"})]
        if e.fp8_scaling != "current":
            notes.append(f"fp8 {e.fp8_scaling} scaling: written as torchtitan's tensorwise float8 recipe")
    lines = [f"# torchtitan job for {spec.name}, {e.gpus} GPUs (mcdla search)",
             *(f"# not expressed: {n}" for n in notes)]
    for name, table in sections:
        lines += ["", f"[{name}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"
