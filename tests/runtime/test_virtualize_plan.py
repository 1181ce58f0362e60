"""Executing plans: exactly the planned modules are offloaded, to the planned tier, prefetched at the planned
module; recompute runs under checkpoint; plans for another model are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mcdla.errors import ConfigError, PlanError
from mcdla.runtime import HostBufferPool, HostTier, virtualize
from mcdla.workload.plan import Plan

from ._models import MLP

B, W = 16, 64


def _setup(depth: int = 4):
    torch.manual_seed(0)
    ref, model = MLP(width=W, depth=depth), MLP(width=W, depth=depth)
    model.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(2)
    return ref, model, torch.randn(B, W, generator=g), torch.randint(0, 10, (B,), generator=g)


def _plan(model, actions, **kw) -> Plan:
    names = [n for n, _ in model.named_modules()]
    return Plan.from_actions(workload="mlp", batch=B, layer_names=names, actions=actions, **kw)


def _step(model, x, y, ctx=None):
    torch.manual_seed(7)
    if ctx is None:
        F.cross_entropy(model(x), y).backward()
        return
    with ctx:
        F.cross_entropy(model(x), y).backward()


def _same_grads(a, b) -> bool:
    return all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))


def test_offloads_exactly_the_planned_modules(tmp_path):
    """Only body.0 and body.3 (two Linear layers) are offloaded, each exactly its saved input's bytes."""
    ref, model, x, y = _setup()
    plan = _plan(model, {"body.0": "offload", "body.3": "offload"})
    _step(ref, x, y)
    vm = virtualize(f"file:{tmp_path}", plan=plan, model=model, min_bytes=0)
    _step(model, x, y, vm)
    assert _same_grads(ref, model)
    assert dict(vm.report.offloaded_bytes_by_layer) == {"body.0": B * W * 4, "body.3": B * W * 4}


def test_plan_decision_covers_submodules():
    """A decision on a container applies to the tensors saved by its children."""
    ref, model, x, y = _setup()
    vm = virtualize("host", plan=_plan(model, {"body": "offload"}), model=model, min_bytes=0)
    _step(model, x, y, vm)
    layers = set(vm.report.offloaded_bytes_by_layer)
    assert layers and all(name.startswith("body.") for name in layers)


def test_plan_tier_is_respected(tmp_path):
    """An offload decision naming a tier sends the tensors there first."""
    ref, model, x, y = _setup()
    plan = Plan.from_dict({
        **_plan(model, {}).to_dict(),
        "decisions": [{"layer": "body.0", "action": "offload", "tier": "file"},
                      {"layer": "head", "action": "offload", "tier": "host"}],
    })
    vm = virtualize(f"host,file:{tmp_path}", plan=plan, model=model, min_bytes=0)
    _step(model, x, y, vm)
    by_tier = vm.report.offloaded_bytes_by_tier
    assert by_tier["host"] == B * W * 4 and by_tier[f"file:{tmp_path}"] == B * W * 4


def test_plan_json_file_is_accepted(tmp_path):
    """A plan can be given as the path of its JSON file."""
    ref, model, x, y = _setup()
    path = tmp_path / "plan.json"
    _plan(model, {"head": "offload"}).save(path)
    vm = virtualize("host", plan=str(path), model=model, min_bytes=0)
    _step(model, x, y, vm)
    assert set(vm.report.offloaded_bytes_by_layer) == {"head"}


def test_recompute_runs_under_checkpoint_exactly():
    """A recompute decision re-runs the module in backward: same gradients, its inner tensors never saved."""
    ref, model, x, y = _setup()
    _step(ref, x, y)
    plan = _plan(model, {"body.0": "offload", "body.3": "recompute", "body.4": "recompute"})
    vm = virtualize("host", plan=plan, model=model, min_bytes=0)
    _step(model, x, y, vm)
    assert _same_grads(ref, model)
    assert "forward" not in model.body[3].__dict__  # the wrapper is removed on exit
    assert set(vm.report.offloaded_bytes_by_layer) == {"body.0"}


def test_prefetch_at_triggers_at_that_modules_backward():
    """With prefetch_at, a tensor is fetched when the named module's backward starts, not before."""
    events: list[str] = []

    class LoggingHost(HostTier):
        def _read_into(self, block, out):
            events.append("fetch")
            super()._read_into(block, out)

    def run(prefetch_at):
        _, model, x, y = _setup()
        def on_forward(_m, _i, out):
            out.grad_fn.register_prehook(lambda _g: events.append("bwd body.4"))

        mark = model.body[4].register_forward_hook(on_forward)
        plan = _plan(model, {"body.0": "offload"}, prefetch_at=prefetch_at)
        tier = LoggingHost(capacity_bytes=1 << 30, buffers=HostBufferPool(pinned=False))
        events.clear()
        _step(model, x, y, virtualize(tier, plan=plan, model=model, min_bytes=0, window=8))
        mark.remove()
        return list(events)

    assert run({}) == ["fetch", "bwd body.4"]  # default: fetched as backward begins
    assert run({"body.0": "body.4"}) == ["bwd body.4", "fetch"]


def test_plan_for_another_model_is_refused():
    """A plan naming layers the model does not have raises a one-line PlanError."""
    _, model, _, _ = _setup()
    plan = Plan.from_actions(workload="other", batch=B, layer_names=["encoder.0"], actions={"encoder.0": "offload"})
    with pytest.raises(PlanError, match="does not match model") as err:
        virtualize("host", plan=plan, model=model)
    assert "\n" not in str(err.value)


def test_plan_with_unknown_tier_is_refused(tmp_path):
    """A decision naming a tier the pool does not have is a PlanError listing the pool's tiers."""
    _, model, _, _ = _setup()
    plan = Plan.from_dict({**_plan(model, {}).to_dict(),
                           "decisions": [{"layer": "head", "action": "offload", "tier": "device"}]})
    with pytest.raises(PlanError, match=r"'device'.*host"):
        virtualize("host", plan=plan, model=model)


def test_plan_needs_model_and_excludes_budget():
    """plan= without model= is a PlanError; plan= with budget= is a ConfigError."""
    _, model, _, _ = _setup()
    plan = _plan(model, {"head": "offload"})
    with pytest.raises(PlanError, match="model="):
        virtualize("host", plan=plan)
    with pytest.raises(ConfigError, match="both budget= and plan="):
        virtualize("host", budget=1000, plan=plan, model=model)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"window": 0}, "window"),
    ({"min_bytes": -1}, "min_bytes"),
    ({"budget": "lots"}, "budget"),
    ({"pool": 3}, "pool"),
])
def test_bad_arguments_are_config_errors(kwargs, fragment):
    """Invalid arguments raise one-line ConfigErrors naming the argument."""
    args = {"pool": "host", **kwargs}
    with pytest.raises(ConfigError, match=fragment):
        virtualize(**args)
