"""mcdla.profile.profile: layers, FLOPs, saved bytes and times of real PyTorch models."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ProfileError
from mcdla.profile import profile, profile_run
from mcdla.profile._owners import LOSS_NAME, ROOT_NAME
from mcdla.workload.io import workload_from_dict, workload_to_dict
from mcdla.workload.model import LayerKind

B, IN, HID, OUT = 32, 64, 128, 10
F32 = 4


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, OUT))
    return model, torch.randn(B, IN)


def _quick(model: nn.Module, inputs, loss_fn=None, **kw):  # noqa: ANN001
    kw.setdefault("warmup_steps", 0)
    kw.setdefault("measured_steps", 1)
    return profile(model, inputs, loss_fn, **kw)


def test_layers_are_qualified_module_names_in_execution_order() -> None:
    """Leaf layers are named by qualified module name, in the order they run."""
    model, x = _mlp()
    w = _quick(model, x, lambda o: o.sum())
    assert w.layer_names[:5] == ("0", "1", "2", "3", "4")


def test_linear_flops_match_closed_form() -> None:
    """Forward 2*B*in*out per Linear; backward twice that, except the first (no input gradient)."""
    model, x = _mlp()
    w = _quick(model, x, lambda o: o.sum())
    fwd = {"0": 2 * B * IN * HID, "2": 2 * B * HID * HID, "4": 2 * B * HID * OUT}
    for name, flops in fwd.items():
        layer = w.layers[w.index_of(name)]
        assert layer.fwd_flops == flops
        assert layer.bwd_flops == (flops if name == "0" else 2 * flops)
    assert w.layers[w.index_of("1")].fwd_flops == 0


def test_saved_bytes_go_to_the_last_saver_and_skip_parameters() -> None:
    """With shared_storage_owner='last' (the zoo's rule) a ReLU output saved by the ReLU and the next Linear
    counts once, for the Linear; weights never count."""
    model, x = _mlp()
    w = _quick(model, x, lambda o: o.sum(), shared_storage_owner="last")
    saved = {l.name: l.saved_bytes for l in w.layers}
    assert saved["0"] == B * IN * F32  # the input
    assert saved["1"] == 0 and saved["3"] == 0
    assert saved["2"] == B * HID * F32 and saved["4"] == B * HID * F32
    assert w.saved_bytes == (B * IN + 2 * B * HID) * F32


def test_first_saver_rule_gives_shared_storages_to_the_first_layer() -> None:
    """By default (shared_storage_owner='first', the runtime's rule) the ReLU keeps its output and the Linear
    after it saves nothing."""
    model, x = _mlp()
    for w in (_quick(model, x, lambda o: o.sum()), _quick(model, x, lambda o: o.sum(), shared_storage_owner="first")):
        saved = {l.name: l.saved_bytes for l in w.layers}
        assert saved["1"] == B * HID * F32 and saved["2"] == 0


def test_views_of_one_storage_count_once() -> None:
    """Three chunks of one projection, saved separately, count their one storage once."""

    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 48)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.proj(x).chunk(3, dim=-1)
            return (q * k * v).sum()

    torch.manual_seed(0)
    w = _quick(Split(), torch.randn(8, 16), granularity="block")
    glue = w.layers[w.index_of(ROOT_NAME)]
    assert glue.saved_bytes >= 8 * 48 * F32  # the projection output, once
    assert glue.saved_bytes < 2 * 8 * 48 * F32


def test_param_and_output_bytes() -> None:
    """Parameter bytes are the module's weights and biases; output bytes its output tensor."""
    model, x = _mlp()
    w = _quick(model, x, lambda o: o.sum())
    first = w.layers[w.index_of("0")]
    assert first.param_bytes == (IN * HID + HID) * F32
    assert first.output_bytes == B * HID * F32
    assert w.param_bytes == sum(p.numel() for p in model.parameters()) * F32


def test_kind_and_precision_follow_modules_and_dtype() -> None:
    """Linear is fc, ReLU elementwise, the loss layer loss; fp64 parameters give precision fp64."""
    model, x = _mlp()
    model = model.double()
    w = _quick(model, x.double(), lambda o: F.cross_entropy(o, torch.zeros(B, dtype=torch.long)))
    kinds = {l.name: l.kind for l in w.layers}
    assert kinds["0"] is LayerKind.FC and kinds["1"] is LayerKind.ELEMENTWISE
    assert kinds[LOSS_NAME] is LayerKind.LOSS
    assert w.precision == "fp64" and w.batch == B


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd_s: float, bwd_s: float, spend) -> torch.Tensor:  # noqa: ANN001
        spend(fwd_s)
        ctx.bwd_s, ctx.spend = bwd_s, spend
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.spend(ctx.bwd_s)
        return grad, None, None, None


class _Slow(nn.Module):
    """Takes ``fwd_s`` in forward and ``bwd_s`` in backward: sleeps, or ``spend`` (a clock's advance)."""

    def __init__(self, fwd_s: float, bwd_s: float, spend=time.sleep) -> None:  # noqa: ANN001
        super().__init__()
        self.fwd_s, self.bwd_s, self.spend = fwd_s, bwd_s, spend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self.fwd_s, self.bwd_s, self.spend)


def test_times_are_attributed_to_the_layer_that_spent_them(monkeypatch: pytest.MonkeyPatch, fake_clock) -> None:
    """A module that spends 30 ms in forward and 60 ms in backward gets exactly those times (on the profiler's
    clock, which only that module advances); its neighbours get none of it."""
    from mcdla.profile import _passes

    clock = fake_clock
    monkeypatch.setattr(_passes, "time", clock)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), _Slow(0.03, 0.06, clock.spend), nn.Linear(8, 8))
    w = _quick(model, torch.randn(4, 8), lambda o: o.sum(), measured_steps=2)
    slow = w.layers[w.index_of("1")]
    assert slow.fwd_time_s == pytest.approx(0.03) and slow.bwd_time_s == pytest.approx(0.06)
    for name in ("0", "2"):
        layer = w.layers[w.index_of(name)]
        assert layer.fwd_time_s == 0 and layer.bwd_time_s == 0


def test_real_sleeps_are_attributed_to_the_layer_that_spent_them() -> None:
    """The same on the real clock, with bounds a loaded machine keeps: a sleep is never short, and the
    sleeping module gets far more than either neighbour."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), _Slow(0.03, 0.06), nn.Linear(8, 8))
    w = _quick(model, torch.randn(4, 8), lambda o: o.sum(), measured_steps=3)
    slow = w.layers[w.index_of("1")]
    assert slow.fwd_time_s >= 0.03 and slow.bwd_time_s >= 0.06
    for name in ("0", "2"):
        layer = w.layers[w.index_of(name)]
        assert layer.fwd_time_s < slow.fwd_time_s / 2 and layer.bwd_time_s < slow.bwd_time_s / 2


def test_layer_times_add_up_to_the_step() -> None:
    """With one measured step the layers' forward and backward times partition the measured step time."""
    # Layers that take tens of ms (sleeps: no CPU needed), so that the few hundred microseconds of loss and
    # autograd-engine overhead outside every layer stay well under the tolerance on a loaded machine.
    torch.manual_seed(0)
    model = nn.Sequential(_Slow(0.01, 0.02), nn.Linear(8, 8), nn.Tanh(), _Slow(0.02, 0.01), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    r = profile_run(model, x, lambda o: o.sum(), warmup_steps=1, measured_steps=1)
    total = sum(l.fwd_time_s + l.bwd_time_s for l in r.workload.layers)
    assert total == pytest.approx(r.step_time_s, rel=0.05)


def test_block_granularity_sums_its_leaves() -> None:
    """A block's FLOPs and saved bytes equal those of its leaf modules (plus glue inside it)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3))
            self.head = nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    torch.manual_seed(0)
    net, x = Net(), torch.randn(16, 32)
    leaf = _quick(net, x, lambda o: o.sum())
    block = _quick(net, x, lambda o: o.sum(), granularity="block")
    assert block.layer_names[:4] == ("blocks.0", "blocks.1", "blocks.2", "head")
    for i in range(3):
        parts = [l for l in leaf.layers if l.name.startswith(f"blocks.{i}.")]
        b = block.layers[block.index_of(f"blocks.{i}")]
        assert b.fwd_flops == sum(l.fwd_flops for l in parts)
        assert b.bwd_flops == sum(l.bwd_flops for l in parts)
    assert block.saved_bytes == leaf.saved_bytes


def test_profile_round_trips_through_the_workload_format() -> None:
    """The profiled workload survives the zoo's JSON format (FLOPs, bytes, names, kinds)."""
    model, x = _mlp()
    w = _quick(model, x, lambda o: o.sum())
    back = workload_from_dict(workload_to_dict(w))
    for a, b in zip(w.layers, back.layers):
        assert (a.name, a.kind, a.fwd_flops, a.bwd_flops, a.saved_bytes) == (b.name, b.kind, b.fwd_flops, b.bwd_flops, b.saved_bytes)


def test_measured_times_survive_the_file_format(tmp_path) -> None:  # noqa: ANN001
    """Saved and loaded again, a profile keeps its measured layer times (the simulator needs them)."""
    from mcdla.workload.io import load_workload_file

    model, x = _mlp()
    result = profile_run(model, x, lambda o: o.sum(), warmup_steps=0, measured_steps=1)
    back = load_workload_file(result.save(tmp_path / "w.json"))
    assert [l.fwd_time_s for l in back.layers] == [l.fwd_time_s for l in result.workload.layers]
    assert [l.bwd_time_s for l in back.layers] == [l.bwd_time_s for l in result.workload.layers]


def test_profile_leaves_the_model_as_it_was() -> None:
    """No hooks stay registered, gradients are cleared and the training flag is restored."""
    model, x = _mlp()
    model.eval()
    _quick(model, x, lambda o: o.sum())
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# -- bad input ------------------------------------------------------------------------------------------------
def test_forward_failure_is_one_line_naming_the_module() -> None:
    """A shape mismatch inside a module raises ProfileError naming that module."""
    model, _ = _mlp()
    with pytest.raises(ProfileError, match=r"forward failed in module '0'") as info:
        _quick(model, torch.randn(B, IN + 1), lambda o: o.sum())
    assert "\n" not in str(info.value)


def test_non_scalar_loss_is_rejected() -> None:
    """A loss of shape (B, 10) raises ProfileError giving the shape."""
    model, x = _mlp()
    with pytest.raises(ProfileError, match=r"shape \(32, 10\); must be a scalar"):
        _quick(model, x, lambda o: o * 2)


def test_output_without_loss_must_be_scalar() -> None:
    """Without loss_fn the model output is the loss and must be a scalar."""
    model, x = _mlp()
    with pytest.raises(ProfileError, match="model output"):
        _quick(model, x)


def test_bad_arguments_are_rejected() -> None:
    """Unknown granularity, zero measured steps and a non-module model each raise one-line errors."""
    model, x = _mlp()
    with pytest.raises(ProfileError, match="granularity"):
        _quick(model, x, lambda o: o.sum(), granularity="layer")
    with pytest.raises(ProfileError, match="measured_steps"):
        _quick(model, x, lambda o: o.sum(), measured_steps=0)
    with pytest.raises(ProfileError, match="must be a torch.nn.Module"):
        _quick(lambda t: t, x)
    with pytest.raises(ProfileError, match="example_inputs"):
        _quick(model, 3, lambda o: o.sum())
