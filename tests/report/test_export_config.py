"""The exported Megatron-LM arguments and torchtitan TOML against the frameworks' own parsers, as vendored in
``data/framework_args.json`` (refreshed by ``data/extract_framework_args.py``): every option and key exists, every
value has the type and one of the choices the framework allows, and parsing the file back (an argparse built from
the vendored spec, tomllib) gives the execution it was written from; what cannot be expressed is a comment."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import tomllib
from pathlib import Path

import pytest

from mcdla.plan.llm_search import enumerate_executions
from mcdla.report.export_config import megatron_file, torchtitan_toml
from mcdla.workload.execution import Execution, check_execution, chunk_layers
from mcdla.workload.transformer import TransformerSpec, preset

SPEC = json.loads(Path(__file__).with_name("data").joinpath("framework_args.json").read_text())
MEGATRON, TORCHTITAN = SPEC["megatron"], SPEC["torchtitan"]
DENSE, MOE = preset("megatron-1.7b"), preset("mixtral-8x7b")

# Winners of the kinds the search returns: each parallelism, ZeRO stage, recompute mode and precision at least once.
CASES = [
    (DENSE, Execution(gpus=64, tp=4, pp=4, dp=4, virtual_stages=2, sequence_parallel=True, zero=1, micro_batch=2,
                      global_batch=512, recompute="selective", dp_overlap=True, tp_comm_overlap=True), "fp8"),
    (DENSE, Execution(gpus=16, tp=2, pp=1, dp=8, zero=3, micro_batch=4, global_batch=256, recompute="full",
                      offload_activations=True, sequence_parallel=True, hsdp_shard=4), "bf16"),
    (DENSE, Execution(gpus=8, tp=1, pp=2, dp=4, zero=0, micro_batch=1, global_batch=64), "fp16"),
    (DENSE, Execution(gpus=32, tp=2, pp=2, dp=4, cp=2, zero=2, micro_batch=1, global_batch=64, cp_comm="all_gather",
                      attention="materialized", fp8_scaling="delayed", dp_overlap=True), "fp8"),
    (DENSE, Execution(gpus=16, tp=1, pp=4, dp=2, cp=2, zero=0, micro_batch=2, global_batch=64, layers_first_stage=5,
                      layers_last_stage=5), "bf16"),
    (preset("megatron-3.6b"), Execution(gpus=8, tp=1, pp=2, dp=4, virtual_stages=2, micro_batch=1, global_batch=32,
                                                          account_for_embedding_in_pipeline_split=True,
                                        account_for_loss_in_pipeline_split=True), "bf16"),
    (DENSE, Execution(gpus=8, tp=1, pp=1, dp=8, zero=3, micro_batch=2, global_batch=64, offload_weights=True,
                      offload_optimizer=True, cpu_optimizer=True, dp_overlap=True), "fp32"),
    (DENSE, Execution(gpus=16, tp=4, pp=1, dp=4, zero=3, micro_batch=1, global_batch=32, tp_comm_overlap=True,
                      dp_overlap=True, fsdp_prefetch=2, recompute="full"), "bf16"),
    (DENSE, Execution(gpus=8, tp=2, pp=1, dp=4, zero=3, micro_batch=1, global_batch=32, tp_comm_overlap=True), "bf16"),
    (DENSE, Execution(gpus=8, dp=8, micro_batch=4, global_batch=128, dp_overlap=True), "bf16"),
    (MOE, Execution(gpus=64, tp=2, pp=2, dp=16, ep=8, zero=1, sequence_parallel=True, micro_batch=1,
                    global_batch=256, capacity_factor=1.25, recompute="selective"), "bf16"),
    (MOE, Execution(gpus=32, tp=2, pp=1, dp=16, ep=4, zero=0, sequence_parallel=True, micro_batch=1,
                    global_batch=64, offload_optimizer=True, cpu_optimizer=True, delayed_param_update=True), "bf16"),
    (MOE, Execution(gpus=16, tp=1, pp=2, dp=8, ep=8, zero=1, micro_batch=2, global_batch=64,
                    ep_dispatcher="hybridep", moe_router_graph=True), "bf16"),
    (MOE, Execution(gpus=16, tp=1, pp=2, dp=8, ep=8, zero=1, micro_batch=1, global_batch=64, virtual_stages=2,
                    pp_comm_overlap=True, moe_a2a_overlap=True), "bf16"),
    (DENSE, Execution(gpus=64, tp=4, pp=4, dp=4, virtual_stages=2, micro_batch=1, global_batch=64,
                      pp_comm_overlap=True), "bf16"),
    (DENSE, Execution(gpus=8, pp=2, dp=4, virtual_stages=2, micro_batch=1, global_batch=32, pp_comm_overlap=True,
                      pipeline_layout="Et*5|t*7|t*6|t*6L"), "bf16"),
    (DENSE, Execution(gpus=8, tp=2, dp=4, zero=1, sequence_parallel=True, micro_batch=1, global_batch=32,
                      fp8_scaling="mxfp8"), "fp8"),
    (DENSE, Execution(gpus=4, dp=4, zero=2, micro_batch=1, global_batch=8, recompute="full", offload_activations=True,
                      activation_offload_sync=True, offload_first_touch=True, offload_optimizer=True,
                      cpu_optimizer=True, reduce_bucket_numel=200_000_000), "fp16"),
]
IDS = [f"{s.name}-tp{e.tp}pp{e.pp}v{e.virtual_stages}cp{e.cp}ep{e.ep}z{e.zero}-{e.recompute}-{p}" for s, e, p in CASES]


def test_cases_are_valid_executions():
    for spec, e, _ in CASES:
        check_execution(e, spec)


def vendored_megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's options, actions, types and choices, rebuilt from the vendored spec alone."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    types = {"int": int, "float": float, "str": str, "other": str}
    for option, a in MEGATRON["arguments"].items():
        dest = a.get("dest", option.lstrip("-").replace("-", "_"))
        if a["action"] in ("store_true", "store_false"):
            p.add_argument(option, action=a["action"], dest=dest, default=None)
        elif a["action"] == "store":
            choices = a.get("choices") or MEGATRON["values"].get(option, {}).get("choices")
            p.add_argument(option, dest=dest, type=types[a.get("type", "str")], choices=choices,
                           nargs=a.get("nargs"))
    return p


def parse_megatron(text: str) -> argparse.Namespace:
    args = shlex.split(text, comments=True)
    options = [a for a in args if a.startswith("--")]
    assert len(options) == len(set(options)), "an option given twice"
    assert all(o in MEGATRON["arguments"] for o in options), set(options) - set(MEGATRON["arguments"])
    return vendored_megatron_parser().parse_args(args)


def execution_from_megatron(a: argparse.Namespace, gpus: int) -> dict[str, object]:
    """The execution fields Megatron's parsed arguments say, by Megatron's semantics."""
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    dp = gpus // (tp * pp * cp)
    sharding = a.data_parallel_sharding_strategy if a.use_megatron_fsdp else None
    zero = {None: 1 if a.use_distributed_optimizer else 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
    instances = a.num_distributed_optimizer_instances or 1
    return {
        "tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": a.expert_model_parallel_size,
        "cp_comm": a.cp_comm_type[0] if a.cp_comm_type else "p2p",
        "ep_dispatcher": ("hybridep" if a.moe_token_dispatcher_type == "flex"
                          and a.moe_flex_dispatcher_backend == "hybridep" else "alltoall"),
        # Megatron-Bridge's moe_a2a_overlap sets both (set_moe_a2a_overlap_overrides)
        "moe_a2a_overlap": bool(a.overlap_moe_expert_parallel_comm) and bool(a.delay_wgrad_compute),
        "moe_router_graph": (a.cuda_graph_impl == "transformer_engine"
                             and {"moe_router", "moe_preprocess"} <= set(a.cuda_graph_modules or ())),
        "virtual_stages": a.num_virtual_stages_per_pipeline_rank or 1,
        "layers_first_stage": a.decoder_first_pipeline_num_layers,
        "layers_last_stage": a.decoder_last_pipeline_num_layers,
        "account_for_embedding_in_pipeline_split": bool(a.account_for_embedding_in_pipeline_split),
        "account_for_loss_in_pipeline_split": bool(a.account_for_loss_in_pipeline_split),
        "pipeline_layout": a.pipeline_model_parallel_layout,
        "sequence_parallel": bool(a.sequence_parallel),
        "micro_batch": a.micro_batch_size, "global_batch": a.global_batch_size,
        "recompute": a.recompute_granularity or "none", "zero": zero[sharding],
        "hsdp_shard": dp // instances if instances > 1 else 0, "dp_overlap": bool(a.overlap_grad_reduce),
        "attention": {"flash": "flash", "unfused": "materialized"}[a.attention_backend],
        # Megatron overlaps an interleaved pipeline's sends unless told not to (a store_false, None when absent)
        "pp_comm_overlap": (a.num_virtual_stages_per_pipeline_rank or 1) > 1 and a.overlap_p2p_comm is not False,
    }


@pytest.mark.parametrize("spec, e, precision", CASES, ids=IDS)
def test_megatron_arguments_parse_back_to_the_execution(spec, e, precision):
    text = megatron_file(e, spec, precision)
    a = parse_megatron(text)
    assert execution_from_megatron(a, e.gpus) == {k: getattr(e, k) for k in execution_from_megatron(a, e.gpus)}
    assert a.seq_length == spec.seq_len
    if e.recompute == "full":  # every layer recomputed from its own input
        assert (a.recompute_method, a.recompute_num_layers) == ("uniform", 1)
    else:
        assert (a.recompute_method, a.recompute_num_layers) == (None, None)
    if e.zero >= 2:  # Megatron-FSDP's requirements: its checkpoint format, and the distributed optimizer of v1
        assert a.ckpt_format == "fsdp_dtensor" and a.use_distributed_optimizer
    assert not a.use_torch_fsdp2
    notes = [line for line in text.splitlines() if line.startswith("# not expressed:")]
    # Megatron refuses --tp-comm-overlap without --sequence-parallel, and --overlap-param-gather without
    # --overlap-grad-reduce: the exporter writes what Megatron accepts and notes the rest
    assert a.tp_comm_overlap is ((e.tp_comm_overlap and e.sequence_parallel) or None)
    assert any("tp_comm_overlap" in n for n in notes) is (e.tp_comm_overlap and not e.sequence_parallel)
    if a.tp_comm_overlap:
        assert a.sequence_parallel
    assert a.overlap_param_gather is ((e.zero == 3 and e.fsdp_prefetch > 0 and e.dp_overlap) or None)
    if a.overlap_param_gather:
        assert a.overlap_grad_reduce
    assert any("FSDP prefetch" in n for n in notes) is (e.zero == 3 and e.fsdp_prefetch > 0 and not e.dp_overlap)
    assert a.bf16 is ((precision in ("bf16", "fp8")) or None) and a.fp16 is ((precision == "fp16") or None)
    assert a.fp8 == ("hybrid" if precision == "fp8" else None)
    assert a.fp8_recipe == ({"current": "tensorwise", "delayed": "delayed", "mxfp8": "mxfp8"}[e.fp8_scaling] if precision == "fp8"
                            else None)
    assert a.moe_expert_capacity_factor == (e.capacity_factor if spec.experts > 1 and e.capacity_factor != 1
                                            else None)
    cpu_step = e.cpu_optimizer and e.offload_tier == "host"
    assert a.optimizer_cpu_offload is (cpu_step or None) and a.use_precision_aware_optimizer is (cpu_step or None)
    assert a.optimizer_offload_fraction == (1.0 if cpu_step else None)  # all of the state on the host
    unexpressed = e.offload_activations or e.offload_weights or (e.offload_optimizer and not cpu_step)
    assert any("offloads" in n for n in notes) is unexpressed
    assert any("delayed parameter update" in n for n in notes) is e.delayed_param_update


def test_megatron_vendored_parser_refuses_what_megatron_refuses():
    """The vendored spec is a parser, not a list of names: an unknown option, a value outside the choices and a
    value of the wrong type all fail, as they would in Megatron."""
    p = vendored_megatron_parser()
    for bad in (["--virtual-pipeline-model-parallel-size", "2"], ["--fp8-format", "e5m2"],
                ["--tensor-model-parallel-size", "two"], ["--cp-comm-type", "ring"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            p.parse_args(bad)


def _check_toml_value(key: str, value: object) -> None:
    spec = TORCHTITAN["keys"][key]
    kind = spec["type"]
    if kind == "bool":
        assert isinstance(value, bool), key
    elif kind == "int":
        assert isinstance(value, int) and not isinstance(value, bool), key
    elif kind == "str":
        assert isinstance(value, str), key
    elif kind.startswith("list["):
        inner = kind[len("list["):-1]
        assert isinstance(value, list), key
        for item in value:
            if inner == "str":
                assert isinstance(item, str), key
            else:
                assert inner == "list[str]" and all(isinstance(x, str) for x in item), key
    else:
        raise AssertionError(f"{key}: unexpected vendored type {kind}")
    if spec["choices"] is not None:
        assert value in spec["choices"], (key, value)
    allowed = TORCHTITAN["values"].get(key, {}).get("choices")
    if allowed is not None:
        assert set(value) <= set(allowed), (key, value)  # type: ignore[arg-type]


def _leaves(table: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("spec, e, precision", CASES, ids=IDS)
def test_torchtitan_toml_parses_back_to_the_execution(spec, e, precision):
    text = torchtitan_toml(e, spec, precision)
    job = tomllib.loads(text)
    for key, value in _leaves(job).items():
        assert key in TORCHTITAN["keys"], key
        _check_toml_value(key, value)
    par, train, ac = job["parallelism"], job["training"], job["activation_checkpoint"]
    shard, replicate = par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["expert_parallel_degree"], shard * replicate) == (e.tp, e.pp, e.cp, e.ep, e.dp)
    assert e.tp * e.pp * e.cp * shard * replicate == e.gpus
    if e.zero:
        assert shard == (e.hsdp_shard or e.dp)
    if shard == 1 and e.cp == 1 and replicate > 1:  # torchtitan's DDP: "DDP has not supported > 1D parallelism"
        assert replicate == e.gpus
    notes = [line for line in text.splitlines() if line.startswith("# not expressed:")]
    assert any("ZeRO-0 with TP/PP/CP" in n for n in notes) is (e.zero == 0 and shard > 1)
    if e.ep > 1:  # the experts split over TP as everything else (torchtitan allows ETP = TP or 1)
        assert par["expert_tensor_parallel_degree"] == e.tp
    if shard > 1:  # reshard after forward is what ZeRO-3 adds to ZeRO-2
        assert par["fsdp_reshard_after_forward"] == ("always" if e.zero == 3 else "never")
    assert par.get("context_parallel_rotate_method", "allgather" if e.cp_comm == "all_gather" else None) == (
        "allgather" if e.cp_comm == "all_gather" else None)
    assert (train["global_batch_size"], train["seq_len"]) == (e.global_batch, spec.seq_len)
    if e.pp > 1:  # one optimizer step per local batch, split into micro-batches by the schedule
        assert train["local_batch_size"] * e.dp == e.global_batch
        assert par["pipeline_parallel_microbatch_size"] == e.micro_batch
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if e.virtual_stages > 1 else "1F1B")
        assert torchtitan_chunk_layers(par, spec.layers) == [
            chunk_layers(e, spec)[s][c] for c in range(e.virtual_stages) for s in range(e.pp)]
    else:  # torchtitan accumulates global / (local x dp) micro-batches
        assert train["local_batch_size"] == e.micro_batch
    assert par.get("enable_async_tensor_parallel", False) is e.tp_comm_overlap
    if e.tp_comm_overlap:  # torchtitan's async TP refuses to run uncompiled
        assert job["compile"]["enable"] is True
    assert ac["mode"] == e.recompute
    assert (ac.get("selective_ac_option") == "op") is (e.recompute == "selective")
    assert ("quantize.linear.float8" in job.get("model", {}).get("converters", [])) is (precision == "fp8")
    assert train["mixed_precision_param"] == ("float32" if precision == "fp32" else "bfloat16")
    cpu_offload = train.get("enable_cpu_offload", False)
    assert cpu_offload is (e.zero == 3 and e.offload_weights and e.offload_optimizer and e.cpu_optimizer)
    offloaded = e.offload_activations or e.offload_weights or e.offload_optimizer
    assert ("# not expressed: offloads" in text) is (offloaded and not cpu_offload)


def torchtitan_chunk_layers(par: dict[str, object], layers: int) -> list[int]:
    """The transformer layers of each model chunk as torchtitan v0.2.2 splits them
    (``torchtitan/distributed/pipeline_parallel.py``): an explicit ``module_fqns_per_model_part``, or
    ``ceil((layers + first_less + last_less) / layers_per_stage)`` stages of ``layers_per_stage`` weighted layers,
    the first and the last stage counting the embedding and the output as that many layers."""
    if "module_fqns_per_model_part" in par:
        parts = par["module_fqns_per_model_part"]
        names = [n for part in parts for n in part]  # type: ignore[union-attr]
        assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "output"]
        return [sum(n.startswith("layers.") for n in part) for part in parts]  # type: ignore[union-attr]
    lps, first, last = (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
                        par["pipeline_parallel_last_stage_less_layers"])
    stages = math.ceil((layers + first + last) / lps)  # type: ignore[operator]
    assert stages % par["pipeline_parallel_degree"] == 0  # type: ignore[operator]
    assert (layers + first + last) == stages * lps  # an even split: torchtitan's remainder rule never applies
    return [lps - (first if i == 0 else 0) - (last if i == stages - 1 else 0) for i in range(stages)]  # type: ignore[operator]


def test_torchtitan_schedules_are_torch_pipelining_schedules():
    """torchtitan v0.2.2 looks the schedule name up in torch.distributed.pipelining."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for name, multi in (("1F1B", False), ("Interleaved1F1B", True)):
        cls = schedules.get_schedule_class(name)
        assert issubclass(cls, schedules.PipelineScheduleMulti) is multi


def test_vendored_spec_names_its_sources():
    for framework, repo in ((MEGATRON, "NVIDIA/Megatron-LM"), (TORCHTITAN, "pytorch/torchtitan")):
        assert framework["repo"] == repo and len(framework["commit"]) == 40
    assert TORCHTITAN["ref"] == "v0.2.2"


TINY_DENSE = TransformerSpec(name="tiny", layers=8, hidden=64, heads=4, vocab=128, seq_len=16)
TINY_MOE = TransformerSpec(name="tiny-moe", layers=4, hidden=64, heads=4, vocab=128, seq_len=16, experts=4, top_k=2)
PRECISIONS = ("bf16", "fp8", "fp16", "fp32")


def _one_of_each(executions: tuple[Execution, ...]) -> list[Execution]:
    """The first execution of each parallel layout (degrees, interleaving, SP, ZeRO, recompute) and of each
    ZeRO and offload combination: every kind the exporter maps, a few hundred rather than thousands."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for e in executions:
        layout = (e.tp, e.pp, e.cp, e.ep, e.virtual_stages, e.sequence_parallel, e.zero, e.recompute)
        state = ("state", e.zero, e.offload_activations, e.offload_weights, e.offload_optimizer, e.cpu_optimizer)
        if layout not in seen or state not in seen:
            seen.update((layout, state))
            out.append(e)
    return out


SEARCH_SPACES = [(TINY_DENSE, {"cp": (1, 2), "cpu_optimizer": (False, True), "dp_overlap": True}),
                 (TINY_MOE, {"ep": (1, 2, 4), "max_virtual_stages": 2})]


@pytest.mark.parametrize("spec, space", SEARCH_SPACES, ids=["dense", "moe"])
def test_every_candidate_of_a_search_exports_what_the_parsers_accept(spec, space, llm_cluster):
    """Each execution the search enumerates (every TP/PP/VP/CP/EP, ZeRO stage, recompute, offload), under each
    precision in turn: every Megatron option parses with a valid value and every TOML key is torchtitan's, and the
    degrees read back are the execution's."""
    cluster = llm_cluster(gpus_per_node=4, nodes=2, offload_bytes_per_s=10e9)
    every = enumerate_executions(spec, cluster, gpus=8, global_batch=16, **space).executions
    executions = _one_of_each(every)
    assert len({(e.tp, e.pp, e.cp, e.ep, e.virtual_stages, e.zero, e.recompute) for e in executions}) > 20
    parser = vendored_megatron_parser()
    for i, e in enumerate(executions):
        precision = PRECISIONS[i % len(PRECISIONS)]
        text = megatron_file(e, spec, precision)
        assert all(o in MEGATRON["arguments"] for o in shlex.split(text, comments=True) if o.startswith("--"))
        a = parser.parse_args(shlex.split(text, comments=True))
        got = execution_from_megatron(a, e.gpus)
        assert got == {k: getattr(e, k) for k in got}, e
        job = tomllib.loads(torchtitan_toml(e, spec, precision))
        for key, value in _leaves(job).items():
            assert key in TORCHTITAN["keys"], key
            _check_toml_value(key, value)
        par = job["parallelism"]
        assert (par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * par["context_parallel_degree"]
                * par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"]) == e.gpus
        if e.pp > 1:
            assert torchtitan_chunk_layers(par, spec.layers) == [
                chunk_layers(e, spec)[s][c] for c in range(e.virtual_stages) for s in range(e.pp)]

PARTIAL = dict(gpus=8, dp=8, micro_batch=1, global_batch=64)


@pytest.mark.parametrize("method, n", [("block", 5), ("block", 24), ("uniform", 3)])
def test_megatron_recompute_layer_count(method, n):
    """A recompute count is ``--recompute-method`` with ``--recompute-num-layers`` of the execution."""
    e = Execution(**PARTIAL, recompute="full", recompute_method=method, recompute_num_layers=n)
    a = vendored_megatron_parser().parse_args(shlex.split(megatron_file(e, DENSE, "bf16"), comments=True))
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", method, n)


def test_megatron_recompute_modules():
    """Selective recompute's modules other than the default are ``--recompute-modules`` with their names."""
    e = Execution(**PARTIAL, recompute="selective", recompute_modules=("mla_up_proj", "moe_act"))
    a = vendored_megatron_parser().parse_args(shlex.split(megatron_file(e, preset("deepseek-v3-671b"), "bf16"),
                                                          comments=True))
    assert (a.recompute_granularity, a.recompute_modules) == ("selective", ["mla_up_proj", "moe_act"])
    plain = Execution(**PARTIAL, recompute="selective")
    assert vendored_megatron_parser().parse_args(shlex.split(megatron_file(plain, DENSE, "bf16"),
                                                             comments=True)).recompute_modules is None


def test_megatron_block_of_zero_layers_writes_no_recompute():
    e = Execution(**PARTIAL, recompute="full", recompute_num_layers=0)
    a = vendored_megatron_parser().parse_args(shlex.split(megatron_file(e, DENSE, "bf16"), comments=True))
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == (None, None, None)


def test_megatron_cpu_offloading_num_layers_where_megatron_core_takes_it():
    """``--cpu-offloading-num-layers`` N without a pipeline or recompute and with N < layers; a pipeline, a
    recompute or every layer is a note instead (Megatron-Core refuses them)."""
    ok = Execution(**PARTIAL, offload_activations=True, offload_num_layers=10)
    text = megatron_file(ok, DENSE, "bf16")
    assert vendored_megatron_parser().parse_args(shlex.split(text, comments=True)).cpu_offloading_num_layers == 10
    assert "# not expressed" not in text
    for e, why in ((Execution(gpus=8, pp=2, dp=4, micro_batch=1, global_batch=64, offload_activations=True,
                              offload_num_layers=10), "pipeline parallelism"),
                   (Execution(**PARTIAL, offload_activations=True, offload_num_layers=10, recompute="selective"),
                    "recomputation"),
                   (Execution(**PARTIAL, offload_activations=True, offload_num_layers=24), "< 24")):
        text = megatron_file(e, DENSE, "bf16")
        assert vendored_megatron_parser().parse_args(shlex.split(text, comments=True)).cpu_offloading_num_layers is None
        assert "# not expressed: offloads activations" in text and why in text


@pytest.mark.parametrize("n", [6, 8, 12])
def test_torchtitan_block_count_is_every_f_th_layer(n):
    """Block recompute of N of the 24 layers: torchtitan's every-f-th-layer checkpointing of as many layers,
    with a note that they are spread."""
    e = Execution(**PARTIAL, recompute="full", recompute_num_layers=n)
    text = torchtitan_toml(e, DENSE, "bf16")
    ac = tomllib.loads(text)["activation_checkpoint"]
    assert ac["mode"] == "selective" and DENSE.layers // int(ac["selective_ac_option"]) == n
    assert "# not expressed: block recompute" in text


def test_torchtitan_block_count_counts_per_model_chunk():
    """With pp 2 x v 2, a chunk holds 6 of the 24 layers: N = 2 is every 3rd layer of each chunk."""
    e = Execution(gpus=8, pp=2, dp=4, virtual_stages=2, micro_batch=1, global_batch=64, recompute="full",
                  recompute_num_layers=2)
    ac = tomllib.loads(torchtitan_toml(e, DENSE, "bf16"))["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "3"}


def test_torchtitan_block_count_without_an_every_f_th_equivalent_is_full_with_a_note():
    """24 // f is never 5: written as full, said so."""
    text = torchtitan_toml(Execution(**PARTIAL, recompute="full", recompute_num_layers=5), DENSE, "bf16")
    assert tomllib.loads(text)["activation_checkpoint"]["mode"] == "full"
    assert "no every-f-th-layer count gives 5" in text


def test_op_level_recompute_is_torchtitans_op_policy_and_a_megatron_note():
    """``selective-op`` is torchtitan's ``selective_ac_option = "op"`` without a note; Megatron-LM has no such
    argument (a note, no recompute written); the attention-core ``selective`` written for torchtitan says it is
    the op policy there."""
    e = Execution(**PARTIAL, recompute="selective-op")
    text = torchtitan_toml(e, DENSE, "bf16")
    assert tomllib.loads(text)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "recompute selective" not in text
    megatron = megatron_file(e, DENSE, "bf16")
    assert vendored_megatron_parser().parse_args(shlex.split(megatron, comments=True)).recompute_granularity is None
    assert "# not expressed: recompute selective-op" in megatron
    assert "# not expressed: recompute selective (the attention core)" in torchtitan_toml(
        Execution(**PARTIAL, recompute="selective"), DENSE, "bf16")


@pytest.mark.parametrize("exporter", ["megatron", "torchtitan"])
def test_deepspeed_offload_details_are_notes(exporter):
    """activation_offload_sync, offload_first_touch and ZeRO-Offload's per-bucket gradients are DeepSpeed's:
    neither framework has an option for them, so both exports name them in a note, with the bucket size given."""
    spec, e, precision = CASES[-1]
    export = megatron_file if exporter == "megatron" else torchtitan_toml
    text = export(e, spec, precision)
    assert "activation_offload_sync" in text and "reduce_bucket_numel 200000000" in text
    assert "offload_first_touch" in text
    plain = Execution(gpus=4, dp=4, zero=2, micro_batch=1, global_batch=8)
    plain_text = export(plain, spec, precision)
    assert all(n not in plain_text for n in ("activation_offload_sync", "offload_first_touch", "reduce_bucket_numel"))
