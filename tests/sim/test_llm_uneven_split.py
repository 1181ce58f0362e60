"""Uneven pipeline splits (Megatron-LM's fewer layers on the first/last stage) in the LLM time model."""

import pytest

from mcdla.errors import ConfigError
from mcdla.hardware.cluster import load_cluster
from mcdla.sim.llm import llm_step
from mcdla.sim.llm_ranks import simulate_ranks
from mcdla.workload.execution import Execution, chunk_layers, execution_from_dict, stage_layers
from mcdla.workload.transformer import TransformerSpec, preset

PEAK, EFF = 300e12, 0.5
SPEC = TransformerSpec(name="s", layers=16, hidden=1024, heads=16, vocab=8, seq_len=1024)


def _layer_s(spec: TransformerSpec) -> float:
    """One GPT layer's forward + backward (3 x ``24 b s h^2 + 4 b s^2 h`` FLOPs, b = 1) at PEAK x EFF."""
    s, h = spec.seq_len, spec.hidden
    return 3 * (24 * s * h * h + 4 * s * s * h) / (PEAK * EFF)


def test_llama3_405b_splits_126_layers_on_16_stages():
    """126 layers on 16 stages with 7 on each end stage: the 14 middle stages take (126 - 14) / 14 = 8."""
    e = Execution(gpus=256, tp=4, pp=16, dp=4, micro_batch=1, global_batch=64,
                  layers_first_stage=7, layers_last_stage=7)
    assert stage_layers(e, preset("llama3-405b")) == (7,) + (8,) * 14 + (7,)


def test_llama3_405b_on_16_stages_predicts():
    """The Megatron-Bridge GB200 405B shape (TP4 PP16, 126 layers) runs with an uneven split, and its
    iteration is at least m times the busiest stage's 8 layers of forward + backward."""
    spec = preset("llama3-405b")
    e = Execution(gpus=256, tp=4, pp=16, dp=4, micro_batch=1, global_batch=64,
                  layers_first_stage=7, layers_last_stage=7)
    step = llm_step(spec, e, load_cluster("gb200-nvl72").for_gpus(256))
    busy = 16 * 8 * 3 * (2 * 8192 * spec.params_per_layer()) / 4 / 2.5e15  # >= the FLOPs at peak
    assert step.iteration_s > busy


def test_even_split_of_126_layers_on_16_stages_names_the_uneven_fields():
    """Without the end-stage counts 126 layers on 16 stages is refused in one line that says how to split."""
    e = Execution(gpus=16, pp=16, micro_batch=1, global_batch=16)
    with pytest.raises(ConfigError, match=r"^execution\.pp: .*layers_first_stage") as err:
        stage_layers(e, preset("llama3-405b"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("m", [2, 8])
def test_slowest_middle_stage_sets_the_pace(llm_cluster, m):
    """Layers 2/6/6/2 (1F1B, FLOPs only, tiny vocabulary): stage 2, the last of the two slowest, runs its m
    micro-batches back to back (stage 3 returns each gradient in time) after stages 0 and 1 fed it, and the last
    gradient drains back through them: ``(6 m + 2 + 6)`` layer times, in both modes."""
    e = Execution(gpus=4, pp=4, micro_batch=1, global_batch=m, layers_first_stage=2, layers_last_stage=2,
                  attention="materialized")
    cluster = llm_cluster(nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    expect = (6 * m + 8) * _layer_s(SPEC)
    assert llm_step(SPEC, e, cluster).iteration_s == pytest.approx(expect, rel=1e-3)
    assert simulate_ranks(SPEC, e, cluster).iteration_s == pytest.approx(expect, rel=1e-3)


def test_heavier_last_stage_paces_after_the_others(llm_cluster):
    """Layers 1/5/5/5 with m = 8: the last stage (5 layers and the logits) paces, the others fill once:
    ``8 x 5 + 11`` layer times plus 8 times the logits."""
    e = Execution(gpus=4, pp=4, micro_batch=1, global_batch=8, layers_first_stage=1, attention="materialized")
    cluster = llm_cluster(nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    logits = 3 * 2 * SPEC.seq_len * SPEC.hidden * SPEC.vocab / (PEAK * EFF)
    step = llm_step(SPEC, e, cluster)
    assert step.iteration_s == pytest.approx((8 * 5 + 11) * _layer_s(SPEC) + 8 * logits, rel=1e-3)
    assert step.compute_s + step.bubble_s == pytest.approx(step.iteration_s, rel=1e-9)


@pytest.mark.parametrize("fields, needle", [
    ({"pp": 4, "layers_first_stage": 3, "layers_last_stage": 4}, "execution.layers_first_stage: got first=3, last=4"),
    ({"pp": 4, "layers_last_stage": 16}, "execution.layers_last_stage: got first=None, last=16"),
    ({"pp": 4, "virtual_stages": 2, "layers_first_stage": 3, "layers_last_stage": 3, "global_batch": 4},
     "execution.virtual_stages: got 2; must divide the layers of every stage, here [3, 5, 5, 3]"),
])
def test_bad_uneven_split_is_one_line(fields, needle):
    """A split the middle stages cannot share equally, or chunks of unequal size, is one line naming the field."""
    e = Execution(**{"gpus": 4, "micro_batch": 1, "global_batch": 8, **fields})
    with pytest.raises(ConfigError) as err:
        stage_layers(e, SPEC)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_end_stage_counts_need_a_pipeline():
    """``layers_first_stage`` with pp = 1 is refused where the record is read."""
    with pytest.raises(ConfigError, match=r"execution\.layers_first_stage: got 4 with pp=1"):
        execution_from_dict({"gpus": 1, "layers_first_stage": 4})


def test_embedding_and_loss_counted_as_layers_split_405b_over_16_stages_of_4_chunks():
    """Megatron-Bridge's GB200 405B split (PP16 VP4, embedding and loss as layers): 128 over 64 chunks of 2, the
    first and the last chunk 1 real layer; stages of 7, 14 x 8, 7."""
    e = Execution(gpus=16, pp=16, virtual_stages=4, micro_batch=1, global_batch=16,
                  account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    grid = chunk_layers(e, preset("llama3-405b"))
    assert grid[0] == (1, 2, 2, 2) and grid[-1] == (2, 2, 2, 1) and set(grid[1:-1]) == {(2, 2, 2, 2)}
    assert stage_layers(e, preset("llama3-405b")) == (7,) + (8,) * 14 + (7,)


def test_embedding_as_a_layer_paces_on_the_last_stage(llm_cluster):
    """7 layers on 4 stages with the embedding as a layer: 1/2/2/2; the last stage (2 layers and the logits)
    paces: ``8 x 2 + (1 + 2 + 2)`` layer times plus 8 times the logits, in both modes."""
    spec = TransformerSpec(name="s7", layers=7, hidden=1024, heads=16, vocab=8, seq_len=1024)
    e = Execution(gpus=4, pp=4, micro_batch=1, global_batch=8, account_for_embedding_in_pipeline_split=True,
                  attention="materialized")
    cluster = llm_cluster(nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    logits = 3 * 2 * spec.seq_len * spec.hidden * spec.vocab / (PEAK * EFF)
    expect = (8 * 2 + 5) * _layer_s(spec) + 8 * logits
    assert llm_step(spec, e, cluster).iteration_s == pytest.approx(expect, rel=1e-3)
    assert simulate_ranks(spec, e, cluster).iteration_s == pytest.approx(expect, rel=1e-3)


def test_accounting_and_end_stage_counts_exclude_each_other():
    """Both ways of splitting unevenly at once is one line naming the field."""
    with pytest.raises(ConfigError, match=r"^execution\.layers_first_stage: got it with account_for"):
        Execution(gpus=4, pp=4, layers_first_stage=1, account_for_loss_in_pipeline_split=True)


def test_layout_string_gives_deepseek_v3s_chunks_in_megatrons_order():
    """Megatron-Bridge's DeepSeek-V3 layout for PP4 VP4 (recipe layout_map[(4, 4)], no MTP): the embedding and 4
    layers, 14 chunks of 4, 1 layer and the loss. Megatron-Core puts entry ``c * pp + s`` on stage s as chunk c,
    so stages 0-2 hold 4 x 4 layers and stage 3 holds 4, 4, 4, 1."""
    e = Execution(gpus=4, pp=4, virtual_stages=4, micro_batch=1, global_batch=4,
                  pipeline_layout="Et*4|(t*4|)*14tL")
    flat = [4] * 15 + [1]  # the recipe's list of lists, counted by hand
    grid = chunk_layers(e, preset("deepseek-v3-671b"))
    assert grid == tuple(tuple(flat[c * 4 + s] for c in range(4)) for s in range(4))
    assert grid[3] == (4, 4, 4, 1) and stage_layers(e, preset("deepseek-v3-671b")) == (16, 16, 16, 13)
    one = Execution(gpus=16, pp=16, micro_batch=1, global_batch=16, pipeline_layout="Et*4|(t*4|)*14tL")
    assert stage_layers(one, preset("deepseek-v3-671b")) == (4,) * 15 + (1,)


def test_layout_string_equals_the_end_stage_split(llm_cluster):
    """'Et*2|t*6|(t*3)*2|ttL' ('Ett|tttttt|tttttt|ttL') is the split 2/6/6/2: the same chunks and the same time as the end-stage counts
    (the closed form of test_slowest_middle_stage_sets_the_pace)."""
    cluster = llm_cluster(nodes=2, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    base = dict(gpus=4, pp=4, micro_batch=1, global_batch=8, attention="materialized")
    by_layout = Execution(**base, pipeline_layout="Et*2|t*6|(t*3)*2|ttL")
    by_ends = Execution(**base, layers_first_stage=2, layers_last_stage=2)
    assert chunk_layers(by_layout, SPEC) == chunk_layers(by_ends, SPEC) == ((2,), (6,), (6,), (2,))
    expect = (6 * 8 + 8) * _layer_s(SPEC)
    assert llm_step(SPEC, by_layout, cluster).iteration_s == pytest.approx(expect, rel=1e-3)


def test_unequal_chunks_of_one_stage_pace_by_schedule(llm_cluster):
    """'Et|ttt|ttt|tL' on 2 stages of 2 chunks: stage 0 holds chunks of 1 and 3 layers, stage 1 of 3 and 1 (the
    logits on its last). Both modes agree: the fast path hands the layout to the per-rank schedule."""
    spec = TransformerSpec(name="s8", layers=8, hidden=1024, heads=16, vocab=8, seq_len=1024)
    e = Execution(gpus=2, pp=2, virtual_stages=2, micro_batch=1, global_batch=4, attention="materialized",
                  pipeline_layout="Et|ttt|ttt|tL")
    assert chunk_layers(e, spec) == ((1, 3), (3, 1))
    cluster = llm_cluster(nodes=1, peak_flops_per_s=PEAK, gemm_peak_fraction=EFF)
    assert llm_step(spec, e, cluster).iteration_s == pytest.approx(simulate_ranks(spec, e, cluster).iteration_s,
                                                                   rel=1e-12)


@pytest.mark.parametrize("fields, needle", [
    ({"pipeline_layout": "Et*4|t*4|t*4|t*3mL"}, "character 'm'"),
    ({"pipeline_layout": "t*4|Et*4|t*4|t*4L"}, "not the embedding E once first"),
    ({"pipeline_layout": "Et*8|t*7L"}, "got 2 model chunks; must be pp*virtual_stages = 4*1 = 4"),
    ({"pipeline_layout": "Et*5|t*5|t*5|L"}, "a model chunk with no decoder layer (chunk 3)"),
    ({"pipeline_layout": "Et*4|t*4|t*4|t*4L", "layers_first_stage": 4}, "execution.pipeline_layout: got it with"),
])
def test_bad_layout_is_one_line(fields, needle):
    """A layout Megatron-Core would refuse (or that names MTP, not modelled) is one line naming the field."""
    with pytest.raises(ConfigError) as err:
        Execution(**{"gpus": 4, "pp": 4, "micro_batch": 1, "global_batch": 8, **fields})
    assert needle in str(err.value) and "\n" not in str(err.value) and "pipeline_layout" in str(err.value)


def test_layout_must_hold_the_models_layers():
    """A well-formed layout of 15 decoder layers for a 16-layer model is refused against the model."""
    e = Execution(gpus=4, pp=4, micro_batch=1, global_batch=8, pipeline_layout="Et*3|t*4|t*4|t*4L")
    with pytest.raises(ConfigError, match=r"^execution\.pipeline_layout: .*15 decoder layers; must hold the 16"):
        stage_layers(e, SPEC)
    assert execution_from_dict({"gpus": 4, "pp": 4, "pipeline_layout": "Et*4|t*4|t*4|t*4L"}).pipeline_layout


def test_layout_that_expands_past_the_bound_is_one_line():
    """A repeat count past any model (here 10^12 layers) is refused before it is expanded."""
    with pytest.raises(ConfigError, match=r"^execution\.pipeline_layout: .*expands past 1,000,000 characters"):
        Execution(gpus=2, pp=2, micro_batch=1, global_batch=2, pipeline_layout="Et*1000000000000|tL")
