"""Analytical builders of the four CNNs: AlexNet, GoogLeNet, VGG-E and ResNet-152.

Each builder records one layer per leaf module of the matching PyTorch model in
:mod:`mcdla.profile.models`, under the same qualified name and in execution order. Inputs are
``(batch, 3, resolution, resolution)`` images; every model ends in ``log_softmax`` (the loss is NLL on its
output, which saves only the int64 targets and is not a layer).
"""

from __future__ import annotations

import math

from mcdla.workload.zoo._graph import _Graph, _T
from mcdla.workload.zoo.specs import (
    ALEXNET_CONVS,
    GOOGLENET_INCEPTIONS,
    RESNET152_BLOCKS,
    VGG_E_CFG,
    scale_channels,
)

__all__: list[str] = []


def _flatten(g: _Graph, x: _T) -> _T:
    return g.view(x, (x.shape[0], math.prod(x.shape[1:])))


def alexnet(g: _Graph, batch: int, *, resolution: int, width: float, num_classes: int) -> None:
    """torchvision's AlexNet without the adaptive average pool: the classifier is sized from the feature map
    (identical at 224x224, where the map is already 6x6)."""
    x = g.input((batch, 3, resolution, resolution))
    i = 0
    for out_ch, kernel, stride, pad, pool in ALEXNET_CONVS:
        x = g.conv2d(f"features.{i}", x, scale_channels(out_ch, width), kernel, stride, pad, bias=True)
        x = g.relu(f"features.{i + 1}", x)
        i += 2
        if pool:
            x = g.max_pool(f"features.{i}", x, 3, 2)
            i += 1
    hidden = scale_channels(4096, width)
    x = g.dropout("classifier.0", _flatten(g, x))
    x = g.relu("classifier.2", g.linear("classifier.1", x, hidden))
    x = g.dropout("classifier.3", x)
    x = g.relu("classifier.5", g.linear("classifier.4", x, hidden))
    g.log_softmax("log_softmax", g.linear("classifier.6", x, num_classes))


def vgg_e(g: _Graph, batch: int, *, resolution: int, width: float, num_classes: int) -> None:
    """VGG configuration E (VGG-19) as torchvision's ``vgg19`` without the adaptive average pool."""
    x = g.input((batch, 3, resolution, resolution))
    i = 0
    for item in VGG_E_CFG:
        if item == "M":
            x = g.max_pool(f"features.{i}", x, 2, 2)
            i += 1
        else:
            x = g.conv2d(f"features.{i}", x, scale_channels(int(item), width), 3, 1, 1, bias=True)
            x = g.relu(f"features.{i + 1}", x)
            i += 2
    hidden = scale_channels(4096, width)
    x = g.relu("classifier.1", g.linear("classifier.0", _flatten(g, x), hidden))
    x = g.dropout("classifier.2", x)
    x = g.relu("classifier.4", g.linear("classifier.3", x, hidden))
    x = g.dropout("classifier.5", x)
    g.log_softmax("log_softmax", g.linear("classifier.6", x, num_classes))


def _basic(g: _Graph, prefix: str, x: _T, out_ch: int, kernel: int, pad: int, stride: int = 1) -> _T:
    """Conv (with bias) + ReLU, modules ``<prefix>.conv`` and ``<prefix>.relu``."""
    return g.relu(f"{prefix}.relu", g.conv2d(f"{prefix}.conv", x, out_ch, kernel, stride, pad, bias=True))


def _inception(g: _Graph, name: str, x: _T, widths: tuple[int, ...]) -> _T:
    c1, c3r, c3, c5r, c5, pool_proj = widths
    b1 = _basic(g, f"{name}.branch1", x, c1, 1, 0)
    b2 = _basic(g, f"{name}.branch2.1", _basic(g, f"{name}.branch2.0", x, c3r, 1, 0), c3, 3, 1)
    b3 = _basic(g, f"{name}.branch3.1", _basic(g, f"{name}.branch3.0", x, c5r, 1, 0), c5, 5, 2)
    pooled = g.max_pool(f"{name}.branch4.0", x, 3, 1, 1, ceil_mode=True)
    b4 = _basic(g, f"{name}.branch4.1", pooled, pool_proj, 1, 0)
    n, _, h, w = b1.shape
    return g.glue((b1, b2, b3, b4), (n, c1 + c3 + c5 + pool_proj, h, w))


def googlenet(g: _Graph, batch: int, *, resolution: int, width: float, num_classes: int) -> None:
    """Inception v1 per Szegedy et al. 2015 Table 1 (5x5 convolutions, conv biases, no batch-norm); LRN and
    the auxiliary classifiers are left out; the final 7x7 average pool is a global average pool."""
    x = g.input((batch, 3, resolution, resolution))
    x = _basic(g, "conv1", x, scale_channels(64, width), 7, 3, stride=2)
    x = g.max_pool("maxpool1", x, 3, 2, ceil_mode=True)
    x = _basic(g, "conv2", x, scale_channels(64, width), 1, 0)
    x = _basic(g, "conv3", x, scale_channels(192, width), 3, 1)
    x = g.max_pool("maxpool2", x, 3, 2, ceil_mode=True)
    for name, *widths in GOOGLENET_INCEPTIONS:
        if name == "inception4a":
            x = g.max_pool("maxpool3", x, 3, 2, ceil_mode=True)
        elif name == "inception5a":
            x = g.max_pool("maxpool4", x, 3, 2, ceil_mode=True)
        x = _inception(g, name, x, tuple(scale_channels(c, width) for c in widths))
    x = _flatten(g, g.global_avg_pool("avgpool", x))
    g.log_softmax("log_softmax", g.linear("fc", g.dropout("dropout", x), num_classes))


def _bottleneck(g: _Graph, name: str, x: _T, planes: int, stride: int) -> _T:
    out = g.conv2d(f"{name}.conv1", x, planes, 1, 1, 0, bias=False)
    out = g.relu(f"{name}.relu1", g.batch_norm(f"{name}.bn1", out))
    out = g.conv2d(f"{name}.conv2", out, planes, 3, stride, 1, bias=False)
    out = g.relu(f"{name}.relu2", g.batch_norm(f"{name}.bn2", out))
    out = g.batch_norm(f"{name}.bn3", g.conv2d(f"{name}.conv3", out, 4 * planes, 1, 1, 0, bias=False))
    identity = x
    if stride != 1 or x.shape[1] != 4 * planes:
        identity = g.conv2d(f"{name}.downsample.0", x, 4 * planes, 1, stride, 0, bias=False)
        identity = g.batch_norm(f"{name}.downsample.1", identity)
    return g.relu(f"{name}.relu3", g.glue((out, identity), out.shape))


def resnet152(g: _Graph, batch: int, *, resolution: int, width: float, num_classes: int) -> None:
    """ResNet-152 as torchvision's ``resnet152`` (v1.5: stride on the 3x3 conv), with a separate ReLU module
    per use (``relu1``..``relu3``) instead of one shared ``relu``, so that each module runs once."""
    x = g.input((batch, 3, resolution, resolution))
    x = g.relu("relu", g.batch_norm("bn1", g.conv2d("conv1", x, scale_channels(64, width), 7, 2, 3, bias=False)))
    x = g.max_pool("maxpool", x, 3, 2, 1)
    for stage, (blocks, planes) in enumerate(zip(RESNET152_BLOCKS, (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            x = _bottleneck(g, f"layer{stage}.{b}", x, scale_channels(planes, width), stride)
    x = _flatten(g, g.global_avg_pool("avgpool", x))
    g.log_softmax("log_softmax", g.linear("fc", x, num_classes))
