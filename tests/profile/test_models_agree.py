"""The PyTorch zoo models against the analytical zoo, counted by PyTorch itself.

Reference counts: FLOPs by ``torch.utils.flop_counter`` (the ``FlopCounterMode`` total, and its formulas per
leaf module), saved bytes by ``torch.autograd.graph.saved_tensors_hooks``. Per NOTE [saved-bytes
attribution] in ``mcdla/workload/zoo/_graph.py`` each saved storage counts once, for the last leaf module in
forward order that saves it; parameters and buffers are skipped. Backward FLOPs are attributed to the module
whose forward created the autograd node being run (``FlopCounterMode``'s own module tracker double-counts
recurrent chunks that share a weight, so only its forward per-module counts and its total are used).
Disagreement means the analytical model is wrong: PyTorch is the reference.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from mcdla.errors import ProfileError, WorkloadError
from mcdla.profile import models
from mcdla.workload import Workload, zoo


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threads only contend (a loaded 2-core machine runs this 10-40x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class _Measured:
    order: list[str] = field(default_factory=list)
    fwd_flops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bwd_flops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unattributed_flops: int = 0
    reference_fwd: dict[str, int] = field(default_factory=dict)
    reference_total: int = 0
    saved_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    output_bytes: dict[str, int] = field(default_factory=dict)
    param_bytes: dict[str, int] = field(default_factory=dict)
    glue_saved_bytes: int = 0
    loss_only_saved_bytes: int = 0


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _AttributedFlops(TorchDispatchMode):
    """flop_counter's formulas, attributed to the running leaf module (forward) or the owner of the autograd
    node being run (backward)."""

    def __init__(self, stack: list[str], node_owner: dict[Any, str], res: _Measured) -> None:
        super().__init__()
        self.stack, self.node_owner, self.res = stack, node_owner, res

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func._overloadpacket in flop_registry:
            flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
            node = torch._C._current_autograd_node()
            if node is None and self.stack:
                self.res.fwd_flops[self.stack[-1]] += flops
            elif node is not None and node in self.node_owner:
                self.res.bwd_flops[self.node_owner[node]] += flops
            else:
                self.res.unattributed_flops += flops
        return out


def _measure(model: nn.Module, inputs: tuple[torch.Tensor, ...], loss_fn: Any) -> _Measured:
    """One training step under hooks: per leaf module FLOPs, saved, output and parameter bytes."""
    res = _Measured()
    leaves = {m: n for n, m in model.named_modules() if next(m.children(), None) is None}
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    stack: list[str] = []
    node_owner: dict[Any, str] = {}
    last_saver: dict[int, tuple[str, int]] = {}
    in_model = [True]

    def pre(module: nn.Module, args: Any) -> None:
        stack.append(leaves[module])
        res.order.append(leaves[module])

    def post(module: nn.Module, args: Any, out: Any) -> None:
        name = stack.pop()
        stops = {t.grad_fn for t in _tensors(args)}
        todo = [t.grad_fn for t in _tensors(out)]
        while todo:  # claim the autograd nodes this module's forward created
            node = todo.pop()
            if node is None or node in stops or node in node_owner or type(node).__name__ == "AccumulateGrad":
                continue
            node_owner[node] = name
            todo += [nxt for nxt, _ in node.next_functions]
        storages = {t.untyped_storage().data_ptr(): t.numel() * t.element_size() for t in _tensors(out)}
        res.output_bytes[name] = sum(storages.values())

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in state:
            pass
        elif stack:
            last_saver[ptr] = (stack[-1], storage.nbytes())
        elif in_model[0]:
            res.glue_saved_bytes += storage.nbytes()
        elif ptr not in last_saver:
            res.loss_only_saved_bytes += storage.nbytes()
        return t

    hooks = [h for m in leaves for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    res.param_bytes = {
        n: sum(p.numel() * p.element_size() for p in m.parameters(recurse=False)) for m, n in leaves.items()
    }
    reference = FlopCounterMode(display=False)
    try:
        hooks_on = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with reference, _AttributedFlops(stack, node_owner, res), hooks_on:
            out = model(*inputs)
            in_model[0] = False
            counts = reference.get_flop_counts()
            res.reference_fwd = {k.split(".", 1)[1]: sum(v.values()) for k, v in counts.items() if "." in k}
            loss = loss_fn(out)
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    res.reference_total = sum(reference.get_flop_counts()["Global"].values())
    for name, nbytes in last_saver.values():
        res.saved_bytes[name] += nbytes
    return res


def _both(name: str, scale: dict[str, Any]) -> tuple[Workload, _Measured, Any]:
    model, inputs, loss_fn = models.build(name, **scale)
    return zoo.build(name, precision="fp32", **scale), _measure(model, inputs, loss_fn), loss_fn


def _assert_agree(w: Workload, m: _Measured) -> None:
    assert m.order == list(w.layer_names)  # same leaf modules, each run once, in the same order
    for field_name in ("fwd_flops", "bwd_flops", "saved_bytes", "output_bytes", "param_bytes"):
        measured = {n: float(getattr(m, field_name).get(n, 0)) for n in w.layer_names}
        analytic = {layer.name: getattr(layer, field_name) for layer in w.layers}
        assert sum(measured.values()) == pytest.approx(sum(analytic.values()), rel=0.01), field_name
        wrong = {n: (measured[n], analytic[n]) for n in analytic if measured[n] != analytic[n]}
        assert not wrong, f"{field_name} (measured, analytic): {dict(list(wrong.items())[:3])}"
    assert m.reference_total == w.fwd_flops + w.bwd_flops and m.unattributed_flops == 0
    assert {n: m.reference_fwd.get(n, 0) for n in w.layer_names} == {l.name: l.fwd_flops for l in w.layers}
    assert m.glue_saved_bytes == 0  # cat, stack, add and slicing between modules save nothing


@pytest.mark.parametrize("name", zoo.names())
def test_small_scale_agrees_per_layer(name: str) -> None:
    """At the zoo's small scale every layer's FLOPs and saved/output/parameter bytes equal PyTorch's counts."""
    w, m, loss_fn = _both(name, zoo.small_scale(name))
    _assert_agree(w, m)
    assert m.loss_only_saved_bytes == 8 * loss_fn.targets.numel() + 4  # int64 targets, fp32 total weight


@pytest.mark.parametrize(
    ("name", "scale"),
    [
        ("alexnet", {"batch": 1, "resolution": 70, "width": 0.1, "num_classes": 3}),
        ("googlenet", {"batch": 1, "resolution": 45, "width": 0.05, "num_classes": 3}),
        ("vgg-e", {"batch": 3, "resolution": 40, "width": 0.03, "num_classes": 2}),
        ("resnet-152", {"batch": 1, "resolution": 45, "width": 0.04, "num_classes": 3}),
        ("lstm", {"batch": 2, "hidden": 6, "seq_len": 4, "layers": 1, "input_size": 3, "num_classes": 2, "chunk": 4}),
        ("gru", {"batch": 1, "hidden": 5, "seq_len": 3, "layers": 3, "input_size": 5, "num_classes": 4, "chunk": 1}),
        ("rnn", {"batch": 2, "hidden": 4, "seq_len": 5, "layers": 2, "input_size": 7, "num_classes": 3, "chunk": 9}),
        ("seq-lstm", {"batch": 2, "hidden": 6, "embed": 5, "layers": 1, "seq_len": 3, "src_vocab": 9,
                      "tgt_vocab": 7, "chunk": 2}),
    ],
)
def test_other_shapes_agree_per_layer(name: str, scale: dict[str, Any]) -> None:
    """Odd resolutions (ceil-mode pools), batch 1, single or oversized chunks and one layer also agree."""
    w, m, _ = _both(name, scale)
    _assert_agree(w, m)


@pytest.mark.parametrize(("cell", "reference"), [("rnn", nn.RNN), ("lstm", nn.LSTM), ("gru", nn.GRU)])
def test_recurrent_parameters_equal_torch_rnn_modules(cell: str, reference: type[nn.Module]) -> None:
    """Our split recurrent layers hold exactly as many parameters as torch.nn's fused RNN/LSTM/GRU."""
    scale = {"hidden": 9, "seq_len": 4, "layers": 3, "input_size": 5, "num_classes": 2, "chunk": 3}
    model, _, _ = models.build(cell, batch=1, **scale)
    ours = sum(p.numel() for p in model.layers.parameters())
    assert ours == sum(p.numel() for p in reference(5, 9, 3).parameters())


@pytest.mark.parametrize("name", zoo.names())
def test_training_step_reaches_every_parameter(name: str) -> None:
    """The loss is a scalar and backward reaches every parameter (the shared recurrent weights included)."""
    model, inputs, loss_fn = models.build(name, **zoo.small_scale(name))
    loss = loss_fn(model(*inputs))
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())


def test_build_is_seeded_and_leaves_global_rng_alone() -> None:
    """The same seed gives the same parameters and inputs; the global RNG state is untouched."""
    before = torch.random.get_rng_state()
    (m1, x1, _), (m2, x2, _) = (models.build("lstm", **zoo.small_scale("lstm")) for _ in range(2))
    assert torch.equal(x1[0], x2[0])
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert torch.equal(before, torch.random.get_rng_state())


def test_unknown_model_and_bad_precision() -> None:
    """Unknown names list the zoo; unknown precisions list the allowed ones."""
    with pytest.raises(WorkloadError, match="must be one of alexnet, googlenet"):
        models.build("lenet")
    with pytest.raises(ProfileError, match="precision: got 'fp8'; must be one of fp32, fp16, bf16"):
        models.build("rnn", precision="fp8", **zoo.small_scale("rnn"))
