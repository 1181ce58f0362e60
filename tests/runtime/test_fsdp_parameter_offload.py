"""Two gloo processes on CPU: FSDP2's sharded parameters (each rank's padded local shards) kept in the pool by
``offload_parameters`` give exactly FSDP2's own losses, gradients, weights and AdamW state, with the optimizer
stepped inside ``gathered()`` or by ``offload_optimizer(parameters=...)``, also with the activations virtualized;
between uses the shards take no bytes, and the resident shard bytes peak at the largest window of ``prefetch + 1``
consecutive groups."""

from __future__ import annotations

import contextlib
import copy
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ConfigError
from mcdla.runtime import offload_optimizer, offload_parameters, virtualize

WORLD = 2
STEPS = 3
SIZES = [(32, 63), (63, 64), (64, 17), (17, 4)]  # odd output sizes: rank 1's shards carry FSDP2's padding


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for n_in, n_out in SIZES:
        layers += [nn.Linear(n_in, n_out), nn.GELU()]
    return nn.Sequential(*layers[:-1])


def _sharded(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def _shard_bytes(n_in: int, n_out: int) -> int:
    """A Linear's padded shard per rank, by hand: FSDP2 shards dim 0 into chunks of ceil(n_out / WORLD) rows."""
    rows = math.ceil(n_out / WORLD)
    return 4 * (rows * n_in + rows)


def _window(prefetch: int) -> int:
    sizes = [_shard_bytes(*s) for s in SIZES]
    return max(sum(sizes[i:i + prefetch + 1]) for i in range(len(sizes)))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own shard of the batch
    return torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _run(rank: int, out_dir: str, how: str, prefetch: int) -> dict:
    base = _model()
    ref, mine = _sharded(copy.deepcopy(base)), _sharded(copy.deepcopy(base))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    params = offload_parameters(mine, pool=f"file:{out_dir}/w-{how}-{prefetch}-{rank}", prefetch=prefetch)
    empty_between = all(p.to_local().untyped_storage().nbytes() == 0 for p in mine.parameters())
    vm = virtualize(f"file:{out_dir}/a-{how}-{prefetch}-{rank}", model=mine, min_bytes=0) if how == "all" else None
    if how in ("offload_optimizer", "all"):
        opt = offload_optimizer(torch.optim.AdamW(mine.parameters(), lr=1e-2, weight_decay=0.1), pool="host",
                                parameters=params)
    else:
        opt = torch.optim.AdamW(mine.parameters(), lr=1e-2, weight_decay=0.1)
    losses_equal, grads_equal, peaks, activations = [], [], [], []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        want = F.cross_entropy(ref(x), y)
        want.backward()
        params.reset_report()
        with vm if vm is not None else contextlib.nullcontext():
            got = F.cross_entropy(mine(x), y)
            got.backward()
        peaks.append(params.peak_resident_bytes)
        activations.append(vm.report.offloaded_bytes if vm is not None else None)
        losses_equal.append(torch.equal(want.detach(), got.detach()))
        grads_equal.append(all(torch.equal(_local(a.grad), _local(b.grad))
                               for a, b in zip(ref.parameters(), mine.parameters())))
        ref_opt.step()
        ref_opt.zero_grad()
        if how != "gathered":
            opt.step()
        else:
            with params.gathered():
                opt.step()
        opt.zero_grad()
    empty_between = empty_between and all(p.to_local().untyped_storage().nbytes() == 0 for p in mine.parameters())
    got_state = opt.state_dict()["state"]
    if how != "gathered":
        opt.close()
    params.close()
    if vm is not None:
        vm.close()
    weights_equal = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(ref.parameters(), mine.parameters()))
    want_state = ref_opt.state_dict()["state"]
    state_equal = want_state.keys() == got_state.keys() and all(
        torch.equal(_local(v), _local(got_state[i][k])) for i, entries in want_state.items() for k, v in entries.items())
    return {"losses": losses_equal, "grads": grads_equal, "weights": weights_equal, "state": state_equal,
            "empty": empty_between, "peaks": peaks, "activations": activations}


def _one_rank_error(rank: int) -> str:
    """The error of offload_parameters on a model sharded over a mesh of this rank alone."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    groups = [dist.new_group([r]) for r in range(WORLD)]  # every rank creates every group
    model = fully_shard(_model(), mesh=DeviceMesh.from_group(groups[rank], "cpu"))
    try:
        offload_parameters(model, pool="host")
    except ConfigError as exc:
        return str(exc)
    return ""


def _worker(rank: int, init_file: str, out_dir: str, runs: list[tuple[str, int]]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results: dict = {f"{how}-{k}": _run(rank, out_dir, how, k) for how, k in runs}
    results["one_rank_error"] = _one_rank_error(rank)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_shards_in_the_pool_exactly(tmp_path):
    """Both ranks, three AdamW steps, shards in the file tier: losses and local gradients equal FSDP2's every step,
    weights and state equal after, shards empty between uses, the peak equals the hand-computed window from the
    second step on (the first forward learns the order), and no block file is left; a model sharded over one
    rank is refused in one line (its unsharded parameters alias the shards)."""
    runs = [("gathered", 1), ("offload_optimizer", 1), ("offload_optimizer", 0), ("gathered", 2), ("all", 1)]
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path), runs), nprocs=WORLD, join=True)
    for r in range(WORLD):
        results = torch.load(tmp_path / f"rank{r}.pt")
        for how, k in runs:
            res = results[f"{how}-{k}"]
            assert res["losses"] == [True] * STEPS, (r, how, k)
            assert res["grads"] == [True] * STEPS, (r, how, k)
            assert res["weights"] and res["state"] and res["empty"], (r, how, k)
            assert res["peaks"][1:] == [_window(k)] * (STEPS - 1), (r, how, k, res["peaks"])
            assert how != "all" or all(b > 0 for b in res["activations"]), res["activations"]
        assert results["one_rank_error"].startswith("offload_parameters.model: FSDP2 group '' has 1 rank")
        assert "\n" not in results["one_rank_error"]
    assert not list(tmp_path.glob("[wa]-*/*.blk"))
