"""The kept fast path (NOTE [kept fast path] in ``mcdla.runtime._step``): after a step that fit under
``budget=``, the next step keeps its storages as tuples, without records or handles. Each test compares
that second step against an independent reference: plain PyTorch's gradients, the first step of the same
virtualizer (records and handles, the general path), or bytes counted by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mcdla.errors import OffloadError
from mcdla.runtime import virtualize

WIDTH = 64


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Sigmoid(),
                         nn.Linear(WIDTH, 1))


def _grads(model: nn.Module, x: torch.Tensor, ctx: object | None = None) -> list[torch.Tensor]:
    model.zero_grad()
    if ctx is None:
        model(x).sum().backward()
    else:
        with ctx:  # type: ignore[attr-defined]
            model(x).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def _fast(v: object) -> bool:
    return v._kept_fast  # type: ignore[attr-defined]


def test_second_step_is_exact_and_reports_like_the_first() -> None:
    model, x = _model(), torch.randn(16, WIDTH)
    want = _grads(model, x)
    v = virtualize("host", budget=1 << 30, min_bytes=0)
    assert not _fast(v)  # the first step uses records: nothing is known about the step's size yet
    first = _grads(model, x, v)
    r1 = v.report
    assert _fast(v)
    second = _grads(model, x, v)
    r2 = v.report
    for a, b, c in zip(want, first, second, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert (r2.saved_count, r2.managed_count, r2.managed_bytes) == (r1.saved_count, r1.managed_count,
                                                                   r1.managed_bytes)
    assert r2.managed_count > 0 and r2.offloaded_bytes == 0
    # every saved storage is alive at the end of forward, so the peak is every managed byte, on both paths
    assert r2.peak_resident_saved_bytes == r1.peak_resident_saved_bytes == r1.managed_bytes
    assert v.live_steps == 0 and r2.complete


def test_in_place_change_of_a_kept_tensor_is_refused_on_the_fast_path() -> None:
    v = virtualize("host", budget=1 << 30, min_bytes=0)
    w = torch.randn(WIDTH, requires_grad=True)
    with v:
        (w * 2).sin().sum().backward()
    assert _fast(v)
    with v:
        a = w * 2
        y = a.sin()  # saves a
        with torch.no_grad():
            a.add_(1.0)  # rewrites the saved bytes; autograd does not check saved-tensor hooks' tensors
        with pytest.raises(OffloadError, match="modified in place"):
            y.sum().backward()


def test_retain_graph_and_double_backward_on_the_fast_path() -> None:
    v = virtualize("host", budget=1 << 30, min_bytes=0)
    x = torch.randn(WIDTH, requires_grad=True)
    with v:
        x.exp().sum().backward()
    assert _fast(v)
    # by hand: d/dx sum(exp(x)^2) = 2 exp(2x); the second derivative of sum(sin(x)) . 1 is -sin(x)
    with v:
        y = x.exp().square().sum()
        (g1,) = torch.autograd.grad(y, x, retain_graph=True)
        (g2,) = torch.autograd.grad(y, x)
        (gs,) = torch.autograd.grad(x.sin().sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(gs.sum(), x)
    assert torch.allclose(g1, 2 * (2 * x.detach()).exp()) and torch.equal(g1, g2)
    assert torch.allclose(gg, -x.detach().sin())


def test_a_step_that_outgrows_the_budget_keeps_it_and_the_next_uses_records() -> None:
    """Step 1 fits, step 2 is four times larger: the kept bytes stay within the budget, the storages beyond
    it are offloaded, and the step after that goes back to records (``_kept_fast`` off)."""
    model = _model()
    small, big = torch.randn(16, WIDTH), torch.randn(64, WIDTH)
    fits = 3 * 16 * WIDTH * 4  # by hand: the input, tanh's output and sigmoid's output, 16 rows each
    v = virtualize("host", budget=fits, min_bytes=0)
    _grads(model, small, v)
    assert (v.report.managed_bytes, v.report.offloaded_bytes) == (fits, 0)
    assert _fast(v)
    got = _grads(model, big, v)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model, big), got, strict=True))
    r = v.report
    assert r.offloaded_bytes > 0
    assert r.managed_bytes == 4 * fits
    assert r.managed_bytes - r.offloaded_bytes <= fits  # what stayed is within the budget
    assert not _fast(v)


def test_abort_refuses_later_unpacks_of_kept_tensors() -> None:
    v = virtualize("host", budget=1 << 30, min_bytes=0)
    x = torch.randn(WIDTH, requires_grad=True)
    with v:
        (x * 2).sin().sum().backward()
    assert _fast(v)
    with pytest.raises(ValueError), v:
        y = (x * 2).sin().sum()
        raise ValueError("stop")
    with pytest.raises(OffloadError, match="aborted"):
        y.backward()
    assert not _fast(v)  # an aborted step does not vouch for the next one


def test_backward_after_the_context_uses_the_kept_tensors() -> None:
    v = virtualize("host", budget=1 << 30, min_bytes=0)
    x = torch.randn(WIDTH, requires_grad=True)
    with v:
        (x * 2).sin().sum().backward()
    assert _fast(v)
    with v:
        y = (x * 2).sin().sum()
    assert v.report.managed_count == 1 and v.report.complete
    y.backward()
    assert torch.allclose(x.grad, 4 * (2 * x.detach()).cos())  # two backwards accumulated, 2 cos(2x) each


def test_kept_tensors_die_with_their_graph_without_the_collector() -> None:
    """The tuples hold an earlier op's output itself and detach the saving op's own output, so no reference
    cycle keeps a saved storage: each is freed by reference counting when backward releases it or the graph
    is dropped unused (the collector is off; the evidence is a weak reference to every storage saved)."""
    import gc
    import weakref

    v = virtualize("host", budget=1 << 30, min_bytes=0)
    w = torch.randn(WIDTH, requires_grad=True)
    with v:
        (w * 2).exp().sin().sum().backward()
    assert _fast(v)
    gc.collect()
    gc.disable()
    try:
        for run_backward in (True, False):
            with v:
                b = (w * 2).exp()  # exp saves its output b (the saving node's own output: detached)
                loss = b.sin().sum()  # sin saves its input b (an earlier op's output: held as itself)
                ref = weakref.ref(b.untyped_storage())
                del b
                assert ref() is not None
                if run_backward:
                    loss.backward()
                del loss
            assert ref() is None, run_backward
        assert v.live_steps == 0
    finally:
        gc.enable()
