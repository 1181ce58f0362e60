"""``mcdla validate-llm`` and ``mcdla llm-predict``."""

import json
import math

import pytest

from mcdla.report.llm_validation import summary, validate_llm


def test_validate_llm_prints_every_run_and_the_summary(run_cli):
    """The table lists the 12 published runs and ends with the mean and max error the report computes."""
    code, out, err = run_cli("validate-llm")
    assert code == 0 and not err
    for name in ("megatron-22b full", "gpt3-175b selective+SP", "megatron-1t full", "megatron-18.4b SC21"):
        assert name in out
    s = summary(validate_llm())
    assert f"mean |error| {s['mean_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%} over 12 runs" in out


def test_validate_llm_json(run_cli):
    """--json gives strict JSON whose errors are predicted / measured - 1."""
    code, out, _ = run_cli("validate-llm", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["rows"]) == 12
    for row in data["rows"]:
        assert row["error"] == row["predicted_s"] / row["measured_s"] - 1


def test_llm_predict_from_yaml(run_cli, tmp_path):
    """llm-predict reads an execution record and prints the breakdown."""
    path = tmp_path / "e.yaml"
    path.write_text("gpus: 64\ntp: 8\npp: 8\nvirtual_stages: 3\nsequence_parallel: true\nmicro_batch: 1\n"
                    "global_batch: 64\nrecompute: selective\n")
    code, out, _ = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["iteration_s"] > data["compute_s"] > 0 and data["fits"] is True


def test_llm_predict_bad_record_one_line(run_cli, tmp_path):
    """An inconsistent record is one line on stderr and exit 2."""
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"gpus": 8, "tp": 8, "pp": 2}))
    code, out, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path))
    assert code == 2 and not out
    assert err.startswith("mcdla: error: ") and "execution.gpus" in err and err.count("\n") == 1


def test_llm_predict_ranks_equals_fast_and_sees_a_straggler(run_cli, tmp_path):
    """--ranks (the per-rank engine) gives the fast path's time on a symmetric system; --slowdown makes it
    longer; a malformed --slowdown is one line and exit 2."""
    path = tmp_path / "e.yaml"
    path.write_text("gpus: 128\ntp: 8\npp: 8\ndp: 2\nmicro_batch: 1\nglobal_batch: 32\nrecompute: selective\n")
    args = ("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--json")
    fast = json.loads(run_cli(*args)[1])
    ranks = json.loads(run_cli(*args, "--ranks")[1])
    slow = json.loads(run_cli(*args, "--slowdown", "127:2")[1])
    assert abs(ranks["iteration_s"] / fast["iteration_s"] - 1) < 1e-12
    assert slow["iteration_s"] > 1.5 * fast["iteration_s"]
    code, out, err = run_cli(*args, "--slowdown", "3x2")
    assert code == 2 and not out and "--slowdown" in err and err.count("\n") == 1


def test_llm_predict_on_a_preset_matches_the_api_and_rejects_unknown_ones(run_cli, tmp_path):
    """--system prices the run on a hardware preset: the same numbers as llm_step on the preset sized for the
    record's GPUs; the default is the dgx-a100 preset; an unknown preset is one line and exit 2."""
    from mcdla.hardware.cluster import load_cluster
    from mcdla.sim.llm import llm_step
    from mcdla.workload.execution import load_execution
    from mcdla.workload.transformer import preset

    path = tmp_path / "e.yaml"
    path.write_text("gpus: 72\ntp: 8\npp: 3\ndp: 3\nsequence_parallel: true\nmicro_batch: 1\n"
                    "global_batch: 48\nrecompute: selective\n")
    code, out, _ = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--json",
                           "--system", "gb200-nvl72")
    assert code == 0
    expected = llm_step(preset("gpt3-175b"), load_execution(path), load_cluster("gb200-nvl72").for_gpus(72))
    assert json.loads(out)["iteration_s"] == expected.iteration_s
    a100 = json.loads(run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--json")[1])
    shipped = llm_step(preset("gpt3-175b"), load_execution(path), load_cluster("dgx-a100").for_gpus(72))
    assert a100["iteration_s"] == shipped.iteration_s > expected.iteration_s  # Blackwell on NVLink5 beats A100
    code, out, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--system", "nope")
    assert code == 2 and not out and err.startswith("mcdla: error: ") and err.count("\n") == 1


def test_validate_llm_runs_on_a_named_system_and_names_a_bad_one(run_cli):
    """validate-llm --system: the default dgx-a100 preset's rows equal validate_llm's; an unknown system is one
    line naming --system and exit 2."""
    code, out, _ = run_cli("validate-llm", "--json")
    assert code == 0
    assert [r["predicted_s"] for r in json.loads(out)["rows"]] == [r.predicted.iteration_s for r in validate_llm()]
    code, out, err = run_cli("validate-llm", "--system", "nope")
    assert code == 2 and not out and err.startswith("mcdla: error: --system: ") and err.count("\n") == 1


def _record(tmp_path, text):
    path = tmp_path / "e.yaml"
    path.write_text(text)
    return str(path)


OFFLOADING = "gpus: 8\ntp: 8\npp: 1\nmicro_batch: 1\nglobal_batch: 8\nrecompute: full\noffload_weights: true\n" \
             "offload_optimizer: true\n"
TOO_BIG = "gpus: 8\ntp: 1\npp: 1\ndp: 8\nmicro_batch: 1\nglobal_batch: 8\nrecompute: full\n"


def test_llm_predict_memory_breakdown_sums_to_the_device_bytes(run_cli, tmp_path):
    """The per-GPU kinds on the device add up to device_bytes, the offloaded ones to offloaded_bytes, and each
    kind is the model's weight/gradient/optimizer/activation bytes, on the device or offloaded."""
    code, out, err = run_cli("llm-predict", "--model", "llama3-70b", "--execution", _record(tmp_path, OFFLOADING),
                             "--system", "dgx-h100", "--json")
    assert code == 0, err
    data = json.loads(out)
    memory = data["memory_per_gpu_bytes"]
    on_device = sum(memory[k] for k in ("weights", "gradients", "optimizer_state", "activations", "workspace_other"))
    offloaded = memory["offloaded"]["second_tier"]
    assert on_device == pytest.approx(data["device_bytes"], rel=1e-12)
    assert sum(offloaded.values()) == pytest.approx(data["offloaded_bytes"], rel=1e-12)
    assert offloaded == {"weights": data["weight_bytes"], "optimizer_state": data["optimizer_bytes"]}
    assert memory["weights"] == 0 and memory["gradients"] == data["gradient_bytes"]
    assert data["offload_tier"]


def test_llm_predict_throughput_and_time_to_train(run_cli, tmp_path):
    """tokens/s per GPU is global_batch * seq / iteration / gpus; --train-tokens 1T takes 1e12 tokens at that rate;
    model FLOP/s per GPU is model FLOPs / iteration / gpus."""
    from mcdla.workload.transformer import preset

    code, out, _ = run_cli("llm-predict", "--model", "llama3-70b", "--execution", _record(tmp_path, OFFLOADING),
                           "--system", "dgx-h100", "--json", "--train-tokens", "1T")
    data = json.loads(out)
    tokens = 8 * preset("llama3-70b").seq_len
    assert data["tokens_per_s_per_gpu"] == pytest.approx(tokens / data["iteration_s"] / 8, rel=1e-12)
    assert data["time_to_train_s"] == pytest.approx(1e12 / tokens * data["iteration_s"], rel=1e-12)
    assert data["model_flops_per_s_per_gpu"] == pytest.approx(data["model_flops"] / data["iteration_s"] / 8, rel=1e-9)


def test_llm_predict_prints_human_units(run_cli, tmp_path):
    """The text output gives memory in GiB, times in s/ms, TFLOP/s and MFU in %, and no raw float like 5.8e+10."""
    code, out, _ = run_cli("llm-predict", "--model", "llama3-70b", "--execution", _record(tmp_path, OFFLOADING),
                           "--system", "dgx-h100", "--train-tokens", "15T")
    assert code == 0
    for needle in ("GiB", " s ", " ms ", "TFLOP/s", "MFU", "%", "tokens/s per GPU", "time to train 15T tokens",
                   "years", "optimizer state"):
        assert needle in out, needle
    assert "e+" not in out


def test_llm_predict_exits_1_when_it_does_not_fit(run_cli, tmp_path):
    """A record whose memory exceeds the GPU prints its prediction (fits false) and exits 1, with the reason."""
    code, out, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", _record(tmp_path, TOO_BIG),
                             "--system", "dgx-h100", "--json")
    data = json.loads(out)
    assert code == 1 and data["fits"] is False and data["device_bytes"] > data["hbm_bytes"]
    assert "does not fit" in err and err.count("\n") == 1
    code, out, _ = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", _record(tmp_path, TOO_BIG),
                           "--system", "dgx-h100")
    assert code == 1 and "does NOT fit" in out


def test_llm_predict_and_search_share_the_gpu_count_rule(run_cli, tmp_path):
    """A GPU count that is not whole 72-GPU nodes is accepted by llm-predict (64) and by search (100) alike, and
    a count past the largest system is refused by both with the same rule."""
    record = _record(tmp_path, "gpus: 64\ntp: 8\npp: 8\nmicro_batch: 1\nglobal_batch: 64\n")
    code, _, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", record, "--system", "gb200-nvl72")
    assert code == 0, err
    code, out, err = run_cli("search", "--model", "megatron-1.7b", "--system", "gb200-nvl72", "--gpus", "100",
                             "--global-batch", "100", "--max-virtual-stages", "1", "--no-offload", "--workers", "1",
                             "--quiet", "--json", "--top", "1")
    assert code == 0, err
    assert json.loads(out)["best"]["execution"]["gpus"] == 100
    limit = 72 << 20  # 2**20 nodes of 72, the most a generated system may have
    huge = _record(tmp_path, f"gpus: {limit + 8}\ntp: 8\npp: 1\ndp: {limit // 8 + 1}\nmicro_batch: 1\n"
                             f"global_batch: {limit // 8 + 1}\n")
    code, _, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", huge, "--system", "gb200-nvl72")
    assert code == 2 and f"execution.gpus: got {limit + 8}; must be an integer in 1..{limit}" in err
    code, _, err = run_cli("search", "--model", "gpt3-175b", "--system", "gb200-nvl72", "--gpus", str(limit + 8),
                           "--global-batch", "64", "--quiet")
    assert code == 2 and f"--gpus: got {limit + 8}; must be an integer in 1..{limit}" in err


def test_train_tokens_bad_value_is_one_line(run_cli, tmp_path):
    """--train-tokens 300B (B reads as bytes) is refused in one line naming the option."""
    record = _record(tmp_path, OFFLOADING)
    code, out, err = run_cli("llm-predict", "--model", "llama3-70b", "--execution", record, "--train-tokens", "300B")
    assert code == 2 and not out and "--train-tokens: got '300B'" in err and err.count("\n") == 1


def test_validate_llm_reports_the_held_out_zero3_family(run_cli):
    """The DeepSpeed ZeRO-3 rows of SC21 Table 2 come as their own family with their own summary; the
    1,536-GPU row's 44 TFLOP/s is the 66.7 s the issue quotes."""
    code, out, _ = run_cli("validate-llm", "--json")
    family = json.loads(out)["held_out"]["DeepSpeed ZeRO-3, SC21 Table 2 (held out)"]
    assert code == 0 and len(family["rows"]) == 3
    assert family["rows"][-1]["measured_s"] == pytest.approx(66.7, rel=1e-3)
    errors = [row["predicted_s"] / row["measured_s"] - 1 for row in family["rows"]]
    assert family["mean_abs_error"] == pytest.approx(sum(map(abs, errors)) / 3, rel=1e-12)
    for row in family["rows"]:
        assert row["breakdown"]["fsdp_comm_s"] > 0


def test_llm_predict_names_the_nvme_tier(run_cli, tmp_path):
    """An execution on the NVMe tier reports the drives as its second tier, and the CPU step as optimizer time."""
    path = tmp_path / "e.yaml"
    path.write_text("gpus: 8\ndp: 8\nzero: 2\nglobal_batch: 8\noffload_optimizer: true\ncpu_optimizer: true\n"
                    "offload_tier: nvme\nrecompute: full\n")
    code, out, _ = run_cli("llm-predict", "--model", "llama3-8b", "--execution", str(path), "--system", "dgx-h100",
                           "--json")
    data = json.loads(out)
    assert code == 0 and "NVMe" in data["offload_tier"] and data["optimizer_s"] > 0
def _record_fields(tmp_path, **fields):
    path = tmp_path / "e.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return path


def test_llm_predict_refuses_a_slowdown_past_its_bound_and_prints_strict_json_at_it(run_cli, tmp_path):
    """--slowdown 0:1e308 is one line naming the bound; the largest accepted factor gives strict, finite JSON
    whose iteration is longer than the straggler's own compute alone would make it."""
    from mcdla.cli.llm_cmd import MAX_SLOWDOWN

    path = _record_fields(tmp_path, gpus=128, tp=8, pp=8, dp=2, micro_batch=1, global_batch=32, recompute="selective")
    args = ("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--json")
    for flags in (("--slowdown", "0:1e308", "--json"), ("--slowdown", "0:1e308"), ("--slowdown", "0:nan")):
        code, out, err = run_cli(*args[:-1], *flags)
        assert code == 2 and not out and err.count("\n") == 1
        assert "--slowdown" in err and f"{MAX_SLOWDOWN:.0f}" in err
    code, out, _ = run_cli(*args, "--slowdown", f"0:{MAX_SLOWDOWN:.0f}")
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    fast = json.loads(run_cli(*args)[1])
    assert code == 0 and data["iteration_s"] > MAX_SLOWDOWN / 2 * fast["compute_s"] / 32


def test_llm_predict_ranks_refuses_past_the_engines_size(run_cli, tmp_path):
    """--ranks on dp = 10^6 replicas of 8 micro-batches (8 million GPUs, the most dgx-a100 may have) is one line
    naming the size dp*pp*micro_batches*virtual_stages, not hours."""
    from mcdla.sim.llm_ranks import MAX_SCHEDULED_OPS

    dp = 10**6
    path = _record_fields(tmp_path, gpus=8 * dp, tp=8, pp=1, dp=dp, micro_batch=1, global_batch=8 * dp)
    code, out, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--ranks")
    assert code == 2 and not out and err.count("\n") == 1
    assert f"= {dp * 1 * 8 * 1}" in err and str(MAX_SCHEDULED_OPS) in err


def test_check_finite_names_the_non_finite_field(capsys):
    """The final guard refuses a result holding inf or NaN with one line naming its field, and passes a finite one."""
    from mcdla.cli._app import check_finite

    check_finite({"a": 1.0, "b": [2.0, {"c": 3.0}]}, "what")
    for bad, field in (({"a": 1.0, "b": [2.0, {"c": math.inf}]}, "what.b.1.c"), ({"x": math.nan}, "what.x")):
        with pytest.raises(SystemExit) as info:
            check_finite(bad, "what")
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and f"{field}: got " in err


def test_an_execution_record_with_a_330_digit_degree_is_one_short_line(run_cli, tmp_path):
    """pp = 10**330 (found by the fuzz test) is refused naming execution.pp and the largest count, in a line of
    bounded length, not echoed digit by digit in the gpus product."""
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"gpus": 16, "tp": 8, "pp": 10**330, "micro_batch": 1, "global_batch": 16}))
    code, out, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path))
    assert code == 2 and not out and err.count("\n") == 1 and len(err) < 300
    assert "execution.pp" in err and str(2**31 - 1) in err


def test_llm_predict_splits_a_partial_offload_between_device_and_tier(run_cli, tmp_path):
    """With ``offload_num_layers``, the memory table keeps the other layers' activations on the GPU: 10 of
    Llama-3 8B's 32 layers offloaded leave 22/32 of the activations on the device; a count past the layers is one
    line naming the field."""
    path = tmp_path / "e.yaml"
    path.write_text("gpus: 8\ndp: 8\nzero: 1\nmicro_batch: 1\nglobal_batch: 64\noffload_activations: true\n"
                    "offload_num_layers: 10\n")
    code, out, err = run_cli("llm-predict", "--model", "llama3-8b", "--execution", str(path), "--system", "gh200",
                             "--json")
    assert code == 0, err
    data = json.loads(out)
    on_device, tier = data["memory_per_gpu_bytes"]["activations"], data["memory_per_gpu_bytes"]["offloaded"]
    assert on_device == pytest.approx(data["activation_bytes"] * 22 / 32, rel=1e-12)
    assert tier["second_tier"]["activations"] == pytest.approx(data["activation_bytes"] * 10 / 32, rel=1e-12)
    path.write_text("gpus: 8\ndp: 8\nmicro_batch: 1\nglobal_batch: 64\noffload_activations: true\n"
                    "offload_num_layers: 33\n")
    code, out, err = run_cli("llm-predict", "--model", "llama3-8b", "--execution", str(path), "--system", "gh200")
    assert code == 2 and err.count("\n") == 1 and "execution.offload_num_layers: got 33" in err
