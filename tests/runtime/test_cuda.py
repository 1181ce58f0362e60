"""CUDA paths: pinned buffers, side streams, events, record_stream and the device tier (skipped without GPUs)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from mcdla.runtime import HostBufferPool, parse_pool, virtualize

from ._models import MODELS, assert_identical, make_batch, train_steps, twin

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def _to_cuda(batches):
    return [(x.cuda(), y.cuda()) for x, y in batches]


@cuda
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("spec", ["host", "file", "compress", "host-budget"])
def test_cuda_bit_exact(kind, spec, tmp_path):
    """On the GPU every tier gives bit-identical losses and gradients over three steps."""
    ref_model, model = (m.cuda() for m in twin(kind))
    batches = _to_cuda([make_batch(kind, 8, seed=s) for s in range(3)])
    pool = {"host": "host", "file": f"file:{tmp_path}", "compress": f"compress(file:{tmp_path})",
            "host-budget": "host"}[spec]
    budget = 16 * 1024 if spec == "host-budget" else None
    ref = train_steps(ref_model, batches)
    vm = virtualize(pool, budget=budget, min_bytes=512, model=model)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)
    assert vm.live_steps == 0 and vm.pool.block_count == 0


@cuda
def test_host_buffers_are_pinned():
    """With CUDA the host pool hands out page-locked buffers."""
    pool = HostBufferPool()
    buf = pool.acquire(1 << 20)
    assert pool.pinned and buf.is_pinned()
    pool.release(buf)
    pool.trim()


@cuda
def test_escaping_view_survives_delayed_compute():
    """A fetched tensor used by a slow kernel on the compute stream is not reused before that kernel ends."""
    torch.manual_seed(0)
    x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
    ref_grad = None
    for use_mcdla in (False, True):
        x.grad = None
        ctx = virtualize("host", min_bytes=0, window=1) if use_mcdla else None
        if ctx is not None:
            ctx.__enter__()
        y = (x.sigmoid() * x.tanh()).sum()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        torch.cuda._sleep(50_000_000)  # delay the compute stream so side-stream copies race ahead
        y.backward()
        junk = [torch.randn(4096, 1024, device="cuda") for _ in range(4)]  # tempt the allocator
        torch.cuda.synchronize()
        del junk
        if ref_grad is None:
            ref_grad = x.grad.clone()
    assert torch.equal(ref_grad, x.grad)


@cuda
def test_cuda_memory_drops_between_forward_and_backward():
    """Offloading to host: allocated device memory after forward is far below the run without offload."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(8)]).cuda()
    x = torch.randn(4096, 1024, device="cuda")

    def after_forward(ctx):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with ctx:
            loss = model(x * 1.0).square().mean()
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - base
            loss.backward()
        return held

    plain = after_forward(contextlib.nullcontext())
    vm = virtualize("host", min_bytes=0, window=2, model=model)
    offloaded = after_forward(vm)
    assert offloaded < 0.4 * plain
    assert vm.report.offloaded_bytes > 0


@two_gpus
def test_device_tier_bit_exact():
    """device:1 as a memory node for training on cuda:0 gives bit-identical gradients."""
    ref_model, model = (m.cuda(0) for m in twin("gpt"))
    batches = _to_cuda([make_batch("gpt", 8, seed=s) for s in range(2)])
    ref = train_steps(ref_model, batches)
    vm = virtualize(parse_pool("device:1"), min_bytes=512)
    got = train_steps(model, batches, lambda: vm)
    assert_identical(ref, got)
    assert vm.report.offloaded_bytes_by_tier["device:1"] > 0
