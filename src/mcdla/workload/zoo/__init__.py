"""The workload zoo: analytical builders of the eight applications of our MC-DLA reconstruction.

``build(name, batch, precision, **scale)`` returns a :class:`~mcdla.workload.model.Workload` computed from
layer shapes alone (no PyTorch): one layer per leaf module of the matching model in
:mod:`mcdla.profile.models`, named by its qualified module name, with FLOPs as ``torch.utils.flop_counter``
counts them and saved bytes as PyTorch autograd keeps them (see NOTEs in ``_graph.py``). The PyTorch models
take the same scale parameters, and ``tests/profile/test_models_agree.py`` checks the two against each other.

Shapes, sources, default batches and totals: ``docs/zoo.md`` (table printed by ``python -m mcdla.workload.zoo``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import MappingProxyType
from typing import Any

from mcdla.errors import WorkloadError
from mcdla.workload.model import Workload
from mcdla.workload.zoo import _cnn, _rnn
from mcdla.workload.zoo._graph import SAVES, _Graph
from mcdla.workload.zoo.specs import SPECS, ZooSpec, element_bytes, resolve_scale, spec

__all__ = ["ZooSpec", "names", "build", "spec", "default_batch", "small_scale", "scale_parameters"]

_BUILDERS: MappingProxyType[str, Callable[..., None]] = MappingProxyType(
    {
        "alexnet": _cnn.alexnet,
        "googlenet": _cnn.googlenet,
        "vgg-e": _cnn.vgg_e,
        "resnet-152": _cnn.resnet152,
        "rnn": partial(_rnn.recurrent_stack, "rnn"),
        "lstm": partial(_rnn.recurrent_stack, "lstm"),
        "gru": partial(_rnn.recurrent_stack, "gru"),
        "seq-lstm": _rnn.seq2seq,
    }
)


def names() -> tuple[str, ...]:
    """Names of the zoo workloads: four CNNs, then four recurrent models."""
    return tuple(SPECS)


def default_batch(name: str) -> int:
    """The documented per-device batch of ``name`` (its fp16 footprint exceeds a 16 GiB device)."""
    return spec(name).default_batch


def small_scale(name: str) -> dict[str, int | float]:
    """Scale parameters (``batch`` included) at which ``name``'s PyTorch model runs on a CPU in well under a
    second; pass them to :func:`build` and to ``mcdla.profile.models.build`` alike."""
    return dict(spec(name).small)


def scale_parameters(name: str) -> dict[str, int | float]:
    """The scale parameters ``name`` accepts besides ``batch`` and ``precision``, with their defaults."""
    return dict(spec(name).defaults)


def build(name: str, batch: int | None = None, precision: str = "fp16", *, saves: str = "pytorch",
          **scale: Any) -> Workload:
    """Build zoo workload ``name`` analytically.

    Args:
        name: one of :func:`names`.
        batch: per-device mini-batch (samples); None = the documented default batch.
        precision: ``"fp16"`` (default: V100 tensor cores, an assumption), ``"bf16"`` or ``"fp32"``; sets the
            bytes per activation, gradient and weight element.
        saves: what a layer saves for backward: ``"pytorch"`` (default: what autograd keeps, checked against
            PyTorch by ``tests/profile/test_models_agree.py``) or ``"cudnn"`` (vDNN's cuDNN layers: a max-pool
            keeps its input and output, not PyTorch's int64 indices; the reproduction's setting).
        scale: shape parameters (:func:`scale_parameters`), e.g. ``resolution``, ``width`` for CNNs,
            ``hidden``, ``seq_len``, ``layers``, ``chunk`` for recurrent models.
    """
    s = spec(name)
    if batch is None:
        batch = s.default_batch
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkloadError(f"{name}.batch: got {batch!r}; must be an integer >= 1")
    if saves not in SAVES:
        raise WorkloadError(f"{name}.saves: got {saves!r}; must be one of {', '.join(SAVES)}")
    params = resolve_scale(name, scale)
    graph = _Graph(elt_bytes=element_bytes(precision), saves=saves)
    try:
        _BUILDERS[name](graph, batch, **params)
    except WorkloadError as exc:
        raise WorkloadError(f"{name} at {_scale_text(params)}: {exc}") from None
    return Workload(
        name=name,
        batch=batch,
        layers=graph.layers(),
        precision=precision,
        description=f"{s.summary}; {_scale_text(params)}; {precision}" + ("; cuDNN saves" if saves == "cudnn" else ""),
    )


def _scale_text(params: dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
