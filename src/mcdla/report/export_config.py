"""A searched :class:`~mcdla.workload.execution.Execution` as the launch configuration of a training framework:
Megatron-LM command-line arguments and a torchtitan TOML, so that ``mcdla search``'s winner can be run.

Megatron-LM (``pretrain_gpt.py`` arguments):

- ``tp``, ``pp``, ``cp``, ``ep``: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--expert-model-parallel-size``; the data-parallel degree is what remains of
  the GPUs, so Megatron has no argument for it.
- ``virtual_stages`` > 1: ``--virtual-pipeline-model-parallel-size`` (model chunks per pipeline rank), and
  ``--no-overlap-p2p-communication`` unless ``pp_comm_overlap`` (Megatron-LM overlaps the sends by default).
- ``sequence_parallel``: ``--sequence-parallel``; ``tp_comm_overlap``: ``--tp-comm-overlap``.
- ``micro_batch``, ``global_batch``, the model's ``seq_len``: ``--micro-batch-size``, ``--global-batch-size``,
  ``--seq-length``.
- ``recompute``: ``selective`` is ``--recompute-granularity selective`` (the attention core); ``full`` is
  ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every layer from its
  input); with ``recompute_num_layers`` N, ``--recompute-method block|uniform --recompute-num-layers N`` (block
  with N = 0 recomputes nothing and writes no recompute argument).
- ``offload_num_layers`` N with ``offload_activations``: ``--cpu-offloading-num-layers N``, where Megatron-Core
  accepts it: ``0 < N < layers``, no pipeline parallelism, no recomputation, weights kept (its
  ``cpu_offloading_weights`` has no argument); otherwise a ``#`` note says which condition fails.
- ``zero``: 1 is ``--use-distributed-optimizer`` (optimizer state sharded over the data-parallel group); 2 is
  the same argument, the nearest Megatron has (its distributed optimizer reduce-scatters gradients but keeps a
  full gradient buffer); 3 is ``--use-torch-fsdp2``.
- ``dp_overlap``: ``--overlap-grad-reduce``.
- precision: ``bf16`` is ``--bf16``, ``fp16`` is ``--fp16``, ``fp8`` is ``--bf16 --fp8-format hybrid`` (E4M3
  forward, E5M2 backward, Transformer Engine's recipe) with ``--fp8-recipe tensorwise`` (current scaling) or
  ``delayed``.

Not expressible in Megatron-LM's arguments, written as ``#`` comment lines of the file: offloading
activations of every layer, weights or optimizer state to a second memory tier, and ZeRO-2's sharded gradient
buffer.

torchtitan (``[job]``-style TOML sections):

- ``[parallelism]``: ``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``context_parallel_degree``,
  ``expert_parallel_degree``; the data-parallel degree is ``data_parallel_shard_degree`` (FSDP2, ZeRO 1-3)
  or ``data_parallel_replicate_degree`` (DDP, ZeRO 0), the other being 1; ZeRO 1 and 2 keep the gathered
  weights after forward (``fsdp_reshard_after_forward = "never"``, FSDP2's ZeRO-2); the pipeline schedule is
  ``1F1B`` or, with virtual stages, ``Interleaved1F1B`` with ``pipeline_parallel_layers_per_stage`` (layers
  per model chunk) and ``pipeline_parallel_microbatch_size``.
- ``[training]``: ``global_batch_size``, ``seq_len`` and ``local_batch_size``, the samples one data-parallel
  rank runs per optimizer step with a pipeline (``global_batch / dp``, split into micro-batches by the
  schedule) and the micro-batch without one (torchtitan then accumulates ``global_batch / (micro_batch * dp)``
  gradient steps); ``mixed_precision_param`` ``bfloat16`` (or ``float32`` for fp32).
- ``[activation_checkpoint]`` ``mode``: ``none``, ``selective`` (``selective_ac_option = "op"``) or ``full``;
  ``block`` recompute of N of a model chunk's ``L`` layers is ``selective`` with ``selective_ac_option = "f"``,
  torchtitan's checkpoint of every f-th layer of each model part (its counter restarts with each part's
  ``apply_ac``), for an ``f`` with ``floor(L / f) = N`` (the same number of layers, spread over the chunk instead
  of its first N; a ``#`` note says so, and says when no ``f`` exists).
- fp8: ``[model] converters = ["float8"]`` with ``[float8] recipe_name = "tensorwise"``.

Not expressible in torchtitan's TOML, written as ``#`` comments: offloading to a second tier (by layer count or
not), ``uniform`` recompute groups of more than one layer (written as ``full``), sequence
parallelism off with TP > 1 (torchtitan's TP always shards the norms along the sequence), ZeRO-1's replicated
gradients, fp8 delayed scaling, and ``dp_overlap`` off (FSDP2 always overlaps its reduce-scatter); torchtitan's
selective checkpointing saves chosen ops' outputs, not exactly Megatron's attention-core recompute.
"""

from __future__ import annotations

from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec

__all__ = ["megatron_args", "megatron_file", "torchtitan_toml"]


def _offload_notes(e: Execution) -> list[str]:
    kinds = [k for k, on in (("activations", e.offload_activations), ("weights", e.offload_weights),
                             ("optimizer state", e.offload_optimizer)) if on]
    if not kinds:
        return []
    count = "" if e.offload_num_layers is None else f" (activations/weights of the first {e.offload_num_layers} " \
                                                    "layers of each model chunk)"
    return [f"offloads {', '.join(kinds)} to the second memory tier{count}"]


def _megatron_recompute(e: Execution) -> list[str]:
    """``--recompute-*`` arguments (module docstring)."""
    if e.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if e.recompute != "full":
        return []
    if e.recompute_num_layers is None:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if e.recompute_method == "block" and e.recompute_num_layers == 0:
        return []
    return ["--recompute-granularity", "full", "--recompute-method", e.recompute_method,
            "--recompute-num-layers", str(e.recompute_num_layers)]


def _megatron_offload(e: Execution, spec: TransformerSpec) -> tuple[list[str], list[str]]:
    """``--cpu-offloading-num-layers`` where Megatron-Core accepts the count (module docstring), and the notes."""
    n = e.offload_num_layers
    if n is None or not e.offload_activations:
        return [], _offload_notes(e)
    why = [text for text, bad in (
        (f"Megatron-Core needs 0 < cpu_offloading_num_layers < {spec.layers}", not 0 < n < spec.layers),
        ("Megatron-Core refuses CPU offloading with pipeline parallelism", e.pp > 1),
        ("Megatron-Core refuses CPU offloading with recomputation", e.recompute != "none"))
        if bad]
    if why:
        return [], [f"{_offload_notes(e)[0]}: {'; '.join(why)}"]
    rest = [k for k, on in (("weights", e.offload_weights), ("optimizer state", e.offload_optimizer)) if on]
    notes = [f"offloads {', '.join(rest)} to the second memory tier (--cpu-offloading-num-layers moves activations "
             "only)"] if rest else []
    return ["--cpu-offloading-num-layers", str(n)], notes


def megatron_args(e: Execution, spec: TransformerSpec, precision: str) -> tuple[list[str], list[str]]:
    """Megatron-LM's arguments for ``e`` (module docstring) and the notes on what they cannot express."""
    args = ["--tensor-model-parallel-size", str(e.tp), "--pipeline-model-parallel-size", str(e.pp),
            "--context-parallel-size", str(e.cp), "--expert-model-parallel-size", str(e.ep)]
    if e.virtual_stages > 1:
        args += ["--virtual-pipeline-model-parallel-size", str(e.virtual_stages)]
        if not e.pp_comm_overlap:
            args.append("--no-overlap-p2p-communication")
    if e.sequence_parallel:
        args.append("--sequence-parallel")
    if e.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    args += ["--micro-batch-size", str(e.micro_batch), "--global-batch-size", str(e.global_batch),
             "--seq-length", str(spec.seq_len)]
    args += _megatron_recompute(e)
    offload, notes = _megatron_offload(e, spec)
    args += offload
    if e.zero in (1, 2):
        args.append("--use-distributed-optimizer")
        if e.zero == 2:
            notes.append("ZeRO-2: --use-distributed-optimizer shards the optimizer state, not the gradient buffer")
    elif e.zero == 3:
        args.append("--use-torch-fsdp2")
    if e.dp_overlap:
        args.append("--overlap-grad-reduce")
    if precision == "fp8":
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                 "tensorwise" if e.fp8_scaling == "current" else "delayed"]
    elif precision in ("bf16", "fp16"):
        args.append(f"--{precision}")
    return args, notes


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


def _torchtitan_checkpoint(e: Execution, spec: TransformerSpec) -> tuple[dict[str, object], list[str]]:
    """The ``[activation_checkpoint]`` table (module docstring) and the notes on what it does not express."""
    n = e.recompute_num_layers
    if e.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}, []
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
    notes = _offload_notes(e)
    sharded = e.zero > 0
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": 1 if sharded else e.dp,
        "data_parallel_shard_degree": e.dp if sharded else 1,
        "tensor_parallel_degree": e.tp, "pipeline_parallel_degree": e.pp,
        "context_parallel_degree": e.cp, "expert_parallel_degree": e.ep}
    if e.zero in (1, 2):
        parallelism["fsdp_reshard_after_forward"] = "never"
        if e.zero == 1:
            notes.append("ZeRO-1: FSDP2 shards the gradients too (written as ZeRO-2)")
    if e.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if e.virtual_stages > 1 else "1F1B"
        parallelism["pipeline_parallel_layers_per_stage"] = spec.layers // (e.pp * e.virtual_stages)
        parallelism["pipeline_parallel_microbatch_size"] = e.micro_batch
    if e.tp > 1 and not e.sequence_parallel:
        notes.append("sequence parallelism off: torchtitan's tensor parallelism always shards along the sequence")
    if not e.dp_overlap and e.dp > 1 and sharded:
        notes.append("dp_overlap off: FSDP2 always overlaps its gradient reduce-scatter")
    training: dict[str, object] = {
        "local_batch_size": e.global_batch // e.dp if e.pp > 1 else e.micro_batch,
        "global_batch_size": e.global_batch, "seq_len": spec.seq_len,
        "mixed_precision_param": "float32" if precision == "fp32" else "bfloat16"}
    checkpoint, recompute_notes = _torchtitan_checkpoint(e, spec)
    notes += recompute_notes
    sections: list[tuple[str, dict[str, object]]] = [("parallelism", parallelism), ("training", training),
                                                     ("activation_checkpoint", checkpoint)]
    if precision == "fp8":
        sections += [("model", {"converters": ["float8"]}), ("float8", {"recipe_name": "tensorwise"})]
        if e.fp8_scaling == "delayed":
            notes.append("fp8 delayed scaling: torchtitan's float8 recipes scale per tensor at run time")
    lines = [f"# torchtitan job for {spec.name}, {e.gpus} GPUs (mcdla search)",
             *(f"# not expressed: {n}" for n in notes)]
    for name, table in sections:
        lines += ["", f"[{name}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"
