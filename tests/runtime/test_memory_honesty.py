"""The report counts what is really alive, not only what the runtime holds (NOTE [memory honesty]).

The independent count: the test wraps the steps' pack and unpack hooks and keeps a weak reference to
the storage of every tensor autograd hands to pack and gets back from unpack. A storage's weak reference
dies exactly when the storage does, whoever held it, so the live ones over min_bytes are the saved bytes
really in memory. After forward (offloads landed) the runtime's ``alive_saved_bytes`` must equal that count,
for a plain MLP (where offloading frees everything but the caller's input and output), for the same MLP
under ``torch.compile`` (aot_eager: the same AOTAutograd saved-tensor path as inductor) and for CPU
``nn.LSTM``.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from mcdla.runtime import virtualize
from mcdla.runtime._step import _Step

MIN = 1 << 20  # managed storages: activations of 4 MiB; weights (256 KiB) stay below


class _Watch:
    """Weak references to every storage packed or unpacked through the hooks of the virtualizer's steps (each
    entry installs its step's own ``pack`` and ``unpack`` as the hooks, so the test wraps those)."""

    def __init__(self, monkeypatch) -> None:
        self.refs: list[weakref.ref] = []
        pack, unpack = _Step.pack, _Step.unpack

        def watched_pack(step, t):
            self._note(t)
            return pack(step, t)

        def watched_unpack(step, h):
            out = unpack(step, h)
            self._note(out)
            return out

        monkeypatch.setattr(_Step, "pack", watched_pack)
        monkeypatch.setattr(_Step, "unpack", watched_unpack)

    def _note(self, t: torch.Tensor) -> None:
        if t.layout is torch.strided and not (t.requires_grad and t.is_leaf):
            self.refs.append(weakref.ref(t.untyped_storage()))

    def live_bytes(self) -> int:
        alive = {}
        for ref in self.refs:
            s = ref()
            if s is not None and s.nbytes() >= MIN:
                alive[id(s)] = s.nbytes()
        return sum(alive.values())


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.Tanh())])


def _forward(vm, fn, x):
    with vm:
        y = fn(x)
    vm._last.settle()  # offloads in flight land: what they free is freed
    gc.collect()
    return y


def _run(tmp_path, monkeypatch, fn, x, model):
    vm = virtualize(f"file:{tmp_path}", budget=0, model=model, min_bytes=MIN, window=2)
    watch = _Watch(monkeypatch)
    y = _forward(vm, fn, x)
    after_forward = (vm.alive_saved_bytes, watch.live_bytes(), vm.resident_saved_bytes)
    y.float().sum().backward()
    vm.synchronize()
    report = vm.report
    vm.close()
    return after_forward, report


def test_plain_mlp_offload_frees_all_but_the_callers_tensors(tmp_path, monkeypatch):
    model = _mlp()
    x = torch.randn(4096, 256)
    (alive, independent, resident), report = _run(tmp_path, monkeypatch, model, x, model)
    act = x.nbytes
    assert report.complete and report.managed_bytes == 5 * act  # x and the four Tanh outputs
    assert resident == 0  # the runtime holds nothing after forward...
    assert alive == independent == 2 * act  # ...but x and the output y (saved by the last Tanh) stay alive
    assert report.unfreed_count == 2 and report.unfreed_bytes == 2 * act
    assert any("freed nothing" in line for line in report.not_freed)
    assert report.node_saved_max_count == 1  # eager: every op saves its own storage
    assert report.peak_alive_saved_bytes >= report.peak_resident_saved_bytes
    assert "not freed:" in report.summary()


def test_compiled_mlp_saves_everything_at_once(tmp_path, monkeypatch):
    model = _mlp()
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(4096, 256)
    compiled(x).sum().backward()  # compile outside the measured step
    model.zero_grad(set_to_none=True)
    (alive, independent, resident), report = _run(tmp_path, monkeypatch, compiled, x, model)
    act = x.nbytes
    assert report.complete and report.managed_bytes == 5 * act
    assert resident == 0
    assert alive == independent == 2 * act
    # one node (the compiled graph) saved every storage: all in memory before the first pack...
    assert report.node_saved_max_count == 5 and report.node_saved_max_bytes == 5 * act
    assert report.peak_resident_saved_bytes == 5 * act
    # ...and its backward unpacks them all at once, next to the caller's x and y: nothing was saved at the peak
    assert report.unfreed_bytes == 2 * act
    assert report.peak_alive_saved_bytes == report.managed_bytes + report.unfreed_bytes
    assert any("one autograd node" in line for line in report.not_freed)


def test_cpu_lstm(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = nn.LSTM(256, 256, num_layers=2, batch_first=True)
    x = torch.randn(16, 256, 256)  # 4 MiB input

    def fn(inp):
        return model(inp)[0]

    (alive, independent, resident), report = _run(tmp_path, monkeypatch, fn, x, model)
    assert report.complete
    assert resident == 0
    assert alive == independent  # x at least (held by the caller)
    assert alive >= x.nbytes
    assert report.unfreed_bytes >= x.nbytes
    grad_fn = fn(x).grad_fn
    names = []
    while grad_fn is not None and len(names) < 3:
        names.append(grad_fn.name())
        grad_fn = grad_fn.next_functions[0][0] if grad_fn.next_functions else None
    if any("Mkldnn" in n for n in names):  # the fused CPU path: one node saves input, output and workspace
        assert report.node_saved_max_count >= 3
        assert report.untouched_bytes <= report.managed_bytes


@pytest.mark.parametrize("pool", ["host", "file"])
def test_alive_matches_independent_count_during_backward(tmp_path, monkeypatch, pool):
    """In backward, what the runtime let go of but autograd still holds is counted (host tier: inline copies)."""
    model = _mlp()
    x = torch.randn(4096, 256)
    spec = "host" if pool == "host" else f"file:{tmp_path}"
    vm = virtualize(spec, budget=0, model=model, min_bytes=MIN, window=1)
    watch = _Watch(monkeypatch)
    seen = []

    def check(grad):
        vm._last.settle()
        step = vm._last
        held = step.resident_saved_bytes  # prefetched, not yet unpacked: invisible to the watch
        seen.append((step.alive_saved_bytes - held, watch.live_bytes(), held))
        return grad

    hooks = [m.register_forward_hook(lambda m, i, o: (o.register_hook(check), None)[1])
             for m in model if isinstance(m, nn.Tanh)]
    y = _forward(vm, model, x)
    y.sum().backward()
    for h in hooks:
        h.remove()
    vm.synchronize()
    assert all(lingering >= 2 * x.nbytes for lingering, _, _ in seen)  # x and y: offloaded, still alive
    assert len(seen) == 4
    for lingering, independent, held in seen:
        # everything alive that the runtime does not hold is what the watch sees, minus fetched copies
        # the runtime still holds (those are in ``held``, and the watch sees them only once unpacked)
        assert independent - held <= lingering <= independent
    vm.close()


def test_kept_storages_handed_back_are_counted_until_they_die(monkeypatch):
    """Budget above the step: every storage stays on the device and is handed back to autograd in backward.
    Those only their record still holds are counted without a weak reference (NOTE [memory honesty]), the
    caller's x and y with one; at every point the count equals the independent one."""
    model = _mlp()
    x = torch.randn(4096, 256)
    vm = virtualize("host", budget=1 << 40, model=model, min_bytes=MIN)
    watch = _Watch(monkeypatch)
    seen = []

    def check(grad):
        gc.collect()
        seen.append((vm._last.alive_saved_bytes, watch.live_bytes()))
        return grad

    hooks = [m.register_forward_hook(lambda m, i, o: (o.register_hook(check), None)[1])
             for m in model if isinstance(m, nn.Tanh)]
    with vm:
        y = model(x)
        y.sum().backward()
    for h in hooks:
        h.remove()
    gc.collect()
    report, act = vm.report, x.nbytes
    assert report.complete and report.offloaded_bytes == 0 and report.managed_bytes == 5 * act
    assert len(seen) == 4 and all(alive == independent for alive, independent in seen)
    assert vm.resident_saved_bytes == 0
    assert vm.alive_saved_bytes == watch.live_bytes() == 2 * act  # x and y, held by this test
    del y
    gc.collect()
    assert vm.alive_saved_bytes == watch.live_bytes() == act  # y's storage died: its count went with it
    assert report.peak_alive_saved_bytes == 5 * act  # all five before backward, none handed back yet
