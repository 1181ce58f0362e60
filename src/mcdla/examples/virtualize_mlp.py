"""Train the example perceptron under ``mcdla.virtualize`` with plan.json; the gradients stay exact.

The model is the one ``workloads/tiny-mlp.yaml`` describes, with the same layer names, so ``plan.json`` (made
by ``mcdla plan`` from that file) applies to it: the plan offloads the tensors saved by ``fc1``, ``fc2`` and
``log_softmax`` to the host and prefetches them back for backward. The gradients are compared with a run
without virtualization, which they equal bit for bit.

Run it from a directory holding ``plan.json`` (``mcdla examples --copy DIR`` writes one)::

    python virtualize_mlp.py [--plan plan.json] [--steps 3]

It runs on the CPU in about a second.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

import mcdla


def make_model() -> nn.Module:
    """The tiny-mlp workload as a PyTorch module: Linear(1024, 4096), ReLU, Linear(4096, 10), LogSoftmax."""
    return nn.Sequential(OrderedDict([
        ("fc1", nn.Linear(1024, 4096)),
        ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(4096, 10)),
        ("log_softmax", nn.LogSoftmax(dim=1)),
    ]))


def gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, plan: Path | None) -> list[torch.Tensor]:
    """One forward and backward of ``model`` (under the plan when given); its parameter gradients."""
    model.zero_grad(set_to_none=True)
    loss_fn = nn.NLLLoss()
    if plan is None:
        loss_fn(model(x), y).backward()
    else:
        with mcdla.virtualize(pool="host", plan=plan, model=model) as v:
            loss_fn(model(x), y).backward()
        print(v.report.summary())
    return [p.grad.clone() for p in model.parameters()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, default=Path(__file__).with_name("plan.json"))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = make_model()
    for step in range(args.steps):
        x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
        plain = gradients(model, x, y, plan=None)
        virtualized = gradients(model, x, y, plan=args.plan)
        same = all(torch.equal(a, b) for a, b in zip(plain, virtualized))
        print(f"step {step}: gradients {'identical' if same else 'DIFFER'} with and without virtualization")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
