"""The example files shipped in ``mcdla/examples`` load, agree with the code that made them, are installed as
package data, and ``mcdla examples`` lists and copies exactly them."""

import fnmatch
import importlib
import tomllib
from pathlib import Path

import pytest

from mcdla.cli import main
from mcdla.hardware import load_system
from mcdla.plan import make_plan
from mcdla.profile import profile
from mcdla.sim import pool_link
from mcdla.workload import load_workload
from mcdla.workload.execution import check_execution, load_execution
from mcdla.workload.plan import Plan
from mcdla.workload.transformer import preset

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "src" / "mcdla" / "examples"
ON_DISK = sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def _load_script(name: str):
    """An example script as the installed package holds it (``mcdla validate`` imports it the same way)."""
    module = importlib.import_module(f"mcdla.examples.{name}")
    assert Path(module.__file__).resolve() == (EXAMPLES / f"{name}.py").resolve()
    return module


def test_the_checkout_examples_directory_is_the_package_one() -> None:
    """``examples/`` at the top of a checkout shows the same files as the installed ``mcdla/examples``."""
    assert (REPO / "examples").resolve() == EXAMPLES.resolve()


def test_every_example_is_package_data() -> None:
    """Each shipped file matches one of pyproject's package-data patterns, so a wheel installs it."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mcdla"]
    missing = [name for name in ON_DISK if not any(fnmatch.fnmatch(f"examples/{name}", p) for p in patterns)]
    assert ON_DISK and not missing, f"not package data: {missing}"


def test_examples_lists_every_file(capsys) -> None:
    """``mcdla examples`` names every file in the examples directory."""
    code, out, _ = _cli(capsys, "examples")
    assert code == 0
    assert all(name in out for name in ON_DISK)


def test_examples_copy_writes_identical_files(tmp_path, capsys) -> None:
    """``mcdla examples --copy DIR`` writes a byte-identical copy of each file, and keeps a file already there."""
    (tmp_path / "plan.json").write_text("mine")
    code, _, _ = _cli(capsys, "examples", "--copy", str(tmp_path))
    assert code == 0
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert copied == ON_DISK
    assert (tmp_path / "plan.json").read_text() == "mine"
    assert all((tmp_path / n).read_bytes() == (EXAMPLES / n).read_bytes() for n in ON_DISK if n != "plan.json")


def test_examples_copy_onto_a_file_is_one_line_error(tmp_path, capsys) -> None:
    """``--copy`` naming a file exits 2 with one line naming the option."""
    target = tmp_path / "f"
    target.write_text("")
    code, _, err = _cli(capsys, "examples", "--copy", str(target))
    assert code == 2 and err.startswith("mcdla: error: --copy:") and err.count("\n") == 1


def test_example_plan_is_what_the_planner_makes_of_the_example_files() -> None:
    """plan.json equals a fresh vdnn-all plan of the example workload on the example system at its budget."""
    shipped = Plan.load(EXAMPLES / "plan.json")
    system = load_system(EXAMPLES / "system.yaml")
    workload = load_workload(str(EXAMPLES / "workloads" / "tiny-mlp.yaml"))
    fresh = make_plan(workload, shipped.budget_bytes, pool_link(system), planner=shipped.planner)
    assert fresh.to_dict() == shipped.to_dict()
    shipped.check_matches([layer.name for layer in workload.layers], workload.name)


@pytest.mark.parametrize("model", ["gpt3-175b", "llama3-70b"])
def test_example_execution_is_valid_for_the_models_the_docs_use(model: str) -> None:
    """execution.yaml is a valid execution record on 64 GPUs for both models the docs run it with."""
    execution = load_execution(EXAMPLES / "execution.yaml")
    check_execution(execution, preset(model))
    assert execution.tp * execution.pp * execution.dp * execution.cp == execution.gpus == 64


def test_example_system_devices_carry_sources() -> None:
    """system.yaml loads and every device figure carries its source."""
    system = load_system(EXAMPLES / "system.yaml")
    assert len(system.devices) == 2 and all(d.source for d in system.devices)


def test_virtualize_example_keeps_gradients_exact(capsys) -> None:
    """virtualize_mlp.py runs its model under the shipped plan and finds the gradients bit-identical."""
    module = _load_script("virtualize_mlp")
    assert module.main(["--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "gradients identical" in out and "offloaded" in out


def test_tutorial_script_plans_predicts_and_runs(tmp_path) -> None:
    """tutorial.py: the runtime offloads the planned layers' profiled saved bytes, gradients stay exact."""
    tutorial = _load_script("tutorial")
    result = tutorial.run(tmp_path, batch=4, systems=("dc-dla", "mc-dla"))
    assert result.planned_offload_bytes
    assert result.offloaded_bytes == pytest.approx(result.planned_offload_bytes)
    assert result.gradients_identical
    # MC-DLA's memory-nodes give the pool more bandwidth than DC-DLA's PCIe: never slower for the same plan.
    assert 0 < result.iteration_s["mc-dla"] <= result.iteration_s["dc-dla"]
    workload = load_workload(str(tmp_path / "my-net.yaml"))
    assert workload.measured_on is not None and workload.has_measured_times
    Plan.load(tmp_path / "plan.json").check_matches(workload.layer_names, workload.name)


def test_shipped_profiled_workload_is_the_tutorial_model() -> None:
    """workloads/tutorial-cnn.yaml has the FLOPs and saved bytes a fresh profile of the tutorial's model counts."""
    tutorial = _load_script("tutorial")
    shipped = load_workload(str(EXAMPLES / "workloads" / "tutorial-cnn.yaml"))
    model, x, loss_fn = tutorial.make_model(shipped.batch)
    fresh = profile(model, x, loss_fn, name=shipped.name, warmup_steps=0, measured_steps=1)
    counted = ("fwd_flops", "bwd_flops", "saved_bytes", "param_bytes", "output_bytes")
    assert [(l.name, *(getattr(l, f) for f in counted)) for l in shipped.layers] == \
        [(l.name, *(getattr(l, f) for f in counted)) for l in fresh.layers]
    assert shipped.measured_on is not None and shipped.has_measured_times


def test_example_torchtitan_execution_is_the_validation_record() -> None:
    """llama3-8b-torchtitan.yaml is the execution of the torchtitan-fsdp2 record it describes (8 H100)."""
    from mcdla.report.llm_validation_runs import TORCHTITAN_RUNS

    record = next(r for r in TORCHTITAN_RUNS if r.name == "llama3-8b H100 8 GPUs")
    assert load_execution(EXAMPLES / "llama3-8b-torchtitan.yaml") == record.execution
