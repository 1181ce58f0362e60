"""mcdla.offload_optimizer: state in the pool, the update on the CPU, bit-identical to the plain optimizer."""

from __future__ import annotations

import importlib.util
import json
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from mcdla.errors import ConfigError, OffloadError, PlanError
from mcdla.runtime import offload_optimizer

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
}


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(dtype)


def _batches(n: int, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=g, dtype=dtype), torch.randn(4, 8, generator=g, dtype=dtype)) for _ in range(n)]


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def _assert_same_state(got: dict, want: dict) -> None:
    assert got["state"].keys() == want["state"].keys()
    for i, entries in want["state"].items():
        assert got["state"][i].keys() >= entries.keys()
        for key, value in entries.items():
            assert torch.equal(got["state"][i][key], value), (i, key)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("pool", ["host", "file", "compress(file)"])
def test_fp32_steps_bit_identical(tmp_path, kind, pool):
    """Three steps with the state in host/file/compress tiers give the plain optimizer's parameters and state."""
    spec = pool.replace("file", f"file:{tmp_path}")
    ref, model = _model(), _model()
    ref_opt = OPTIMIZERS[kind](ref.parameters())
    with offload_optimizer(OPTIMIZERS[kind](model.parameters()), pool=spec, model=model) as opt:
        for x, y in _batches(3):
            for m, o in ((ref, ref_opt), (model, opt)):
                _loss(m, x, y).backward()
                o.step()
                o.zero_grad()
            assert opt.stepped_in_backward == 4  # every parameter's update started during backward
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)
        _assert_same_state(opt.state_dict(), ref_opt.state_dict())
        assert opt.stored_bytes == sum(v.nbytes for s in ref_opt.state.values() for v in s.values() if v.dim() > 0)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_bf16_with_fp32_master_bit_identical(kind):
    """bf16 parameters: the update equals a hand-written fp32-master loop (fp32 grads, rounded back to bf16)."""
    ref, model = _model(torch.bfloat16), _model(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    ref_opt = OPTIMIZERS[kind](masters)
    with offload_optimizer(OPTIMIZERS[kind](model.parameters()), pool="host") as opt:
        for x, y in _batches(3, torch.bfloat16):
            _loss(ref, x, y).backward()
            for p, m in zip(ref.parameters(), masters):
                m.grad = p.grad.float()
            ref_opt.step()
            with torch.no_grad():
                for p, m in zip(ref.parameters(), masters):
                    p.copy_(m)
            ref.zero_grad()
            _loss(model, x, y).backward()
            opt.step()
            opt.zero_grad()
        for a, b in zip(ref.parameters(), model.parameters()):
            assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
        got = opt.state_dict()
        _assert_same_state(got, ref_opt.state_dict())
        for i, m in enumerate(masters):
            assert torch.equal(got["state"][i]["master_param"], m.detach())


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradient_accumulation_bit_identical(set_to_none):
    """Two micro-batches per step, the first under no_step(): same as the plain optimizer accumulating."""
    ref, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host") as opt:
        batches = _batches(4)
        for first, last in (batches[:2], batches[2:]):
            _loss(ref, *first).backward()
            _loss(ref, *last).backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=set_to_none)
            with opt.no_step():
                _loss(model, *first).backward()
            _loss(model, *last).backward()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)
        _assert_same_state(opt.state_dict(), ref_opt.state_dict())


def test_accumulating_without_no_step_raises():
    """A second backward before step() would change a gradient whose update already ran: OffloadError."""
    model = _model()
    with offload_optimizer(torch.optim.Adam(model.parameters()), pool="host", model=model) as opt:
        (x, y), (x2, y2) = _batches(2)
        _loss(model, x, y).backward()
        with pytest.raises(OffloadError, match=r"parameter '\d\.\w+': gradient accumulated again.*no_step"):
            _loss(model, x2, y2).backward()


def test_clipping_needs_overlap_off():
    """Clipping after backward is caught with overlap; with overlap=False the result equals the plain optimizer."""
    model = _model()
    (x, y), = _batches(1)
    with offload_optimizer(torch.optim.Adam(model.parameters()), pool="host") as opt:
        _loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        with pytest.raises(OffloadError, match="gradient changed after its update started.*overlap=False"):
            opt.step()
    ref, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref.parameters())
    with offload_optimizer(torch.optim.Adam(model.parameters()), pool="host", overlap=False) as opt:
        for m, o in ((ref, ref_opt), (model, opt)):
            _loss(m, x, y).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
            o.step()
        assert opt.stepped_in_backward == 0
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_damaged_state_block_raises(tmp_path, damage):
    """A corrupted or truncated state block file makes step() raise OffloadError naming parameter and tier."""
    model = _model()
    with offload_optimizer(torch.optim.Adam(model.parameters()), pool=f"file:{tmp_path}", model=model) as opt:
        (x, y), = _batches(1)
        _loss(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        files = sorted(tmp_path.glob("*.blk"))
        assert len(files) == 2 * 4  # exp_avg and exp_avg_sq of 4 parameters
        for f in files:
            raw = bytearray(f.read_bytes())
            if damage == "corrupt":
                raw[len(raw) // 2] ^= 0xFF
            else:
                raw = raw[: len(raw) // 2]
            f.write_bytes(bytes(raw))
        with pytest.raises(OffloadError, match=r"optimizer state 'exp_avg\w*' of parameter '\d\.\w+'.*"
                                               rf"tier 'file:{tmp_path}'.*(corrupted|truncated)"):
            _loss(model, x, y).backward()
            opt.step()


def test_close_frees_blocks_and_files(tmp_path):
    """close() frees every block (the pool holds nothing) and removes the block files."""
    model = _model(torch.bfloat16)
    opt = offload_optimizer(torch.optim.Adam(model.parameters()), pool=f"file:{tmp_path}")
    x, y = _batches(1, torch.bfloat16)[0]
    _loss(model, x, y).backward()
    opt.step()
    assert opt.pool.block_count == 3 * 4  # two moments and a master weight per parameter
    opt.close()
    assert opt.pool.block_count == 0 and opt.pool.used_bytes == 0
    assert list(tmp_path.glob("*.blk")) == []
    with pytest.raises(OffloadError, match="closed"):
        opt.step()


def test_state_dict_round_trip():
    """state_dict() into a fresh offloaded optimizer continues exactly like the uninterrupted run."""
    a, b = _model(torch.bfloat16), _model(torch.bfloat16)
    batches = _batches(4, torch.bfloat16)
    opt_a = offload_optimizer(torch.optim.AdamW(a.parameters(), lr=1e-2), pool="host")
    opt_b = offload_optimizer(torch.optim.AdamW(b.parameters(), lr=1e-2), pool="host")
    for i, (x, y) in enumerate(batches):
        if i == 2:
            b.load_state_dict(a.state_dict())
            saved = opt_a.state_dict()
            opt_b.close()
            opt_b = offload_optimizer(torch.optim.AdamW(b.parameters(), lr=1e-2), pool="host")
            opt_b.load_state_dict(saved)
        for m, o in ((a, opt_a), (b, opt_b)):
            _loss(m, x, y).backward()
            o.step()
            o.zero_grad()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    _assert_same_state(opt_b.state_dict(), opt_a.state_dict())
    opt_a.close()
    opt_b.close()


def test_existing_state_moves_into_the_pool():
    """An optimizer that already stepped keeps its state: wrapping it continues like the plain one."""
    ref, model = _model(), _model()
    ref_opt, plain = torch.optim.Adam(ref.parameters()), torch.optim.Adam(model.parameters())
    batches = _batches(2)
    for m, o in ((ref, ref_opt), (model, plain)):
        _loss(m, *batches[0]).backward()
        o.step()
        o.zero_grad()
    with offload_optimizer(plain, pool="host") as opt:
        assert plain.state == {} and opt.stored_bytes > 0
        for m, o in ((ref, ref_opt), (model, opt)):
            _loss(m, *batches[1]).backward()
            o.step()
        for p, q in zip(ref.parameters(), model.parameters()):
            assert torch.equal(p, q)


def test_bad_arguments_raise_config_error():
    """A non-optimizer, LBFGS and a bad pool spec are one-line ConfigErrors."""
    model = _model()
    with pytest.raises(ConfigError, match="offload_optimizer.optimizer: got list"):
        offload_optimizer([1], pool="host")
    with pytest.raises(ConfigError, match="LBFGS"):
        offload_optimizer(torch.optim.LBFGS(model.parameters()), pool="host")
    with pytest.raises(ConfigError, match="pool spec"):
        offload_optimizer(torch.optim.Adam(model.parameters()), pool="disk:/x")


def test_gpu_state_offload_check_tiny_runs_on_cpu(tmp_path):
    """gpu_state_offload_check --tiny runs every part on the CPU, each offloaded way exact, and writes its files."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_state_offload_check.py"
    spec = importlib.util.spec_from_file_location("_bench_gpu_state_offload_check", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_state_offload_check.json").read_text())
    for kind in ("optimizer_host", "optimizer_file", "params_and_optimizer"):
        assert result["exact"][kind] == {"same_losses": True, "same_params": True}, kind
    for part in ("scale.device", "scale.optimizer_host", "scale.params_and_optimizer", "file"):
        assert "step_s" in result[part], result[part]
    assert result["scale.optimizer_host"]["stored_bytes"] == 12 * result["scale.optimizer_host"]["params"]
    assert (tmp_path / "gpu_state_offload_check.md").read_text().startswith("cpu")


def test_plan_offloads_only_the_modules_it_names():
    """A plan offloading module '2''s optimizer state: its moments go to the pool, module '0''s stay in memory
    and update there, and parameters and state equal the plain optimizer's."""
    import dataclasses

    from mcdla.workload.plan import Plan, StateDecision

    ref, model = _model(), _model()
    names = [n for n, _ in model.named_modules()]
    plan = dataclasses.replace(Plan.from_actions(workload="mlp", batch=4, layer_names=names, actions={}),
                               state=(StateDecision(layer="2", optimizer_state="offload"),))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", model=model, plan=plan) as opt:
        for x, y in _batches(3):
            for m, o in ((ref, ref_opt), (model, opt)):
                _loss(m, x, y).backward()
                o.step()
                o.zero_grad()
            assert opt.stepped_in_backward == 2  # module '2''s weight and bias
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)
        _assert_same_state(opt.state_dict(), ref_opt.state_dict())
        moments = {n: 2 * p.numel() * 4 for n, p in model.named_parameters()}
        assert opt.stored_bytes == moments["2.weight"] + moments["2.bias"]
        assert opt.resident_state_bytes == moments["0.weight"] + moments["0.bias"] + 4 * 4  # and four step counters
    with pytest.raises(ConfigError, match="offload_optimizer.plan: needs model="):
        offload_optimizer(torch.optim.Adam(model.parameters()), pool="host", plan=plan)


def test_kept_optimizer_state_of_offloaded_weights_updates_them_exactly():
    """A plan offloading module '0''s weights but keeping its optimizer state on the device: step() updates
    those weights where they live (gathered for the update) and every parameter equals the plain optimizer's."""
    import dataclasses

    from mcdla.runtime import offload_parameters
    from mcdla.workload.plan import Plan, StateDecision

    ref, model = _model(), _model()
    names = [n for n, _ in model.named_modules()]
    plan = dataclasses.replace(Plan.from_actions(workload="mlp", batch=4, layer_names=names, actions={}),
                               state=(StateDecision(layer="0", weights="offload"),
                                      StateDecision(layer="2", optimizer_state="offload")))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    params = offload_parameters(model, "host", plan=plan)
    opt = offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", model=model,
                            parameters=params, plan=plan)
    try:
        for x, y in _batches(3):
            for m, o in ((ref, ref_opt), (model, opt)):
                _loss(m, x, y).backward()
                o.step()
                o.zero_grad()
    finally:
        opt.close()
        params.close()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_free_gradients_leaves_no_gradient_and_stays_exact():
    """free_gradients=True: after backward no parameter holds a gradient, and three steps equal plain Adam."""
    ref, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", free_gradients=True) as opt:
        for x, y in _batches(3):
            _loss(ref, x, y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
            _loss(model, x, y).backward()
            assert all(p.grad is None for p in model.parameters())
            opt.step()
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="free_gradients: needs overlap=True"):
        offload_optimizer(torch.optim.Adam(model.parameters()), pool="host", free_gradients=True, overlap=False)


def test_plan_frees_gradients_of_the_modules_it_names():
    """A plan offloading module '2''s gradients and state drops only its gradients; offloading gradients of a
    module whose state stays on the device is refused."""
    import dataclasses

    from mcdla.workload.plan import Plan, StateDecision

    ref, model = _model(), _model()
    base = Plan.from_actions(workload="mlp", batch=4, layer_names=[n for n, _ in model.named_modules()], actions={})
    plan = dataclasses.replace(base, state=(StateDecision(layer="2", gradients="offload", optimizer_state="offload"),))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", model=model, plan=plan) as opt:
        for x, y in _batches(2):
            _loss(ref, x, y).backward()
            ref_opt.step()
            ref_opt.zero_grad()
            _loss(model, x, y).backward()
            assert [p.grad is None for p in model.parameters()] == [False, False, True, True]
            opt.step()
            opt.zero_grad()
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)
    bad = dataclasses.replace(base, state=(StateDecision(layer="0", gradients="offload"),))
    with pytest.raises(PlanError, match=r"plan state for '0'.gradients: got 'offload' with optimizer_state 'device'"):
        offload_optimizer(torch.optim.Adam(model.parameters()), pool="host", model=model, plan=bad)


def test_state_spills_from_a_full_host_tier_to_file(tmp_path):
    """With 'host@4KiB,file:DIR' the moments that do not fit in the host tier go to files, and the result is exact."""
    ref, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool=f"host@4KiB,file:{tmp_path}") as opt:
        for x, y in _batches(2):
            for m, o in ((ref, ref_opt), (model, opt)):
                _loss(m, x, y).backward()
                o.step()
                o.zero_grad()
        host, file = opt.pool.tiers
        assert 0 < host.used_bytes <= 4096 and file.block_count > 0
        assert host.block_count + file.block_count == 2 * 4
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)


def test_learning_rate_schedule_applies():
    """An LR scheduler on the wrapped optimizer changes the offloaded updates as it changes the plain ones."""
    ref, model = _model(), _model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    with offload_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), pool="host") as opt:
        schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.5 ** e) for o in (ref_opt, opt.optimizer)]
        for x, y in _batches(3):
            for m, o, sched in ((ref, ref_opt, schedules[0]), (model, opt, schedules[1])):
                _loss(m, x, y).backward()
                o.step()
                o.zero_grad()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # opt.step() replaces the wrapped step the scheduler watches
                    sched.step()
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 1e-2 * 0.5 ** 3
        for a, b in zip(ref.parameters(), model.parameters()):
            assert torch.equal(a, b)


def test_update_seconds_are_per_step_and_within_the_step_call():
    """overlap=False runs every update in step() while it waits: the worker's update_s of each step is positive
    and at most that step() call's wall time (a total carried over from the previous step would exceed it)."""
    model = _model()
    opt = offload_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), pool="host", overlap=False)
    for x, y in _batches(3):
        _loss(model, x, y).backward()
        t0 = time.perf_counter()
        opt.step()
        wall = time.perf_counter() - t0
        opt.zero_grad()
        assert 0 < opt.update_s <= wall
    opt.close()
