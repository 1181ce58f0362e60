"""ZeRO-3 with one collective per parameter tensor (``zero3_collectives="per-tensor"``, DeepSpeed ZeRO-3 0.3.12
to 0.5.4) against hand-computed closed forms: collective count x per-collective ring time."""

import dataclasses

import pytest

from mcdla.errors import ConfigError, WorkloadError
from mcdla.hardware.cluster import load_cluster
from mcdla.sim.llm import llm_step, zero3_traffic
from mcdla.sim.llm_lower import engine_step
from mcdla.workload.execution import Execution, execution_from_dict
from mcdla.workload.transformer import TransformerSpec, preset

H = 1024
SMALL = TransformerSpec(name="s", layers=8, hidden=H, heads=16, vocab=1, seq_len=1024)
FAST = 1e18  # FLOP/s: compute next to nothing, so every collective is exposed
FASTEST = 1e15  # B/s: HBM and NVLink that barely cost
NEAR = 1e-3  # the layers' elementwise kernels at FASTEST overlap ~1e-4 of a collective

# GPT's layer by hand: LayerNorm gain and bias, fused QKV weight and bias, projection weight and bias, LayerNorm,
# fc1 weight and bias, fc2 weight and bias
GPT_TENSORS = [H, H, 3 * H * H, 3 * H, H * H, H, H, H, 4 * H * H, 4 * H, 4 * H * H, H]


def test_layer_tensors_of_gpt_and_llama_by_hand():
    """GPT: the twelve tensors above; Llama (no biases, RMSNorm, SwiGLU, GQA): seven, the QKV of ``h (h + 2
    kv_heads head_dim)``; each list sums to the layer's parameters."""
    assert [n for _, n in SMALL.layer_tensors()] == GPT_TENSORS
    llama = preset("llama3-8b")
    h, f, kv = llama.hidden, int(llama.ffn_hidden), int(llama.kv_heads) * (llama.hidden // llama.heads)
    assert [n for _, n in llama.layer_tensors()] == [h, h * (h + 2 * kv), h * h, h, h * f, h * f, h * f]
    for spec in (SMALL, llama, preset("gpt3-175b")):
        assert sum(n for _, n in spec.layer_tensors()) == spec.params_per_layer()
    with pytest.raises(WorkloadError, match="dense model"):
        preset("mixtral-8x7b").layer_tensors()


def _ring(n_bytes: float, p: int, bw: float, a: float) -> float:
    """One ring all-gather or reduce-scatter of ``n_bytes`` over ``p`` ranks: (p-1)/p n/B + (p-1) a."""
    return (p - 1) / p * n_bytes / bw + (p - 1) * a


@pytest.mark.parametrize("persist", [0, 100_000])
def test_per_tensor_collectives_cost_their_count_times_the_ring_latency(persist, llm_cluster):
    """dp = 4 ranks, one per node, nothing to hide behind: per micro-batch and layer each gathered tensor is
    all-gathered in the forward and in the backward and every tensor reduce-scattered in the backward, each a
    ring of (p-1)/p n/B + (p-1) a. With the persistence threshold 1e5 the ten vectors (< 4h = 4096 elements)
    are not gathered per layer but once per iteration, all layers' at once, beside the embedding's
    reduce-scatter and gather."""
    dp, bw, a, m = 4, 10e9, 20e-6, 2
    cluster = llm_cluster(gpus_per_node=1, nodes=dp, network_bytes_per_s=bw, network_latency_s=a,
                          peak_flops_per_s=FAST, gemm_peak_fraction=1.0, hbm_bytes_per_s=FASTEST)
    e = Execution(gpus=dp, dp=dp, zero=3, fsdp_prefetch=0, micro_batch=1, global_batch=dp * m,
                  zero3_collectives="per-tensor", zero3_persist_numel=persist)
    gathered = [n for n in GPT_TENSORS if n >= persist]
    kept = [n for n in GPT_TENSORS if n < persist]
    assert len(gathered) == (12 if not persist else 4)
    per_layer = 2 * sum(_ring(2 * n, dp, bw, a) for n in gathered) + sum(_ring(2 * n, dp, bw, a) for n in GPT_TENSORS)
    step = llm_step(SMALL, e, cluster)
    assert step.fsdp_comm_s == pytest.approx(m * SMALL.layers * per_layer, rel=NEAR)
    emb = 2 * _ring(2 * SMALL.embedding_params(), dp, bw, a)
    persisted = _ring(2 * SMALL.layers * sum(kept), dp, bw, a) if kept else 0.0
    assert step.dp_comm_s == pytest.approx(emb + persisted, rel=1e-12)
    # against one collective per layer: the same bytes, (collectives - 3) more ring latencies per layer
    whole = llm_step(SMALL, dataclasses.replace(e, zero3_collectives="per-layer", zero3_persist_numel=0), cluster)
    extra = m * SMALL.layers * (2 * len(gathered) + 12 - 3) * (dp - 1) * a
    bytes_shift = m * SMALL.layers * 3 * (dp - 1) / dp * 2 * sum(kept) / bw  # the kept vectors' gathers gone
    assert step.fsdp_comm_s - whole.fsdp_comm_s == pytest.approx(extra - 2 / 3 * bytes_shift, rel=NEAR)


def test_per_tensor_traffic_lists_one_collective_per_tensor_per_tp_rank():
    """Under TP each tensor's share per TP rank (as the per-layer group counts it), over the DP group."""
    e = Execution(gpus=8, tp=2, dp=4, zero=3, global_batch=4, zero3_collectives="per-tensor")
    z3 = zero3_traffic(SMALL, e, 2)
    assert [c.nbytes for c in z3.gathers] == [2 * n / 2 for n in GPT_TENSORS]
    assert [c.kind for c in z3.reduces] == ["reduce-scatter"] * 12
    assert {(c.size, c.stride) for c in (*z3.gathers, *z3.reduces)} == {(4, 2)}


_CASES = [
    dict(gpus=16, dp=16, micro_batch=1, global_batch=16, zero=3, fsdp_prefetch=0, zero3_collectives="per-tensor",
         zero3_persist_numel=100_000, recompute="full"),
    dict(gpus=16, dp=16, micro_batch=1, global_batch=32, zero=3, fsdp_prefetch=1, zero3_collectives="per-tensor"),
    dict(gpus=16, tp=2, dp=8, micro_batch=1, global_batch=16, zero=3, fsdp_prefetch=2,
         zero3_collectives="per-tensor", zero3_persist_numel=10_000),
]


@pytest.mark.parametrize("replicas", ["fold", "all"])
@pytest.mark.parametrize("fields", _CASES)
def test_per_tensor_on_the_engine_equals_the_analytical_model(fields, replicas):
    """The lowering issues the same per-tensor collectives in the same order on the ``fsdp`` stream: on DGX H100
    nodes, where nothing else loads their links, the engine's iteration equals the closed form to 1e-9."""
    spec = preset("megatron-1.7b")
    e = Execution(**fields)
    cluster = load_cluster("dgx-h100").for_gpus(e.gpus)
    got = engine_step(spec, e, cluster, replicas=replicas)
    assert got.analytical.fsdp_comm_s > 0
    assert got.iteration_s == pytest.approx(llm_step(spec, e, cluster).iteration_s, rel=1e-9)


@pytest.mark.parametrize("fields, message", [
    (dict(zero=3, zero3_collectives="per-param"), "execution.zero3_collectives: got 'per-param'; must be one of "
                                                  "per-layer, per-tensor"),
    (dict(zero=2, zero3_collectives="per-tensor"), "execution.zero3_collectives: got 'per-tensor' with zero=2"),
    (dict(zero=3, zero3_persist_numel=10), "execution.zero3_persist_numel: got 10 with zero3_collectives="),
    (dict(zero=3, zero3_collectives="per-tensor", zero3_persist_numel=-1),
     "execution.zero3_persist_numel: got -1; must be an integer >= 0"),
])
def test_option_one_line_errors(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Execution(gpus=4, dp=4, global_batch=4, **fields)
    assert "\n" not in str(err.value)


def test_option_read_from_a_file_and_refused_for_moe():
    e = execution_from_dict(dict(gpus=8, dp=8, zero=3, global_batch=8, zero3_collectives="per-tensor",
                                 zero3_persist_numel=100000))
    assert (e.zero3_collectives, e.zero3_persist_numel) == ("per-tensor", 100000)
    with pytest.raises(ConfigError, match="execution.zero3_collectives"):
        execution_from_dict(dict(gpus=8, dp=8, zero=3, global_batch=8, zero3_collectives="tensor"))
    moe = Execution(gpus=8, dp=8, zero=3, global_batch=8, zero3_collectives="per-tensor")
    with pytest.raises(ConfigError, match="execution.zero3_collectives: got 'per-tensor' for mixtral-8x7b"):
        llm_step(preset("mixtral-8x7b"), moe, load_cluster("dgx-h100").for_gpus(8))


def test_exporters_note_that_their_frameworks_do_not_gather_per_tensor():
    """Neither Megatron-LM nor torchtitan can gather one tensor at a time: the exported configs say so."""
    from mcdla.report.export_config import megatron_args, torchtitan_toml

    e = Execution(gpus=8, dp=8, zero=3, global_batch=8, zero3_collectives="per-tensor")
    _, notes = megatron_args(e, SMALL, "bf16")
    assert any("zero3_collectives per-tensor" in n for n in notes)
    assert "zero3_collectives per-tensor" in torchtitan_toml(e, SMALL, "bf16")
    plain = dataclasses.replace(e, zero3_collectives="per-layer")
    assert not any("zero3_collectives" in n for n in megatron_args(plain, SMALL, "bf16")[1])
