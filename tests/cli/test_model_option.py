"""``--model`` takes a model file or a Hugging Face config.json in llm-predict and search."""

import json


def test_llm_predict_takes_a_config_json(tmp_path, run_cli):
    """``llm-predict --model examples/hf-mixtral-8x7b.json`` predicts (Adam state offloaded, so 46.7B parameters fit
    eight 80 GB GPUs); a missing file exits 2 in one line."""
    execution = tmp_path / "e.yaml"
    execution.write_text("gpus: 8\ntp: 8\nmicro_batch: 1\nglobal_batch: 1\nrecompute: full\noffload_optimizer: true\n")
    code, out, _ = run_cli("llm-predict", "--model", "examples/hf-mixtral-8x7b.json", "--execution", str(execution),
                           "--system", "dgx-h100", "--json")
    assert code == 0 and json.loads(out)["iteration_s"] > 0
    code, _, err = run_cli("llm-predict", "--model", "nope.json", "--execution", str(execution))
    assert code == 2 and err.startswith("mcdla: error: transformer: got 'nope.json'; no such file")


def test_search_takes_a_config_json(run_cli):
    """``search --model examples/hf-qwen2-7b.json --seq 4096`` finds a configuration on one DGX H100."""
    code, out, _ = run_cli("search", "--model", "examples/hf-qwen2-7b.json", "--system", "dgx-h100", "--gpus", "8",
                           "--global-batch", "16", "--seq", "4096", "--workers", "1", "--quiet", "--json",
                           "--no-offload", "--top", "1")
    assert code == 0, out
    assert json.loads(out)["top"]
