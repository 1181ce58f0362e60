"""``mcdla search``: the table, --json and --out agree with the Python search; bad input is one line."""

from __future__ import annotations

import csv
import functools
import json
import shlex
import sys
import tomllib

import pytest

import mcdla
from mcdla.hardware.cluster import load_cluster
from mcdla.plan.llm_search import enumerate_executions, search
from mcdla.report.export_config import megatron_file
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

GPUS = 4  # SMALL's GPU count: 2,592 valid configurations, a search of 0.6 s
SMALL = ("--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", str(GPUS), "--global-batch", "16",
         "--max-virtual-stages", "2", "--quiet")


def test_json_and_csv_match_the_python_search(run_cli, tmp_path):
    out = tmp_path / "results.csv"
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "1", "--json", "--top", "4", "--out", str(out))
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["meta"]["mcdla_version"] == mcdla.__version__
    expected = _full_small_search()
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
    (("--global-batch", "0"), "--global-batch: got '0'; must be a comma-separated list of integers >= 1"),
    (("--tp", "8,x"), "--tp: got '8,x'; must be a comma-separated list of integers >= 1"),
    (("--pp", "0"), "--pp: got '0'; must be a comma-separated list of integers >= 1"),
    (("--micro-batch", "-1"), "--micro-batch: got '-1'; must be a comma-separated list of integers >= 1"),
    (("--zero", "4"), "--zero: got '4'; must be a comma-separated list of 0, 1, 2, 3"),
    (("--recompute", "none,most"), "--recompute: got 'none,most'; must be a comma-separated list of none, "),
    (("--train-tokens", "lots"), "--train-tokens: got 'lots'"),
    (("--cp", "1,x"), "--cp: got '1,x'; must be a comma-separated list of integers >= 1"),
    (("--memory-limit", "12"), "--memory-limit: got '12'; a bare number is ambiguous"),
    (("--memory-limit", "1TiB"), "--memory-limit: got '1TiB'; must be at most the memory of"),
    (("--system", "nosuch"), "system: got 'nosuch'; must be a preset"),
    (("--workers", "0"), "--workers: got 0; must be >= 1"),
    (("--recompute-layers", "all,-1"), "--recompute-layers: got 'all,-1'; must be a comma-separated list of layer"),
    (("--offload-layers", "two"), "--offload-layers: got 'two'; must be a comma-separated list of layer counts"),
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


def _small_search(**kwargs):
    return search(preset("megatron-1.7b"), load_cluster("dgx-a100").for_gpus(GPUS), gpus=GPUS, global_batch=16,
                  max_virtual_stages=2, **kwargs)


@functools.cache
def _full_small_search():
    """The library's search of ``SMALL`` with every row kept, run once for the tests that read it."""
    return _small_search()


@pytest.mark.slow  # ~3.5 s; test_table_and_process_pool runs the process pool by default
def test_workers_past_the_cpu_count_start_no_more_processes_than_cpus(run_cli, monkeypatch):
    """--workers 2147483647 starts at most os.cpu_count() processes (never one per chunk, never an
    OverflowError) and gives the in-process answer."""
    import concurrent.futures
    import os

    sizes = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            sizes.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Recording)
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "2147483647", "--json", "--chunk-size", "2048")
    serial = json.loads(run_cli("search", *SMALL, "--workers", "1", "--json")[1])
    data = json.loads(stdout)
    chunks = -(-data["valid"] // 2048)
    assert code == 0, stderr
    assert sizes == [min(os.cpu_count() or 1, chunks)]
    assert data["best"] == serial["best"] and data["top"] == serial["top"]


def test_max_configurations_refuses_past_the_candidate_count(run_cli):
    """The candidates counted in closed form equal the enumeration's; one fewer allowed is one line naming
    --max-configurations and the count, before any candidate is evaluated; exactly that many runs."""
    from mcdla.plan.llm_search import count_candidates

    cluster = load_cluster("dgx-a100").for_gpus(GPUS)
    spec = preset("megatron-1.7b")
    n = enumerate_executions(spec, cluster, gpus=GPUS, global_batch=16, max_virtual_stages=2).candidates
    assert count_candidates(spec, cluster, gpus=GPUS, global_batch=16, max_virtual_stages=2) == n
    code, stdout, stderr = run_cli("search", *SMALL, "--max-configurations", str(n - 1))
    assert code == 2 and not stdout and stderr.count("\n") == 1
    assert "--max-configurations: got" in stderr and f"has {n} candidate configurations" in stderr
    code, stdout, _ = run_cli("search", *SMALL, "--max-configurations", str(n), "--workers", "1", "--json")
    assert code == 0 and json.loads(stdout)["candidates"] == n


def test_a_highly_composite_batch_is_refused_in_seconds(run_cli):
    """--global-batch 2095133040 (tens of millions of candidates) is refused by the default limit at once."""
    import time

    from mcdla.plan.llm_search import DEFAULT_MAX_CONFIGURATIONS

    t0 = time.perf_counter()
    code, stdout, stderr = run_cli("search", "--model", "gpt3-175b", "--system", "dgx-h100", "--gpus", "64",
                                   "--global-batch", "2095133040", "--quiet")
    assert code == 2 and not stdout and f"got {DEFAULT_MAX_CONFIGURATIONS}" in stderr
    assert time.perf_counter() - t0 < 10


def test_top_is_bounded(run_cli):
    """--top past MAX_TOP is one line naming the limit; --top MAX_TOP is accepted."""
    from mcdla.cli.search_cmd import MAX_TOP

    code, stdout, stderr = run_cli("search", *SMALL, "--top", str(MAX_TOP + 1))
    assert code == 2 and not stdout and f"--top: got {MAX_TOP + 1}; must be at most {MAX_TOP}" in stderr
    code, stdout, _ = run_cli("search", *SMALL, "--top", str(MAX_TOP), "--workers", "1", "--json")
    assert code == 0 and len(json.loads(stdout)["top"]) == min(MAX_TOP, json.loads(stdout)["fitting"])


def test_streamed_top_k_equals_the_full_ranking():
    """A search that keeps only the top k rows (a bounded heap) ranks them as sorting every row does, counts
    the same fitting rows and the same least device memory, and streams every row to on_row in order."""
    full = _full_small_search()
    seen = []
    streamed = _small_search(top=7, keep_rows=False, on_row=seen.append)
    assert streamed.rows == () and streamed.ranked == full.ranked[:7] and streamed.fitting == len(full.ranked)
    assert streamed.least_device_bytes == min(r.step.device_bytes for r in full.rows)
    assert tuple(seen) == full.rows


def test_a_non_finite_time_is_refused_not_ranked(llm_cluster):
    """A cluster (built in Python, past the file bounds: a 5e-324 B/s NVLink) whose figures give inf times is
    refused with one line naming iteration_s, not ranked fastest."""
    import dataclasses

    from mcdla.errors import ConfigError
    from mcdla.workload.transformer import TransformerSpec

    spec = TransformerSpec(name="tiny", layers=6, hidden=96, heads=6, vocab=128, seq_len=12)
    fast = llm_cluster(gpus_per_node=4, nodes=2, peak_flops_per_s=1e12, hbm_bytes=2e6, hbm_bytes_per_s=1e11,
                       network_bytes_per_s=1e9, gemm_half_width=10.0)
    cluster = dataclasses.replace(fast, dims=(dataclasses.replace(fast.dims[0], bytes_per_s=5e-324), *fast.dims[1:]))
    with pytest.raises(ConfigError, match=r"search: got iteration_s = inf for tp=") as info:
        search(spec, cluster, gpus=8, global_batch=8)
    assert "\n" not in str(info.value)


def test_out_is_not_left_partial_when_the_disk_fills(run_cli, tmp_path, monkeypatch):
    """An OS error while --out is written (ENOSPC at the final sync) is one line naming --out and leaves neither
    the target nor a temporary file behind; an existing file is left as it was."""
    import errno
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "results.csv"
    out.write_text("previous\n")
    monkeypatch.setattr(os, "fsync", full)
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "1", "--out", str(out))
    assert code == 2 and stderr.count("\n") == 1 and "--out: got" in stderr and "No space left" in stderr
    assert out.read_text() == "previous\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_an_unreachable_ray_address_fails_in_seconds(run_cli):
    """--ray-address to a closed port is one line within seconds (Ray alone retries for minutes)."""
    import time

    pytest.importorskip("ray")
    from mcdla.plan.llm_search import RAY_CONNECT_TIMEOUT_S

    t0 = time.perf_counter()
    code, stdout, stderr = run_cli("search", *SMALL, "--ray-address", "127.0.0.1:1")
    assert code == 2 and not stdout and stderr.count("\n") == 1 and "--ray-address: got '127.0.0.1:1'" in stderr
    assert time.perf_counter() - t0 < RAY_CONNECT_TIMEOUT_S + 10


@pytest.mark.slow
@pytest.mark.parametrize("when", ["in ray.init", "evaluating"])
def test_sigterm_during_a_ray_search_leaves_no_ray_process_and_a_clean_stdout(tmp_path, when):
    """SIGTERM while a local Ray search starts Ray (its raylet's agents up, ray.init not returned) or evaluates:
    the process exits, every process it had started is gone within 5 s (not orphaned ray::DashboardAgent and
    ray::RuntimeEnvAgent), and stdout holds no Ray line (they go to stderr)."""
    import contextlib
    import os
    import signal
    import subprocess
    import time

    psutil = pytest.importorskip("psutil")
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, "-m", "mcdla", "search", "--model", "gpt3-175b", "--system", "dgx-h100", "--gpus", "1024",
            "--global-batch", "1536", "--ray", "--workers", "2", "--json", "--quiet"]
    stdout, stderr = tmp_path / "out", tmp_path / "err"

    def ray_started(proc) -> bool:
        if when == "evaluating":
            return b"Started a local Ray instance" in stderr.read_bytes()
        names = []
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                names.append(child.name())
        return any("Agent" in n for n in names)  # the raylet's agents are up, ray.init has not returned

    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + 120
        while not ray_started(proc):
            assert proc.poll() is None and time.monotonic() < deadline, stderr.read_text()[-2000:]
            time.sleep(0.05)
        if when == "evaluating":
            time.sleep(1.5)
        started = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    _, alive = psutil.wait_procs(started, timeout=5)
    running = []
    for p in alive:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:  # exited, only not yet reaped by its new parent
                running.append(p.name())
            p.kill()
    assert not running, running
    assert "raylet" not in stdout.read_text()


@pytest.mark.slow
def test_ray_with_more_workers_than_cpus_returns_the_serial_answer(run_cli):
    """--ray --workers 2147483647 starts a local Ray of at most the CPU count and gives the in-process answer
    (an uncapped num_cpus never returned)."""
    pytest.importorskip("ray")
    code, stdout, stderr = run_cli("search", *SMALL, "--ray", "--workers", "2147483647", "--json")
    serial = json.loads(run_cli("search", *SMALL, "--workers", "1", "--json")[1])
    data = json.loads(stdout)
    assert code == 0, stderr
    assert data["best"] == serial["best"] and data["top"] == serial["top"]


def test_constraints_narrow_the_python_search(run_cli):
    """--tp/--pp/--micro-batch/--zero/--recompute give the Python search narrowed to the same values."""
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "1", "--json", "--top", "1000", "--tp", "2,4",
                                   "--pp", "1,2", "--micro-batch", "1", "--zero", "1", "--recompute", "none,selective")
    assert code == 0, stderr
    data = json.loads(stdout)
    expected = _small_search(tp=[2, 4], pp=[1, 2], micro_batch=[1], zero=[1], recompute=["none", "selective"])
    assert data["valid"] == expected.enumeration.valid and data["fitting"] == expected.fitting
    assert [r["index"] for r in data["top"]] == [r.index for r in expected.ranked]
    for r in data["top"]:
        e = r["execution"]
        assert e["tp"] in (2, 4) and e["pp"] in (1, 2) and e["micro_batch"] == 1 and e["zero"] == 1
        assert e["recompute"] in ("none", "selective")


def test_global_batches_rank_by_tokens_per_gpu_with_train_time(run_cli):
    """Each --global-batch value is its own search; rows carry their batch, tokens/s per GPU (batch x seq /
    iteration / GPUs), MFU and the time to train --train-tokens; the best is the highest rate over all batches."""
    code, stdout, stderr = run_cli("search", *SMALL, "--workers", "1", "--json", "--top", "1000",
                                   "--global-batch", "8,16", "--train-tokens", "1T", "--tp", "2", "--zero", "0")
    assert code == 0, stderr
    data = json.loads(stdout)
    spec = preset("megatron-1.7b")
    rates = {}
    for batch in (8, 16):
        expected = search(spec, load_cluster("dgx-a100").for_gpus(GPUS), gpus=GPUS, global_batch=batch,
                          max_virtual_stages=2, tp=[2], zero=[0])
        per = next(p for p in data["per_batch"] if p["global_batch"] == batch)
        assert per["best"]["index"] == expected.best.index and per["fitting"] == expected.fitting
        rates[batch] = batch * spec.seq_len / expected.best.step.iteration_s / GPUS
        assert per["best"]["tokens_per_s_per_gpu"] == pytest.approx(rates[batch], rel=1e-12)
        assert per["best"]["mfu"] == expected.best.step.mfu
    assert data["best"]["global_batch"] == max(rates, key=rates.get)
    assert data["best"]["tokens_per_s_per_gpu"] == pytest.approx(max(rates.values()), rel=1e-12)
    assert {r["global_batch"] for r in data["top"]} == {8, 16}
    got = [r["tokens_per_s_per_gpu"] for r in data["top"]]
    assert got == sorted(got, reverse=True)
    for r in data["top"]:
        assert r["time_to_train_s"] == pytest.approx(1e12 / (r["tokens_per_s_per_gpu"] * GPUS), rel=1e-12)
    code, stdout, _ = run_cli("search", *SMALL, "--workers", "1", "--global-batch", "8,16", "--train-tokens", "1T",
                              "--tp", "2", "--zero", "0")
    assert code == 0 and "best at global batch 8" in stdout and "best at global batch 16" in stdout
    assert "train 1T" in stdout and "tok/s/GPU" in stdout


def test_search_exports_its_best_row(run_cli, tmp_path):
    """--export-megatron/--export-torchtitan write the row --json reports as best."""
    megatron, titan = tmp_path / "args.txt", tmp_path / "job.toml"
    code, stdout, stderr = run_cli("search", "--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", "8",
                                   "--global-batch", "16", "--max-virtual-stages", "2", "--quiet", "--workers", "1",
                                   "--tp", "2", "--json", "--export-megatron", str(megatron),
                                   "--export-torchtitan", str(titan))
    assert code == 0, stderr
    best = Execution(**json.loads(stdout)["best"]["execution"])
    assert megatron.read_text() == megatron_file(best, preset("megatron-1.7b"), "bf16")
    words = shlex.split(megatron.read_text(), comments=True)
    assert words[words.index("--tensor-model-parallel-size") + 1] == "2" and best.tp == 2
    assert words[words.index("--micro-batch-size") + 1] == str(best.micro_batch)
    assert tomllib.loads(titan.read_text())["parallelism"]["tensor_parallel_degree"] == 2


def test_tiers_and_cpu_optimizer_options_reach_the_search(run_cli):
    """--tiers host,nvme --cpu-optimizer searches the same space as the library with those dimensions; a bad
    tier is one line naming --tiers."""
    small = ("--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", str(GPUS), "--global-batch", "8",
             "--max-virtual-stages", "1", "--quiet", "--workers", "1", "--json")
    code, stdout, stderr = run_cli("search", *small, "--tiers", "host,nvme", "--cpu-optimizer")
    assert code == 0, stderr
    data = json.loads(stdout)
    expected = enumerate_executions(preset("megatron-1.7b"), load_cluster("dgx-a100").for_gpus(GPUS), gpus=GPUS,
                                    global_batch=8, max_virtual_stages=1, tiers=("host", "nvme"),
                                    cpu_optimizer=(False, True))
    assert data["valid"] == len(expected.executions)
    assert any(e.offload_tier == "nvme" and e.cpu_optimizer for e in expected.executions)
    code, _, stderr = run_cli("search", *small, "--tiers", "disk")
    assert code == 2 and stderr.count("\n") == 1 and "--tiers: got 'disk'" in stderr


def test_layer_count_options_reach_the_search(run_cli):
    """--recompute-layers and --offload-layers search the same space as the library with those counts (all =
    every layer), and the table names a count."""
    small = ("--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", str(GPUS), "--global-batch", "8",
             "--max-virtual-stages", "1", "--quiet", "--workers", "1")
    code, stdout, stderr = run_cli("search", *small, "--json", "--recompute-layers", "all,2", "--offload-layers",
                                   "all,4")
    assert code == 0, stderr
    data = json.loads(stdout)
    expected = enumerate_executions(preset("megatron-1.7b"), load_cluster("dgx-a100").for_gpus(GPUS), gpus=GPUS,
                                    global_batch=8, max_virtual_stages=1, recompute_layers=(None, 2),
                                    offload_layers=(None, 4))
    assert data["valid"] == len(expected.executions)
    assert any(e.recompute_num_layers == 2 for e in expected.executions)
    code, stdout, stderr = run_cli("search", *small, "--recompute", "full", "--recompute-layers", "2", "--top", "1",
                                   "--no-offload")
    assert code == 0 and "full block 2" in stdout, stderr
