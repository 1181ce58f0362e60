"""DistributedDataParallel: two gloo processes on CPU get the same gradients with and without mcdla."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mcdla.runtime import virtualize

WORLD = 2
STEPS = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    base = _model()
    ref, mine = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    vm = virtualize(f"file:{out_dir}/blocks-{rank}", model=mine, min_bytes=0)
    equal, offloaded = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own shard of the batch
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        for m in (ref, mine):
            m.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with vm:
            F.cross_entropy(mine(x), y).backward()
        equal.append(all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), mine.parameters())))
        offloaded.append(vm.report.offloaded_bytes)
        with torch.no_grad():  # same update on both, so later steps start from the same weights
            for a, b in zip(ref.parameters(), mine.parameters()):
                a -= 0.1 * a.grad
                b -= 0.1 * b.grad
    torch.save({"equal": equal, "offloaded": offloaded,
                "grad0": [p.grad.clone() for p in mine.parameters()]}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_ddp_gloo_gradients_identical(tmp_path):
    """Both ranks: gradients equal with and without mcdla each step, and equal across ranks (all-reduced)."""
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for r in results:
        assert r["equal"] == [True] * STEPS
        assert all(b > 0 for b in r["offloaded"])
    for a, b in zip(results[0]["grad0"], results[1]["grad0"]):
        assert torch.equal(a, b)
    assert not list(tmp_path.glob("blocks-*/*.blk"))
