"""Loss and every gradient are bit-identical with and without mcdla, over several optimizer steps.

Reference: the same model (a deep copy, same seed) trained on the same batches with no hooks at all.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

import mcdla
from mcdla.runtime import keep_resident, virtualize

from ._models import MLP, MODELS, assert_identical, make_batch, train_steps, twin, wait_offloaded

TIERS = ["host", "file", "compress", "spill"]


def _spec(tier: str, tmp_path) -> str:
    return {
        "host": "host",
        "file": f"file:{tmp_path}",
        "compress": f"compress(file:{tmp_path})",
        "spill": f"host@24KiB,compress(file:{tmp_path}@64KiB),file:{tmp_path / 'overflow'}",
    }[tier]


def _model_tier_cases():
    """Every model x every tier; in the default suite every model on the spill pool (host, compress(file) and
    file, all three reached) and the CNN on each tier, the other pairs in the slow suite."""
    for kind in MODELS:
        for tier in TIERS:
            slow = tier != "spill" and kind != "cnn"
            yield pytest.param(kind, tier, id=f"{kind}-{tier}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize(("kind", "tier"), list(_model_tier_cases()))
def test_every_tier_is_bit_exact(kind, tier, tmp_path):
    """Each model x each tier: identical loss and gradients over three Adam steps, everything offloaded."""
    ref_model, model = twin(kind)
    batches = [make_batch(kind, 8, seed=s) for s in range(3)]
    ref = train_steps(ref_model, batches)
    vm = virtualize(_spec(tier, tmp_path), min_bytes=512, model=model)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)
    assert vm.report.offloaded_bytes > 0 and vm.report.complete
    assert not [p for p in tmp_path.rglob("*.blk")]


@pytest.mark.parametrize("kind", list(MODELS))
def test_budget_is_bit_exact(kind, tmp_path):
    """With a budget (some tensors kept, the rest offloaded) results are still identical."""
    ref_model, model = twin(kind)
    batches = [make_batch(kind, 8, seed=s) for s in range(3)]
    ref = train_steps(ref_model, batches)
    vm = virtualize(f"file:{tmp_path}", budget=16 * 1024, min_bytes=512, model=model, window=1)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)


@pytest.mark.examples(4, 12)
def test_mlp_exact_over_sizes(tmp_path_factory, examples):
    """Property: for any size, tier, budget, threshold and window the MLP's step is bit-identical."""
    settings(max_examples=examples, deadline=None)(given(
        batch=st.integers(min_value=1, max_value=33),
        width=st.sampled_from([8, 24, 64, 130]),
        depth=st.integers(min_value=1, max_value=4),
        tier=st.sampled_from(TIERS),
        budget=st.one_of(st.none(), st.integers(min_value=0, max_value=200_000)),
        min_bytes=st.sampled_from([0, 100, 4096]),
        window=st.integers(min_value=1, max_value=4),
    )(lambda **case: _check_mlp_size(tmp_path_factory, **case)))()


def _check_mlp_size(tmp_path_factory, batch, width, depth, tier, budget, min_bytes, window):
    torch.manual_seed(0)
    ref_model = MLP(width=width, depth=depth)
    model = MLP(width=width, depth=depth)
    model.load_state_dict(ref_model.state_dict())
    g = torch.Generator().manual_seed(batch)
    batches = [(torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(2)]
    ref = train_steps(ref_model, batches)
    tmp = tmp_path_factory.mktemp("mlp")
    vm = virtualize(_spec(tier, tmp), budget=budget, min_bytes=min_bytes, window=window)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)
    assert vm.live_steps == 0 and not list(tmp.rglob("*.blk"))


@pytest.mark.examples(4, 15)
def test_every_model_exact_over_batch_sizes(tmp_path_factory, examples):
    """Property: every model, any batch size, tier and budget: two Adam steps bit-identical."""
    settings(max_examples=examples, deadline=None)(given(
        kind=st.sampled_from(list(MODELS)),
        batch=st.integers(min_value=1, max_value=12),
        tier=st.sampled_from(TIERS),
        budget=st.one_of(st.none(), st.integers(min_value=0, max_value=100_000)),
    )(lambda **case: _check_model_batch(tmp_path_factory, **case)))()


def _check_model_batch(tmp_path_factory, kind, batch, tier, budget):
    ref_model, model = twin(kind)
    batches = [make_batch(kind, batch, seed=s) for s in range(2)]
    ref = train_steps(ref_model, batches)
    tmp = tmp_path_factory.mktemp(kind)
    vm = virtualize(_spec(tier, tmp), budget=budget, min_bytes=256, model=model)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)
    assert vm.live_steps == 0 and not list(tmp.rglob("*.blk"))


def test_backward_outside_context_is_exact(tmp_path):
    """The context may wrap forward only; backward later still gets the exact tensors back."""
    ref_model, model = twin("gpt")
    x, y = make_batch("gpt", 4)
    F.cross_entropy(ref_model(x), y).backward()
    with virtualize(f"file:{tmp_path}", min_bytes=512) as vm:
        loss = F.cross_entropy(model(x), y)
    assert vm.report.complete is False
    loss.backward()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    vm.synchronize()  # offloads the backward overtook may still be landing
    assert vm.report.complete and vm.live_steps == 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_composes_with_checkpoint(tmp_path, reentrant):
    """torch.utils.checkpoint inside virtualize: identical gradients; non-reentrant inputs get offloaded."""
    ref_model, model = twin("mlp", width=64, depth=4)
    x, y = make_batch("mlp", 16)
    x.requires_grad_()  # reentrant checkpoint needs an input that requires grad

    def run(m):
        torch.manual_seed(3)
        h = checkpoint(m.body, x, use_reentrant=reentrant)
        return F.cross_entropy(m.head(h), y)

    run(ref_model).backward()
    with virtualize(f"file:{tmp_path}", min_bytes=0) as vm:
        run(model).backward()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert vm.report.offloaded_bytes > 0


def test_keep_resident_region_is_not_offloaded():
    """Tensors saved under keep_resident() are not managed; results stay exact."""
    ref_model, model = twin("mlp", width=64, depth=2)
    x, y = make_batch("mlp", 16)
    torch.manual_seed(5)
    F.cross_entropy(ref_model(x), y).backward()
    torch.manual_seed(5)
    with virtualize("host", min_bytes=0, model=model) as vm:
        with keep_resident():
            h = model.body(x)
        loss = F.cross_entropy(model.head(h), y)
        loss.backward()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    layers = set(vm.report.offloaded_bytes_by_layer)
    assert "head" in layers and not any(name.startswith("body") for name in layers)


def test_top_level_lazy_export():
    """``mcdla.virtualize`` is the runtime's virtualize."""
    assert mcdla.virtualize is virtualize


class _SaveTwoViews(torch.autograd.Function):
    """Saves two strided views of one intermediate storage and records what backward gets back."""

    seen: list[tuple[tuple[int, ...], tuple[int, ...], int, torch.Tensor]] = []

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        y = x * 2.0
        first, second = y.t()[1:], y[:, ::2]  # non-contiguous, with storage offsets 1 and 0
        ctx.save_for_backward(first, second)
        return y.sum()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        for t in ctx.saved_tensors:
            _SaveTwoViews.seen.append((tuple(t.shape), t.stride(), t.storage_offset(), t.clone()))
        return grad * torch.ones(6, 4)


@pytest.mark.parametrize("budget", [None, 1 << 40])
def test_views_sharing_a_record_come_back_with_their_own_geometry(budget):
    """Two strided views saved into one record (the first makes it, the second shares it) unpack with the
    size, stride, offset and values they had when saved, whether the record stayed put or was offloaded
    and fetched back."""
    x = torch.arange(24.0).reshape(6, 4).requires_grad_()
    y = x.detach() * 2.0
    expected = [(t.shape, t.stride(), t.storage_offset(), t) for t in (y.t()[1:], y[:, ::2])]
    vm = virtualize("host", budget=budget, min_bytes=0)
    _SaveTwoViews.seen.clear()
    with vm:
        loss = _SaveTwoViews.apply(x) + x.sin().sum()  # sin's save (a leaf: not managed) starts the offload
        if budget is None:
            wait_offloaded(vm)
        loss.backward()
    assert vm.report.managed_count == 1 and vm.report.saved_count == 3
    assert (vm.report.offloaded_bytes > 0) == (budget is None)
    assert len(_SaveTwoViews.seen) == 2
    for (shape, stride, offset, values), (e_shape, e_stride, e_offset, e_values) in zip(
            _SaveTwoViews.seen, expected, strict=True):
        assert (shape, stride, offset) == (tuple(e_shape), e_stride, e_offset)
        assert torch.equal(values, e_values)


def test_each_step_unpacks_its_own_tensors():
    """The hooks are the step's own: a graph saved in one step and backpropagated inside the next step's
    context is unpacked by the step that saved it; both steps finish and the gradients are those of the
    same two steps without mcdla."""
    ref_model, model = twin("mlp")
    batches = [make_batch("mlp", 8, seed=s) for s in range(2)]
    vm = virtualize("host", min_bytes=512, model=model)

    def two_steps(net, ctx, check=lambda: None):
        torch.manual_seed(1)
        with ctx():
            first = F.cross_entropy(net(batches[0][0]), batches[0][1])
        with ctx():
            second = F.cross_entropy(net(batches[1][0]), batches[1][1])
            first.backward()  # the first step's tensors, unpacked while the second step is the active one
            check()
            second.backward()
        return [p.grad for p in net.parameters()]

    def first_step_finished() -> None:
        assert [s.index for s in vm._live] == [1]

    ref = two_steps(ref_model, contextlib.nullcontext)
    got = two_steps(model, lambda: vm, first_step_finished)
    assert vm.report.complete and vm.report.offloaded_bytes > 0 and vm.live_steps == 0
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)


def test_a_save_after_exit_is_left_alone():
    """A pack hook called after its step's context exited (a stray save on another thread's stack) returns
    the tensor itself, detached, and leaves the finished step's report as it was."""
    vm = virtualize("host", min_bytes=0)
    x = torch.randn(64, requires_grad=True)
    with vm:
        x.sin().sum().backward()
    pack, saved = vm.pack_hook, vm.report.saved_count
    t = x * 2
    packed = pack(t)
    assert type(packed) is torch.Tensor and packed.grad_fn is None and packed.data_ptr() == t.data_ptr()
    assert saved == vm.report.saved_count == 1
