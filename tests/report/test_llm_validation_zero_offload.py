"""The ``deepspeed-zero-offload`` family: DeepSpeed's ZeRO-Offload tutorial run (a 10B GPT-2 on one V100 with
Adam on the CPU) against its published script and log, the dgx-2-v100 preset's figures, and the CPU step and the
parameters' return the prediction charges against closed forms from those figures."""

import math

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.report.llm_validation import FAMILIES, family_runs, run_cluster, summary, validate_llm
from mcdla.report.llm_validation_runs import ZERO_OFFLOAD_RUNS
from mcdla.sim.llm import llm_step
from mcdla.sim.llm_offload import cpu_adam_params_per_s, host_dram_bytes_per_s, tier_rejection
from mcdla.workload.transformer import preset

# microsoft/DeepSpeedExamples ece5e0e0 Megatron-LM/scripts/ds_zero-offload_10B_pretrain_gpt2_model_parallel.sh
# and ds_zero-offload_10B_config.json, as published.
SCRIPT = {"num_layers": 50, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 1024, "batch_size": 10,
          "num_gpus": 1, "gpt2_bpe_tokens": 50257, "make_vocab_size_divisible_by": 128,
          "reduce_bucket_size": 50000000, "overlap_comm": False}  # overlap_comm unset: v0.3.0's default
# "elapsed time per iteration (ms)" of iterations 8-10 in deepspeedai/DeepSpeed
# docs/assets/images/zero_offload_dp1_10B_log.png, read from the screenshot.
LOG_MS = (25765.4, 26756.4, 25680.7)
# The DGX-2's figures as the preset cites them: V100 SXM3 125 TFLOP/s fp16, 32 GB at 900 GB/s; Xeon Platinum 8168,
# 6 channels x DDR4-2666 (21.33 GB/s) per socket, 8 of the 16 GPUs per socket; PCIe 3.0 x16 16 GB/s x 0.8, a
# switch per two GPUs.
V100_FP16, V100_HBM, V100_HBM_BW = 125e12, 32e9, 900e9
SOCKET_DRAM, GPUS_PER_SOCKET, PCIE, PER_SWITCH = 6 * 21.33e9, 8, 16e9 * 0.8, 2
# ZeRO-Offload paper (Ren et al. 2021) Table 4: CPU-Adam over 10 billion parameters in 2.57 s on its DGX-2.
CPU_ADAM_PARAMS_PER_S = 10e9 / 2.57
# Azure HC-series (2 x Xeon Platinum 8168) performance page: "STREAM Triad | 190 GB/s", both sockets.
SOCKET_SUSTAINED = 190e9 / 2
# github.com/rapidsai/dask-cuda/issues/106: device-to-host copies into fresh host memory "at around 1.5-2.0 GB/s"
# (a DGX-1), the midpoint.
FIRST_TOUCH = (1.5e9 + 2.0e9) / 2


def test_family_is_registered_and_in_all():
    """One record, registered under its name and part of ``all``."""
    assert FAMILIES["deepspeed-zero-offload"] is ZERO_OFFLOAD_RUNS and len(ZERO_OFFLOAD_RUNS) == 1
    assert family_runs("deepspeed-zero-offload") is ZERO_OFFLOAD_RUNS
    assert all(run in family_runs("all") for run in ZERO_OFFLOAD_RUNS)
    assert {r.family for r in ZERO_OFFLOAD_RUNS} == {"deepspeed-zero-offload"}


def test_record_is_the_tutorial_script_and_its_log():
    """Model shape, batch and GPUs as the script sets them, the vocabulary padded as Megatron-LM pads it, and the
    measured time the mean of the three logged iterations; source and choices stated."""
    run = ZERO_OFFLOAD_RUNS[0]
    spec, e = preset(run.model), run.execution
    assert (spec.layers, spec.hidden, spec.heads, spec.seq_len) == (
        SCRIPT["num_layers"], SCRIPT["hidden_size"], SCRIPT["num_attention_heads"], SCRIPT["seq_length"])
    d = SCRIPT["make_vocab_size_divisible_by"]
    assert spec.vocab == math.ceil(SCRIPT["gpt2_bpe_tokens"] / d) * d
    assert spec.params() / 1e9 == pytest.approx(10, rel=0.05)  # "a 10-billion parameter GPT-2"
    assert (e.gpus, e.dp, e.micro_batch, e.global_batch) == (SCRIPT["num_gpus"], 1, SCRIPT["batch_size"],
                                                             SCRIPT["batch_size"])
    assert e.offload_optimizer and e.cpu_optimizer and not e.delayed_param_update
    assert e.reduce_bucket_numel == SCRIPT["reduce_bucket_size"] and e.dp_overlap == SCRIPT["overlap_comm"]
    assert e.recompute == "full" and e.offload_activations and e.activation_offload_sync
    assert e.attention == "materialized"
    assert run.precision == "fp16" and run.system == "dgx-2-v100"
    assert run.measured_s == pytest.approx(sum(LOG_MS) / len(LOG_MS) / 1e3, rel=1e-12)
    assert "zero_offload_dp1_10B_log.png" in run.source and "ece5e0e0" in run.source and run.choices


def test_dgx2_preset_carries_the_cited_figures():
    """The preset's V100 and host figures are the ones its sources give; the CPU's passes run at the socket's
    sustained DRAM bandwidth (below its peak), a whole node's GPU sharing it with 7 others and its PCIe switch with
    one, the one-GPU job having both to itself; the host's CPU-Adam rate is shared by the job's GPUs on the node,
    and moves Adam's 28 bytes per parameter faster than one socket sustains (so its measurement, not the socket's
    DRAM, prices Adam)."""
    c = load_cluster("dgx-2-v100")
    assert c.gpus_per_node == 16 and c.nodes == 1
    assert c.device.peak_flops_per_s["fp16"] == pytest.approx(V100_FP16, rel=1e-12)
    assert c.device.hbm_bytes == pytest.approx(V100_HBM, rel=1e-12)
    assert c.device.hbm_bytes_per_s == pytest.approx(V100_HBM_BW, rel=1e-12)
    assert SOCKET_SUSTAINED < SOCKET_DRAM
    assert host_dram_bytes_per_s(c) == pytest.approx(SOCKET_SUSTAINED / GPUS_PER_SOCKET, rel=1e-12)
    assert host_dram_bytes_per_s(c, 1) == pytest.approx(SOCKET_SUSTAINED, rel=1e-12)
    assert host_dram_bytes_per_s(c.without_offload().for_gpus(1)) is None
    assert c.pool_link().prefetch_bytes_per_s == pytest.approx(PCIE / PER_SWITCH, rel=1e-12)
    assert c.pool_link_for_gpus(1).prefetch_bytes_per_s == pytest.approx(PCIE, rel=1e-12)
    assert cpu_adam_params_per_s(c, 1) == pytest.approx(CPU_ADAM_PARAMS_PER_S, rel=1e-3)
    assert cpu_adam_params_per_s(c) == pytest.approx(CPU_ADAM_PARAMS_PER_S / 16, rel=1e-3)
    assert 28 * CPU_ADAM_PARAMS_PER_S > SOCKET_SUSTAINED


def test_run_is_valid_on_its_preset_and_charges_the_closed_forms():
    """The execution runs on the preset (no rejection). Its optimizer time is the CPU step of ``llm_offload``:
    the fp32 gradients' unscale (8 bytes per parameter) at the socket's sustained DRAM bandwidth, then Adam, the
    parameters at the host's CPU-Adam rate (the one GPU has both to itself);
    its exposed transfer the GPU's passes over the gradients (34 bytes per parameter at the HBM rate), the fp32
    gradients out (4 bytes, after the backward: no overlap_comm), the 16-bit
    parameters back (2 bytes) and the layers' checkpoints (batch x seq x hidden 2-byte elements each) out in the
    forward and back in the backward, blocking (cpu_checkpointing), each over the GPU's own PCIe switch uplink,
    out at the host's first-touch rate (fresh CPU tensors every iteration), which is below the link's."""
    run = ZERO_OFFLOAD_RUNS[0]
    spec, cluster = preset(run.model), run_cluster(run, None)
    assert tier_rejection(run.execution, cluster) is None
    step = llm_step(spec, run.execution, cluster, precision=run.precision)
    p = spec.params()
    assert step.optimizer_s == pytest.approx(8 * p / SOCKET_SUSTAINED + p / CPU_ADAM_PARAMS_PER_S, rel=1e-3)
    checkpoints = SCRIPT["num_layers"] * SCRIPT["batch_size"] * SCRIPT["seq_length"] * SCRIPT["hidden_size"] * 2
    # the GPU's passes before each gradient copy (DeepSpeed v0.3.0 copy_grads_in_partition: float64 norm 2 + 8 + 8,
    # overflow check 2 + 4 + 4, fp32 cast 2 + 4 bytes per parameter) at the V100's HBM rate x 0.8
    passes = ((2 + 8 + 8) + (2 + 4 + 4) + (2 + 4)) * p / (V100_HBM_BW * 0.8)
    assert FIRST_TOUCH < PCIE
    assert step.offload_s == pytest.approx(passes + (4 + 2) * p / PCIE + checkpoints / FIRST_TOUCH
                                           + checkpoints / PCIE, rel=1e-9)
    assert step.iteration_s == pytest.approx(step.compute_s + step.recompute_s + step.optimizer_s + step.offload_s,
                                             rel=1e-6)


def test_run_fits_with_the_gradients_leaving_bucket_by_bucket():
    """On the GPU: the 16-bit weights, one 5e7-element bucket of 16-bit gradients, the in-flight activations
    the model keeps (the checkpoints are in host memory): under the V100's 32 GB, as the run was."""
    run = ZERO_OFFLOAD_RUNS[0]
    step = llm_step(preset(run.model), run.execution, run_cluster(run, None), precision=run.precision)
    assert step.gradient_bytes == pytest.approx(2 * SCRIPT["reduce_bucket_size"], rel=1e-12)
    assert step.weight_bytes == pytest.approx(2 * preset(run.model).params(), rel=1e-12)
    assert step.fits and step.device_bytes < V100_HBM


def test_family_error_is_the_predicted_over_measured_ratio():
    """The reported error is predicted / measured - 1 and the summary its absolute value (one row)."""
    rows = validate_llm(None, ZERO_OFFLOAD_RUNS)
    run = ZERO_OFFLOAD_RUNS[0]
    predicted = llm_step(preset(run.model), run.execution, load_cluster("dgx-2-v100").for_gpus(1),
                         precision="fp16").iteration_s
    assert rows[0].error == pytest.approx(predicted / (sum(LOG_MS) / 3e3) - 1, rel=1e-9)
    assert summary(rows) == pytest.approx({"mean_abs_error": abs(rows[0].error), "max_abs_error": abs(rows[0].error)})
