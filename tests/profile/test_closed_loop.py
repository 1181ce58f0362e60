"""The closed loop: a plan made from a profile runs under the runtime, exactly as planned, bit for bit."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mcdla.errors import ConfigError, PlanError, ProfileError
from mcdla.plan import policy_plan
from mcdla.profile import profile
from mcdla.profile.resolve import ResolvedModel
from mcdla.report.validate import executable_plan, parse_budget, predict, validate
from mcdla.profile.rounds import one_copy_stream
from mcdla.runtime import DEFAULT_MIN_BYTES, parse_pool, virtualize
from mcdla.workload.plan import Action, Plan

BATCH, WIDTH = 512, 256  # 512 x 256 float32 = 512 KiB per activation, above the runtime's 256 KiB min_bytes


def _mlp(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, 10))
    return nn.Sequential(*layers), torch.randn(BATCH, WIDTH), torch.randint(10, (BATCH,))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _profile_like_the_runtime(model: nn.Module, x: torch.Tensor, y: torch.Tensor):  # noqa: ANN202
    return profile(model, x, lambda o: F.cross_entropy(o, y), warmup_steps=0, measured_steps=1,
                   min_saved_bytes=DEFAULT_MIN_BYTES, shared_storage_owner="first")


def test_planned_tensors_and_only_those_are_offloaded_with_identical_gradients(tmp_path: Path) -> None:
    """Every other saving layer is offloaded to a file pool: the runtime moves exactly their profiled bytes,
    nothing else, and the gradients equal those of the same step without mcdla bit for bit."""
    model, x, y = _mlp()
    workload = _profile_like_the_runtime(model, x, y)
    saving = [l.name for l in workload.layers if l.saved_bytes > 0]
    chosen = saving[::2]
    plan = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names,
                             actions={n: Action.OFFLOAD for n in chosen}, planner="test")
    run_plan, notes = executable_plan(plan, workload, [n for n, _ in model.named_modules()])
    assert notes == ()

    F.cross_entropy(model(x), y).backward()
    reference = _grads(model)
    model.zero_grad(set_to_none=True)
    vm = virtualize(pool=f"file:{tmp_path}", plan=run_plan, model=model)
    with vm:
        F.cross_entropy(model(x), y).backward()
    report = vm.report
    vm.close()

    expected = {n: workload.layers[workload.index_of(n)].saved_bytes for n in chosen}
    assert dict(report.offloaded_bytes_by_layer) == expected
    assert report.fetched_bytes <= report.offloaded_bytes  # a copy still running when needed is not fetched
    for got, want in zip(_grads(model), reference):
        assert torch.equal(got, want)


def test_vdnn_all_plan_from_a_profile_offloads_every_saving_module(tmp_path: Path) -> None:
    """The vDNN 'all' plan made from the profile offloads every module's saved bytes; the loss's are kept."""
    model, x, y = _mlp(seed=1)
    workload = _profile_like_the_runtime(model, x, y)
    run_plan, _ = executable_plan(policy_plan(workload, "all"), workload, [n for n, _ in model.named_modules()])
    vm = virtualize(pool=f"file:{tmp_path}", plan=run_plan, model=model)
    with vm:
        F.cross_entropy(model(x), y).backward()
    report = vm.report
    vm.close()
    module_bytes = sum(l.saved_bytes for l in workload.layers if not l.name.startswith("("))
    assert report.offloaded_bytes == module_bytes
    assert report.managed_bytes == workload.saved_bytes


def test_executable_plan_spells_out_the_default_prefetch_and_drops_non_modules() -> None:
    """Offloads get prefetch_at = the next layer; a decision for the loss pseudo-layer is dropped with a note."""
    model, x, y = _mlp()
    workload = profile(model, x, lambda o: F.cross_entropy(o, y), warmup_steps=0, measured_steps=1)
    names = workload.layer_names
    assert "(loss)" in names  # it saves the targets
    plan = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=names,
                             actions={names[1]: "offload", "(loss)": "offload"})
    run_plan, notes = executable_plan(plan, workload, [n for n, _ in model.named_modules()])
    assert run_plan.decision(names[1]).prefetch_at == names[2]
    assert run_plan.action("(loss)") is Action.KEEP
    assert len(notes) == 1 and "(loss)" in notes[0]


def test_keep_all_prediction_of_peak_saved_bytes_is_exact() -> None:
    """With nothing offloaded the engine's peak resident saved bytes are all the saved bytes the profile saw."""
    model, x, y = _mlp()
    workload = _profile_like_the_runtime(model, x, y)
    keep = Plan.from_actions(workload=workload.name, batch=workload.batch, layer_names=workload.layer_names, actions={})
    from mcdla.hardware import PoolLink

    prediction = predict(workload, keep, PoolLink.symmetric(1e9))
    assert prediction.peak_saved_bytes == pytest.approx(workload.saved_bytes)
    assert prediction.step_s == pytest.approx(sum(l.fwd_time_s + l.bwd_time_s for l in workload.layers), rel=1e-6)
    assert prediction.timeline.peak_bytes == pytest.approx(prediction.peak_saved_bytes)
    assert prediction.wait_s == 0


def test_budget_percentages_keep_that_share_of_saved_bytes() -> None:
    """'40%' is static bytes + largest transient + 40% of the saved bytes; sizes parse as bytes."""
    model, x, y = _mlp()
    w = _profile_like_the_runtime(model, x, y)
    transient = max(2 * l.output_bytes + l.workspace_bytes for l in w.layers)
    assert parse_budget("40%", w) == pytest.approx(w.static_bytes + transient + 0.4 * w.saved_bytes)
    assert parse_budget("3MiB", w) == 3 * 2**20
    with pytest.raises(ConfigError, match="percentage"):
        parse_budget("140%", w)
    with pytest.raises(ConfigError, match="must be a size"):
        parse_budget("lots", w)


# -- validate() end to end, and its bad input ------------------------------------------------------------------
def _resolved(seed: int = 0) -> ResolvedModel:
    model, x, y = _mlp(seed)
    return ResolvedModel("mlp-test", model, (x,), lambda o: F.cross_entropy(o, y))


def test_validate_with_a_keep_all_plan_measures_what_it_predicts(tmp_path: Path) -> None:
    """A keep-all plan: nothing offloaded, and measured peak resident saved bytes equal the prediction."""
    r = _resolved()
    layers = profile(r.model, r.example_inputs, r.loss_fn, warmup_steps=0, measured_steps=1).layer_names
    keep = tmp_path / "keep.json"
    Plan.from_actions(workload="mlp-test", batch=BATCH, layer_names=layers, actions={}).save(keep)
    result = validate(r, pool=f"file:{tmp_path / 'pool'}", budget="100%", plan=keep, steps=1, warmup=0)
    assert result.measured_offload_bytes == 0 and result.offloaded_layers == ()
    assert result.measured_peak_saved_bytes == pytest.approx(result.predicted_peak_saved_bytes)
    assert result.measured_step_s > 0 and result.predicted_step_s > 0


def test_validate_rejects_a_plan_for_another_model(tmp_path: Path) -> None:
    """A plan naming modules this model does not have is a one-line PlanError."""
    other = tmp_path / "other.json"
    Plan.from_actions(workload="resnet", batch=1, layer_names=["conv1"], actions={"conv1": "offload"}).save(other)
    with pytest.raises(PlanError, match="does not match model") as info:
        validate(_resolved(), pool=f"file:{tmp_path / 'pool'}", budget="50%", plan=other, steps=1, warmup=0)
    assert "\n" not in str(info.value)


def test_validate_reports_a_failing_forward(tmp_path: Path) -> None:
    """A model whose forward fails is a one-line ProfileError naming the module."""
    model, x, y = _mlp()
    bad = ResolvedModel("bad", model, (torch.randn(BATCH, WIDTH + 3),), lambda o: F.cross_entropy(o, y))
    with pytest.raises(ProfileError, match="forward failed in module '0'"):
        validate(bad, pool=f"file:{tmp_path}", budget="50%", steps=1, warmup=0)


def test_validate_reports_a_non_scalar_loss(tmp_path: Path) -> None:
    """A loss that is not a scalar is a one-line ProfileError giving its shape."""
    model, x, _ = _mlp()
    bad = ResolvedModel("bad", model, (x,), lambda o: o * 1.0)
    with pytest.raises(ProfileError, match=r"shape \(512, 10\); must be a scalar"):
        validate(bad, pool=f"file:{tmp_path}", budget="50%", steps=1, warmup=0)


def test_validate_reports_an_unusable_pool_directory(tmp_path: Path) -> None:
    """A pool directory that cannot be created is a one-line ConfigError naming the tier."""
    (tmp_path / "f").write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot create directory"):
        validate(_resolved(), pool=f"file:{tmp_path / 'f' / 'pool'}", budget="50%", steps=1, warmup=0)


def test_one_copy_stream_sets_threaded_tiers_only() -> None:
    """File and compress tiers get the asked thread count; the host tier (no threads) is left alone; one
    thread means offloads and prefetches share a stream."""
    with tempfile.TemporaryDirectory() as tmp:
        pool = parse_pool(f"file:{tmp}/a,compress(file:{tmp}/b),host")
        assert one_copy_stream(pool, 1) is True
        assert [t.io_threads for t in pool.tiers] == [1, 1, 0]
        assert one_copy_stream(pool, 3) is False
        host = parse_pool("host")
        assert one_copy_stream(host, 1) is False and host.tiers[0].io_threads == 0
        pool.close()


def test_offloading_a_glue_owner_does_not_offload_its_child_layers(tmp_path: Path) -> None:
    """At leaf granularity a transformer block's own code (attention) is the layer 'blocks.0'; offloading it
    must not offload its children (the runtime applies a module's decision to its submodules), so the
    runtime moves exactly the planned layers' bytes."""
    from mcdla.profile import extra_models

    model, (idx,), loss_fn = extra_models.build("transformer", batch=4, d_model=64, heads=2, layers=1, seq_len=64,
                                                vocab=64)
    workload = profile(model, idx, loss_fn, warmup_steps=0, measured_steps=1, min_saved_bytes=16 << 10,
                       shared_storage_owner="first")
    assert workload.layers[workload.index_of("blocks.0")].saved_bytes > 0  # attention's saves
    plan = Plan.from_actions(workload=workload.name, batch=4, layer_names=workload.layer_names,
                             actions={"blocks.0": "offload"})
    run_plan, _ = executable_plan(plan, workload, [n for n, _ in model.named_modules()])
    assert run_plan.action("blocks.0.fc2") is Action.KEEP and run_plan.decision("blocks.0.fc2") in run_plan.decisions
    vm = virtualize(pool=f"file:{tmp_path}", plan=run_plan, model=model, min_bytes=16 << 10)
    with vm:
        loss_fn(model(idx)).backward()
    report = vm.report
    vm.close()
    assert dict(report.offloaded_bytes_by_layer) == {"blocks.0": workload.layers[workload.index_of("blocks.0")].saved_bytes}
