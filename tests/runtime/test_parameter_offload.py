"""mcdla.offload_parameters: weights in the pool between uses, bit-identical, with the device bytes it claims."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.checkpoint import checkpoint

from mcdla.errors import ConfigError, OffloadError, PlanError
from mcdla.runtime import offload_optimizer, offload_parameters, virtualize
from mcdla.workload.plan import Plan, StateDecision

WIDTHS = (16, 32, 48, 24, 40, 8)  # unequal layers, so the peak window is a specific pair


class Chain(nn.Module):
    def __init__(self, *, checkpointed: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))
        self.norm = nn.LayerNorm(WIDTHS[-1])
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if self.checkpointed and i in (1, 2):
                x = checkpoint(lambda t, f=layer: torch.relu(f(t)), x, use_reentrant=False)
            else:
                x = torch.relu(layer(x))
        return self.norm(x)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, WIDTHS[0], generator=g), torch.randn(6, WIDTHS[-1], generator=g)


def _unit_bytes(model: Chain) -> list[int]:
    """Parameter bytes of each module owning parameters, in forward order (counted from the model itself)."""
    return [sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
            for m in [*model.layers, model.norm]]


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


def _run(model: nn.Module, steps: int, *, wrap=lambda: torch.autocast("cpu", enabled=False), gathered=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    losses, grads = [], []
    for _ in range(steps):
        with wrap():
            losses.append(_step(model, x, y).detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        with gathered() if gathered is not None else torch.autocast("cpu", enabled=False):
            opt.step()
        opt.zero_grad()
    return losses, grads


@pytest.mark.parametrize("pool", ["host", "file"])
@pytest.mark.parametrize("case", ["plain", "checkpoint", "autocast", "virtualize"])
def test_losses_and_gradients_bit_identical(tmp_path, pool, case):
    """Three SGD steps with the weights offloaded (plain, checkpointed, autocast bf16, activations virtualized)."""
    checkpointed = case == "checkpoint"
    ref, model = Chain(checkpointed=checkpointed), Chain(checkpointed=checkpointed)
    wrap = {"autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            "virtualize": lambda: virtualize("host", min_bytes=1, model=model)}.get(
        case, lambda: torch.autocast("cpu", enabled=False))
    want = _run(ref, 3, wrap=wrap if case != "virtualize" else lambda: torch.autocast("cpu", enabled=False))
    with offload_parameters(model, pool=pool.replace("file", f"file:{tmp_path}"), prefetch=1) as params:
        got = _run(model, 3, wrap=wrap, gathered=params.gathered)
        assert params.resident_bytes == 0
    for a, b in zip(want[0], got[0]):
        assert torch.equal(a, b)
    for ga, gb in zip(want[1], got[1]):
        assert all(torch.equal(a, b) for a, b in zip(ga, gb))
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_peak_device_bytes_is_the_prefetch_window(prefetch):
    """After the first step, the resident parameter bytes peak at the largest window of prefetch+1
    consecutive units, and the bytes saved are those of the units outside it."""
    model = Chain()
    units = _unit_bytes(model)
    window = prefetch + 1
    largest_window = max(sum(units[i:i + window]) for i in range(len(units) - window + 1))
    x, y = _batch()
    with offload_parameters(model, pool="host", prefetch=prefetch) as params:
        assert params.offloadable_bytes == sum(units) and params.resident_bytes == 0
        _step(model, x, y)
        params.reset_report()
        _step(model, x, y)
        assert params.peak_resident_bytes == largest_window
        assert params.offloadable_bytes - params.peak_resident_bytes == sum(units) - largest_window
        assert max(b for _, b in params.timeline) == largest_window and params.timeline[-1][1] == 0
        assert params.fetches_ahead == (2 * (len(units) - 1) if prefetch else 0)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_checkpoint_recomputation_stays_within_the_window(prefetch):
    """Checkpointed layers recomputed in backward prefetch nothing ahead in forward order: the peak is still
    the largest window of prefetch+1 consecutive units."""
    model = Chain(checkpointed=True)
    units = _unit_bytes(model)
    window = prefetch + 1
    largest_window = max(sum(units[i:i + window]) for i in range(len(units) - window + 1))
    x, y = _batch()
    with offload_parameters(model, pool="host", prefetch=prefetch) as params:
        _step(model, x, y)
        params.reset_report()
        _step(model, x, y)
        assert params.peak_resident_bytes == largest_window


def test_frozen_layers_stay_within_the_window_and_exact():
    """Frozen middle layers (LoRA-style base weights) are emptied after their backward like trained ones: the
    peak is still the largest window of two units, and gradients of the trained layers are exact."""
    ref, model = Chain(), Chain()
    for m in (ref, model):
        for layer in m.layers[1:4]:
            layer.requires_grad_(False)
    units = _unit_bytes(model)
    x, y = _batch()
    _step(ref, x, y)
    with offload_parameters(model, pool="host", prefetch=1) as params:
        _step(model, x, y)
        model.zero_grad()
        params.reset_report()
        _step(model, x, y)
        assert params.peak_resident_bytes == max(a + b for a, b in zip(units, units[1:]))
        assert params.resident_bytes == 0
        for a, b in zip(ref.parameters(), model.parameters()):
            assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)


def test_tied_parameters_stay_in_place():
    """A parameter owned by two modules (tied embedding and head) is not moved; the others are."""
    torch.manual_seed(0)
    emb, mid = nn.Embedding(20, 8), nn.Linear(8, 8)
    head = nn.Linear(8, 20, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, mid, head)
    with offload_parameters(model, pool="host") as params:
        assert params.offloadable_bytes == sum(p.numel() * 4 for p in mid.parameters())
        assert emb.weight.untyped_storage().nbytes() == 20 * 8 * 4
        assert mid.weight.untyped_storage().nbytes() == 0


@pytest.mark.parametrize("joined", ["gathered", "parameters"])
def test_with_offloaded_optimizer_bit_identical(joined):
    """Weights and Adam state both in the pool, the step inside gathered() or the update reading and writing
    the weights' blocks (overlapped with backward): same parameters as plain Adam."""
    ref, model = Chain(), Chain()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x, y = _batch()
    with offload_parameters(model, pool="host") as params:
        link = {"parameters": params} if joined == "parameters" else {"overlap": False}
        with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", **link) as opt:
            for _ in range(3):
                _step(ref, x, y)
                ref_opt.step()
                ref_opt.zero_grad()
                _step(model, x, y)
                with params.gathered() if joined == "gathered" else contextlib.nullcontext():
                    opt.step()
                opt.zero_grad()
                assert params.resident_bytes == 0
            assert opt.stepped_in_backward == (len(list(model.parameters())) if joined == "parameters" else 0)
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_bf16_weights_and_masters_match_optimizer_offload_alone():
    """bf16 weights in the pool with fp32 masters (parameters=): the same weights as offload_optimizer alone
    (itself checked against a hand-written fp32-master loop in test_optimizer_offload.py)."""
    ref, model = Chain().to(torch.bfloat16), Chain().to(torch.bfloat16)
    x, y = (t.to(torch.bfloat16) for t in _batch())
    with offload_parameters(model, pool="host") as params, \
            offload_optimizer(torch.optim.AdamW(ref.parameters(), lr=1e-2), pool="host") as ref_opt, \
            offload_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), pool="host", parameters=params) as opt:
        for _ in range(3):
            for m, o in ((ref, ref_opt), (model, opt)):
                _step(m, x, y)
                o.step()
                o.zero_grad()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_damaged_weight_block_raises_in_forward(tmp_path):
    """A corrupted weight block file makes the forward that fetches it raise OffloadError naming the parameter
    and the tier (the file tier's CRC-32), not compute with wrong weights; close() still frees every block
    and then raises the same error."""
    model = Chain()
    x, y = _batch()
    params = offload_parameters(model, pool=f"file:{tmp_path}", prefetch=0)
    for f in tmp_path.glob("*.blk"):
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        f.write_bytes(bytes(raw))
    label = rf"parameter 'layers.0.(weight|bias)': block file .* of tier 'file:{tmp_path}' is corrupted"
    with pytest.raises(OffloadError, match=label):
        _step(model, x, y)
    assert model.layers[0].weight.untyped_storage().nbytes() == 0  # no half-read weights left behind
    with pytest.raises(OffloadError, match="is corrupted"):
        params.close()
    assert params.pool.block_count == 0 and list(tmp_path.glob("*.blk")) == []


def test_close_restores_weights_and_frees_blocks(tmp_path):
    """close() puts every weight back on the device and removes the block files."""
    model = Chain()
    want = copy.deepcopy(model.state_dict())
    params = offload_parameters(model, pool=f"file:{tmp_path}")
    assert len(list(tmp_path.glob("*.blk"))) == 2 * len(_unit_bytes(model))
    params.close()
    assert list(tmp_path.glob("*.blk")) == [] and params.pool.block_count == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k])


def test_bad_prefetch_raises_config_error():
    """prefetch must be an int >= 0; the message names the field and the value."""
    with pytest.raises(ConfigError, match=r"offload_parameters.prefetch: got -1; must be an int >= 0"):
        offload_parameters(Chain(), pool="host", prefetch=-1)


def _state_plan(model: nn.Module, **state: dict) -> Plan:
    """A plan with no activation decisions and the given per-module ``state`` entries."""
    names = [n for n, _ in model.named_modules()]
    base = Plan.from_actions(workload="chain", batch=6, layer_names=names, actions={})
    return dataclasses.replace(base, state=tuple(StateDecision(layer=k, **v) for k, v in state.items()))


def test_plan_moves_only_the_modules_it_names():
    """A plan offloading the weights of layers 1 and 3 moves exactly their bytes, and stays bit-identical."""
    ref, model = Chain(), Chain()
    plan = _state_plan(model, **{"layers.1": {"weights": "offload"}, "layers.3": {"weights": "offload"}})
    want = _run(ref, 2)
    with offload_parameters(model, pool="host", plan=plan) as params:
        assert params.offloadable_bytes == sum(_unit_bytes(model)[i] for i in (1, 3))
        assert model.layers[1].weight.untyped_storage().nbytes() == 0
        assert model.layers[0].weight.untyped_storage().nbytes() > 0
        got = _run(model, 2, gathered=params.gathered)
    assert all(torch.equal(a, b) for a, b in zip(want[0], got[0]))
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_plan_naming_no_module_raises():
    """A plan whose state names a module the model does not have is refused with a one-line PlanError."""
    model = Chain()
    plan = dataclasses.replace(_state_plan(model), layer_names=(),
                               state=(StateDecision(layer="layers.9", weights="offload"),))
    with pytest.raises(PlanError, match=r"plan.state: layer 'layers.9' is not a module of the model"):
        offload_parameters(model, pool="host", plan=plan)


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(min_value=1, max_value=24), min_size=3, max_size=7),
       prefetch=st.integers(min_value=0, max_value=3))
def test_peak_is_the_largest_window_for_any_chain(widths, prefetch):
    """For any chain of Linear layers and any prefetch depth, the resident parameter bytes after the first step
    peak at the largest sum over prefetch+1 consecutive layers (brute force over the layer sizes)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(widths, widths[1:])])
    units = [4 * (a * b + b) for a, b in zip(widths, widths[1:])]
    window = min(prefetch + 1, len(units))
    largest_window = max(sum(units[i:i + window]) for i in range(len(units) - window + 1))
    x = torch.randn(3, widths[0])
    with offload_parameters(model, pool="host", prefetch=prefetch) as params:
        model(x).sum().backward()
        params.reset_report()
        model(x).sum().backward()
        assert params.peak_resident_bytes == largest_window
        assert params.resident_bytes == 0
