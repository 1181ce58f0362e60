"""Partial recompute and offload by layer count: which share of each model chunk's layers recomputes and offloads.

NOTE [partial recompute and offload] Megatron-LM counts per model chunk (its ``TransformerBlock``, one per virtual
stage): ``block`` recomputes the first ``N = recompute_num_layers`` layers of the chunk fully and keeps the others'
activations (``N = 0``: none recomputed, ``N`` = the chunk's layers: all, each from its input); ``uniform``
recomputes every layer, in groups of ``N`` consecutive layers of which only the group's input is stored (``N = 1``:
every layer from its own input). Transformer Engine's CPU offload (Megatron-Core's ``--cpu-offloading-num-layers``)
moves the first ``offload_num_layers`` layers of the chunk. A chunk's figures are then the count-weighted mean of a
recomputed (offloaded) and a plain layer, exact for chunk totals when every chunk holds the same layers, which is
why a layer count needs an even split here. What is not a sum takes the mean layer too, an approximation: ZeRO-3's
exposed gathers (each layer's compute hides the next one's gather) and the offload's exposure against the stage's
compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.errors import ConfigError
from mcdla.workload.execution import Execution, chunk_layers
from mcdla.workload.transformer import TransformerSpec
from mcdla.workload.memo import pure_cache

__all__ = ["LayerShares", "dense_chunk_layers", "layer_shares"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShares:
    """Which share of each model chunk's layers recomputes and offloads (NOTE [partial recompute and offload]).

    Attributes:
        recomputed: share of the layers fully recomputed in backward (1 with ``recompute="full"`` and no count).
        attention_recomputed: share whose attention core is recomputed (1 with ``selective`` and ``core_attn``; 0 with
            ``selective-op``, which keeps the attention kernel's output).
        stored_inputs: share of the layers whose input is stored as a checkpoint (the recomputed ones; with
            ``uniform``, one in each group of ``recompute_num_layers``).
        group: layers one recomputation runs at once (``uniform``'s group; 1 otherwise): their activations
            are live together in backward.
        offloaded: share of the layers whose activations (and weights) go to the second tier when offloaded.
    """

    recomputed: float
    attention_recomputed: float
    stored_inputs: float
    group: int
    offloaded: float


@pure_cache(64)
def layer_shares(execution: Execution, spec: TransformerSpec) -> LayerShares:
    """The :class:`LayerShares` of ``execution`` on ``spec`` (module docstring); one-line ConfigError when a layer
    count exceeds a model chunk's layers or the chunks differ in size."""
    e = execution
    full = e.recompute == "full"
    counted = e.recompute_num_layers is not None or e.offload_num_layers is not None
    offloading = e.offload_activations or e.offload_weights
    if not counted:
        return LayerShares(recomputed=float(full), attention_recomputed=float(e.recomputes_attention),
                           stored_inputs=float(full), group=1, offloaded=float(offloading))
    sizes = {n for row in chunk_layers(e, spec) for n in row}
    field = "recompute_num_layers" if e.recompute_num_layers is not None else "offload_num_layers"
    if len(sizes) > 1:
        raise ConfigError(f"execution.{field}: got {getattr(e, field)} with model chunks of {sorted(sizes)} layers; "
                          "a layer count needs every chunk the same size (an even split)")
    chunk = sizes.pop()
    count = getattr(e, field)
    if count > chunk:
        raise ConfigError(f"execution.{field}: got {count}; must be at most the {chunk} layers of each model chunk "
                          f"(layers / (pp * virtual_stages) of {spec.name})")
    if e.recompute_num_layers is None:
        recomputed = stored = float(full)
        group = 1
    elif e.recompute_method == "uniform":
        recomputed, stored, group = 1.0, -(-chunk // count) / chunk, count
    else:
        recomputed = stored = count / chunk
        group = 1
    offloaded = float(offloading) if e.offload_num_layers is None else e.offload_num_layers / chunk
    return LayerShares(recomputed=recomputed,
                       attention_recomputed=recomputed if full else float(e.recomputes_attention),
                       stored_inputs=stored, group=group, offloaded=offloaded)


def dense_chunk_layers(chunks: tuple[tuple[int, ...], ...], dense_layers: int) -> tuple[tuple[int, ...], ...]:
    """How many of each model chunk's layers (``chunks[stage][chunk]``, :func:`~mcdla.workload.execution.chunk_layers`)
    are among the model's first ``dense_layers`` (DeepSeek's dense leading layers). Megatron-Core numbers the
    layers in order over the virtual pipeline stages, chunk ``c`` of stage ``s`` the ``c * pp + s``-th, and
    gives each chunk's layers the specs of their global numbers in the model's dense/MoE pattern
    (Megatron-LM 0d8e0714, ``megatron/core/models/gpt/gpt_layer_specs.py`` ``get_gpt_decoder_block_spec``:
    ``moe_layer_pattern`` sliced at ``get_transformer_layer_offset``, or at the layout's ``get_layer_id_list``)."""
    pp = len(chunks)
    v = len(chunks[0]) if chunks else 0
    dense = [[0] * v for _ in range(pp)]
    start = 0
    for c in range(v):
        for s in range(pp):
            n = chunks[s][c]
            dense[s][c] = min(n, max(0, dense_layers - start))
            start += n
    return tuple(tuple(row) for row in dense)
