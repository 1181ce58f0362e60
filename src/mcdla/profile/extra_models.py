"""Two PyTorch models beside the zoo's eight, for closing the loop on a CPU: an MLP and a transformer.

``build(name, batch=..., **scale)`` returns ``(model, example_inputs, loss_fn)`` like
:func:`mcdla.profile.models.build`. Defaults are sized so that one training step takes tens of milliseconds
on two CPU cores and the saved activations are tens of MiB (each well above the runtime's 256 KiB
``min_bytes``), which is what a validation of offloading needs: transfers long enough to time, compute long
enough to hide them behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ProfileError

__all__ = ["names", "defaults", "build", "MLP", "Transformer"]


class MLP(nn.Module):
    """``depth`` hidden layers of ``width`` (Linear then ReLU) and a Linear head."""

    def __init__(self, *, in_features: int, width: int, depth: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_features
        for _ in range(depth):
            layers += [nn.Linear(cin, width), nn.ReLU()]
            cin = width
        layers.append(nn.Linear(cin, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a GELU MLP, both residual."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attn)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """A GPT-style decoder: token and position embeddings, ``layers`` blocks, final norm, vocabulary head."""

    def __init__(self, *, vocab: int, d_model: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ProfileError(f"transformer.d_model: got {d_model}; must be divisible by heads={heads}")
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


_DEFAULTS: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "mlp": {"batch": 512, "in_features": 1024, "width": 2048, "depth": 6, "num_classes": 10},
    "transformer": {"batch": 8, "vocab": 512, "d_model": 256, "heads": 4, "layers": 4, "seq_len": 256},
})


def names() -> tuple[str, ...]:
    return tuple(_DEFAULTS)


def defaults(name: str) -> dict[str, int]:
    """The default scale (``batch`` included) of ``name``."""
    if name not in _DEFAULTS:
        raise ProfileError(f"model: got {name!r}; must be one of {', '.join(_DEFAULTS)}")
    return dict(_DEFAULTS[name])


def build(name: str, *, seed: int = 0, **scale: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[[Any], torch.Tensor]]:
    """``(model, example_inputs, loss_fn)`` for ``name`` at ``scale`` (unknown scale keys are an error)."""
    params = defaults(name)
    unknown = sorted(set(scale) - set(params))
    if unknown:
        raise ProfileError(f"{name}: unknown scale parameter {unknown[0]!r}; known: {', '.join(params)}")
    for key, value in scale.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{name}.{key}: got {value!r}; must be an integer >= 1")
    params.update(scale)
    batch = params.pop("batch")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model: nn.Module = MLP(**params)
            x = torch.randn(batch, params["in_features"])
            targets = torch.randint(params["num_classes"], (batch,))
            return model, (x,), lambda out: F.cross_entropy(out, targets.to(out.device))
        model = Transformer(**params)
        idx = torch.randint(params["vocab"], (batch, params["seq_len"]))
        tokens = torch.randint(params["vocab"], (batch * params["seq_len"],))
        return model, (idx,), lambda out: F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens.to(out.device))
