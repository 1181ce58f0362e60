"""Two gloo processes on CPU. FSDP2 (fully_shard, DTensor parameters): activations virtualized and the sharded
AdamW state offloaded give exactly FSDP2's own gradients, weights and state. DDP: weights and AdamW state
offloaded (and activations virtualized) give exactly DDP's own gradients and weights."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from mcdla.runtime import offload_optimizer, offload_parameters, virtualize

WORLD = 2
STEPS = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def _sharded(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    base = _model()
    ref, mine = _sharded(copy.deepcopy(base)), _sharded(copy.deepcopy(base))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = offload_optimizer(torch.optim.AdamW(mine.parameters(), lr=1e-2), pool=f"file:{out_dir}/state-{rank}")
    vm = virtualize(f"file:{out_dir}/blocks-{rank}", model=mine, min_bytes=0)
    grads_equal, offloaded = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own shard of the batch
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        F.cross_entropy(ref(x), y).backward()
        with vm:
            F.cross_entropy(mine(x), y).backward()
        grads_equal.append(all(torch.equal(a.grad.to_local(), b.grad.to_local())
                               for a, b in zip(ref.parameters(), mine.parameters())))
        offloaded.append(vm.report.offloaded_bytes)
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
    weights_equal = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(ref.parameters(), mine.parameters()))
    want, got = ref_opt.state_dict()["state"], opt.state_dict()["state"]
    state_equal = want.keys() == got.keys() and all(
        torch.equal(v.to_local() if hasattr(v, "to_local") else v, got[i][k])
        for i, entries in want.items() for k, v in entries.items())
    opt.close()
    vm.close()
    torch.save({"grads_equal": grads_equal, "offloaded": offloaded, "weights_equal": weights_equal,
                "state_equal": state_equal}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_activations_and_state_offloaded_exactly(tmp_path):
    """Both ranks, two AdamW steps: gradients (local shards) equal each step with the activations in the file
    tier, weights and state equal after them with the state in the file tier, and no block file left."""
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD, join=True)
    for r in range(WORLD):
        result = torch.load(tmp_path / f"rank{r}.pt")
        assert result["grads_equal"] == [True] * STEPS
        assert all(b > 0 for b in result["offloaded"])
        assert result["weights_equal"] and result["state_equal"]
    assert not list(tmp_path.glob("*-*/*.blk"))


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    base = _model()
    ref, mine = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    params = offload_parameters(mine.module, pool="host", prefetch=1)
    opt = offload_optimizer(torch.optim.AdamW(mine.parameters(), lr=1e-2), pool="host", parameters=params,
                            overlap=False)  # DDP's all-reduce rewrites the gradients after they accumulate
    vm = virtualize("host", model=mine, min_bytes=0)
    grads_equal = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        F.cross_entropy(ref(x), y).backward()
        with vm:
            F.cross_entropy(mine(x), y).backward()
        grads_equal.append(all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), mine.parameters())))
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
    opt.close()
    params.close()
    vm.close()
    weights_equal = all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters()))
    torch.save({"grads_equal": grads_equal, "weights_equal": weights_equal}, os.path.join(out_dir, f"ddp{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_weights_and_state_offloaded_exactly(tmp_path):
    """Both ranks, two AdamW steps of DDP with weights, state and activations in the host tier: gradients equal
    DDP's each step (all-reduced from the fetched weights) and weights equal after them."""
    mp.spawn(_ddp_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD, join=True)
    for r in range(WORLD):
        result = torch.load(tmp_path / f"ddp{r}.pt")
        assert result["grads_equal"] == [True] * STEPS
        assert result["weights_equal"]
