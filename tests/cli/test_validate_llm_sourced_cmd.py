"""``mcdla validate-llm --family`` for the torchtitan FSDP2, PyTorch FSDP, Megatron-Bridge MoE and DeepSpeed ZeRO-Offload
families:
each row's error and each family's summary against a prediction and a measured time computed here, apart from
the command."""

import json

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation_runs import SOURCED_FAMILIES
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

# tokens/s/GPU of each run as published (torchtitan docs and benchmarks; fms-fsdp README; Megatron-Bridge 25.11)
PUBLISHED_RATE = {"llama3-8b A100 selective op": 2973, "llama3-8b A100 selective layer": 2904,
                  "llama3-70b A100 full": 331, "llama3-8b H100 8 GPUs": 5762, "llama3-8b H100 128 GPUs": 5605,
                  "llama3-405b H100 FSDP16 TP8": 109, "llama2-7b A100 HSDP": 3700, "llama2-34b A100 FSDP": 700,
                  "llama2-70b A100 FSDP": 370, "llama2-7b H100 HSDP": 7500, "llama2-34b H100 FSDP": 1550,
                  "llama2-70b H100 FSDP": 800, "qwen3-30b-a3b dgx-h100": 5275, "qwen3-30b-a3b b200": 9299,
                  "qwen3-30b-a3b gb200-nvl72": 23766, "qwen3-30b-a3b gb300-nvl72": 28934,
                  "qwen3-235b-a22b gb200-nvl72": 4916, "qwen3-235b-a22b gb300-nvl72": 6131,
                  "qwen3-235b-a22b b200": 3269, "deepseek-v3-671b gb200-nvl72": 3139,
                  "deepseek-v3-671b b200": 2139}
# seconds per iteration of the runs published as a log (DeepSpeed's ZeRO-Offload tutorial screenshot, iterations
# 8-10 in ms)
PUBLISHED_ITERATION_MS = {"gpt2-10b ZeRO-Offload 1 V100": (25765.4, 26756.4, 25680.7)}


def _measured(name, e, spec):
    """The measured seconds from the published figure: a rate as tokens per iteration over (rate x GPUs), a log
    as the mean of its iterations."""
    if name in PUBLISHED_ITERATION_MS:
        ms = PUBLISHED_ITERATION_MS[name]
        return sum(ms) / len(ms) / 1e3
    return e.global_batch * spec.seq_len / (PUBLISHED_RATE[name] * e.gpus)


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "megatron-bridge-moe" else f
                                    for f in SOURCED_FAMILIES])  # the MoE family takes ~4 s
def test_family_errors_follow_from_measured_and_predicted(run_cli, family):
    """Each row: measured = GBS x seq / (rate x GPUs) from the published rate (or the mean of a published log's
    iterations), predicted = llm_step on the run's
    own preset (on the GPUs per node its job took); the reported error is their ratio less one and the summary their mean and max |error|."""
    code, out, _ = run_cli("validate-llm", "--family", family, "--json")
    assert code == 0
    data = json.loads(out)
    records = {r.name: r for r in SOURCED_FAMILIES[family]}
    assert [row["run"] for row in data["rows"]] == list(records)
    errors = []
    for row in data["rows"]:
        run = records[row["run"]]
        spec, e = preset(run.model), run.execution
        measured = _measured(row["run"], e, spec)
        cluster = load_cluster(run.system)
        if run.gpus_per_node:  # the GPUs of each node the run's job took
            cluster = cluster.with_gpus_per_node(run.gpus_per_node)
        predicted = llm_step(spec, e, cluster.for_gpus(e.gpus), precision=run.precision).iteration_s
        assert row["measured_s"] == pytest.approx(measured, rel=1e-12)
        assert row["error"] == pytest.approx(predicted / measured - 1, rel=1e-9, abs=1e-12)
        errors.append(abs(predicted / measured - 1))
    assert data["families"][family]["mean_abs_error"] == pytest.approx(sum(errors) / len(errors), rel=1e-9)
    assert data["families"][family]["max_abs_error"] == pytest.approx(max(errors), rel=1e-9)


def test_family_option_lists_the_families(run_cli):
    """--help names every family the option accepts."""
    code, out, _ = run_cli("validate-llm", "--help")
    flat = " ".join(out.split())
    assert code == 0
    for family in ("megatron-a100", "megatron-bridge-fp8", *SOURCED_FAMILIES):
        assert family in flat
