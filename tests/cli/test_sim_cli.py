"""The ``mcdla simulate`` and ``mcdla reproduce`` commands, run in-process."""

import json
import re

import pytest

import mcdla
from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.sim import simulate
from mcdla.workload import zoo


def test_simulate_json_matches_the_engine(run_cli) -> None:
    """--json reports the same iteration time and offloaded bytes as calling mcdla.sim.simulate directly."""
    code, out, _ = run_cli("simulate", "--system", "mc-dla", "--workload", "lstm", "--batch", "512",
                        "--parallel", "model", "--policy", "all", "--json")
    assert code == 0
    got = json.loads(out)
    w = zoo.build("lstm", batch=512)
    direct = simulate(load_system("mc-dla"), w, policy_plan(w, "all"), parallel="model")
    assert got["iteration_time_s"] == pytest.approx(direct.iteration_time_s)
    assert got["offloaded_bytes"] == pytest.approx(direct.offloaded_bytes)


def test_simulate_writes_a_chrome_trace(tmp_path, run_cli) -> None:
    """--trace writes a Chrome trace with compute and offload events."""
    trace = tmp_path / "t.json"
    code, out, _ = run_cli("simulate", "--system", "dc-dla", "--workload", "alexnet", "--batch", "256",
                        "--trace", str(trace))
    assert code == 0 and "iteration time" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--system", "dgx-9", "--workload", "lstm"), "dgx-9"),
        (("--system", "mc-dla", "--workload", "bert-9000"), "bert-9000"),
        (("--system", "mc-dla", "--workload", "lstm", "--batch", "0"), "--batch: got 0"),
        (("--system", "mc-dla", "--workload", "lstm", "--planner", "magic"), "--planner: got 'magic'"),
        (("--system", "mc-dla", "--workload", "lstm", "--planner", "lp", "--budget", "lots"), "--budget: got 'lots'"),
    ],
)
def test_simulate_bad_input_is_one_line(run_cli, argv, needle) -> None:
    """Bad input exits 2 with one line on stderr naming the value, no traceback."""
    code, _, err = run_cli("simulate", *argv)
    assert code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_reproduce_writes_results_and_figures(tmp_path, run_cli) -> None:
    """reproduce (without the sweep) writes records for 8 workloads x 3 systems x 2 parallelisms and PNGs."""
    code, out, _ = run_cli("reproduce", "--out", str(tmp_path), "--no-sweep", "--no-sensitivity", "--variants", "none",
                           "--workers", "1")
    assert code == 0 and "geo. mean" in out
    assert re.search(r"│ resnet-152\s+│ data\s+│\s+\d", out)  # workload, parallelism and times in their own cells
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["mcdla_version"] == mcdla.__version__ and data["meta"]["date"]
    records = data["rows"]
    assert len(records) == len(zoo.names()) * 3 * 2
    for key in ("workload", "parallel", "system", "iteration_time_s", "peak_device_bytes", "offloaded_bytes"):
        assert all(key in r for r in records)
    assert all(r["offloaded_bytes"] == 0 for r in records if r["system"] == "oracle")
    for png in ("speedup.png", "breakdown.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_lines = [line for line in (tmp_path / "results.csv").read_text().splitlines() if not line.startswith("#")]
    assert len(csv_lines) == len(records) + 1


@pytest.mark.slow
def test_reproduce_with_sweep(tmp_path, run_cli) -> None:
    """The full reproduce, sweep and sensitivity grid included, writes their figures and prints the sweep table."""
    code, out, _ = run_cli("reproduce", "--out", str(tmp_path), "--sensitivity")
    assert code == 0 and "PCIe 6.0" in out and "the paper's 2.8x at" in out
    for name in ("sweep.png", "sensitivity.png", "sensitivity.json", "variants.json"):
        assert (tmp_path / name).exists()
