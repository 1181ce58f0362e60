"""``mcdla export-chakra`` and ``mcdla simulate --workload <trace>.et``, run in-process."""

import json

import pytest

from mcdla.hardware import load_system
from mcdla.plan import policy_plan
from mcdla.sim import simulate
from mcdla.workload import zoo


def test_export_then_simulate_the_trace_gives_the_same_iteration(tmp_path, run_cli) -> None:
    prefix = tmp_path / "alex"
    code, out, err = run_cli("export-chakra", "--system", "mc-dla", "--workload", "alexnet", "--batch", "256",
                             "--parallel", "model", "--prefix", str(prefix), "--json")
    assert code == 0, err
    exported = json.loads(out)
    assert exported["files"] == [str(prefix) + f".{r}.et" for r in range(8)]
    w = zoo.build("alexnet", batch=256)
    direct = simulate(load_system("mc-dla"), w, policy_plan(w, "all"), parallel="model")
    assert exported["iteration_time_s"] == direct.iteration_time_s
    code, out, err = run_cli("simulate", "--system", "mc-dla", "--workload", exported["files"][3],
                             "--parallel", "model", "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] == direct.iteration_time_s


@pytest.mark.parametrize(("argv", "needle"), [
    (("--prefix", "/no/such/dir/t"), "--prefix: got '/no/such/dir/t.0.et'; directory"),
    (("--prefix", "PLACEHOLDER", "--planner", "nope"), "--planner: got 'nope'"),
    (("--prefix", "PLACEHOLDER", "--budget", "8GiB"), "--budget: only used with --planner"),
])
def test_bad_options_fail_in_one_line(tmp_path, run_cli, argv, needle) -> None:
    argv = tuple(str(tmp_path / "t") if a == "PLACEHOLDER" else a for a in argv)
    code, _, err = run_cli("export-chakra", "--system", "dc-dla", "--workload", "alexnet", *argv)
    assert code == 2
    assert err.count("\n") == 1 and needle in err


def test_an_infeasible_iteration_writes_nothing(tmp_path, run_cli) -> None:
    code, _, err = run_cli("export-chakra", "--system", "dc-dla", "--workload", "vgg-e", "--batch", "4096",
                           "--policy", "none", "--prefix", str(tmp_path / "t"))
    assert code == 1 and "infeasible" in err and "no trace written" in err
    assert not list(tmp_path.iterdir())


def test_a_bad_trace_as_workload_fails_in_one_line(tmp_path, run_cli) -> None:
    bad = tmp_path / "bad.0.et"
    bad.write_bytes(b"\x05abc")
    code, _, err = run_cli("simulate", "--system", "dc-dla", "--workload", str(bad))
    assert code == 2 and err.count("\n") == 1 and "truncated" in err
