"""Published runs of the families beyond Megatron-LM: torchtitan's FSDP2 runs, IBM's PyTorch FSDP runs (fms-fsdp),
Megatron-Bridge's MoE runs and DeepSpeed's ZeRO-Offload tutorial run.

Each record is copied from its source with the repository, path and commit, and states every field the source
does not publish (``choices``), chosen before comparing. Measured seconds per iteration are the source's
tokens per second per GPU turned into time: ``global_batch x seq_len / (tokens/s/GPU x GPUs)``.

* ``torchtitan-fsdp2``: torchtitan (PyTorch's reference trainer, FSDP2 = per-parameter ZeRO-3) on Llama 3,
  bf16, eager mode (no ``torch.compile``), no Float8: the rows of its published tables run that way. Three
  rows on 64 A100 80 GB (``docs/performance.md`` at torchtitan commit 4d88a8a4, "Llama 3 performance numbers"
  and the 405B row of "Llama 3.1 performance numbers"), three on Grand Teton H100
  (``benchmarks/llama3_h100_202412_torchtitan.md`` at commit 820504e2, Tables 1 and 3). The rows with
  ``torch.compile``, Float8 or async TP are left out: none of the three is modelled.
* ``pytorch-fsdp``: IBM's PyTorch FSDP (FSDP1) runs of Llama 2, eager mode, batch 2 per GPU, the throughput
  table of foundation-model-stack/fms-fsdp ``README.md`` at commit 4ffb9bdf (before it was re-measured with
  ``torch.compile``): 7B HSDP without AC, 34B and 70B FSDP with full AC on 128 A100 and on 96 H100. The 13B rows
  ("Selective AC": every k-th block checkpointed, k not published) are left out: a partial recompute is not
  expressible.
* ``megatron-bridge-moe``: Megatron-Bridge 25.11's ``performance-summary.md`` (NVIDIA-NeMo/Megatron-Bridge,
  commit 5776a6d9), the MoE rows the execution record expresses as published: seven Qwen3 rows and two
  DeepSeek-V3 rows, GB200 bf16 (PP4 VP4) and B200 FP8-MX (PP16), whose 61 layers the r0.2.0 recipe splits by its
  ``pipeline_model_parallel_layout`` for that PP x VP (``pipeline_layout``; MLA approximated, MTP and the router's
  group-limited top-k not modelled, each record's ``choices``). Left out, with the
  reason: DeepSeek-V3 on GB300 (PP2 VP4) and its GB200 FP8-MX row (PP8 VP4), for which neither the recipe's
  layout map (keys (1,1), (4,1), (8,1), (4,2), (16,1), (8,2), (4,4)) nor the configs give a layout, and 61
  layers do not split over 8 or 32 chunks without one (Megatron-Core's ``get_num_layers_to_build`` asserts),
  GPT-OSS 120B (alternating sliding-window attention is not modelled), Qwen3-235B on H100 (EP 32 over TP x DP,
  expert-parallel folding, is not expressible: EP must divide DP x CP), and the FP8-MX rows on H100 (none). Unpublished fields come from
  the 25.11 container's performance scripts (Megatron-Bridge r0.2.0), each named in the record's ``choices``;
  the 256-GPU GB jobs take 64 GPUs per NVL72 rack, as the launcher's Slurm segment places them
  (``MeasuredRun.gpus_per_node``). Four rows' layouts appear token-drop in the same page's 25.09 table; each of
  those records' ``choices`` gives that rate against its own (the alltoall rows at 0.50-0.76 of it, HybridEP's
  GB200 row at the same), evidence of the dropless alltoall path's host cost, which is not modelled.
* ``deepspeed-zero-offload``: DeepSpeed's ZeRO-Offload tutorial (deepspeedai/DeepSpeed
  ``docs/_tutorials/zero-offload.md``), a 10B GPT-2 on one V100-SXM3 32 GB with Adam on the CPU: its measured
  seconds are the mean "elapsed time per iteration" of the three iterations its log screenshot shows, its
  configuration the DeepSpeedExamples script of the same days (commit ece5e0e0), on the ``dgx-2-v100`` preset.

Nothing here is fitted except one GEMM peak fraction per PyTorch family (their sources say so) and one host figure
for the MoE family: the ``grand-teton-h100`` preset's peak fraction on torchtitan's three H100 rows (their 500 W clock
is not published), the ``fms-h100-800g`` preset's on fms-fsdp's three H100 rows (``dgx-h100`` has no fitted bf16
curve), and ``host_call_time`` (the host's time per launch of a grouped GEMM's per-expert loop, NOTE [expert
parallelism]) of ``dgx-h100``, ``b200``, ``gb200-nvl72`` and ``gb300-nvl72`` on the nine MoE rows.
"""

from __future__ import annotations

import functools

from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_records import MeasuredRun
from mcdla.workload.execution import Execution

CUDNN_25_11 = "cudnn-9.13.1"
"""The attention kernel build of the Megatron-Bridge 25.11 runs: NeMo Framework 25.11 ships cuDNN 9.13.1.26
(NVIDIA-NeMo/Megatron-Bridge r0.2.0 7af9601c and v0.2.1 1c43b392, ``docs/releases/software-versions.md``), whose
measured SDPA times the Blackwell presets carry (``node.attention_kernels``); no cuDNN 9.13.1 time on Hopper was
published, so the H100 rows keep the model's pricing."""

_CUDNN_CHOICE = ("attention at cuDNN 9.13.1's measured times (attention_kernel cudnn-9.13.1: NeMo Framework 25.11's "
                 "cuDNN 9.13.1.26, Megatron-Bridge r0.2.0 and v0.2.1 docs/releases/software-versions.md; the preset's "
                 "node.attention_kernels, NVIDIA/cudnn-frontend's published bf16 SDPA times over the model's)")
_CUDNN_H100 = ("attention at the model's pricing (the 25.11 container's cuDNN 9.13.1 has no published SDPA time on "
               "Hopper)")


@functools.cache
def _measures_cudnn_25_11(system: str) -> bool:
    """Whether the preset ``system`` carries the 25.11 container's cuDNN build (``node.attention_kernels``)."""
    return load_cluster(system).attention_kernel(CUDNN_25_11) is not None


def bridge_attention_kernel(system: str) -> dict[str, object]:
    """The execution field a Megatron-Bridge 25.11 row on ``system`` takes for its attention kernel: the
    container's cuDNN build where the preset measures it (the Blackwell presets), none otherwise (H100)."""
    return {"attention_kernel": CUDNN_25_11} if _measures_cudnn_25_11(system) else {}


def bridge_attention_note(system: str) -> str:
    """The record's stated choice for its attention kernel (:func:`bridge_attention_kernel`)."""
    return _CUDNN_CHOICE if _measures_cudnn_25_11(system) else _CUDNN_H100


__all__ = ["TORCHTITAN_RUNS", "FMS_FSDP_RUNS", "BRIDGE_MOE_RUNS", "ZERO_OFFLOAD_RUNS", "ZO_TUTORIAL_ITERATIONS_MS",
           "SOURCED_FAMILIES", "CUDNN_25_11", "bridge_attention_kernel", "bridge_attention_note"]

_TITAN_A100 = ("pytorch/torchtitan docs/performance.md (commit 4d88a8a44fe4), \"Llama 3 performance numbers\" "
               "(FSDP2 on 64 A100 80GB)")
_TITAN_405B = ("pytorch/torchtitan docs/performance.md (commit 4d88a8a44fe4), \"Llama 3.1 performance numbers\" "
               "(128 H100, FSDP2 + TP), Optimizations None")
_TITAN_H100 = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit 820504e20d11), Grand Teton "
               "H100, torchtitan 9dec370")
_TITAN_COMMON = ("seq 8192, bf16 with fp32 gradient reduction (torchtitan's mixed_precision_reduce default; reduced "
                 "as bf16 here); fsdp_prefetch 1 (FSDP2's forward and backward prefetch of the next layer); "
                 "dp_overlap off (the root module's reduce-scatter of the embedding, final norm and output runs "
                 "after the whole backward, its gather before the first layer; the layers' reduce-scatters overlap "
                 "the backward in the ZeRO-3 model itself); flash attention (SDPA); eager mode: fused_kernels "
                 "false (torchtitan's RMSNorm, RoPE, repeat_kv and SwiGLU as PyTorch ops, norm_type rmsnorm); "
                 "optimizer_kernels foreach (optimizer.fused defaults to false in config_manager.py, and "
                 "build_optimizers passes foreach=not fused: torchtitan/optimizer.py at 4d88a8a4 and 9dec370)")
_SAC = ("selective AC with selective_ac_option op (the train config's default) as recompute=selective-op, "
        "torchtitan's op policy: the outputs of wq, wv, w1, w2 and SDPA kept, wk, wo, w3 and the memory-bound "
        "kernels recomputed (parallelize_llama.py _save_list and _custom_policy, the same at 4d88a8a4 and 9dec370)")
_LAYER_SAC = ("selective layer AC, its frequency not published: config_manager.py's default selective_ac_option 2 "
              "(every second block wrapped in a full checkpoint, parallelize_llama.py at 4d88a8a4) as recompute=full "
              "with recompute_num_layers 16 of the 32 layers, recompute_method block: the same count and totals, the "
              "first 16 layers instead of every second one")


def _torchtitan(name: str, model: str, system: str, gpus: int, local_batch: int, tokens_per_s_per_gpu: float,
                source: str, choices: str, *, tp: int = 1, **execution: object) -> MeasuredRun:
    """A torchtitan row: FSDP2 (ZeRO-3) over ``gpus / tp`` ranks, global batch = local batch x FSDP ranks."""
    dp = gpus // tp
    gbs = local_batch * dp
    seconds = gbs * 8192 / (tokens_per_s_per_gpu * gpus)
    return MeasuredRun(
        name=name, model=model, system=system, measured_s=seconds, family="torchtitan-fsdp2",
        source=f"{source}: {tokens_per_s_per_gpu:,g} tokens/s/GPU on {gpus} GPUs, local batch {local_batch}",
        choices=f"{choices}; {_TITAN_COMMON}",
        execution=Execution(gpus=gpus, tp=tp, dp=dp, zero=3, fsdp_prefetch=1, micro_batch=local_batch,
                            global_batch=gbs, fused_kernels=False, optimizer_kernels="foreach",
                            **execution))  # type: ignore[arg-type]


TORCHTITAN_RUNS: tuple[MeasuredRun, ...] = (
    _torchtitan("llama3-8b A100 selective op", "llama3-8b", "dgx-a100", 64, 1, 2973, _TITAN_A100,
                f"the A100 cluster is not described: the dgx-a100 preset; {_SAC}", recompute="selective-op"),
    _torchtitan("llama3-8b A100 selective layer", "llama3-8b", "dgx-a100", 64, 1, 2904, _TITAN_A100,
                f"the A100 cluster is not described: the dgx-a100 preset; {_LAYER_SAC}", recompute="full",
                recompute_num_layers=16),
    _torchtitan("llama3-70b A100 full", "llama3-70b", "dgx-a100", 64, 1, 331, _TITAN_A100,
                "the A100 cluster is not described: the dgx-a100 preset; full AC", recompute="full"),
    _torchtitan("llama3-8b H100 8 GPUs", "llama3-8b", "grand-teton-h100", 8, 2, 5762, f"{_TITAN_H100}, Table 1 FSDP",
                _SAC, recompute="selective-op"),
    _torchtitan("llama3-8b H100 128 GPUs", "llama3-8b", "grand-teton-h100", 128, 2, 5605,
                f"{_TITAN_H100}, Table 3 FSDP", _SAC, recompute="selective-op"),
    _torchtitan("llama3-405b H100 FSDP16 TP8", "llama3-405b", "grand-teton-h100", 128, 2, 109, _TITAN_405B,
                "the 128 H100 of the 405B row are taken as the Grand Teton hosts of the later tables; full AC; TP "
                "with sequence parallelism (torchtitan's SequenceParallel norms), no async TP",
                tp=8, recompute="full", sequence_parallel=True),
)
"""torchtitan's eager bf16 FSDP2 runs on A100 and Grand Teton H100."""

_FMS = ("foundation-model-stack/fms-fsdp README.md (commit 4ffb9bdf), \"Training throughput benchmarks\" (PyTorch "
        "FSDP, eager, batch size 2 per GPU, seq 4096)")
_FMS_COMMON = ("bf16 parameters and reductions (fms-fsdp's bfSixteen policy); fsdp_prefetch 1 (FSDP's default "
               "backward prefetch, limit_all_gathers); flash attention (SDPA); eager mode, each PyTorch op a kernel: "
               "fused_kernels false, rope_kernels rotation (foundation-model-stack 6440fee8, the ibm-fms fms-fsdp "
               "installed: fms/modules/positions.py adjusted_qk); optimizer_kernels foreach (optim.AdamW with neither "
               "foreach nor fused given, clip_grad_norm_ each step)")


_HSDP = (", hsdp_shard=8, dp_overlap (FSDP1's _reduce_grad all-reduces each unit's shard across the replicas "
         "right after its reduce-scatter, on its all-reduce stream: NOTE [HSDP all-reduce as issued])")


def _fms(model: str, system: str, gpus: int, tokens_per_s_per_gpu: float, strategy: str,
         recompute: str) -> MeasuredRun:
    """An fms-fsdp row: FSDP (ZeRO-3 over all GPUs) or HSDP (sharded in the 8-GPU node, replicated across),
    batch 2 per GPU."""
    seconds = 2 * gpus * 4096 / (tokens_per_s_per_gpu * gpus)
    size = model.removeprefix("llama2-")
    gpu = "A100" if "a100" in system else "H100"
    ac = {"none": "No AC", "full": "Full AC"}[recompute]
    return MeasuredRun(
        name=f"{model} {gpu} {strategy.upper()}", model=model, system=system, measured_s=seconds,
        family="pytorch-fsdp",
        source=f"{_FMS}: {size} {strategy.upper()} {ac}, {tokens_per_s_per_gpu:,g} tokens/s/GPU on {gpus} {gpu}",
        choices=f"{strategy.upper()} -> zero=3{_HSDP if strategy == 'hsdp' else ''}; {_FMS_COMMON}",
        execution=Execution(gpus=gpus, dp=gpus, zero=3, fsdp_prefetch=1, hsdp_shard=8 if strategy == "hsdp" else 0,
                            dp_overlap=strategy == "hsdp", micro_batch=2, global_batch=2 * gpus, recompute=recompute,
                            fused_kernels=False, rope_kernels="rotation",
                            optimizer_kernels="foreach"))  # type: ignore[arg-type]


FMS_FSDP_RUNS: tuple[MeasuredRun, ...] = (
    _fms("llama2-7b", "fms-a100-400g", 128, 3700, "hsdp", "none"),
    _fms("llama2-34b", "fms-a100-400g", 128, 700, "fsdp", "full"),
    _fms("llama2-70b", "fms-a100-400g", 128, 370, "fsdp", "full"),
    _fms("llama2-7b", "fms-h100-800g", 96, 7500, "hsdp", "none"),
    _fms("llama2-34b", "fms-h100-800g", 96, 1550, "fsdp", "full"),
    _fms("llama2-70b", "fms-h100-800g", 96, 800, "fsdp", "full"),
)
"""IBM's PyTorch FSDP runs of Llama 2 on 128 A100 and 96 H100 (fms-fsdp), eager mode."""

_BRIDGE_SUMMARY = ("Megatron-Bridge 25.11 performance-summary.md (NVIDIA-NeMo/Megatron-Bridge, commit "
                   "5776a6d90b4d), seq 4096")
_BRIDGE_RECIPES = ("the 25.11 container's performance scripts (Megatron-Bridge r0.2.0, tag v0.2.0 at commit 7af9601c9da7, "
                   "scripts/performance: configs/qwen3/qwen3_llm_pretrain.py, configs/qwen3/workload_base_configs.py, "
                   "utils/executors.py; src/megatron/bridge/models/qwen/qwen_provider.py)")
_MOE_COMMON = ("distributed optimizer as ZeRO-1; dp_overlap on (src/megatron/bridge/recipes/qwen/qwen3_moe.py "
               "_qwen3_moe_common: DistributedDataParallelConfig overlap_grad_reduce and overlap_param_gather True); "
               "with interleaving pp_comm_overlap on (training/comm_overlap.py: overlap_p2p_comm True when vp > 1); "
               "no recompute (set_qwen3_common_configs sets recompute_granularity "
               "None over the 30B recipe's uniform full recompute); grouped GEMM (the provider's moe_grouped_gemm "
               "True); permute fusion (moe_permute_fusion True: the permutations' HBM bytes as its fused kernels "
               "move them); router fusion (moe_router_fusion True) not modelled apart; token-dropless "
               "with forced balance (moe_router_force_load_balancing True, no moe_expert_capacity_factor): every "
               "expert at its mean load, capacity_factor 1; expert TP 1 (expert_tensor_parallel_size 1, = TP here); "
               "flash attention; " + _BRIDGE_RECIPES)
_ALLTOALL = ("token dispatcher alltoall (the provider's default; no flex backend in the B200 and H100 configs); its "
             "host synchronisation of the per-expert token counts in every MoE layer's forward (Megatron-Core 0.15 "
             "MoEAlltoAllTokenDispatcher, cuda_sync_point before_ep_alltoall; HybridEP's dropless dispatch and "
             "TEGroupedMLP's tokens_per_expert.tolist() sync as well) and the host time it exposes are not modelled")
_HYBRIDEP = ("token dispatcher flex with the HybridEP backend (moe_flex_dispatcher_backend hybridep in the GB200 and "
             "GB300 configs) as ep_dispatcher hybridep: each token sent once to each rank holding one of its experts, "
             "in bf16, at DeepEP's measured GB200 algorithm bandwidth for 32 SMs (Megatron-Bridge's "
             "moe_hybridep_num_sms 32, scripts/performance/utils/helpers.py), the rows permuted on the destination "
             "(Megatron-LM 0d8e0714 fused_a2a.py HybridEPDispatch; NOTE [expert parallelism]); not overlapped with "
             "compute (no moe_a2a_overlap in these configs); the GB300 rows at the GB200 measurement (the same "
             "NVLink 5)")

_FP8_PAD = ("fp8 row padding charged: TEGroupedMLP.forward (Megatron-LM 0d8e0714 megatron/core/transformer/moe/"
            "experts.py) pads each local expert's bf16 rows to a multiple of 16 (32 with MXFP8) and unpads the fc2 "
            "output (Transformer Engine 2.9 Fp8Padding, Fp8Unpadding: fused_multi_row_padding, skipped only when "
            "every split is aligned, which the dropless counts are not; moe_router_padding_for_quantization unset), "
            "4 R h bf16 elements read and written each way (R the rows the rank's experts take) and 3 launches "
            "each way (sim/llm_moe.py fp8_padding_bytes, fp8_padding_launches)")
_FP8_PAD_HYBRIDEP = ("no separate fp8 row padding: HybridEP's permute rounds each expert's rows up to the fp8 "
                     "alignment (pad_multiple, Megatron-LM 0d8e0714 token_dispatcher.py _HybridEPManager), so "
                     "Transformer Engine's Fp8Padding finds every split aligned")


def _token_drop(drop: float, dropless: float, precision: str) -> str:
    """The note of a row whose layout the same page's 25.09 table also ran, token-drop (``drop`` tokens/s/GPU):
    the same-layout evidence of what the dropless path costs on its dispatcher."""
    ratio = drop / dropless
    verdict = ("the dropless alltoall path's cost, not modelled" if ratio > 1.05
               else "the same within 5%")
    return (f"the same page's 25.09 table runs this layout token-drop at {drop:,g} tokens/s/GPU ({precision}), "
            f"{ratio:.2f}x this dropless row: {verdict}")


def _bridge_moe(system: str, model: str, gpus: int, precision: str, gbs: int, mbs: int, tp: int, pp: int,
                vp: int, ep: int, tokens_per_s_per_gpu: float, choices: str, *, gpus_per_node: int = 0,
                common: str = _MOE_COMMON, table_mbs: int = 0, table_vp: int = 0,
                **execution: object) -> MeasuredRun:
    """One 25.11 row; ``table_mbs`` and ``table_vp`` are the table's MBS and VP where the configuration that ran
    sets ``mbs`` and ``vp`` instead (the row's layout columns copied from the 25.09 table, docs/llm.md)."""
    seconds = gbs * 4096 / (tokens_per_s_per_gpu * gpus)
    hybridep = system.startswith("gb")
    execution.update(bridge_attention_kernel(system))
    choices += "; " + bridge_attention_note(system)
    dispatcher = _HYBRIDEP if hybridep else _ALLTOALL
    if precision == "fp8":
        dispatcher += "; " + (_FP8_PAD_HYBRIDEP if hybridep else _FP8_PAD)
    return MeasuredRun(
        name=f"{model} {system}", model=model, system=system, precision=precision, measured_s=seconds,
        family="megatron-bridge-moe", gpus_per_node=gpus_per_node,
        source=f"{_BRIDGE_SUMMARY}: {tokens_per_s_per_gpu:,g} tokens/s/GPU on {gpus} GPUs, GBS {gbs}, MBS {table_mbs or mbs}, "
               f"TP{tp} PP{pp} VP{table_vp or vp} EP{ep}",
        choices=f"{choices}; {dispatcher}; {common}",
        execution=Execution(gpus=gpus, tp=tp, pp=pp, dp=gpus // (tp * pp), virtual_stages=vp, ep=ep, zero=1,
                            micro_batch=mbs, global_batch=gbs, sequence_parallel=tp > 1, dp_overlap=True,
                            pp_comm_overlap=vp > 1, ep_dispatcher="hybridep" if hybridep else "alltoall",
                            **execution))  # type: ignore[arg-type]


_MX = ("FP8-MX (MXFP8, 32-element block scales) as fp8 with fp8_scaling mxfp8: its GEMMs at the fp8 peak, one cast "
       "kernel per expert split")
_SPLIT_235B = ("94 layers split with the embedding and the loss counted as layers (the Qwen3-235B-A22B recipe's "
               "account_for_*_in_pipeline_split)")
_RACK_64 = ("64 GPUs per NVL72 rack: the launcher (utils/executors.py) asks Slurm for --segment 16 on a 64-tray GB "
            "job, the largest tray count up to 18 that divides it, so each rack holds 16 of its 18 four-GPU trays' "
            "GPUs of the job")

_SPLIT_RACK = f"{_SPLIT_235B}; {_RACK_64}"
_GRAPH = ("the pre-MLP norm, the router and the dispatcher's preprocess in a CUDA graph as moe_router_graph "
          "(cuda_graph_impl transformer_engine, cuda_graph_scope moe_router and moe_preprocess in this config of "
          "scripts/performance/configs/qwen3/workload_base_configs.py): one graph launch a layer each way")
_NO_GRAPH = ("no CUDA graph (this config of scripts/performance/configs/qwen3/workload_base_configs.py sets no "
             "cuda_graph_scope): the pre-MLP norm's, the router's and the alltoall preprocess's launches charged at "
             "host_call_time each (sim/llm_moe.py router_preprocess_launches)")
_SPLIT_KW = dict(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)

_DSV3_RECIPES = ("the 25.11 container's performance scripts (Megatron-Bridge r0.2.0, tag v0.2.0 at commit "
                 "7af9601c9da7: scripts/performance/configs/deepseek/deepseek_llm_pretrain.py and "
                 "workload_base_configs.py, src/megatron/bridge/recipes/deepseek/deepseek_v3.py, "
                 "src/megatron/bridge/models/deepseek/deepseek_provider.py)")
_DSV3_COMMON = ("61 layers split by the recipe's pipeline_model_parallel_layout for this PP x VP (deepseek_v3.py "
                "layout_map: the embedding and 4 layers, 14 chunks of 4, 1 layer with the loss) as pipeline_layout "
                "'Et*4|(t*4|)*14tL'; MLA run as expanded multi-head attention (the preset: its projections' FLOPs "
                "and parameters exact, the attention core and Q/K/V over the 192/128 per-head dimensions); "
                "the 3 leading dense layers (first_k_dense_replace) and the shared expert in the model's counts, "
                "each chunk timed with its own dense and MoE layers (the 3 dense ones on the first chunk, layers "
                "0-3, as Megatron-Core numbers them; every other chunk, the pacing stages' included, MoE layers "
                "only; the memory with the mean layer); the router's group-limited top-k (8 groups, top 4), "
                "sigmoid scores and expert bias not modelled: with forced balance "
                "(moe_router_force_load_balancing True) every "
                "expert at its mean load, capacity_factor 1, its launches counted as the Qwen3 router's; "
                "selective recompute of the MLA up-projections (deepseek_llm_pretrain.py recompute_granularity "
                "selective, the GB200 and B200 configs recompute_modules ['mla_up_proj'], set by "
                "utils/helpers.py set_recompute_overrides) as recompute selective with recompute_modules "
                "mla_up_proj: the q and kv up projections re-run in the backward at the GEMM rate (9 % of the "
                "mean layer's forward GEMM FLOPs) and Q, K, V not stored (Megatron-LM 0d8e0714 "
                "multi_latent_attention.py, CheckpointWithoutOutput), the attention core not recomputed (no "
                "core_attn); distributed optimizer (use_distributed_optimizer True) as ZeRO-1, its precision-aware "
                "state (use_precision_aware_optimizer: bf16 moments and main gradients) not modelled, the state "
                "counted as fp32 Adam's; dp_overlap on (the "
                "configs set overlap_grad_reduce True, the recipe overlap_param_gather); with interleaving "
                "pp_comm_overlap on (training/comm_overlap.py: overlap_p2p_comm when vp > 1); grouped GEMM "
                "(moe_grouped_gemm True), permute fusion (moe_permute_fusion True), router fusion "
                "(moe_router_fusion True) not modelled apart; expert TP 1; TP 1 (no sequence parallelism); flash "
                "attention; " + _DSV3_RECIPES)
_MLA_UP = dict(recompute="selective", recompute_modules=("mla_up_proj",))
_DSV3_MTP = ("the table's 'w/ MTP': the recipe's one multi-token-prediction layer (mtp_num_layers 1, on the last "
             "stage with the loss: 'Et*4|(t*4|)*14tmL') not modelled, so the last stage lacks one MoE layer, its "
             "embedding-and-hidden projection and a second output layer and loss; it holds 1 of the 4 layers of "
             "the other stages")

_COPIED = ("the table's MBS/VP columns equal the 25.09 table's row of this system and model while the container's "
           "config (r0.2.0 7af9601c scripts/performance/configs/qwen3/workload_base_configs.py) and main at the "
           "table's commits (97ad8cc6, 5776a6d9: configs/qwen/qwen3_workload_base_configs.py) set another: the "
           "record follows the config that ran")

_A2A_OVERLAP = ("moe_a2a_overlap True (overlap_moe_expert_parallel_comm and delay_wgrad_compute, "
                "set_moe_a2a_overlap_overrides): the all-to-alls hidden behind the other micro-batch's compute in "
                "the combined 1F1B steps; its host cost not modelled")

BRIDGE_MOE_RUNS: tuple[MeasuredRun, ...] = (
    _bridge_moe("dgx-h100", "qwen3-30b-a3b", 16, "fp8", 512, 1, 1, 2, 12, 8, 5275,
                "MBS 1 and VP 12 as QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG (virtual_pipeline_model_parallel_size 12, "
                "micro_batch_size the WorkloadBaseConfig default 1, utils/utils.py), not the table's MBS 2 VP 24 "
                f"GA 32: {_COPIED}; "
                "FP8-CS as fp8 with fp8_scaling current (amax, scale and cast kernels per expert split); "
                f"{_A2A_OVERLAP} (the H100 configs); {_NO_GRAPH}; {_token_drop(10494, 5275, 'FP8-CS, at MBS 2 VP 24')}",
                table_mbs=2, table_vp=24, moe_a2a_overlap=True),
    _bridge_moe("b200", "qwen3-30b-a3b", 8, "fp8", 512, 1, 1, 1, 1, 8, 9299,
                f"{_MX}; {_GRAPH}; {_token_drop(18066, 9299, 'FP8-CS, no FP8-MX figure')}", fp8_scaling="mxfp8",
                moe_router_graph=True),
    _bridge_moe("gb200-nvl72", "qwen3-30b-a3b", 8, "fp8", 512, 4, 1, 1, 1, 8, 23766,
                f"{_MX}; {_GRAPH}; {_token_drop(23723, 23766, 'FP8-MX')}", fp8_scaling="mxfp8", moe_router_graph=True),
    _bridge_moe("gb300-nvl72", "qwen3-30b-a3b", 8, "fp8", 512, 8, 1, 1, 1, 8, 28934,
                "MBS 8 (GA 8) as the configuration that ran, where the table says MBS 4 with GA 16: every GB300 30B "
                "config from its first (Megatron-Bridge main bf75c658, Megatron-Bridge#971, 2025-11-06) through "
                "r0.2.0 (7af9601c) and main at the table's commits (97ad8cc6, 5776a6d9) sets micro_batch_size=8, and "
                "no version sets 4; the table's first GB300 section (97ad8cc6, Megatron-Bridge#1596) gave its Qwen3 "
                "rows the GB200 rows' layout columns (its GB300 235B row MBS 1 GA 32 where the r0.2.0 config sets 4),"
                " Megatron-Bridge#1669 replaced the other GB300 rows and left this one; 26.02 lists it at MBS 8, "
                "30,376 tokens/s/GPU "
                f"(+5.0 %, GB200 30B at MBS 4 +9.8 %); {_MX}; {_GRAPH}",
                fp8_scaling="mxfp8", moe_router_graph=True, table_mbs=4),
    _bridge_moe("gb200-nvl72", "qwen3-235b-a22b", 256, "bf16", 8192, 1, 1, 8, 3, 32, 4916,
                f"{_SPLIT_RACK}; {_GRAPH} (and attention, cuda_graph_scope attn, not modelled)", gpus_per_node=64,
                moe_router_graph=True, **_SPLIT_KW),
    _bridge_moe("gb300-nvl72", "qwen3-235b-a22b", 256, "bf16", 8192, 2, 1, 4, 12, 16, 6131,
                f"{_SPLIT_RACK}; {_GRAPH}", gpus_per_node=64, moe_router_graph=True, **_SPLIT_KW),
    _bridge_moe("b200", "qwen3-235b-a22b", 64, "fp8", 1024, 1, 1, 8, 4, 8, 3269,
                "VP 4 as QWEN3_235B_A22B_B200_FP8_CS_BASE_CONFIG (virtual_pipeline_model_parallel_size 4), not the "
                f"table's VP 2: {_COPIED}; "
                f"{_MX}; {_SPLIT_235B}; {_A2A_OVERLAP} (the B200 configs); {_NO_GRAPH}; "
                f"{_token_drop(4275, 3269, 'FP8-MX, at VP 2')}",
                fp8_scaling="mxfp8", table_vp=2, moe_a2a_overlap=True, **_SPLIT_KW),
    _bridge_moe("gb200-nvl72", "deepseek-v3-671b", 256, "bf16", 4096, 1, 1, 4, 4, 64, 3139,
                "the table's 'w/o MTP' (no multi-token-prediction layer); GBS 4096 as the table (the r0.2.0 GB200 "
                "config says 2048); the pre-MLP norm, router and preprocess in a CUDA graph as moe_router_graph "
                "(cuda_graph_scope moe_router and moe_preprocess in the GB200 config); the shared expert's overlap "
                "off (apply_flex_dispatcher_backend sets moe_shared_expert_overlap False with HybridEP); "
                f"{_RACK_64}", gpus_per_node=64, common=_DSV3_COMMON, moe_router_graph=True,
                pipeline_layout="Et*4|(t*4|)*14tL", **_MLA_UP),
    _bridge_moe("b200", "deepseek-v3-671b", 256, "fp8", 2048, 1, 1, 16, 1, 8, 2139,
                f"{_MX}; {_DSV3_MTP}; token dispatcher alltoall (no flex backend in the B200 config: the "
                "provider's default), with the provider's moe_shared_expert_overlap True (the shared expert beside "
                "the dispatch on a side stream) not modelled; no CUDA graph (the B200 config sets no "
                "cuda_graph_scope): the pre-MLP norm's, the router's and the alltoall preprocess's launches charged "
                "at host_call_time each; moe_a2a_overlap False", common=_DSV3_COMMON, fp8_scaling="mxfp8",
                pipeline_layout="Et*4|(t*4|)*14tL", **_MLA_UP),
)
"""Megatron-Bridge 25.11's MoE runs: Qwen3 30B-A3B on H100, B200, GB200, GB300; Qwen3 235B-A22B on GB200, GB300,
B200; DeepSeek-V3 671B on GB200 (bf16) and B200 (FP8-MX)."""

_ZO_TUTORIAL = ("deepspeedai/DeepSpeed docs/_tutorials/zero-offload.md and its training-log screenshot "
                "docs/assets/images/zero_offload_dp1_10B_log.png (commit 38327e07f6cd), one V100-SXM3 32 GB")
_ZO_SCRIPT = ("microsoft/DeepSpeedExamples commit ece5e0e0 (9 Sep 2020, \"ZeRO-Offload updates\"), "
              "Megatron-LM/scripts/ds_zero-offload_10B_pretrain_gpt2_model_parallel.sh and "
              "ds_zero-offload_10B_config.json")
ZO_TUTORIAL_ITERATIONS_MS: tuple[float, ...] = (25765.4, 26756.4, 25680.7)
"""The "elapsed time per iteration (ms)" of iterations 8, 9 and 10 in the tutorial's log screenshot (the three
the screenshot shows; logged 2020-09-10, the day after the script's commit)."""


def _zero_offload_tutorial() -> MeasuredRun:
    """The 10B GPT-2 of DeepSpeed's ZeRO-Offload tutorial on one V100: its measured seconds per iteration are the
    mean of the three iterations its log screenshot shows (no FLOP count involved)."""
    seconds = sum(ZO_TUTORIAL_ITERATIONS_MS) / len(ZO_TUTORIAL_ITERATIONS_MS) / 1e3
    shown = ", ".join(f"{ms:g}" for ms in ZO_TUTORIAL_ITERATIONS_MS)
    return MeasuredRun(
        name="gpt2-10b ZeRO-Offload 1 V100", model="gpt2-10b", system="dgx-2-v100", precision="fp16",
        measured_s=seconds, family="deepspeed-zero-offload",
        source=f"{_ZO_TUTORIAL}: elapsed time per iteration {shown} ms (iterations 8-10), batch 10; configuration "
               f"from {_ZO_SCRIPT}: 50 layers, hidden 4096, 32 heads, seq 1024, batch 10, fp16",
        choices=("ZeRO stage 2 with cpu_offload on one GPU -> zero=0 with offload_optimizer and cpu_optimizer (one "
                 "rank: nothing to shard; the execution record takes zero >= 1 only with dp > 1), DeepSpeedCPUAdam "
                 "(--cpu-optimizer); full recompute (--checkpoint-activations) with the checkpoints in host memory "
                 "(activation_checkpointing.cpu_checkpointing true) -> offload_activations with "
                 "activation_offload_sync "
                 "(DeepSpeed v0.3.0's CheckpointFunction copies each checkpoint into a pageable CPU tensor and "
                 "back with a blocking copy_); offload_first_touch (those CPU tensors come from new_empty at the "
                 "first layer of every iteration, 83.9 MB each, above glibc's mmap threshold, so each forward's "
                 "copies land in fresh pages: node.sockets.first_touch_copy); no delayed parameter "
                 "update (the config sets none); overlap_comm unset (False by default at DeepSpeed v0.3.0, "
                 "runtime/zero/constants.py) -> dp_overlap false: the fp32 gradient copies run on the compute "
                 "stream after each bucket's reduction; reduce_bucket_size 5e7 -> reduce_bucket_numel; "
                 "materialized attention (Megatron-LM GPT-2 of 2020, no flash "
                 "attention); the tutorial names a single V100-SXM3 32 GB, not its host: the dgx-2-v100 preset, "
                 "the machine of the ZeRO-Offload paper's evaluation, with the job's one GPU sized by its GPUs"),
        execution=Execution(gpus=1, dp=1, zero=0, micro_batch=10, global_batch=10, recompute="full",
                            offload_activations=True, offload_optimizer=True, cpu_optimizer=True,
                            attention="materialized", reduce_bucket_numel=50_000_000,
                            activation_offload_sync=True, offload_first_touch=True))


ZERO_OFFLOAD_RUNS: tuple[MeasuredRun, ...] = (_zero_offload_tutorial(),)
"""DeepSpeed's ZeRO-Offload (Adam on the CPU) on one V100: the tutorial's 10B GPT-2 run."""

SOURCED_FAMILIES: dict[str, tuple[MeasuredRun, ...]] = {
    "torchtitan-fsdp2": TORCHTITAN_RUNS,
    "pytorch-fsdp": FMS_FSDP_RUNS,
    "megatron-bridge-moe": BRIDGE_MOE_RUNS,
    "deepspeed-zero-offload": ZERO_OFFLOAD_RUNS,
}
"""The families of this module by name, registered into :data:`mcdla.report.llm_validation.FAMILIES`."""
