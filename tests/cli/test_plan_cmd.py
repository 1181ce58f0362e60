"""The ``mcdla plan`` command, run in-process."""

import json

import pytest

from mcdla.hardware import load_system
from mcdla.plan import evaluate, make_plan
from mcdla.sim import pool_link
from mcdla.workload import zoo
from mcdla.workload.plan import Plan


def test_plan_prints_bytes_time_and_overhead(run_cli) -> None:
    """The summary names offloaded, recomputed and resident bytes, the iteration time and the overhead."""
    code, out, _ = run_cli("plan", "--workload", "vgg-e", "--batch", "128", "--system", "dc-dla",
                        "--budget", "4GiB", "--planner", "lp")
    assert code == 0
    for word in ("offloaded", "recomputed", "resident", "iteration", "over the no-offload bound"):
        assert word in out


def test_plan_json_and_out_file_match_the_api(tmp_path, run_cli) -> None:
    """--json reports what make_plan + evaluate give, and --out writes a loadable plan."""
    path = tmp_path / "plan.json"
    code, out, _ = run_cli("plan", "--workload", "alexnet", "--batch", "512", "--system", "mc-dla",
                        "--budget", "2GiB", "--planner", "pofo", "--out", str(path), "--json")
    assert code == 0
    got = json.loads(out)
    system = load_system("mc-dla")
    w = zoo.build("alexnet", batch=512)
    link = pool_link(system)
    plan = make_plan(w, 2 * 2**30, link, "pofo", device=system.devices[0])
    want = evaluate(w, plan, link, device=system.devices[0])
    assert got["iteration_time_s"] == pytest.approx(want.makespan_s)
    assert got["overhead"] == pytest.approx(want.overhead)
    assert Plan.load(path) == plan


def test_infeasible_budget_is_one_line_and_exit_2(run_cli) -> None:
    """A budget the planner cannot meet prints one error line with the smallest feasible budget, exit 2."""
    code, out, err = run_cli("plan", "--workload", "vgg-e", "--batch", "128", "--system", "dc-dla",
                          "--budget", "100MiB", "--planner", "rotor")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "the smallest feasible is" in err


def test_unknown_planner_exits_2(run_cli) -> None:
    """An unknown --planner prints the allowed names and exits 2."""
    code, _, err = run_cli("plan", "--workload", "vgg-e", "--system", "dc-dla", "--planner", "nope")
    assert code == 2 and "milp" in err


def test_plan_states_fits_a_budget_the_activation_planner_alone_cannot(run_cli) -> None:
    """--states offloads optimizer state where the budget is below the static bytes and agrees with the API."""
    args = ("plan", "--workload", "vgg-e", "--batch", "8", "--system", "dc-dla", "--budget", "700MiB")
    code, _, err = run_cli(*args)
    assert code == 2 and "infeasible" in err
    code, out, _ = run_cli(*args, "--states", "--json")
    assert code == 0
    got = json.loads(out)
    system = load_system("dc-dla")
    w = zoo.build("vgg-e", batch=8)
    plan = make_plan(w, 700 * 2**20, pool_link(system), device=system.devices[0], states=True)
    assert got["state_offloaded"]["optimizer_state"] == sum(sd.offloads("optimizer_state") for sd in plan.state) > 0
    assert got["peak_device_bytes"] <= 700 * 2**20


def test_plan_state_prefetch_is_written_into_the_entries(run_cli, tmp_path) -> None:
    """--states --state-prefetch 2 --out: every state entry of the written plan carries depth 2; -1 is refused."""
    args = ("plan", "--workload", "vgg-e", "--batch", "8", "--system", "dc-dla", "--budget", "700MiB", "--states")
    code, _, _ = run_cli(*args, "--state-prefetch", "2", "--out", str(tmp_path / "p.json"))
    assert code == 0
    state = json.loads((tmp_path / "p.json").read_text())["state"]
    assert state and all(sd["prefetch"] == 2 for sd in state)
    code, _, err = run_cli(*args, "--state-prefetch", "-1")
    assert code == 2 and "--state-prefetch: got -1" in err
