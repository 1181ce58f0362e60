"""The tutorial (docs/tutorial.md) as one script: profile a model, plan it, predict the speedup, run it.

1. Profile a small PyTorch CNN on this machine into a workload (``my-net.yaml``): measured layer times,
   FLOPs, saved bytes.
2. Plan it under a GPU's memory: the budget keeps the static bytes and half of the saved bytes on the device
   (a model this small fits any GPU; a real one is planned under the GPU's memory, ``budget = 16GiB``).
3. Predict the iteration time on DC-DLA, MC-DLA and two 2026 systems. The measured times are this CPU's,
   so they are rescaled to each GPU first (``--scale-to roofline`` on the command line).
4. Run a training step under ``mcdla.virtualize`` with the plan and compare it with the plan and with a run
   without virtualization: the bytes offloaded per layer equal the profiled saved bytes of the planned
   layers, and the gradients are bit-identical.

Run it (about 10 s on a laptop CPU, most of it simulating the 72-GPU system)::

    python tutorial.py [--out DIR] [--batch 16]

``make_model`` is also a model factory for ``mcdla validate --model python:mcdla.examples.tutorial:make_model``.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import mcdla
from mcdla.hardware import load_system
from mcdla.plan import make_plan
from mcdla.profile import profile
from mcdla.sim import pool_link, simulate
from mcdla.sim.measured import scale_measured_times
from mcdla.units import format_bytes
from mcdla.workload import Action, save_workload

SYSTEMS = ("dc-dla", "mc-dla", "dc-dla-2026", "gb200-nvl72-memnode")
"""Where the speedup is predicted: the paper's baseline and MC-DLA, and two 2026 presets (docs/hardware.md)."""


def make_model(batch: int = 16) -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """A small CNN for 32x32 RGB images, a batch of inputs, and its loss (cross-entropy on fixed labels)."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(3, 32, 3, padding=1)), ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 64, 3, padding=1)), ("relu2", nn.ReLU()), ("pool", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc", nn.Linear(64 * 16 * 16, 10)),
    ]))
    x = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))
    return model, x, lambda out: nn.functional.cross_entropy(out, labels)


@dataclass(frozen=True)
class TutorialResult:
    """What the tutorial found: the iteration time per system (s), and the runtime's run of the plan.

    ``planned_offload_bytes`` are the saved bytes (per layer) of the layers the plan offloads, from the profile;
    ``offloaded_bytes`` what the runtime moved to the pool per module."""

    iteration_s: dict[str, float]
    planned_offload_bytes: dict[str, float]
    offloaded_bytes: dict[str, int]
    gradients_identical: bool


def run(out: Path, batch: int = 16, systems: Sequence[str] = SYSTEMS) -> TutorialResult:
    """The four steps of the tutorial; writes ``my-net.yaml`` and ``plan.json`` into ``out``.

    ``systems`` are where the iteration time is predicted; the first is the one planned for."""
    out.mkdir(parents=True, exist_ok=True)
    model, x, loss_fn = make_model(batch)

    # 1. Profile: measured on this machine (measured_on records where).
    workload = profile(model, x, loss_fn, name="tutorial-cnn", warmup_steps=1, measured_steps=3)
    save_workload(workload, out / "my-net.yaml")

    # 2. Plan: static bytes plus half the saved bytes stay on the device; the rest is offloaded or recomputed.
    baseline = load_system(systems[0])
    on_gpu = scale_measured_times(workload, baseline.devices[0], "roofline")
    budget = on_gpu.footprint_bytes() - on_gpu.saved_bytes / 2
    plan = make_plan(on_gpu, budget, pool_link(baseline), planner="lp")
    plan.save(out / "plan.json")

    # 3. Predict: the same plan on each system, with the layer times rescaled to its GPU.
    times = {}
    for name in systems:
        system = load_system(name)
        times[name] = simulate(system, scale_measured_times(workload, system.devices[0], "roofline"),
                               plan).iteration_time_s

    # 4. Run: one step under the plan, one without; the gradients must be equal bit for bit.
    # min_bytes=0 moves every planned storage, however small (by default those under 256 KiB stay).
    def grads(virtualized: bool) -> tuple[list[torch.Tensor], dict[str, int]]:
        model.zero_grad(set_to_none=True)
        if not virtualized:
            loss_fn(model(x)).backward()
            return [p.grad.clone() for p in model.parameters()], {}
        with mcdla.virtualize(pool="host", plan=plan, model=model, min_bytes=0) as v:
            loss_fn(model(x)).backward()
        moved = {layer: nbytes for layer, nbytes in v.report.offloaded_bytes_by_layer.items() if nbytes}
        return [p.grad.clone() for p in model.parameters()], moved

    plain, _ = grads(False)
    virtualized, moved = grads(True)
    return TutorialResult(
        iteration_s=times,
        planned_offload_bytes={name: workload.layers[workload.index_of(name)].saved_bytes
                               for name in plan.layers_with(Action.OFFLOAD)},
        offloaded_bytes=moved,
        gradients_identical=all(torch.equal(a, b) for a, b in zip(plain, virtualized)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tutorial-out"))
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    result = run(args.out, args.batch)
    base = result.iteration_s[SYSTEMS[0]]
    for name, seconds in result.iteration_s.items():
        print(f"{name:<22} {seconds * 1e3:9.3f} ms  speedup over {SYSTEMS[0]} {base / seconds:5.2f}x")
    for label, per_layer in (("planned offloads", result.planned_offload_bytes),
                             ("runtime offloaded", result.offloaded_bytes)):
        print(f"{label:<18} " + (", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(per_layer.items())) or "none"))
    print(f"gradients {'identical' if result.gradients_identical else 'DIFFER'} with and without virtualization")
    same_bytes = result.offloaded_bytes == {k: int(v) for k, v in result.planned_offload_bytes.items()}
    return 0 if result.gradients_identical and same_bytes else 1


if __name__ == "__main__":
    raise SystemExit(main())
