"""PyTorch definitions of the eight zoo workloads, scalable down to CPU-sized shapes.

``build(name, **scale)`` returns ``(model, example_inputs, loss_fn)``: ``loss_fn(model(*example_inputs))``
is the scalar training loss. The scale parameters are those of :func:`mcdla.workload.zoo.build`
(:func:`mcdla.workload.zoo.scale_parameters`), and the leaf modules' qualified names, in execution order,
are exactly the analytical zoo's layer names at the same scale: a plan made on the analytical workload
names modules of this model. ``tests/profile/test_models_agree.py`` checks FLOPs (``FlopCounterMode``) and
saved bytes (``saved_tensors_hooks``) of these models against the analytical zoo.

Differences from torchvision, all deliberate: every model ends in ``LogSoftmax`` (the loss is NLL, so the
big softmax output is a layer); ReLUs are not in-place and never shared between call sites; dropout is
:class:`Dropout` (a bool mask on every device); AlexNet and VGG size their classifier from the feature map
instead of an adaptive average pool; GoogLeNet follows the 2015 paper (5x5 convolutions, biases, no
batch-norm, no LRN, no auxiliary heads). Recurrent layers are split per NOTE [recurrent granularity] in
``mcdla/workload/zoo/_rnn.py``.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ProfileError
from mcdla.workload.zoo import specs

__all__ = ["build", "names", "Dropout", "StepChunk", "RecurrentLayer"]

_DTYPES = MappingProxyType({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16})


def names() -> tuple[str, ...]:
    """Names of the eight models (the zoo's names)."""
    return tuple(specs.SPECS)


class Dropout(nn.Module):
    """Dropout through ``torch.native_dropout``, which saves a bool keep-mask on every device (``nn.Dropout``
    on a CPU saves a mask in the activation dtype instead, 2-4x the bytes)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


# -- CNNs ------------------------------------------------------------------------------------------------------
class AlexNet(nn.Module):
    def __init__(self, *, resolution: int, width: float, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, size = 3, resolution
        for out_ch, kernel, stride, pad, pool in specs.ALEXNET_CONVS:
            out_ch = specs.scale_channels(out_ch, width)
            layers += [nn.Conv2d(channels, out_ch, kernel, stride, pad), nn.ReLU()]
            channels, size = out_ch, specs.conv_out(size, kernel, stride, pad)
            if pool:
                layers.append(nn.MaxPool2d(3, 2))
                size = specs.pool_out(size, 3, 2, 0, False)
        self.features = nn.Sequential(*layers)
        hidden = specs.scale_channels(4096, width)
        self.classifier = nn.Sequential(
            Dropout(0.5), nn.Linear(channels * size * size, hidden), nn.ReLU(),
            Dropout(0.5), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )  # fmt: skip
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_softmax(self.classifier(torch.flatten(self.features(x), 1)))


class VGG(nn.Module):
    def __init__(self, *, resolution: int, width: float, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, size = 3, resolution
        for item in specs.VGG_E_CFG:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
                size = specs.pool_out(size, 2, 2, 0, False)
            else:
                out_ch = specs.scale_channels(int(item), width)
                layers += [nn.Conv2d(channels, out_ch, 3, padding=1), nn.ReLU()]
                channels = out_ch
        self.features = nn.Sequential(*layers)
        hidden = specs.scale_channels(4096, width)
        self.classifier = nn.Sequential(
            nn.Linear(channels * size * size, hidden), nn.ReLU(), Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(), Dropout(0.5), nn.Linear(hidden, num_classes),
        )  # fmt: skip
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_softmax(self.classifier(torch.flatten(self.features(x), 1)))


class _ConvReLU(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, pad: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, pad)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv(x))


class _Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool_proj: int) -> None:
        super().__init__()
        self.branch1 = _ConvReLU(cin, c1, 1)
        self.branch2 = nn.Sequential(_ConvReLU(cin, c3r, 1), _ConvReLU(c3r, c3, 3, pad=1))
        self.branch3 = nn.Sequential(_ConvReLU(cin, c5r, 1), _ConvReLU(c5r, c5, 5, pad=2))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _ConvReLU(cin, pool_proj, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, *, resolution: int, width: float, num_classes: int) -> None:
        del resolution  # the global average pool makes the classifier resolution-independent
        super().__init__()
        ch = {c: specs.scale_channels(c, width) for c in (64, 192)}
        self.conv1 = _ConvReLU(3, ch[64], 7, stride=2, pad=3)
        self.maxpool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = _ConvReLU(ch[64], ch[64], 1)
        self.conv3 = _ConvReLU(ch[64], ch[192], 3, pad=1)
        self.maxpool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        cin = ch[192]
        for name, *widths in specs.GOOGLENET_INCEPTIONS:
            if name == "inception4a":
                self.maxpool3 = nn.MaxPool2d(3, 2, ceil_mode=True)
            elif name == "inception5a":
                self.maxpool4 = nn.MaxPool2d(3, 2, ceil_mode=True)
            c1, c3r, c3, c5r, c5, pp = (specs.scale_channels(c, width) for c in widths)
            self.add_module(name, _Inception(cin, c1, c3r, c3, c5r, c5, pp))
            cin = c1 + c3 + c5 + pp
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = Dropout(0.4)
        self.fc = nn.Linear(cin, num_classes)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        for name, *_ in specs.GOOGLENET_INCEPTIONS:
            if name == "inception4a":
                x = self.maxpool3(x)
            elif name == "inception5a":
                x = self.maxpool4(x)
            x = getattr(self, name)(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.log_softmax(self.fc(self.dropout(x)))


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2, self.relu2 = nn.BatchNorm2d(planes), nn.ReLU()
        self.conv3, self.bn3 = nn.Conv2d(planes, 4 * planes, 1, bias=False), nn.BatchNorm2d(4 * planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != 4 * planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, 4 * planes, 1, stride, bias=False), nn.BatchNorm2d(4 * planes)
            )
        self.relu3 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(out + identity)


class ResNet152(nn.Module):
    def __init__(self, *, resolution: int, width: float, num_classes: int) -> None:
        del resolution
        super().__init__()
        stem = specs.scale_channels(64, width)
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem), nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = stem
        for stage, (blocks, planes) in enumerate(zip(specs.RESNET152_BLOCKS, (64, 128, 256, 512)), start=1):
            planes = specs.scale_channels(planes, width)
            layer = []
            for b in range(blocks):
                layer.append(_Bottleneck(cin, planes, 2 if (b == 0 and stage > 1) else 1))
                cin = 4 * planes
            self.add_module(f"layer{stage}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.log_softmax(self.fc(torch.flatten(self.avgpool(x), 1)))


# -- recurrent models ------------------------------------------------------------------------------------------
def _cell_step(
    cell: str, gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None, w: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One timestep: ``gx`` = x_t W_ih^T + b_ih (N x gates*H), state (h, c); returns the new (h, c)."""
    gh = torch.addmm(b, h, w.t())
    if cell == "rnn":
        return torch.tanh(gx + gh), None
    if cell == "lstm":
        i, f, g, o = (gx + gh).chunk(4, 1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        return o * torch.tanh(c), c
    x_r, x_z, x_n = gx.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return torch.lerp(n, h, z), None


class StepChunk(nn.Module):
    """``length`` consecutive timesteps of one recurrent layer; the layer's first chunk owns ``weight_hh``
    (gates*H x H) and ``bias_hh``, which the parent passes to every chunk."""

    def __init__(self, cell: str, hidden: int, length: int, *, owns_weights: bool) -> None:
        super().__init__()
        self.cell, self.length = cell, length
        if owns_weights:
            bound = 1.0 / math.sqrt(hidden)
            gated = specs.GATES[cell] * hidden
            self.weight_hh = nn.Parameter(torch.empty(gated, hidden).uniform_(-bound, bound))
            self.bias_hh = nn.Parameter(torch.empty(gated).uniform_(-bound, bound))

    def forward(
        self, gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None, w: torch.Tensor, b: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        hs = []
        for t in range(gx.shape[0]):
            h, c = _cell_step(self.cell, gx[t], h, c, w, b)
            hs.append(h)
        return tuple(hs), c


class RecurrentLayer(nn.Module):
    """One recurrent layer over (T, N, I): ``ih`` (all timesteps' input GEMM at once) then ``steps.<k>``."""

    def __init__(self, cell: str, input_size: int, hidden: int, seq_len: int, chunk: int) -> None:
        super().__init__()
        self.cell, self.hidden, self.seq_len = cell, hidden, seq_len
        self.ih = nn.Linear(input_size, specs.GATES[cell] * hidden)
        lengths = specs.chunk_lengths(seq_len, chunk)
        self.steps = nn.ModuleList(StepChunk(cell, hidden, n, owns_weights=k == 0) for k, n in enumerate(lengths))

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor | None] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
        if x.shape[0] != self.seq_len:
            raise ProfileError(f"recurrent layer input: got {x.shape[0]} timesteps; must be {self.seq_len}")
        gx = self.ih(x)
        if state is None:
            h = x.new_zeros(x.shape[1], self.hidden)
            c = x.new_zeros(x.shape[1], self.hidden) if self.cell == "lstm" else None
        else:
            h, c = state
        owner = self.steps[0]
        hs: list[torch.Tensor] = []
        t = 0
        for chunk in self.steps:
            out, c = chunk(gx[t : t + chunk.length], h, c, owner.weight_hh, owner.bias_hh)
            h, t = out[-1], t + chunk.length
            hs += out
        return torch.stack(hs), (h, c)


class RecurrentNet(nn.Module):
    """``layers`` recurrent layers over (T, N, input_size) features, a per-timestep ``fc`` and ``log_softmax``."""

    def __init__(self, cell: str, *, hidden: int, seq_len: int, layers: int, input_size: int, num_classes: int,
                 chunk: int) -> None:  # fmt: skip
        super().__init__()
        self.layers = nn.ModuleList(
            RecurrentLayer(cell, input_size if i == 0 else hidden, hidden, seq_len, chunk) for i in range(layers)
        )
        self.fc = nn.Linear(hidden, num_classes)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x, _ = layer(x)
        return self.log_softmax(self.fc(x))


class _Coder(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, seq_len: int, chunk: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.layers = nn.ModuleList(
            RecurrentLayer("lstm", embed if i == 0 else hidden, hidden, seq_len, chunk) for i in range(layers)
        )


class Seq2Seq(nn.Module):
    """LSTM encoder-decoder (Sutskever et al. 2014): decoder layer l starts from encoder layer l's final state."""

    def __init__(self, *, hidden: int, embed: int, layers: int, seq_len: int, src_vocab: int, tgt_vocab: int,
                 chunk: int) -> None:  # fmt: skip
        super().__init__()
        self.encoder = _Coder(src_vocab, embed, hidden, layers, seq_len, chunk)
        self.decoder = _Coder(tgt_vocab, embed, hidden, layers, seq_len, chunk)
        self.proj = nn.Linear(hidden, tgt_vocab)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.encoder.embed(src)
        states = []
        for layer in self.encoder.layers:
            x, state = layer(x)
            states.append(state)
        y = self.decoder.embed(tgt)
        for layer, state in zip(self.decoder.layers, states):
            y, _ = layer(y, state)
        return self.log_softmax(self.proj(y))


# -- build -----------------------------------------------------------------------------------------------------
class _TargetNLL:
    """The loss: NLL of fixed random targets under the model's log-probabilities (any leading shape)."""

    def __init__(self, targets: torch.Tensor) -> None:
        self.targets = targets

    def __call__(self, log_probs: torch.Tensor) -> torch.Tensor:
        flat = log_probs.reshape(-1, log_probs.shape[-1])
        return F.nll_loss(flat, self.targets.to(flat.device))


def build(
    name: str, *, batch: int | None = None, precision: str = "fp32", seed: int = 0, **scale: Any
) -> tuple[nn.Module, tuple[torch.Tensor, ...], _TargetNLL]:
    """The PyTorch model ``name`` at ``scale``, random example inputs of ``batch`` samples, and its loss.

    Args:
        name: a zoo name (:func:`names`).
        batch: samples per step; None = the zoo's default batch (large: pass a small one on a CPU).
        precision: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"``: dtype of parameters and float inputs.
        seed: seeds parameters, inputs and targets (the global RNG state is left as it was).
        scale: the zoo's scale parameters (``mcdla.workload.zoo.scale_parameters(name)``).
    """
    spec = specs.spec(name)
    params = specs.resolve_scale(name, scale)
    batch = spec.default_batch if batch is None else batch
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ProfileError(f"{name}.batch: got {batch!r}; must be an integer >= 1")
    if precision not in _DTYPES:
        raise ProfileError(f"precision: got {precision!r}; must be one of {', '.join(_DTYPES)}")
    dtype = _DTYPES[precision]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, inputs, targets = _make(name, spec.family, batch, dtype, params)
    model.to(dtype).train()
    return model, inputs, _TargetNLL(targets)


def _make(
    name: str, family: str, batch: int, dtype: torch.dtype, p: dict[str, Any]
) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    if family == "cnn":
        cls = {"alexnet": AlexNet, "googlenet": GoogLeNet, "vgg-e": VGG, "resnet-152": ResNet152}[name]
        model: nn.Module = cls(**p)
        x = torch.randn(batch, 3, p["resolution"], p["resolution"], dtype=dtype)
        return model, (x,), torch.randint(p["num_classes"], (batch,))
    seq_len = p["seq_len"]
    if family == "rnn":
        model = RecurrentNet(name, **p)
        x = torch.randn(seq_len, batch, p["input_size"], dtype=dtype)
        return model, (x,), torch.randint(p["num_classes"], (seq_len * batch,))
    model = Seq2Seq(**p)
    src = torch.randint(p["src_vocab"], (seq_len, batch))
    tgt = torch.randint(p["tgt_vocab"], (seq_len, batch))
    return model, (src, tgt), torch.randint(p["tgt_vocab"], (seq_len * batch,))
