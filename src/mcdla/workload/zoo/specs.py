"""Architecture constants and scale parameters of the eight zoo workloads.

Shared by the analytical builders (:mod:`mcdla.workload.zoo`) and the PyTorch definitions
(:mod:`mcdla.profile.models`) so that both are instantiated at identical shapes from the same scale
parameters. Only shapes live here; what each layer costs is computed independently on each side (by closed
forms here, by PyTorch's own counting there), which is what makes the comparison of the two a check.

Sources: ``docs/zoo.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mcdla.errors import WorkloadError

__all__ = [
    "ZooSpec",
    "SPECS",
    "ELEMENT_BYTES",
    "VGG_E_CFG",
    "ALEXNET_CONVS",
    "GOOGLENET_INCEPTIONS",
    "RESNET152_BLOCKS",
    "GATES",
    "spec",
    "resolve_scale",
    "element_bytes",
    "scale_channels",
    "conv_out",
    "pool_out",
    "chunk_lengths",
]

#: Bytes per element of each supported precision (pure low-precision training: weights, activations and
#: gradients all in that type; batch-norm statistics are always fp32, indices int64, dropout masks bool).
ELEMENT_BYTES = MappingProxyType({"fp16": 2, "bf16": 2, "fp32": 4})

#: VGG configuration "E" (VGG-19), Simonyan & Zisserman 2015 Table 1: channels, "M" = 2x2 max-pool.
VGG_E_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
)  # fmt: skip

#: AlexNet (single-tower, Krizhevsky 2014 "one weird trick" = torchvision): (out, kernel, stride, pad, pool after).
ALEXNET_CONVS: tuple[tuple[int, int, int, int, bool], ...] = (
    (64, 11, 4, 2, True),
    (192, 5, 1, 2, True),
    (384, 3, 1, 1, False),
    (256, 3, 1, 1, False),
    (256, 3, 1, 1, True),
)

#: GoogLeNet (Inception v1), Szegedy et al. 2015 Table 1: name, #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5,
#: pool proj; a 3x3/2 max-pool (ceil mode) follows 3b and 4e.
GOOGLENET_INCEPTIONS: tuple[tuple[str, int, int, int, int, int, int], ...] = (
    ("inception3a", 64, 96, 128, 16, 32, 32),
    ("inception3b", 128, 128, 192, 32, 96, 64),
    ("inception4a", 192, 96, 208, 16, 48, 64),
    ("inception4b", 160, 112, 224, 24, 64, 64),
    ("inception4c", 128, 128, 256, 24, 64, 64),
    ("inception4d", 112, 144, 288, 32, 64, 64),
    ("inception4e", 256, 160, 320, 32, 128, 128),
    ("inception5a", 256, 160, 320, 32, 128, 128),
    ("inception5b", 384, 192, 384, 48, 128, 128),
)

#: Bottleneck blocks per stage of ResNet-152 (He et al. 2016 Table 1); stage widths 64, 128, 256, 512 (x4 out).
RESNET152_BLOCKS = (3, 8, 36, 3)

#: Gate blocks per recurrent cell: the recurrent weight is (GATES * hidden) x hidden.
GATES = MappingProxyType({"rnn": 1, "lstm": 4, "gru": 3})


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooSpec:
    """One zoo workload: its family, scale parameters with defaults, default batch and a small CPU scale.

    Attributes:
        name: zoo name (``"vgg-e"``).
        family: ``"cnn"``, ``"rnn"`` (rnn/lstm/gru stacks) or ``"seq2seq"``.
        defaults: scale parameters (shapes, not the batch) with their full-size values.
        default_batch: per-device batch: the smallest power of two whose fp16 footprint exceeds 16 GiB.
        small: scale parameters (including ``batch``) at which the PyTorch model runs on a CPU in well under
            a second; used by tests and by profiling smoke runs.
        summary: one line: what the workload is and where its shapes come from.
    """

    name: str
    family: str
    defaults: Mapping[str, int | float]
    default_batch: int
    small: Mapping[str, int | float]
    summary: str


def _cnn_defaults() -> Mapping[str, int | float]:
    return MappingProxyType({"resolution": 224, "width": 1.0, "num_classes": 1000})


def _cnn_small(resolution: int, width: float) -> Mapping[str, int | float]:
    return MappingProxyType({"batch": 2, "resolution": resolution, "width": width, "num_classes": 10})


def _rnn_defaults(hidden: int, seq_len: int, layers: int, chunk: int) -> Mapping[str, int | float]:
    return MappingProxyType(
        {
            "hidden": hidden,
            "seq_len": seq_len,
            "layers": layers,
            "input_size": hidden,
            "num_classes": 29,
            "chunk": chunk,
        }
    )


_RNN_SMALL = MappingProxyType(
    {"batch": 3, "hidden": 16, "seq_len": 7, "layers": 2, "input_size": 12, "num_classes": 5, "chunk": 3}
)

SPECS: Mapping[str, ZooSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            ZooSpec(
                name="alexnet",
                family="cnn",
                defaults=_cnn_defaults(),
                default_batch=8192,
                small=_cnn_small(64, 0.125),
                summary="AlexNet, single-tower variant (Krizhevsky 2014; torchvision), 224x224 images",
            ),
            ZooSpec(
                name="googlenet",
                family="cnn",
                defaults=_cnn_defaults(),
                default_batch=1024,
                small=_cnn_small(64, 0.125),
                summary="GoogLeNet / Inception v1 (Szegedy et al. 2015, Table 1), no LRN, no aux heads, 224x224",
            ),
            ZooSpec(
                name="vgg-e",
                family="cnn",
                defaults=_cnn_defaults(),
                default_batch=512,
                small=_cnn_small(32, 0.0625),
                summary="VGG-E / VGG-19 (Simonyan & Zisserman 2015, configuration E), 224x224 images",
            ),
            ZooSpec(
                name="resnet-152",
                family="cnn",
                defaults=_cnn_defaults(),
                default_batch=256,
                small=_cnn_small(32, 0.0625),
                summary="ResNet-152 v1.5 (He et al. 2016; torchvision stride placement), 224x224 images",
            ),
            ZooSpec(
                name="rnn",
                family="rnn",
                defaults=_rnn_defaults(1760, 50, 7, 5),
                default_batch=8192,
                small=_RNN_SMALL,
                summary="7-layer vanilla (tanh) RNN, hidden 1760, 50 steps (DeepBench training set; DS2 depth)",
            ),
            ZooSpec(
                name="lstm",
                family="rnn",
                defaults=_rnn_defaults(2048, 25, 4, 5),
                default_batch=4096,
                small=_RNN_SMALL,
                summary="4-layer LSTM, hidden 2048, 25 steps (DeepBench training set)",
            ),
            ZooSpec(
                name="gru",
                family="rnn",
                defaults=_rnn_defaults(2560, 375, 3, 25),
                default_batch=512,
                small=_RNN_SMALL,
                summary="3-layer GRU, hidden 2560, 375 steps (DeepBench training set; DS2-style speech model)",
            ),
            ZooSpec(
                name="seq-lstm",
                family="seq2seq",
                defaults=MappingProxyType(
                    {
                        "hidden": 1000,
                        "embed": 1000,
                        "layers": 4,
                        "seq_len": 50,
                        "src_vocab": 160000,
                        "tgt_vocab": 80000,
                        "chunk": 5,
                    }
                ),
                default_batch=512,
                small=MappingProxyType(
                    {
                        "batch": 3,
                        "hidden": 16,
                        "embed": 8,
                        "layers": 2,
                        "seq_len": 6,
                        "src_vocab": 50,
                        "tgt_vocab": 40,
                        "chunk": 4,
                    }
                ),
                summary="Seq2seq 4+4-layer LSTM encoder-decoder, 1000 units, vocab 160k/80k (Sutskever et al. 2014)",
            ),
        )
    }
)


def spec(name: str) -> ZooSpec:
    """The spec of zoo workload ``name``; unknown names raise a WorkloadError listing the allowed ones."""
    try:
        return SPECS[name]
    except (KeyError, TypeError):
        raise WorkloadError(f"zoo workload: got {name!r}; must be one of {', '.join(SPECS)}") from None


def element_bytes(precision: str) -> int:
    """Bytes per element of ``precision`` (``"fp16"`` -> 2)."""
    try:
        return ELEMENT_BYTES[precision]
    except (KeyError, TypeError):
        raise WorkloadError(f"precision: got {precision!r}; must be one of {', '.join(ELEMENT_BYTES)}") from None


def resolve_scale(name: str, scale: Mapping[str, Any]) -> dict[str, int | float]:
    """Fill ``scale`` with the defaults of workload ``name`` and check every value.

    Integers must be >= 1; ``width`` is a channel multiplier > 0.
    Unknown parameters raise a WorkloadError listing the allowed ones.
    """
    s = spec(name)
    out: dict[str, int | float] = dict(s.defaults)
    for key, value in scale.items():
        if key not in s.defaults:
            raise WorkloadError(
                f"{name}.{key}: got {value!r}; unknown scale parameter, must be one of {', '.join(s.defaults)}"
            )
        if key == "width":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise WorkloadError(f"{name}.width: got {value!r}; must be a number > 0")
            out[key] = float(value)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{name}.{key}: got {value!r}; must be an integer >= 1")
        out[key] = value
    return out


def scale_channels(channels: int, width: float) -> int:
    """Channels after the width multiplier: ``round(channels * width)``, at least 1 (half rounds up)."""
    return max(1, int(math.floor(channels * width + 0.5)))


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output length of a convolution along one axis (PyTorch's formula, dilation 1)."""
    return (size + 2 * pad - kernel) // stride + 1


def pool_out(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """Output length of a max-pool along one axis, PyTorch's ``pooling_output_shape`` (dilation 1)."""
    numerator = size + 2 * pad - kernel + (stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def chunk_lengths(seq_len: int, chunk: int) -> tuple[int, ...]:
    """Timesteps per step-chunk module: ``chunk`` each, the last one shorter if ``chunk`` does not divide."""
    full, rest = divmod(seq_len, chunk)
    return (chunk,) * full + ((rest,) if rest else ())
