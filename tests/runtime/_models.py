"""Small models covering what autograd saves: MLP, CNN with batch norm, LSTM, a tiny transformer with weight
tying, and a model with in-place ops, views and a custom autograd Function; plus a step runner."""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU() if i % 2 == 0 else nn.GELU(), nn.Dropout(0.1)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class CNN(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(inplace=True),
            nn.AvgPool2d(2),
        )
        self.head = nn.Linear(2 * channels * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class LSTMNet(nn.Module):
    def __init__(self, vocab: int = 50, hidden: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)  # three views of one storage
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln(x), self.tok.weight)  # weight tying
        return logits[:, -1]


class _ScaledSquare(torch.autograd.Function):
    """y = s * x^2 with s = sigmoid(x).sum(-1): saves its input and an intermediate made inside forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x).sum(-1, keepdim=True)
        sq = x * x
        ctx.save_for_backward(x, sq, s)
        return s * sq

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x, sq, s = ctx.saved_tensors
        sig = torch.sigmoid(x)
        ds_dx = sig * (1 - sig)
        return grad * s * 2 * x + (grad * sq).sum(-1, keepdim=True) * ds_dx


class InPlaceNet(nn.Module):
    """In-place ops, views (transpose, narrow, strided slice, view of a view) and a custom Function."""

    def __init__(self, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width // 2, width)
        self.fc3 = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h.add_(1.0)  # in place, nothing saved
        torch.sigmoid_(h)  # in place, saves its output (h itself)
        half = h.view(h.shape[0], 2, -1).transpose(1, 2)  # view of h
        g = half[..., 0] * half[..., 1]  # saves two strided views of h's storage
        g = g.narrow(1, 0, g.shape[1]).contiguous()
        r = self.fc2(g)
        r += x[:, ::1]  # in-place residual add (fc2's output is not saved)
        r = _ScaledSquare.apply(torch.relu_(r))
        return self.fc3(r[:, : r.shape[1]])


def make_batch(kind: str, batch: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if kind == "cnn":
        x = torch.randn(batch, 3, 16, 16, generator=g)
    elif kind == "lstm":
        x = torch.randint(0, 50, (batch, 12), generator=g)
    elif kind == "gpt":
        x = torch.randint(0, 64, (batch, 16), generator=g)
    else:
        x = torch.randn(batch, 64, generator=g)
    return x, torch.randint(0, 10 if kind != "gpt" else 64, (batch,), generator=g)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": MLP, "cnn": CNN, "lstm": LSTMNet, "gpt": TinyGPT, "inplace": InPlaceNet,
}


def train_steps(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    ctx: Callable[[], Any] = contextlib.nullcontext,
    *,
    seed: int = 1,
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Run one optimizer step per batch under ``ctx()``; return (loss, grads) of each step."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = []
    for i, (x, y) in enumerate(batches):
        torch.manual_seed(seed + i)  # dropout masks identical across runs
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    return out


def twin(kind: str, *, seed: int = 0, **kwargs: Any) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    model = MODELS[kind](**kwargs)
    return model, copy.deepcopy(model)


def assert_identical(ref: list, got: list) -> None:
    """Loss and every gradient bit-identical, step by step."""
    assert len(ref) == len(got)
    for step, ((l_ref, g_ref), (l_got, g_got)) in enumerate(zip(ref, got)):
        assert torch.equal(l_ref, l_got), f"step {step}: loss {l_ref.item()} != {l_got.item()}"
        for i, (a, b) in enumerate(zip(g_ref, g_got)):
            assert torch.equal(a, b), f"step {step}: grad {i} differs by {(a - b).abs().max().item()}"


def model_and_batch() -> tuple[MLP, torch.Tensor, torch.Tensor]:
    """A small MLP (width 128, depth 4) and a seeded classification batch of 32."""
    torch.manual_seed(0)
    model = MLP(width=128, depth=4)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)


def wait_offloaded(vm: Any, timeout_s: float = 5.0) -> None:
    """Poll until every managed storage of ``vm``'s step has left the device (offloads landed)."""
    deadline = time.monotonic() + timeout_s
    while vm.resident_saved_bytes > 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert vm.resident_saved_bytes == 0


def assert_released(vm: Any, threads: int) -> None:
    """``vm``'s steps left the live set holding no records, pool capacity or I/O threads beyond ``threads``."""
    deadline = time.monotonic() + 5.0
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= threads
    assert vm.live_steps == 0 and vm.tracker_entries == 0
    assert vm.pool.used_bytes == 0 and vm.pool.block_count == 0
