"""``mcdla search``: the table, --json and --out agree with the Python search; bad input is one line."""

from __future__ import annotations

import csv
import json
import sys

import pytest

import mcdla
from mcdla.hardware.cluster import load_cluster
from mcdla.plan.llm_search import search
from mcdla.workload.transformer import preset

SMALL = ("--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", "8", "--global-batch", "16",
         "--max-virtual-stages", "2", "--quiet")


def test_json_and_csv_match_the_python_search(run_cli, tmp_path):
    out = tmp_path / "results.csv"
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "1", "--json", "--top", "4", "--out", str(out))
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["meta"]["mcdla_version"] == mcdla.__version__
    expected = search(preset("megatron-1.7b"), load_cluster("dgx-a100").for_gpus(8), gpus=8, global_batch=16,
                      max_virtual_stages=2)
    assert data["valid"] == len(expected.enumeration.executions) and data["rejected"] == expected.enumeration.rejected
    assert data["candidates"] == data["valid"] + sum(data["rejected"].values())
    assert data["best"]["index"] == expected.best.index
    assert data["best"]["prediction"]["iteration_s"] == expected.best.step.iteration_s
    assert [r["index"] for r in data["top"]] == [r.index for r in expected.ranked[:4]]
    with out.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert len(rows) == data["valid"]
    fastest = min((r for r in rows if r["fits_limits"] == "True"), key=lambda r: float(r["pred_iteration_s"]))
    assert float(fastest["pred_iteration_s"]) == data["best"]["prediction"]["iteration_s"]


def test_table_and_process_pool(run_cli):
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "2", "--top", "3")
    assert code == 0, stderr
    assert "fastest 3 of" in stdout and "rejected" in stdout and "(process)" in stdout


def test_memory_limit_is_respected(run_cli):
    code, stdout, _ = run_cli("search", *SMALL, "--workers", "1", "--json", "--memory-limit", "12GiB", "--top", "50")
    assert code == 0
    data = json.loads(stdout)
    assert data["top"] and all(r["prediction"]["device_bytes"] <= 12 * 2**30 for r in data["top"])
    code, stdout, _ = run_cli("search", *SMALL, "--workers", "1", "--memory-limit", "1MiB")
    assert code == 1 and "no configuration fits in memory" in stdout


@pytest.mark.parametrize("args, message", [
    (("--model", "nope"), "transformer: got 'nope'; must be one of"),
    (("--gpus", str((8 << 20) + 8)), f"--gpus: got {(8 << 20) + 8}; must be an integer in 1..{8 << 20}"),
    (("--gpus", "0"), "--gpus: got 0; must be >= 1"),
    (("--global-batch", "0"), "--global-batch: got 0; must be >= 1"),
    (("--cp", "1,x"), "--cp: got '1,x'; must be a comma-separated list of integers >= 1"),
    (("--memory-limit", "12"), "--memory-limit: got '12'; a bare number is ambiguous"),
    (("--memory-limit", "1TiB"), "--memory-limit: got '1TiB'; must be at most the memory of"),
    (("--system", "nosuch"), "cluster: got 'nosuch'; must be a preset"),
    (("--workers", "0"), "--workers: got 0; must be >= 1"),
])
def test_bad_input_is_one_line(run_cli, args, message):
    argv = list(SMALL)
    for opt, value in zip(args[::2], args[1::2]):
        if opt in argv:
            argv[argv.index(opt) + 1] = value
        else:
            argv += [opt, value]
    code, stdout, stderr = run_cli("search", *argv)
    assert code == 2
    assert stderr.startswith("mcdla: error: ") and stderr.count("\n") == 1
    assert message in stderr


def test_ray_missing_says_how_to_install(run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, stderr = run_cli("search", *SMALL, "--ray")
    assert code == 2 and stderr.count("\n") == 1
    assert "--ray: the ray package is not installed; install it with pip install 'mcdla[ray]'" in stderr
