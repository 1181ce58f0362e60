"""The exported Megatron-LM arguments and torchtitan TOML: parsed back (argparse with Megatron's option names,
tomllib), every value equals the execution's own field, and what cannot be expressed is a comment."""

from __future__ import annotations

import argparse
import shlex
import tomllib

import pytest

from mcdla.report.export_config import megatron_file, torchtitan_toml
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

SPEC = preset("megatron-1.7b")
CASES = [
    (Execution(gpus=64, tp=4, pp=4, dp=4, virtual_stages=2, sequence_parallel=True, zero=1, micro_batch=2,
               global_batch=512, recompute="selective", dp_overlap=True), "fp8"),
    (Execution(gpus=64, tp=4, pp=4, dp=4, virtual_stages=2, micro_batch=1, global_batch=64, pp_comm_overlap=True),
     "bf16"),
    (Execution(gpus=16, tp=2, pp=1, dp=8, zero=3, micro_batch=4, global_batch=256, recompute="full",
               offload_activations=True), "bf16"),
    (Execution(gpus=8, tp=1, pp=2, dp=4, zero=0, micro_batch=1, global_batch=64), "fp16"),
]


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's names for the exported arguments, parsed independently of the exporter."""
    p = argparse.ArgumentParser()
    for name in ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
                 "expert-model-parallel-size", "virtual-pipeline-model-parallel-size", "micro-batch-size",
                 "global-batch-size", "seq-length", "recompute-num-layers", "cpu-offloading-num-layers"):
        p.add_argument(f"--{name}", type=int)
    for name in ("recompute-granularity", "recompute-method", "fp8-format", "fp8-recipe"):
        p.add_argument(f"--{name}")
    for name in ("sequence-parallel", "use-distributed-optimizer", "use-torch-fsdp2", "overlap-grad-reduce",
                 "bf16", "fp16", "tp-comm-overlap", "no-overlap-p2p-communication"):
        p.add_argument(f"--{name}", action="store_true")
    return p


@pytest.mark.parametrize("e, precision", CASES)
def test_megatron_arguments_are_the_execution(e, precision):
    text = megatron_file(e, SPEC, precision)
    a = megatron_parser().parse_args(shlex.split(text, comments=True))
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size,
            a.expert_model_parallel_size) == (e.tp, e.pp, e.cp, e.ep)
    assert a.virtual_pipeline_model_parallel_size == (e.virtual_stages if e.virtual_stages > 1 else None)
    assert a.no_overlap_p2p_communication is (e.virtual_stages > 1 and not e.pp_comm_overlap)
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (e.micro_batch, e.global_batch, SPEC.seq_len)
    assert a.sequence_parallel is e.sequence_parallel and a.overlap_grad_reduce is e.dp_overlap
    assert a.recompute_granularity == {"none": None, "selective": "selective", "full": "full"}[e.recompute]
    assert (a.recompute_method, a.recompute_num_layers) == (("uniform", 1) if e.recompute == "full" else (None, None))
    assert a.use_distributed_optimizer is (e.zero in (1, 2)) and a.use_torch_fsdp2 is (e.zero == 3)
    assert a.fp8_format == ("hybrid" if precision == "fp8" else None)
    assert a.fp8_recipe == ("tensorwise" if precision == "fp8" else None)
    assert a.bf16 is (precision in ("bf16", "fp8")) and a.fp16 is (precision == "fp16")
    offloaded = e.offload_activations or e.offload_weights or e.offload_optimizer
    assert ("# not expressed: offloads" in text) is offloaded


@pytest.mark.parametrize("e, precision", CASES)
def test_torchtitan_toml_is_the_execution(e, precision):
    text = torchtitan_toml(e, SPEC, precision)
    job = tomllib.loads(text)
    par, train, ac = job["parallelism"], job["training"], job["activation_checkpoint"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["expert_parallel_degree"]) == (e.tp, e.pp, e.cp, e.ep)
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == e.dp
    assert par["data_parallel_shard_degree"] == (e.dp if e.zero else 1)
    assert e.tp * e.pp * e.cp * par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == e.gpus
    assert (train["global_batch_size"], train["seq_len"]) == (e.global_batch, SPEC.seq_len)
    if e.pp > 1:  # one optimizer step per local batch, split into micro-batches by the schedule
        assert train["local_batch_size"] * e.dp == e.global_batch
        assert par["pipeline_parallel_microbatch_size"] == e.micro_batch
        assert par["pipeline_parallel_layers_per_stage"] * e.pp * e.virtual_stages == SPEC.layers
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if e.virtual_stages > 1 else "1F1B")
    else:  # torchtitan accumulates global / (local x dp) micro-batches
        assert train["local_batch_size"] == e.micro_batch
    assert ac["mode"] == e.recompute
    assert ("float8" in job.get("model", {}).get("converters", [])) is (precision == "fp8")
    offloaded = e.offload_activations or e.offload_weights or e.offload_optimizer
    assert ("# not expressed: offloads" in text) is offloaded



PARTIAL = dict(gpus=8, dp=8, micro_batch=1, global_batch=64)


@pytest.mark.parametrize("method, n", [("block", 5), ("block", 24), ("uniform", 3)])
def test_megatron_recompute_layer_count(method, n):
    """A recompute count is ``--recompute-method`` with ``--recompute-num-layers`` of the execution."""
    e = Execution(**PARTIAL, recompute="full", recompute_method=method, recompute_num_layers=n)
    a = megatron_parser().parse_args(shlex.split(megatron_file(e, SPEC, "bf16"), comments=True))
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", method, n)


def test_megatron_block_of_zero_layers_writes_no_recompute():
    e = Execution(**PARTIAL, recompute="full", recompute_num_layers=0)
    a = megatron_parser().parse_args(shlex.split(megatron_file(e, SPEC, "bf16"), comments=True))
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == (None, None, None)


def test_megatron_cpu_offloading_num_layers_where_megatron_core_takes_it():
    """``--cpu-offloading-num-layers`` N without a pipeline or recompute and with N < layers; a pipeline, a
    recompute or every layer is a note instead (Megatron-Core refuses them)."""
    ok = Execution(**PARTIAL, offload_activations=True, offload_num_layers=10)
    text = megatron_file(ok, SPEC, "bf16")
    assert megatron_parser().parse_args(shlex.split(text, comments=True)).cpu_offloading_num_layers == 10
    assert "# not expressed" not in text
    for e, why in ((Execution(gpus=8, pp=2, dp=4, micro_batch=1, global_batch=64, offload_activations=True,
                              offload_num_layers=10), "pipeline parallelism"),
                   (Execution(**PARTIAL, offload_activations=True, offload_num_layers=10, recompute="selective"),
                    "recomputation"),
                   (Execution(**PARTIAL, offload_activations=True, offload_num_layers=24), "< 24")):
        text = megatron_file(e, SPEC, "bf16")
        assert megatron_parser().parse_args(shlex.split(text, comments=True)).cpu_offloading_num_layers is None
        assert "# not expressed: offloads activations" in text and why in text


@pytest.mark.parametrize("n", [6, 8, 12])
def test_torchtitan_block_count_is_every_f_th_layer(n):
    """Block recompute of N of the 24 layers: torchtitan's every-f-th-layer checkpointing of as many layers,
    with a note that they are spread."""
    e = Execution(**PARTIAL, recompute="full", recompute_num_layers=n)
    text = torchtitan_toml(e, SPEC, "bf16")
    ac = tomllib.loads(text)["activation_checkpoint"]
    assert ac["mode"] == "selective" and SPEC.layers // int(ac["selective_ac_option"]) == n
    assert "# not expressed: block recompute" in text


def test_torchtitan_block_count_counts_per_model_chunk():
    """With pp 2 x v 2, a chunk holds 6 of the 24 layers: N = 2 is every 3rd layer of each chunk."""
    e = Execution(gpus=8, pp=2, dp=4, virtual_stages=2, micro_batch=1, global_batch=64, recompute="full",
                  recompute_num_layers=2)
    ac = tomllib.loads(torchtitan_toml(e, SPEC, "bf16"))["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "3"}


def test_torchtitan_block_count_without_an_every_f_th_equivalent_is_full_with_a_note():
    """24 // f is never 5: written as full, said so."""
    text = torchtitan_toml(Execution(**PARTIAL, recompute="full", recompute_num_layers=5), SPEC, "bf16")
    assert tomllib.loads(text)["activation_checkpoint"]["mode"] == "full"
    assert "no every-f-th-layer count gives 5" in text
