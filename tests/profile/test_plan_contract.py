"""One contract between a plan's maker and the runtime: the plan's budgets (NOTE [plan
budgets] in ``mcdla.workload.plan``) and the owner of a storage saved by several modules (NOTE [saved bytes]
in ``mcdla.profile.profiler``)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mcdla.cli import main
from mcdla.profile import profile
from mcdla.runtime import Block, Tier, virtualize
from mcdla.runtime._policy import plan_cap_bytes
from mcdla.workload.io import save_workload
from mcdla.workload.plan import Action, Plan

B, W = 128, 256  # 128 KiB per float32 activation


class _TwoReaders(nn.Module):
    """``a(x) + b(x)``: both Linears save the one storage ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(W, W), nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def _shared_savers() -> nn.Sequential:
    """Storages saved by two or more modules: the stem's output (the in-place ReLU ``act``, then ``pair1.a``
    and ``pair1.b``), ``mid``'s output (``pair2.a`` then ``pair2.b``, Linear then Linear) and ``relu``'s
    output (``relu``, then ``head``)."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict([
        ("stem", nn.Linear(W, W)), ("act", nn.ReLU(inplace=True)), ("pair1", _TwoReaders()),
        ("mid", nn.Linear(W, W)), ("pair2", _TwoReaders()), ("relu", nn.ReLU()), ("head", nn.Linear(W, W)),
    ]))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()  # saves nothing


def _saved(workload) -> dict[str, float]:  # noqa: ANN001
    return {l.name: l.saved_bytes for l in workload.layers if l.saved_bytes > 0}


def test_profile_and_runtime_give_a_shared_storage_to_the_same_module() -> None:
    """The profile's owner of every storage (its default rule) is the module the runtime attributes it to:
    per module, the profiled saved bytes equal the bytes the runtime offloads (offloading everything), and a
    plan made in those names offloads exactly the profiled bytes of the modules it names. The zoo's
    last-saver rule would not agree."""
    model = _shared_savers()
    x = torch.randn(B, W, generator=torch.Generator().manual_seed(1))
    act = B * W * 4
    workload = profile(model, x, _loss, warmup_steps=0, measured_steps=1)
    first = {"stem": act, "act": act, "mid": act, "pair2.a": act, "relu": act}
    assert _saved(workload) == first
    last = profile(model, x, _loss, warmup_steps=0, measured_steps=1, shared_storage_owner="last")
    assert _saved(last) == {"stem": act, "pair1.b": act, "mid": act, "pair2.b": act, "head": act}

    vm = virtualize("host", model=model, min_bytes=0)  # no plan, no budget: every storage offloaded
    with vm:
        _loss(model(x.clone())).backward()
    assert dict(vm.report.offloaded_bytes_by_layer) == first
    vm.close()

    chosen = ("act", "pair2.a")
    plan = Plan.from_actions(workload=workload.name, batch=B, layer_names=workload.layer_names,
                             actions={n: "offload" for n in chosen})
    model.zero_grad(set_to_none=True)
    vm = virtualize("host", plan=plan, model=model, min_bytes=0)
    with vm:
        _loss(model(x.clone())).backward()
    assert dict(vm.report.offloaded_bytes_by_layer) == {n: first[n] for n in chosen}
    vm.close()


# -- mcdla plan --out, then virtualize(plan=FILE) ----------------------------------------------------------------
WRITE_S = 0.25  # each offload; the whole forward takes milliseconds, so offloads fall behind


class _SleepyTier(Tier):
    """Blocks in memory; each write sleeps ``WRITE_S`` first (a slow pool, no CPU used); one I/O thread."""

    kind = "sleepy"

    def __init__(self) -> None:
        super().__init__(name="sleepy", capacity_bytes=1 << 30, io_threads=1)

    def _write(self, data, *, reserved_bytes, label):  # noqa: ANN001, ANN202
        time.sleep(WRITE_S)
        return Block(tier=self, nbytes=len(data), reserved_bytes=reserved_bytes, label=label, payload=bytes(data))

    def _read_into(self, block, out):  # noqa: ANN001, ANN202
        np.copyto(np.frombuffer(out, dtype=np.uint8), np.frombuffer(block.payload, dtype=np.uint8))

    def _discard(self, block):  # noqa: ANN001, ANN202
        block.payload = None


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(W, W), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(W, W))


def _run(model: nn.Module, x: torch.Tensor, plan: Plan | str) -> tuple[object, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    vm = virtualize(_SleepyTier(), plan=plan, model=model, min_bytes=0, window=16)
    with vm:
        _loss(model(x.clone())).backward()
    report = vm.report
    vm.close()
    return report, [p.grad.clone() for p in model.parameters()]


@pytest.mark.timeout(120)
def test_plan_file_from_the_cli_caps_the_runtime_at_its_saved_cap(tmp_path: Path) -> None:
    """``mcdla plan --out plan.json`` on the profile of a real model writes the device budget and the saved
    cap (budget less static bytes); ``virtualize(plan="plan.json")`` on that model holds its resident saved
    bytes within that cap, waiting for offloads when the pool is slow, with gradients bit-identical. Read with
    the old meaning (cap = the device budget, here larger than all saved bytes) the same plan does not hold
    them there, so the cap is what bounds them."""
    model = _mlp()
    x = torch.randn(B, W, generator=torch.Generator().manual_seed(1))
    workload = profile(model, x, _loss, warmup_steps=0, measured_steps=1)
    wl_path = save_workload(workload, tmp_path / "mlp.json")
    transient = max(2 * l.output_bytes + l.workspace_bytes for l in workload.layers)
    budget = int(workload.static_bytes + transient + 0.4 * workload.saved_bytes)
    plan_path = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as code:
        main(["plan", "--workload", str(wl_path), "--system", "dc-dla", "--budget", f"{budget}B",
              "--planner", "lp", "--out", str(plan_path)])
    assert code.value.code in (0, None)

    data = json.loads(plan_path.read_text())
    cap = budget - workload.static_bytes
    assert data["budget_bytes"] == budget
    assert data["saved_cap_bytes"] == pytest.approx(cap)
    plan = Plan.load(plan_path)
    assert plan_cap_bytes(plan) == pytest.approx(cap)
    assert plan.layers_with(Action.OFFLOAD)  # the budget makes it offload something

    _loss(model(x.clone())).backward()
    reference = [p.grad.clone() for p in model.parameters()]
    report, grads = _run(model, x, str(plan_path))
    assert report.peak_resident_saved_bytes <= cap * (1 + 1e-9)
    assert report.pack_wait_s > 0  # the forward waited for room under the cap
    for got, want in zip(grads, reference):
        assert torch.equal(got, want)

    legacy = dataclasses.replace(plan, saved_cap_bytes=plan.budget_bytes)  # the old reading of budget_bytes
    assert legacy.budget_bytes > workload.saved_bytes
    old_report, _ = _run(model, x, legacy)
    assert old_report.peak_resident_saved_bytes > cap
