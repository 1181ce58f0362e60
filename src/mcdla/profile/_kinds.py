"""The workload layer kind of a PyTorch module, from its type."""

from __future__ import annotations

from torch import nn

from mcdla.workload.model import LayerKind

__all__ = ["kind_of"]

_BY_TYPE: tuple[tuple[tuple[type, ...], LayerKind], ...] = (
    ((nn.modules.conv._ConvNd,), LayerKind.CONV),
    ((nn.Linear, nn.Bilinear), LayerKind.FC),
    ((nn.RNNBase, nn.RNNCellBase), LayerKind.RNN_CELL),
    ((nn.MultiheadAttention,), LayerKind.ATTENTION),
    ((nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm), LayerKind.NORM),
    ((nn.Embedding, nn.EmbeddingBag), LayerKind.EMBEDDING),
    ((nn.modules.loss._Loss,), LayerKind.LOSS),
    ((nn.Dropout, nn.Identity, nn.Flatten, nn.Unflatten), LayerKind.ELEMENTWISE),
)
_BY_NAME = (
    ("attention", LayerKind.ATTENTION),
    ("attn", LayerKind.ATTENTION),
    ("conv", LayerKind.CONV),
    ("lstm", LayerKind.RNN_CELL),
    ("gru", LayerKind.RNN_CELL),
    ("norm", LayerKind.NORM),
    ("pool", LayerKind.POOL),
    ("embed", LayerKind.EMBEDDING),
    ("loss", LayerKind.LOSS),
)
# For a block, the most telling kind among its descendants wins, in this order.
_PRIORITY = (LayerKind.ATTENTION, LayerKind.RNN_CELL, LayerKind.CONV, LayerKind.FC, LayerKind.EMBEDDING)


def _own_kind(module: nn.Module) -> LayerKind:
    for types, kind in _BY_TYPE:
        if isinstance(module, types):
            return kind
    if type(module).__module__ == nn.modules.activation.__name__:
        return LayerKind.ELEMENTWISE
    lowered = type(module).__name__.lower()
    for needle, kind in _BY_NAME:
        if needle in lowered:
            return kind
    return LayerKind.OTHER


def kind_of(module: nn.Module) -> LayerKind:
    """The kind of ``module``; a module with children takes the most telling kind among them."""
    own = _own_kind(module)
    if own is not LayerKind.OTHER or next(module.children(), None) is None:
        return own
    kinds = {_own_kind(m) for m in module.modules()}
    return next((k for k in _PRIORITY if k in kinds), LayerKind.OTHER)
