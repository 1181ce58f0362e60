"""``mcdla validate`` and ``mcdla probe`` on the command line: output, JSON, one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mcdla.cli import main
from mcdla.hardware import load_system

FACTORY = '''
import torch
import torch.nn.functional as F

def make(batch=256, width=256):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 4))
    x, y = torch.randn(batch, width), torch.randint(4, (batch,))
    return model, (x,), lambda out: F.cross_entropy(out, y)

def broken(batch=8):
    model = torch.nn.Linear(4, 4)
    return model, (torch.randn(batch, 5),), lambda out: out.sum()

def vector_loss(batch=8):
    model = torch.nn.Linear(4, 4)
    return model, (torch.randn(batch, 4),), lambda out: out
'''


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "cli_factories.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "python:cli_factories"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_prints_json_with_both_numbers(factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json gives predicted and measured step time and peak saved bytes with their errors."""
    code, out, err = _run(["validate", "--model", f"{factories}:make", "--pool", f"file:{tmp_path / 'pool'}",
                           "--budget", "50%", "--steps", "1", "--warmup", "0", "--min-bytes", "64KiB", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    for key in ("predicted_step_s", "measured_step_s", "step_time_error", "predicted_peak_saved_bytes",
                "measured_peak_saved_bytes", "peak_saved_error"):
        assert isinstance(data[key], float)
    assert data["measured_offload_bytes"] == data["planned_offload_bytes"]
    assert data["meta"]["mcdla_version"] and data["meta"]["date"]
    assert err == ""  # stderr is not a terminal here: no progress bar


def test_validate_prints_a_predicted_vs_measured_table(factories: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The text output is a table: step time and peak saved bytes, each with predicted, measured and error
    in separate cells."""
    code, out, err = _run(["validate", "--model", f"{factories}:make", "--pool", f"file:{tmp_path / 'pool'}",
                           "--budget", "50%", "--steps", "1", "--warmup", "0", "--min-bytes", "64KiB"], capsys)
    assert code == 0, err
    for row in ("step time", "peak saved bytes"):
        assert re.search(rf"│ {row}\s+│\s+[\d.]+ \S+\s+│\s+[\d.]+ \S+\s+│\s+[+-]\d+\.\d%\s+│", out), row


def test_validate_reports_progress_of_profiling_and_rounds(factories: str, tmp_path: Path) -> None:
    """validate(on_progress=...) hears of every profiling step and every measured round, each phase ending at
    its total (warm-up 1 + 1 round; the profile times warm-up + min(3, steps) steps)."""
    from mcdla.report.validate import validate

    seen: list[tuple[int, int, str]] = []
    validate(f"{factories}:make", pool=f"file:{tmp_path / 'pool'}", budget="50%", steps=1, warmup=1,
             min_bytes=64 * 1024, on_progress=lambda done, total, what="": seen.append((done, total, what)))
    rounds = [(d, t) for d, t, what in seen if what.startswith("measuring")]
    timed = [(d, t) for d, t, what in seen if "timed" in what]
    assert rounds == [(1, 2), (2, 2)]
    assert timed == [(1, 2), (2, 2)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "{f}:broken"], "forward failed in module"),
        (["--model", "{f}:vector_loss"], "must be a scalar"),
        (["--model", "{f}:make", "--pool", "file:{tmp}/blocker/pool"], "cannot create directory"),
        (["--model", "no-such-model"], "must be one of"),
        (["--model", "{f}:make", "--budget", "lots"], "--budget"),
    ],
)
def test_validate_bad_input_is_one_line(argv: list[str], message: str, factories: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Bad models, losses, pools and budgets exit 2 with one line on stderr naming the problem."""
    (tmp_path / "blocker").write_text("a file, not a directory")
    args = {"--pool": f"file:{tmp_path / 'pool'}", "--budget": "50%"}
    filled = [a.format(f=factories, tmp=tmp_path) for a in argv]
    for flag, value in args.items():
        if flag not in filled:
            filled += [flag, value]
    code, _, err = _run(["validate", *filled, "--steps", "1", "--warmup", "0"], capsys)
    assert code == 2
    assert err.startswith("mcdla: error: ") and err.count("\n") == 1
    assert message in err


def test_validate_rejects_a_plan_for_another_model(factories: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan file naming other modules exits 2 with a one-line error."""
    from mcdla.workload.plan import Plan

    plan = tmp_path / "plan.json"
    Plan.from_actions(workload="vgg", batch=1, layer_names=["features.0"], actions={"features.0": "offload"}).save(plan)
    code, _, err = _run(["validate", "--model", f"{factories}:make", "--pool", f"file:{tmp_path / 'pool'}",
                         "--budget", "50%", "--plan", str(plan), "--steps", "1", "--warmup", "0"], capsys)
    assert code == 2 and "does not match model" in err and err.count("\n") == 1


def test_probe_writes_a_loadable_system(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mcdla probe writes a system file the hardware loader accepts, with measured sources."""
    out = tmp_path / "machine.yaml"
    code, stdout, err = _run(["probe", "--out", str(out), "--dir", str(tmp_path / "scratch")], capsys)
    assert code == 0, err
    system = load_system(out)
    assert "measured on" in system.devices[0].source
    assert system.pool_of("dev0") == ("pool-file",)
    assert "wrote" in stdout


def test_probe_rejects_a_bad_suffix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out must be .yaml/.yml/.json."""
    code, _, err = _run(["probe", "--out", str(tmp_path / "machine.txt")], capsys)
    assert code == 2 and "--out" in err


def test_validate_states_prints_exact_weight_bytes(factories: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--states --json: every module's weights and optimizer state offloaded; predicted peak weight bytes equal
    the runtime's, which are two 256x256 layers (weights and biases, float32) with prefetch 1."""
    code, out, _ = _run(["validate", "--model", f"{factories}:make", "--pool", "host", "--budget", "100%",
                         "--states", "--steps", "2", "--warmup", "1", "--threads", "1", "--batch", "32", "--json"],
                        capsys)
    assert code == 0
    got = json.loads(out)
    assert got["offloaded_weight_layers"] == got["offloaded_optimizer_layers"] == 3
    assert got["measured_peak_weight_bytes"] == 2 * (256 * 256 + 256) * 4
    assert got["predicted_peak_weight_bytes"] == got["measured_peak_weight_bytes"]
    # the least-disturbed comparison: its prediction against the fastest of the measured steps printed beside it
    fastest = min(got["measured_step_samples_s"])
    assert got["fastest_error"] == pytest.approx((got["fastest_predicted_step_s"] - fastest) / fastest)
    assert got["offloader_s_per_unit_pass"] >= 0


def test_validate_states_bad_prefetch_exits_2(factories: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative --state-prefetch is one error line and exit 2."""
    code, _, err = _run(["validate", "--model", f"{factories}:make", "--pool", "host", "--budget", "100%",
                         "--states", "--state-prefetch", "-1"], capsys)
    assert code == 2 and "--state-prefetch: got -1" in err
