"""A tiny analytical autograd: tensors as (shape, storage) handles, layers as records of what they read,
write and save, turned into :class:`~mcdla.workload.model.Layer` values.

NOTE [saved-bytes attribution]
1. A layer *saves* the storages PyTorch's autograd keeps for its backward (``saved_tensors_hooks`` sees
   them); a view keeps its whole storage alive, so a saved view counts its storage's bytes.
2. Parameters and buffers are not activations and are never counted as saved.
3. A storage saved by several layers (a ReLU saves its output, the next conv saves the same tensor as its
   input) is counted once, for the *last* layer in forward order that saves it: that layer's backward is
   the first to need it, so the simulator's "prefetch before this layer's backward" is the right
   deadline, and ``Workload.saved_bytes`` equals the bytes autograd really holds.
4. Max-pool differs between frameworks (``saves``): PyTorch's autograd keeps the input and the int64 argmax
   indices (8 bytes per output element: for a 2x2/2 pool of fp16 as many bytes as the input, for GoogLeNet's
   3x3/1 branch pools four times the input); cuDNN's ``cudnnPoolingBackward`` takes ``x``, ``y`` and ``dy``
   and keeps no indices, which is what vDNN (Rhu et al., MICRO 2016) offloads. ``saves="cudnn"`` models that:
   the pool saves ``x`` and ``y`` (``y`` is usually also the next layer's saved input and counts there).

NOTE [FLOP convention]
FLOPs are what ``torch.utils.flop_counter`` counts: convolutions and matrix products only, a multiply-add
being 2 FLOP; bias adds, normalisation, activations, pooling and softmax count 0 (they are memory-bound and
their time comes from the bytes they move). Backward = gradient wrt the input (only when the input
requires grad: not for the first layer) + gradient wrt the weight.

NOTE [bytes moved]
A roofline estimate, not a measurement: forward reads the inputs and parameters, writes the outputs and
the tensors it creates only to save them (pool indices, dropout masks, gates); backward reads the output
gradient and every tensor it saved and writes the input gradient (when needed), reading the parameters and
writing their gradients (``2 * param_bytes``). Functional glue between modules (``cat``, ``stack``, the
residual ``add``) is charged to the first layer that consumes its result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mcdla.errors import WorkloadError
from mcdla.workload.model import Layer, LayerKind
from mcdla.workload.zoo.specs import conv_out, pool_out

__all__: list[str] = []

_INT64_BYTES = 8
_BOOL_BYTES = 1
_STAT_BYTES = 4  # batch-norm mean / inverse std are fp32 even for fp16 activations (cuDNN and PyTorch CPU)
SAVES = ("pytorch", "cudnn")
"""What a layer is taken to save for its backward (NOTE [saved-bytes attribution] item 4)."""


def _checked(name: str, shape: tuple[int, ...], x: _T) -> tuple[int, ...]:
    if min(shape[2:]) < 1:
        raise WorkloadError(
            f"layer {name!r}: input feature map {x.shape[2]}x{x.shape[3]} is too small; must use a larger resolution"
        )
    return shape


@dataclass(frozen=True, slots=True)
class _T:
    """A tensor handle: full shape (batch included), bytes per element, storage id, autograd facts."""

    shape: tuple[int, ...]
    elt_bytes: int
    storage: int
    requires_grad: bool
    producers: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.elt_bytes


@dataclass(slots=True)
class _Record:
    name: str
    kind: LayerKind
    reads: tuple[_T, ...]
    outputs: tuple[_T, ...]
    saves: tuple[_T, ...]
    param_bytes: float
    fwd_flops: float
    bwd_flops: float


@dataclass(slots=True)
class _Graph:
    """Collects layer records in forward order; ``layers()`` turns them into Layer values."""

    elt_bytes: int
    saves: str = "pytorch"
    _storage_bytes: dict[int, int] = field(default_factory=dict)
    _creator: dict[int, str] = field(default_factory=dict)
    _glue_bytes: dict[int, int] = field(default_factory=dict)
    _records: list[_Record] = field(default_factory=list)

    # -- tensors -------------------------------------------------------------------------------------------
    def new(self, shape: tuple[int, ...], *, producer: str | None, requires_grad: bool, elt_bytes: int = 0) -> _T:
        """A tensor in a fresh storage (``elt_bytes`` 0 = the workload's precision)."""
        storage = len(self._storage_bytes)
        t = _T(tuple(shape), elt_bytes or self.elt_bytes, storage, requires_grad, (producer,) if producer else ())
        self._storage_bytes[storage] = t.nbytes
        if producer:
            self._creator[storage] = producer
        return t

    def input(self, shape: tuple[int, ...], *, elt_bytes: int = 0) -> _T:
        """A graph input (no producer, no grad)."""
        return self.new(shape, producer=None, requires_grad=False, elt_bytes=elt_bytes)

    @staticmethod
    def view(t: _T, shape: tuple[int, ...]) -> _T:
        """A view of ``t`` with another shape (same storage, same producers)."""
        return _T(tuple(shape), t.elt_bytes, t.storage, t.requires_grad, t.producers)

    def glue(self, parts: tuple[_T, ...], shape: tuple[int, ...]) -> _T:
        """The result of cat/stack/add over ``parts``: a fresh storage fed by all their producers."""
        producers = tuple(dict.fromkeys(p for t in parts for p in t.producers))
        out = _T(tuple(shape), parts[0].elt_bytes, len(self._storage_bytes), any(t.requires_grad for t in parts),
                 producers)  # fmt: skip
        self._storage_bytes[out.storage] = out.nbytes
        self._glue_bytes[out.storage] = sum(t.nbytes for t in parts) + out.nbytes
        return out

    # -- layers --------------------------------------------------------------------------------------------
    def layer(
        self,
        name: str,
        kind: LayerKind,
        *,
        reads: tuple[_T, ...],
        outputs: tuple[_T, ...],
        saves: tuple[_T, ...] = (),
        param_bytes: float = 0.0,
        fwd_flops: float = 0.0,
        bwd_flops: float = 0.0,
    ) -> None:
        self._records.append(_Record(name, kind, reads, outputs, saves, param_bytes, fwd_flops, bwd_flops))

    def layers(self) -> tuple[Layer, ...]:
        """The recorded layers with saved bytes attributed per NOTE [saved-bytes attribution]."""
        last_saver: dict[int, int] = {}
        for i, rec in enumerate(self._records):
            for t in rec.saves:
                last_saver[t.storage] = i
        saved = [0.0] * len(self._records)
        for storage, i in last_saver.items():
            saved[i] += self._storage_bytes[storage]
        charged: set[int] = set()
        out: list[Layer] = []
        for i, rec in enumerate(self._records):
            out.append(self._to_layer(rec, saved[i], out[-1].name if out else None, charged))
        return tuple(out)

    def _to_layer(self, rec: _Record, saved_bytes: float, previous: str | None, charged: set[int]) -> Layer:
        reads = {t.storage: t for t in rec.reads}
        out_storages = {t.storage: t.nbytes for t in rec.outputs}
        output_bytes = sum(out_storages.values())
        save_storages = {t.storage for t in rec.saves}
        created_only_to_save = sum(
            self._storage_bytes[s]
            for s in save_storages
            if self._creator.get(s) == rec.name and s not in out_storages
        )
        glue = 0
        for s in reads:
            if s in self._glue_bytes and s not in charged:
                charged.add(s)
                glue += self._glue_bytes[s]
        read_bytes = sum(t.nbytes for t in rec.reads)
        grad_in_bytes = sum(t.nbytes for t in rec.reads if t.requires_grad)
        fwd_bytes = rec.param_bytes + read_bytes + output_bytes + created_only_to_save + glue
        bwd_bytes = (
            2 * rec.param_bytes
            + output_bytes
            + sum(self._storage_bytes[s] for s in save_storages)
            + grad_in_bytes
        )
        producers = tuple(dict.fromkeys(p for t in rec.reads for p in t.producers if p != rec.name))
        inputs = () if producers in ((), (previous,)) else producers
        return Layer(
            name=rec.name,
            kind=rec.kind,
            fwd_flops=rec.fwd_flops,
            bwd_flops=rec.bwd_flops,
            fwd_bytes_moved=fwd_bytes,
            bwd_bytes_moved=bwd_bytes,
            param_bytes=rec.param_bytes,
            output_bytes=output_bytes,
            saved_bytes=saved_bytes,
            inputs=inputs,
        )

    # -- modules (one call = one leaf module = one layer) ----------------------------------------------------
    def _grad_factor(self, x: _T) -> int:
        return 2 if x.requires_grad else 1

    def conv2d(self, name: str, x: _T, out_ch: int, kernel: int, stride: int, pad: int, *, bias: bool) -> _T:
        """nn.Conv2d (groups 1): saves its input."""
        n, c, h, w = x.shape
        shape = _checked(name, (n, out_ch, conv_out(h, kernel, stride, pad), conv_out(w, kernel, stride, pad)), x)
        y = self.new(shape, producer=name, requires_grad=True)
        flops = 2.0 * math.prod(y.shape) * c * kernel * kernel
        params = (out_ch * c * kernel * kernel + (out_ch if bias else 0)) * self.elt_bytes
        self.layer(name, LayerKind.CONV, reads=(x,), outputs=(y,), saves=(x,), param_bytes=params,
                   fwd_flops=flops, bwd_flops=flops * self._grad_factor(x))  # fmt: skip
        return y

    def linear(self, name: str, x: _T, out_features: int, *, bias: bool = True) -> _T:
        """nn.Linear over the last axis: saves its input."""
        in_features = x.shape[-1]
        y = self.new(x.shape[:-1] + (out_features,), producer=name, requires_grad=True)
        flops = 2.0 * math.prod(x.shape) * out_features
        params = (in_features * out_features + (out_features if bias else 0)) * self.elt_bytes
        self.layer(name, LayerKind.FC, reads=(x,), outputs=(y,), saves=(x,), param_bytes=params,
                   fwd_flops=flops, bwd_flops=flops * self._grad_factor(x))  # fmt: skip
        return y

    def batch_norm(self, name: str, x: _T) -> _T:
        """nn.BatchNorm2d in training: saves its input and the per-channel fp32 mean and inverse std."""
        c = x.shape[1]
        y = self.new(x.shape, producer=name, requires_grad=True)
        mean = self.new((c,), producer=name, requires_grad=False, elt_bytes=_STAT_BYTES)
        invstd = self.new((c,), producer=name, requires_grad=False, elt_bytes=_STAT_BYTES)
        self.layer(name, LayerKind.NORM, reads=(x,), outputs=(y,), saves=(x, mean, invstd),
                   param_bytes=2 * c * self.elt_bytes)  # fmt: skip
        return y

    def relu(self, name: str, x: _T) -> _T:
        """nn.ReLU: saves its output."""
        y = self.new(x.shape, producer=name, requires_grad=x.requires_grad)
        self.layer(name, LayerKind.ELEMENTWISE, reads=(x,), outputs=(y,), saves=(y,))
        return y

    def max_pool(self, name: str, x: _T, kernel: int, stride: int, pad: int = 0, *, ceil_mode: bool = False) -> _T:
        """nn.MaxPool2d: saves its input and the int64 argmax indices (one per output element); with
        ``saves="cudnn"`` its input and output, no indices (NOTE [saved-bytes attribution] item 4)."""
        n, c, h, w = x.shape
        shape = (n, c, pool_out(h, kernel, stride, pad, ceil_mode), pool_out(w, kernel, stride, pad, ceil_mode))
        shape = _checked(name, shape, x)
        y = self.new(shape, producer=name, requires_grad=x.requires_grad)
        if self.saves == "cudnn":
            self.layer(name, LayerKind.POOL, reads=(x,), outputs=(y,), saves=(x, y))
            return y
        idx = self.new(shape, producer=name, requires_grad=False, elt_bytes=_INT64_BYTES)
        self.layer(name, LayerKind.POOL, reads=(x,), outputs=(y,), saves=(x, idx))
        return y

    def global_avg_pool(self, name: str, x: _T) -> _T:
        """nn.AdaptiveAvgPool2d(1): a mean over H, W; its backward needs only the shape, so it saves nothing."""
        y = self.new(x.shape[:2] + (1, 1), producer=name, requires_grad=x.requires_grad)
        self.layer(name, LayerKind.POOL, reads=(x,), outputs=(y,))
        return y

    def dropout(self, name: str, x: _T) -> _T:
        """Dropout as ``torch.native_dropout`` (CUDA's nn.Dropout path): saves a bool keep-mask."""
        y = self.new(x.shape, producer=name, requires_grad=x.requires_grad)
        mask = self.new(x.shape, producer=name, requires_grad=False, elt_bytes=_BOOL_BYTES)
        self.layer(name, LayerKind.ELEMENTWISE, reads=(x,), outputs=(y,), saves=(mask,))
        return y

    def log_softmax(self, name: str, x: _T) -> _T:
        """nn.LogSoftmax over the last axis: saves its output."""
        y = self.new(x.shape, producer=name, requires_grad=x.requires_grad)
        self.layer(name, LayerKind.LOSS, reads=(x,), outputs=(y,), saves=(y,))
        return y

    def embedding(self, name: str, tokens: _T, vocab: int, dim: int) -> _T:
        """nn.Embedding: saves the int64 token indices (its input)."""
        y = self.new(tokens.shape + (dim,), producer=name, requires_grad=True)
        self.layer(name, LayerKind.EMBEDDING, reads=(tokens,), outputs=(y,), saves=(tokens,),
                   param_bytes=vocab * dim * self.elt_bytes)  # fmt: skip
        return y
