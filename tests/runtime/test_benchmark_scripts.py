"""The benchmark scripts run: the GPU check's CPU smoke mode, and a scaled-down RSS measurement (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_check_tiny_runs_on_cpu(tmp_path):
    """gpu_runtime_check --tiny runs every mode on the CPU, with the same first loss, and writes its files."""
    script = _load("gpu_runtime_check")
    assert script.main(["--tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_runtime_check.json").read_text())
    for mode in ("save_on_cpu", "mcdla_host", "mcdla_host_all"):
        assert result[mode]["same_first_loss"] is True
    assert result["mcdla_host_all"]["offloaded_bytes"] > 0
    assert (tmp_path / "gpu_runtime_check.md").read_text().startswith("cpu")


@pytest.mark.slow
def test_file_tier_cuts_peak_rss(tmp_path):
    """Scaled down (~0.6 GiB of activations): the step's RSS growth, read from /proc by another process,
    is at least 50% lower with the file tier, with identical loss and gradients."""
    rss = _load("bench_runtime_rss")
    r = rss.compare(0.6 * 2**30, rows=32768, directory=str(tmp_path), threads=1)
    assert r["same_loss"] and r["same_grads"]
    assert r["growth_reduction"] >= 0.5, r
    assert r["leftover_files"] == []
