"""``mcdla llm-predict --engine`` and ``mcdla search --engine-top``."""

import json

import pytest

import yaml

from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation import ZERO3_SC21_RUNS
from mcdla.sim.llm_lower import engine_step, lowering_rejection
from mcdla.workload.execution import Execution, execution_to_dict
from mcdla.workload.transformer import preset

# weights and optimizer state offloaded too, so that 175B fits 16 GPUs (llm-predict exits 1 otherwise)
_RECORD = ("gpus: 16\ntp: 8\npp: 2\nmicro_batch: 1\nglobal_batch: 4\noffload_activations: true\n"
           "offload_weights: true\noffload_optimizer: true\n")


def test_llm_predict_engine_json_reports_contention_per_link_class(run_cli, tmp_path):
    """--engine --json gives the engine's iteration, the analytical one and the contention split, as
    engine_step computes them for the same record."""
    path = tmp_path / "e.yaml"
    path.write_text(_RECORD)
    code, out, _ = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--system", "dgx-h100",
                           "--engine", "--json")
    data = json.loads(out)
    e = Execution(gpus=16, tp=8, pp=2, micro_batch=1, global_batch=4, offload_activations=True, offload_weights=True,
                  offload_optimizer=True)
    want = engine_step(preset("gpt3-175b"), e, load_cluster("dgx-h100").for_gpus(16))
    assert code == 0
    assert data["iteration_s"] == want.iteration_s and data["analytical_iteration_s"] == want.analytical.iteration_s
    assert data["contention_by_class_s"] == want.contention_by_class_s
    assert data["contention_s"] == want.contention_s


def test_llm_predict_engine_with_ranks_is_one_line_error(run_cli, tmp_path):
    """--engine with --ranks: one line, exit 2."""
    path = tmp_path / "e.yaml"
    path.write_text(_RECORD)
    code, _, err = run_cli("llm-predict", "--model", "gpt3-175b", "--execution", str(path), "--engine", "--ranks")
    assert code == 2 and err.startswith("mcdla: error: --engine") and err.count("\n") <= 1


def test_search_engine_top_json_reorders_the_top_rows_by_their_engine_runs(run_cli):
    """--engine-top K adds the search's K fastest to --json, ordered by each one's engine run."""
    code, out, err = run_cli("search", "--model", "megatron-1.7b", "--system", "dgx-h100", "--gpus", "8",
                             "--global-batch", "16", "--max-virtual-stages", "1", "--quiet", "--workers", "1",
                             "--json", "--top", "40", "--engine-top", "3")
    assert code == 0, err
    data = json.loads(out)
    spec, cluster = preset("megatron-1.7b"), load_cluster("dgx-h100").for_gpus(8)
    # the K fastest the engine lowers (ZeRO-3 among them: the engine runs its per-layer gathers)
    lowered = [(i, row) for i, row in enumerate(data["top"])
               if lowering_rejection(spec, Execution(**row["execution"]), cluster) is None][:3]
    assert len(lowered) == 3
    runs = [(engine_step(spec, Execution(**row["execution"]), cluster).iteration_s, i, row["index"])
            for i, row in lowered]
    assert [r["index"] for r in data["engine_top"]] == [index for _s, _i, index in sorted(runs)]
    assert [r["engine"]["iteration_s"] for r in data["engine_top"]] == sorted(s for s, _i, _x in runs)
    assert [r["analytical_rank"] for r in data["engine_top"]] == [i + 1 for _s, i, _x in sorted(runs)]


def _record(tmp_path, e: Execution) -> str:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(execution_to_dict(e)))
    return str(path)


def test_llm_predict_engine_on_the_held_out_zero3_record(run_cli, tmp_path):
    """The held-out DeepSpeed ZeRO-3 record (GPT-3 175B on 384 DGX A100 GPUs, one pipeline folded): --engine runs
    its per-tensor gathers and reduce-scatters at their closed-form times, which no other transfer shares, so the
    engine's iteration is the closed form's and no link class loses time."""
    run = ZERO3_SC21_RUNS[0]
    code, out, err = run_cli("llm-predict", "--model", run.model, "--execution", _record(tmp_path, run.execution),
                             "--system", "dgx-a100", "--engine", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["iteration_s"] == pytest.approx(data["analytical_iteration_s"], rel=1e-9)
    assert data["contention_s"] == 0.0 and data["contention_by_class_s"] == {}


def test_llm_predict_engine_zero3_with_offload_reports_pcie_contention(run_cli, tmp_path):
    """ZeRO-3 over two DGX H100 nodes with activations offloaded: the shard group's gathers leave through the
    GPU's x16 to its NIC while the offload drains through it, so --engine reports the time lost on pcie, as
    engine_step computes it."""
    e = Execution(gpus=16, tp=8, dp=2, zero=3, micro_batch=1, global_batch=4, offload_activations=True)
    code, out, err = run_cli("llm-predict", "--model", "megatron-1.7b", "--execution", _record(tmp_path, e),
                             "--system", "dgx-h100", "--engine", "--json")
    assert code == 0, err
    data = json.loads(out)
    want = engine_step(preset("megatron-1.7b"), e, load_cluster("dgx-h100").for_gpus(16))
    assert data["iteration_s"] == want.iteration_s and data["contention_by_class_s"] == want.contention_by_class_s
    assert set(data["contention_by_class_s"]) == {"pcie"} and data["contention_s"] > 0


def test_llm_predict_engine_runs_context_and_expert_parallel_records(run_cli, tmp_path):
    """--engine lowers a CP record (Llama 3.1 405B, TP8 PP3 CP2 on 48 GPUs, the ring's K/V exchange) and an EP
    record (Mixtral 8x7B, TP2 DP8 EP8, the all-to-alls) and reports the iteration engine_step gives for them,
    equal to the closed form here (no link carries two classes at once but the optimizer's round trip, whose
    two copy latencies the closed form leaves out)."""
    records = {"llama3-405b": dict(gpus=48, tp=8, pp=3, cp=2, micro_batch=1, global_batch=2, sequence_parallel=True,
                                   recompute="full", offload_optimizer=True),
               "mixtral-8x7b": dict(gpus=16, tp=2, dp=8, ep=8, micro_batch=1, global_batch=8, zero=2,
                                    sequence_parallel=True, recompute="full")}
    for model, fields in records.items():
        path = tmp_path / f"{model}.yaml"
        path.write_text("".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in fields.items()))
        code, out, err = run_cli("llm-predict", "--model", model, "--execution", str(path), "--system", "dgx-h100",
                                 "--engine", "--json")
        assert code == 0, err
        data = json.loads(out)
        cluster = load_cluster("dgx-h100").for_gpus(fields["gpus"])
        want = engine_step(preset(model), Execution(**fields), cluster)
        assert data["iteration_s"] == want.iteration_s and data["contention_s"] == 0.0
        latency = 2 * cluster.offload.latency_s if fields.get("offload_optimizer") else 0.0
        assert data["iteration_s"] == pytest.approx(data["analytical_iteration_s"] + latency, rel=1e-9)


def test_search_engine_top_reranks_context_and_expert_parallel_rows(run_cli):
    """--engine-top runs the search's CP and EP rows on the engine (they are no longer passed over): each row's
    engine time is engine_step's for its execution."""
    code, out, err = run_cli("search", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "16",
                             "--global-batch", "64", "--ep", "1,8", "--cp", "1,2", "--zero", "1", "--tp", "1",
                             "--pp", "1,2", "--recompute", "none", "--max-virtual-stages", "1", "--quiet",
                             "--workers", "1", "--json", "--top", "5", "--engine-top", "3")
    assert code == 0, err
    rows = json.loads(out)["engine_top"]
    assert len(rows) == 3 and any(r["execution"]["cp"] > 1 for r in rows) and all(r["execution"]["ep"] > 1 for r in rows)
    spec, cluster = preset("mixtral-8x7b"), load_cluster("dgx-h100").for_gpus(16)
    for r in rows:
        assert r["engine"]["iteration_s"] == engine_step(spec, Execution(**r["execution"]), cluster).iteration_s
