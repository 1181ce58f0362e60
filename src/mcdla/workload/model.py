"""The workload model: one training step as an ordered chain of layers.

Every quantity is for the workload's batch size and in base units (FLOP, bytes). A layer's *saved bytes*
are what it stashes for backward (typically its input feature map); this is the unit that memory
virtualization offloads, prefetches or recomputes. See ``docs/workload-model.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from mcdla.errors import WorkloadError

__all__ = ["LayerKind", "Layer", "Measurement", "Workload"]


class LayerKind(str, Enum):
    """What a layer computes; the vDNN ``conv`` policy and the roofline efficiency key off this."""

    CONV = "conv"
    FC = "fc"
    RNN_CELL = "rnn-cell"
    ATTENTION = "attention"
    NORM = "norm"
    POOL = "pool"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"
    LOSS = "loss"
    OTHER = "other"


_NONNEGATIVE_FIELDS = (
    "fwd_flops",
    "bwd_flops",
    "fwd_bytes_moved",
    "bwd_bytes_moved",
    "param_bytes",
    "output_bytes",
    "saved_bytes",
    "workspace_bytes",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One layer of a training step, at the workload's batch size.

    Attributes:
        name: unique name; for profiled models the qualified module name (``"encoder.layers.3"``).
        kind: what the layer computes.
        fwd_flops, bwd_flops: floating-point operations of forward and backward (FLOP).
        fwd_bytes_moved, bwd_bytes_moved: device-memory traffic of forward and backward (bytes), for the
            roofline.
        param_bytes: bytes of this layer's parameters.
        output_bytes: bytes of the layer's output activation.
        saved_bytes: bytes the layer stashes for backward (its saved inputs): the unit of virtualization.
        workspace_bytes: transient scratch memory while the layer runs (bytes).
        inputs: names of the layers whose outputs feed this one; empty means "the previous layer".
        fwd_time_s, bwd_time_s: measured times (seconds) from a profile of a real run; when given, the
            simulator uses them instead of the device roofline.
    """

    name: str
    kind: LayerKind
    fwd_flops: float
    bwd_flops: float
    fwd_bytes_moved: float = 0.0
    bwd_bytes_moved: float = 0.0
    param_bytes: float = 0.0
    output_bytes: float = 0.0
    saved_bytes: float = 0.0
    workspace_bytes: float = 0.0
    inputs: tuple[str, ...] = ()
    fwd_time_s: float | None = None
    bwd_time_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"layer.name: got {self.name!r}; must be a non-empty string")
        if not isinstance(self.kind, LayerKind):
            try:
                object.__setattr__(self, "kind", LayerKind(self.kind))
            except ValueError:
                allowed = ", ".join(k.value for k in LayerKind)
                raise WorkloadError(
                    f"layer {self.name!r}.kind: got {self.kind!r}; must be one of {allowed}"
                ) from None
        for name in _NONNEGATIVE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise WorkloadError(f"layer {self.name!r}.{name}: got {value!r}; must be a number")
            if not math.isfinite(value) or value < 0:
                raise WorkloadError(f"layer {self.name!r}.{name}: got {value!r}; must be finite and >= 0")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for name in ("fwd_time_s", "bwd_time_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise WorkloadError(f"layer {self.name!r}.{name}: got {value!r}; must be a finite number >= 0 or null")
            object.__setattr__(self, name, float(value))

    def scaled(self, factor: float) -> Layer:
        """Return this layer with every batch-proportional quantity multiplied by ``factor``.

        FLOPs, activation traffic, outputs, saved bytes and workspace scale with the batch; parameters do not.
        Weight traffic (``param_bytes``) is subtracted before scaling and added back.
        """
        if not factor > 0:
            raise WorkloadError(f"scale factor: got {factor!r}; must be > 0")
        p = self.param_bytes
        return dataclasses.replace(
            self,
            fwd_flops=self.fwd_flops * factor,
            bwd_flops=self.bwd_flops * factor,
            fwd_bytes_moved=p + max(self.fwd_bytes_moved - p, 0.0) * factor,
            bwd_bytes_moved=2 * p + max(self.bwd_bytes_moved - 2 * p, 0.0) * factor,
            output_bytes=self.output_bytes * factor,
            saved_bytes=self.saved_bytes * factor,
            workspace_bytes=self.workspace_bytes * factor,
            fwd_time_s=None if self.fwd_time_s is None else self.fwd_time_s * factor,
            bwd_time_s=None if self.bwd_time_s is None else self.bwd_time_s * factor,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Where a workload's measured layer times (``fwd_time_s`` / ``bwd_time_s``) were taken.

    Measured times hold for that device only; simulating them on other hardware needs them rescaled
    (``mcdla simulate --scale-to``), which the peak makes possible.

    Attributes:
        device: what measured them, in words (``"cpu: Intel(R) Xeon(R) ... on host1"``, ``"cuda: NVIDIA H100"``).
        peak_flops_per_s: that device's peak FLOP/s in the workload's precision, when known (None: unknown).
    """

    device: str
    peak_flops_per_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise WorkloadError(f"measured_on.device: got {self.device!r}; must be a non-empty string")
        peak = self.peak_flops_per_s
        if peak is not None and not (isinstance(peak, (int, float)) and math.isfinite(peak) and peak > 0):
            raise WorkloadError(f"measured_on.peak_flops_per_s: got {peak!r}; must be a finite FLOP/s > 0 or null")


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A training step: layers in forward (topological) order, at a given batch size.

    Attributes:
        name: workload name (``"vgg-e"``).
        batch: global mini-batch size the per-layer quantities are given for.
        layers: layers in forward order; backward runs them in reverse.
        precision: the arithmetic the FLOPs run in (``"fp16"``, ``"fp32"``, ...), to pick the device peak.
        optimizer_bytes_per_param_byte: optimizer state kept per parameter byte (0 for SGD, 1 for momentum,
            2 for Adam), resident on the device beside weights and gradients.
        description: free text (shapes, sources).
        measured_on: where the layers' measured times were taken (None: not measured, or not recorded).
    """

    name: str
    batch: int
    layers: tuple[Layer, ...]
    precision: str = "fp16"
    optimizer_bytes_per_param_byte: float = 1.0
    description: str = ""
    measured_on: Measurement | None = None
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"workload.name: got {self.name!r}; must be a non-empty string")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise WorkloadError(f"workload {self.name!r}.batch: got {self.batch!r}; must be an integer >= 1")
        layers = tuple(self.layers)
        if not layers:
            raise WorkloadError(f"workload {self.name!r}.layers: got an empty list; must have at least one layer")
        object.__setattr__(self, "layers", layers)
        if self.optimizer_bytes_per_param_byte < 0:
            raise WorkloadError(
                f"workload {self.name!r}.optimizer_bytes_per_param_byte: got "
                f"{self.optimizer_bytes_per_param_byte!r}; must be >= 0"
            )
        index: dict[str, int] = {}
        for i, layer in enumerate(layers):
            if layer.name in index:
                raise WorkloadError(f"workload {self.name!r}.layers[{i}].name: got duplicate {layer.name!r}")
            for src in layer.inputs:
                if src not in index:
                    raise WorkloadError(
                        f"workload {self.name!r}.layers[{i}].inputs: got {src!r}; "
                        "must name an earlier layer (layers are in forward order)"
                    )
            index[layer.name] = i
        object.__setattr__(self, "_index", index)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    def index_of(self, name: str) -> int:
        """Position of the layer called ``name``; raises WorkloadError naming the workload if unknown."""
        try:
            return self._index[name]
        except KeyError:
            raise WorkloadError(f"workload {self.name!r}: no layer named {name!r}") from None

    @property
    def has_measured_times(self) -> bool:
        """Whether any layer carries a measured ``fwd_time_s`` or ``bwd_time_s`` (then it is not a roofline)."""
        return any(layer.fwd_time_s is not None or layer.bwd_time_s is not None for layer in self.layers)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    @property
    def param_bytes(self) -> float:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def saved_bytes(self) -> float:
        """Bytes stashed for backward by all layers: what virtualization can move off the device."""
        return sum(layer.saved_bytes for layer in self.layers)

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> float:
        return sum(layer.bwd_flops for layer in self.layers)

    @property
    def static_bytes(self) -> float:
        """Bytes resident for the whole step: weights, weight gradients and optimizer state."""
        return self.param_bytes * (2.0 + self.optimizer_bytes_per_param_byte)

    def footprint_bytes(self) -> float:
        """Device bytes needed without virtualization: static bytes, all saved bytes, and the largest
        transient working set (output, input gradient and workspace of one layer)."""
        transient = max(
            (layer.output_bytes * 2 + layer.workspace_bytes for layer in self.layers), default=0.0
        )
        return self.static_bytes + self.saved_bytes + transient

    def with_batch(self, batch: int) -> Workload:
        """Return the workload at another batch size, scaling batch-proportional quantities linearly."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise WorkloadError(f"batch: got {batch!r}; must be an integer >= 1")
        if batch == self.batch:
            return self
        factor = batch / self.batch
        return dataclasses.replace(self, batch=batch, layers=tuple(l.scaled(factor) for l in self.layers))

    def with_layers(self, layers: Sequence[Layer]) -> Workload:
        return dataclasses.replace(self, layers=tuple(layers))
