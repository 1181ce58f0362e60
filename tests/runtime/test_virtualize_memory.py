"""Resident saved bytes stay within budget plus the in-flight window, and nothing leaks over many steps.

The independent count: a TorchDispatchMode records a weak reference to the storage of every tensor the
forward creates; after forward, the storages still alive (minus parameters and the loss) are exactly the
saved activations still in memory, whoever holds them.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mcdla.runtime import HostBufferPool, HostTier, Pool, parse_pool, virtualize

from ._models import MLP, twin


class _LiveStorages(TorchDispatchMode):
    """Weak references to the storages of every tensor created while active."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout is torch.strided:
                self.refs.append(weakref.ref(t.untyped_storage()))
        return out

    def live_bytes(self, exclude: set[int]) -> int:
        alive = {}
        for ref in self.refs:
            s = ref()
            if s is not None and s.data_ptr() not in exclude:
                alive[s.data_ptr()] = s.nbytes()
        return sum(alive.values())


ACT_BYTES = 64 * 256 * 4  # one activation of the model below


@pytest.mark.parametrize("budget", [None, 0, 100_000, 300_000, 10**9])
@pytest.mark.parametrize("window", [1, 3])
def test_resident_bytes_within_budget_plus_window(tmp_path, budget, window):
    """After forward: runtime accounting == independent live count <= budget + window storages."""
    torch.manual_seed(0)
    model = MLP(width=256, depth=8)
    x = torch.randn(64, 256)
    vm = virtualize(f"file:{tmp_path}", budget=budget, min_bytes=0, window=window, model=model)
    mode = _LiveStorages()
    with vm:
        with mode:
            out = model(x * 1.0)  # x * 1.0: the input itself is not saved
            loss = (out**2).mean()
        gc.collect()
        resident, alive = vm.resident_saved_bytes, vm.alive_saved_bytes
        exclude = {loss.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in model.parameters()}
        independent = mode.live_bytes(exclude)
        report = vm.report
        loss.backward()
    # every save here is of an earlier op's output (pow saves `out`), final when saved, so its copy may start
    # at once (NOTE [bytes final] in _step); `out` stays alive, held by this test, after it was offloaded
    allowed = (budget or 0) + window * ACT_BYTES
    assert alive == independent
    assert resident <= min(allowed, report.managed_bytes)
    forward = [b for _, b in report.timeline]  # the report was taken before backward
    assert max(forward) <= allowed + ACT_BYTES  # during a pack: the new storage before its eviction starts
    if budget is not None and budget >= report.managed_bytes:
        assert report.offloaded_bytes == 0


def test_budget_keeps_the_last_saved(tmp_path):
    """With a budget, the storages saved last (used first in backward) are the ones kept."""
    torch.manual_seed(0)
    model = MLP(width=256, depth=6)
    x = torch.randn(64, 256)
    with virtualize(f"file:{tmp_path}", budget=3 * ACT_BYTES, min_bytes=ACT_BYTES, model=model) as vm:
        (model(x * 1.0) ** 2).mean().backward()
    offloaded = set(vm.report.offloaded_bytes_by_layer)
    assert "body.0" in offloaded and "head" not in offloaded


def test_peak_is_lower_than_without_offload(tmp_path):
    """Offloading everything keeps the peak resident bytes far below the total saved bytes."""
    torch.manual_seed(0)
    model = MLP(width=256, depth=8)
    x = torch.randn(64, 256)
    with virtualize(f"file:{tmp_path}", min_bytes=0, window=2) as vm:
        (model(x * 1.0) ** 2).mean().backward()
    r = vm.report
    assert r.peak_resident_saved_bytes <= 4 * ACT_BYTES < r.managed_bytes / 3


def _threads_settle(baseline: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count()


def test_nothing_grows_over_50_steps(tmp_path):
    """50 steps (backward inside and outside the context): no records, blocks, files, buffers or threads left."""
    model, _ = twin("mlp", width=128, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    host = HostTier(capacity_bytes=40 * 1024, buffers=HostBufferPool(pinned=False))
    pool = Pool([host, *parse_pool(f"compress(file:{tmp_path})").tiers])
    vm = virtualize(pool, min_bytes=1024, model=model, window=2)
    threads = threading.active_count()
    cached = []
    offloaded = []
    for i in range(50):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        with vm:
            loss = F.cross_entropy(model(x), y)
            if i % 2 == 0:
                loss.backward()
        if i % 2 == 1:
            loss.backward()
            vm.synchronize()  # backward after exit: the step finishes when its trailing transfers land
        opt.step()
        del loss
        assert vm.live_steps == 0 and vm.live_records == 0 and vm.tracker_entries == 0
        assert pool.used_bytes == 0 and pool.block_count == 0
        assert list(tmp_path.iterdir()) == []
        assert host.buffers.in_use_bytes == 0
        assert vm.report.complete and not vm.report.aborted
        cached.append(host.buffers.cached_bytes)
        offloaded.append(vm.report.offloaded_bytes)
        assert _threads_settle(threads) <= threads
    assert max(cached[5:]) == cached[5]
    assert offloaded[0] > 0 and len(set(offloaded)) == 1


def test_frozen_parameters_stay_without_model():
    """Without model=, frozen nn.Parameters (LoRA-style base weights) and their views are never managed."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    for p in base.parameters():
        p.requires_grad_(False)
    adapter = nn.Linear(256, 256)
    x = torch.randn(16, 256)
    weights = {p.untyped_storage().data_ptr() for p in base.parameters()}
    saved: dict[int, int] = {}  # storage data_ptr -> bytes, of every non-parameter storage autograd saves

    def note(t):
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            saved[st.data_ptr()] = st.nbytes()
        return t

    def step():
        xs = x * 1.0  # held by the graph only, so its offload frees it
        h = base[0](xs) + adapter(xs)
        return base[2](base[1](h)).square().mean()

    with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
        step()
    with virtualize("host", min_bytes=1) as vm:
        step().backward()
    assert vm.report.managed_bytes == sum(saved.values())
    assert vm.report.unfreed_bytes == 0
