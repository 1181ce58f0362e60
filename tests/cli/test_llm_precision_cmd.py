"""``--precision`` of ``mcdla llm-predict`` and ``mcdla search``; ``--family`` of ``mcdla validate-llm``."""

import json

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation import FAMILIES
from mcdla.sim.llm import llm_step
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

RECORD = {"gpus": 8, "tp": 8, "sequence_parallel": True, "micro_batch": 1, "global_batch": 8}


def _record(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps(RECORD))
    return path


def test_llm_predict_fp32_is_the_library_prediction(run_cli, tmp_path):
    """--precision fp32 prints what llm_step computes at fp32 on the same preset, slower than the bf16 default."""
    code, out, _ = run_cli("llm-predict", "--model", "llama3-8b", "--system", "dgx-h100", "--execution",
                           str(_record(tmp_path)), "--precision", "fp32", "--json")
    cluster = load_cluster("dgx-h100").for_gpus(8)
    fp32 = llm_step(preset("llama3-8b"), Execution(**RECORD), cluster, precision="fp32")
    bf16 = llm_step(preset("llama3-8b"), Execution(**RECORD), cluster)
    assert code == 0 and json.loads(out)["iteration_s"] == fp32.iteration_s > bf16.iteration_s


def test_llm_predict_unknown_precision_is_one_line(run_cli, tmp_path):
    """An unknown precision exits 2 with one line listing the four."""
    code, _, err = run_cli("llm-predict", "--model", "llama3-8b", "--system", "dgx-h100", "--execution",
                           str(_record(tmp_path)), "--precision", "int4")
    assert code == 2 and err.strip() == "mcdla: error: precision: got 'int4'; must be one of bf16, fp16, fp8, fp32"


def test_search_refuses_a_precision_the_system_has_no_peak_for(run_cli, tmp_path):
    """search --precision fp8 on a system whose GPU gives only bf16 and fp16 peaks names it and its peaks."""
    path = tmp_path / "sys.json"
    path.write_text(json.dumps({
        "format": "mcdla-system/1", "name": "nofp8",
        "node": {"gpus": 4, "source": "test", "scale_up": {"bandwidth": "100GB/s", "source": "test"},
                 "gpu": {"peak_flops_per_s": {"bf16": 1e15, "fp16": 1e15}, "hbm": 80e9, "hbm_bandwidth": 3e12,
                         "source": "test"}},
        "scale_out": {"name": "net", "nodes": 1, "bandwidth": "25GB/s", "source": "test"}}))
    code, _, err = run_cli("search", "--model", "megatron-1.7b", "--system", str(path), "--gpus", "4",
                           "--global-batch", "8", "--precision", "fp8", "--workers", "1", "--quiet")
    assert code == 2
    assert err == "mcdla: error: precision: got 'fp8'; nofp8 gives no fp8 peak for its GPU (has bf16, fp16)\n"


def test_validate_llm_family_json_summarises_each_family(run_cli):
    """--family all --json gives one summary per family, each the mean and max |error| of its own rows."""
    code, out, _ = run_cli("validate-llm", "--family", "all", "--json")
    data = json.loads(out)
    assert code == 0 and set(data["families"]) == set(FAMILIES)
    for family, s in data["families"].items():
        errors = [abs(r["error"]) for r in data["rows"] if r["family"] == family]
        assert s["mean_abs_error"] == pytest.approx(sum(errors) / len(errors)) and s["max_abs_error"] == max(errors)


def test_validate_llm_unknown_family_is_one_line(run_cli):
    """An unknown family exits 2 naming the families."""
    code, _, err = run_cli("validate-llm", "--family", "mlperf")
    assert code == 2
    assert err == ("mcdla: error: validate-llm.family: got 'mlperf'; must be one of megatron-a100, "
                   "megatron-bridge-fp8, torchtitan-fsdp2, pytorch-fsdp, megatron-bridge-moe, deepspeed-zero-offload, "
                   "all\n")
