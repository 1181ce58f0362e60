"""ZeRO-Offload (Adam on the CPU, delayed parameter update) and ZeRO-Infinity (NVMe tier) against closed forms."""

import pytest

from mcdla.errors import ConfigError, HardwareError
from mcdla.hardware.cluster import cluster_from_dict, load_cluster
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.sim.llm_offload import (grad_pass_bytes, gradient_passes_s, host_dram_bytes_per_s, nvme_bytes_per_s,
                                   tier_rejection)
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import TransformerSpec, layer_fwd_flops

SMALL = TransformerSpec(name="s", layers=8, hidden=1024, heads=16, vocab=1, seq_len=1024)
DRAM, LINK, READ, WRITE = 100e9, 10e9, 8e9, 4e9  # socket DRAM, GPU link, per-drive NVMe read and write
GPUS = 4  # per node, all on one socket: each GPU gets DRAM / 4; two drives: each GPU gets 2 x READ / 4
HBM = 1e15  # the most a file may give: the layers' elementwise kernels take ~1e-7 s, which the last backward
NEAR = 1e-3  # hides of a transfer: at most ~2e-4 of the figures below, hence this tolerance where it matters


def _cluster(peak=1e18, nvme=True, dram=DRAM, pool=1e12, drive=1e12, cpu_adam=None, hbm=HBM, sustained=None,
             sockets=1, first_touch=None):
    node = {"gpus": GPUS, "source": "test",
            "gpu": {"peak_flops_per_s": {"bf16": peak}, "hbm": 80e9, "hbm_bandwidth": hbm, "source": "test"},
            "gemm_efficiency": {"peak_fraction": 1.0, "half_width": 0.0, "source": "test"},
            "scale_up": {"bandwidth": 1e15, "source": "test"},
            "sockets": {"count": sockets, "source": "test",
                        "memory": {"kind": "host", "capacity": pool, "dram_bandwidth": dram, "source": "test"},
                        "gpu_link": {"kind": "pcie", "bandwidth": LINK, "source": "test"}}}
    if cpu_adam is not None:
        node["sockets"]["cpu_adam"] = {"params_per_s": cpu_adam, "source": "test"}
    if sustained is not None:
        node["sockets"]["sustained_dram"] = {"bandwidth": sustained, "source": "test"}
    if first_touch is not None:
        node["sockets"]["first_touch_copy"] = {"bandwidth": first_touch, "source": "test"}
    if nvme:
        node["nvme"] = {"drives": 2, "capacity": drive, "read_bandwidth": READ, "write_bandwidth": WRITE,
                        "source": "test"}
    return cluster_from_dict({"format": "mcdla-system/1", "name": "t", "node": node,
                              "scale_out": {"nodes": 1, "bandwidth": 1e15, "source": "test"}}, "test")


def _execution(**kw):
    return Execution(gpus=GPUS, dp=GPUS, zero=2, micro_batch=1, global_batch=GPUS * 2, offload_optimizer=True, **kw)


P = SMALL.params() / GPUS  # the rank's shard of the parameters
# DeepSpeed v0.3.0 stage2.py copy_grads_in_partition, per 16-bit gradient element before its copy to the host:
# .double() (read 2, write 8) and .norm(2) (read 8); _has_inf_or_nan's .float() (2 + 4) and .sum() (4); the fp32
# cast (2 + 4). At the file's HBM rate times the default memory_efficiency 0.8.
PASS_BYTES = (2 + 8 + 8) + (2 + 4 + 4) + (2 + 4)
GPU_RATE = HBM * 0.8


def test_cpu_step_streams_unscale_and_adam_at_the_gpus_share_of_host_dram():
    """No compute to hide anything: the step is the fp32 gradients' unscale (8 P) and Adam (28 P) at DRAM / 4;
    the GPU's passes over the gradients (34 P at its HBM rate), the fp32 gradients out (4 P) and the 16-bit
    parameters back (2 P) over the link, all exposed (no dp_overlap: DeepSpeed's copies on the compute
    stream)."""
    step = llm_step(SMALL, _execution(cpu_optimizer=True), _cluster())
    assert step.optimizer_s == pytest.approx((8 + 28) * P / (DRAM / GPUS), rel=1e-12)
    assert step.offload_s == pytest.approx(PASS_BYTES * P / GPU_RATE + 4 * P / LINK + 2 * P / LINK, rel=1e-12)


def test_gradient_passes_before_the_copies_at_the_gpus_memory_rate():
    """The GPU's passes over the gradients before their copies (norm, overflow check, fp32 cast: 34 bytes per
    element of the rank's shard) take 34 P / (HBM x 0.8); with a slow HBM they are a visible part of the exposed
    transfer, exactly the difference between two clusters differing only in HBM rate."""
    slow, fast = 1e12, HBM
    e = _execution(cpu_optimizer=True)
    got = llm_step(SMALL, e, _cluster(hbm=slow)).offload_s - llm_step(SMALL, e, _cluster(hbm=fast)).offload_s
    assert got == pytest.approx(34 * P / (slow * 0.8) - 34 * P / (fast * 0.8), rel=1e-9)
    assert 34 * P / (slow * 0.8) > 0.005 * (4 * P / LINK)


def test_fp32_gradients_skip_the_copy_and_the_cast():
    """An fp32 gradient needs no fp32 copy for its overflow sum and no cast before its copy: its passes read
    4 + 8 + 8 (norm) and 4 (sum), 24 bytes, where a 16-bit one takes 34; every term scales with the parameters."""
    assert grad_pass_bytes(4) == 4 + 8 + 8 + 4
    assert grad_pass_bytes(2) == PASS_BYTES == 34
    c = _cluster(hbm=1e12)
    assert gradient_passes_s(c, 3e9, 4) == pytest.approx(24 * 3e9 / 0.8e12, rel=1e-12)


def test_one_gpu_job_has_the_socket_and_its_link_to_itself():
    """A job of one GPU on the 4-GPU socket: the socket's DRAM and the link are its own (the engine's rule,
    Cluster.paths_for_gpus), and it holds all the parameters (no data parallelism)."""
    e = Execution(gpus=1, micro_batch=1, global_batch=2, offload_optimizer=True, cpu_optimizer=True)
    p = SMALL.params()
    step = llm_step(SMALL, e, _cluster())
    assert host_dram_bytes_per_s(_cluster(), 1) == pytest.approx(DRAM, rel=1e-12)
    assert step.optimizer_s == pytest.approx((8 + 28) * p / DRAM, rel=1e-12)
    assert step.offload_s == pytest.approx(PASS_BYTES * p / GPU_RATE + 4 * p / LINK + 2 * p / LINK, rel=1e-12)


@pytest.mark.parametrize("gpus", [1, GPUS])
@pytest.mark.parametrize("rate", [1e9, 1e13])  # parameters/s: 28 B x rate below and far above DRAM / 4
def test_cpu_adam_at_the_hosts_measured_rate_shared_by_the_jobs_gpus(gpus, rate):
    """With node.sockets.cpu_adam, Adam takes P at the rate over the job's GPUs on the node (each GPU's process
    runs its own step over the host's cores), a measurement of the whole loop that takes the place of the 28 P
    at the DRAM share, below or above it; the unscale stays at the DRAM share."""
    e = (Execution(gpus=1, micro_batch=1, global_batch=2, offload_optimizer=True, cpu_optimizer=True) if gpus == 1
         else _execution(cpu_optimizer=True))
    p = SMALL.params() / gpus
    dram = DRAM if gpus == 1 else DRAM / GPUS
    step = llm_step(SMALL, e, _cluster(cpu_adam=rate))
    assert step.optimizer_s == pytest.approx(8 * p / dram + p / (rate / gpus), rel=1e-12)
    unmeasured = llm_step(SMALL, e, _cluster())
    assert unmeasured.optimizer_s == pytest.approx((8 + 28) * p / dram, rel=1e-12)


@pytest.mark.parametrize("gpus", [1, GPUS])
@pytest.mark.parametrize("sockets", [1, 2])
def test_cpu_passes_at_the_sockets_share_of_the_measured_sustained_bandwidth_where_below_peak(gpus, sockets):
    """node.sockets.sustained_dram, measured over all the sockets: each socket gets it over the sockets, and the
    CPU's passes (the unscale, Adam's 28 B per parameter) run at the lesser of that and the socket's peak DRAM,
    over the job's GPUs on the socket; a figure above the peak changes nothing."""
    low = 0.6 * DRAM * sockets  # 60 % of each socket's peak
    per_socket_gpus = min(gpus, GPUS // sockets)  # GPU i on socket i * sockets // GPUS: the first socket's
    e = (Execution(gpus=1, micro_batch=1, global_batch=2, offload_optimizer=True, cpu_optimizer=True) if gpus == 1
         else _execution(cpu_optimizer=True))
    p = SMALL.params() / gpus
    c = _cluster(sustained=low, sockets=sockets)
    assert c.socket_sustained_dram_bytes_per_s == pytest.approx(0.6 * DRAM, rel=1e-12)
    if sockets == 2:  # a job on two of every node's four GPUs keeps one socket and its share of the figure
        half = c.with_gpus_per_node(GPUS // 2)
        assert half.socket_sustained_dram_bytes_per_s == pytest.approx(0.6 * DRAM, rel=1e-12)
    assert host_dram_bytes_per_s(c, gpus) == pytest.approx(0.6 * DRAM / per_socket_gpus, rel=1e-12)
    assert llm_step(SMALL, e, c).optimizer_s == pytest.approx((8 + 28) * p / (0.6 * DRAM / per_socket_gpus),
                                                              rel=1e-12)
    high = _cluster(sustained=2 * DRAM * sockets, sockets=sockets)
    assert host_dram_bytes_per_s(high, gpus) == pytest.approx(DRAM / per_socket_gpus, rel=1e-12)
    assert host_dram_bytes_per_s(_cluster(sockets=sockets), gpus) == host_dram_bytes_per_s(high, gpus)


def test_gradients_out_hide_behind_the_last_backward_with_dp_overlap():
    """overlap_comm (dp_overlap): the fp32 gradients' copies run beside the last backward (8 layers x 2 layer
    forwards), only the excess is exposed; without it they follow the backward whole."""
    peak = 1e12
    layer = _layer_s(peak)
    grads, back = PASS_BYTES * P / GPU_RATE + 4 * P / LINK, 2 * P / LINK
    overlapped = llm_step(SMALL, _execution(cpu_optimizer=True, dp_overlap=True), _cluster(peak))
    serial = llm_step(SMALL, _execution(cpu_optimizer=True), _cluster(peak))
    assert overlapped.offload_s == pytest.approx(max(0.0, grads - SMALL.layers * 2 * layer) + back, rel=NEAR)
    assert serial.offload_s == pytest.approx(grads + back, rel=1e-12)


def test_gpu_optimizer_offload_moves_the_state_both_ways():
    """Adam on the GPU with its state offloaded: 12 P out and 12 P back per step (no CPU step)."""
    step = llm_step(SMALL, _execution(), _cluster())
    assert step.offload_s == pytest.approx(2 * 12 * P / LINK, rel=1e-12)


def _layer_s(peak):
    f = layer_fwd_flops(SMALL, 1)
    return (f["gemm"] + f["attention"]) / peak


@pytest.mark.parametrize("peak", [1e13, 1e12])
def test_delayed_update_hides_the_step_behind_the_next_iteration(peak):
    """DPU: the CPU step and the parameters' return overlap the iteration's forward and backward
    (2 micro-batches x 8 layers x 3 layer forwards); only the excess is exposed. The fp32 gradients' way out
    (no dp_overlap) follows the backward."""
    layer = _layer_s(peak)
    window = 2 * SMALL.layers * 3 * layer
    cpu, back = (8 + 28) * P / (DRAM / GPUS), 2 * P / LINK
    grads_out = 4 * P / LINK
    plain = llm_step(SMALL, _execution(cpu_optimizer=True), _cluster(peak))
    dpu = llm_step(SMALL, _execution(cpu_optimizer=True, delayed_param_update=True), _cluster(peak))
    assert plain.optimizer_s + plain.offload_s == pytest.approx(cpu + back + grads_out, rel=NEAR)
    assert dpu.optimizer_s + dpu.offload_s == pytest.approx(max(0.0, cpu + back - window) + grads_out, rel=NEAR)
    assert plain.iteration_s - dpu.iteration_s == pytest.approx(cpu + back - max(0.0, cpu + back - window),
                                                                rel=NEAR)


def test_nvme_tier_streams_the_optimizer_state_through_the_drives():
    """ZeRO-Infinity: 12 P read and 12 P written at the GPU's share of the drives (2 x 8 / 4 and 2 x 4 / 4
    GB/s), overlapped with the CPU's Adam: Adam's part of the step is the longer of the two (the gradients'
    unscale, 8 P in host DRAM, before it)."""
    e = _execution(cpu_optimizer=True, offload_tier="nvme")
    drives = 12 * P / (2 * READ / GPUS) + 12 * P / (2 * WRITE / GPUS)
    fast_dram = llm_step(SMALL, e, _cluster(dram=1e15))
    assert fast_dram.optimizer_s == pytest.approx(8 * P / (1e15 / GPUS) + drives, rel=1e-12)
    slow_dram = llm_step(SMALL, e, _cluster(dram=1e9))
    assert slow_dram.optimizer_s == pytest.approx((8 + 28) * P / (1e9 / GPUS), rel=1e-12)


def test_nvme_tier_without_cpu_optimizer_is_bound_by_the_slower_hop():
    """State to NVMe and back, Adam on the GPU: each way at the slower of the link and the drives' share."""
    step = llm_step(SMALL, _execution(offload_tier="nvme"), _cluster())
    out, back = min(LINK, 2 * WRITE / GPUS), min(LINK, 2 * READ / GPUS)
    assert step.offload_s == pytest.approx(12 * P / out + 12 * P / back, rel=1e-12)


def test_nvme_state_counts_against_the_drives_not_the_pool():
    """Optimizer state on NVMe (12 P bytes) needs the GPU's share of the drives (2 drives / 4 GPUs), not room
    in the host pool."""
    e = _execution(cpu_optimizer=True, offload_tier="nvme")
    state = 12 * P
    assert llm_step(SMALL, e, _cluster(pool=GPUS * 1024.0)).fits  # 1 KiB per GPU: the least a file may give
    assert llm_step(SMALL, e, _cluster(drive=state * GPUS / 2 * 1.01)).fits
    assert not llm_step(SMALL, e, _cluster(drive=state * GPUS / 2 * 0.99)).fits
    host = _execution(cpu_optimizer=True)  # the socket's pool is shared by its 4 GPUs
    assert llm_step(SMALL, host, _cluster(pool=state * GPUS * 1.01)).fits
    assert not llm_step(SMALL, host, _cluster(pool=state * GPUS * 0.99)).fits


def test_nvme_without_drives_and_cpu_optimizer_without_pool_are_refused():
    with pytest.raises(ConfigError, match="execution.offload_tier: got 'nvme'; t has no node.nvme drives"):
        llm_step(SMALL, _execution(offload_tier="nvme"), _cluster(nvme=False))
    with pytest.raises(ConfigError, match="execution.cpu_optimizer: got true with offload_optimizer=false"):
        Execution(gpus=4, dp=4, global_batch=4, cpu_optimizer=True)


def test_preset_host_and_nvme_shares_from_their_figures():
    """DGX H100: 307.2 GB/s of DDR5 per socket over its 4 GPUs; 8 drives of 7 / 3.8 GB/s over 8 GPUs."""
    h100 = load_cluster("dgx-h100")
    assert host_dram_bytes_per_s(h100) == pytest.approx(307.2e9 / 4, rel=1e-12)
    assert nvme_bytes_per_s(h100) == pytest.approx((7e9, 3.8e9), rel=1e-12)
    assert load_cluster("dgx-a100").nvme.capacity_bytes == pytest.approx(8 * 3.84e12, rel=1e-12)


@pytest.mark.parametrize("overlap", [False, True])
def test_zero_offload_keeps_only_the_reduce_buckets_of_gradients_on_the_gpu(overlap):
    """DeepSpeed frees each gradient once its bucket is copied to the host: the GPU holds the reduce bucket of
    2-byte elements (two with overlap_comm), or the rank's whole gradients where they are fewer; Adam on the GPU
    keeps the whole 2-byte gradient shard."""
    bucket = 1000
    e = _execution(cpu_optimizer=True, dp_overlap=overlap, reduce_bucket_numel=bucket)
    step = llm_step(SMALL, e, _cluster())
    assert step.gradient_bytes == pytest.approx(2 * bucket * (2 if overlap else 1), rel=1e-12)
    huge = llm_step(SMALL, _execution(cpu_optimizer=True, reduce_bucket_numel=10**12), _cluster())
    assert huge.gradient_bytes == pytest.approx(2 * P, rel=1e-12)
    on_gpu = llm_step(SMALL, _execution(reduce_bucket_numel=bucket), _cluster())
    assert on_gpu.gradient_bytes == pytest.approx(2 * P, rel=1e-12)
    assert step.device_bytes == pytest.approx(on_gpu.device_bytes - 2 * P + step.gradient_bytes, rel=1e-12)


def test_bad_bucket_and_cpu_adam_figures_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"execution.reduce_bucket_numel: got 0; must be an integer >= 1"):
        _execution(cpu_optimizer=True, reduce_bucket_numel=0)
    with pytest.raises(HardwareError, match=r"cpu_adam.params_per_s"):
        _cluster(cpu_adam=0)
    with pytest.raises(HardwareError, match=r"sustained_dram.bandwidth: got 0"):
        _cluster(sustained=0)
    with pytest.raises(HardwareError, match=r"first_touch_copy.bandwidth: got 0"):
        _cluster(first_touch=0)


def test_synchronous_activation_offload_is_exposed_whole():
    """DeepSpeed's cpu_checkpointing copies each layer's checkpoint out before the layer runs and back before its
    backward, waiting on the compute stream: the copies add to the iteration whole (each micro-batch: the stage's
    checkpoints, b s h 2-byte elements per layer, out and back at the link), where the overlapped offload hides
    behind the compute."""
    fields = dict(recompute="full", offload_activations=True, cpu_optimizer=True)
    sync = llm_step(SMALL, _execution(**fields, activation_offload_sync=True), _cluster(peak=1e12))
    overlapped = llm_step(SMALL, _execution(**fields), _cluster(peak=1e12))
    move = SMALL.layers * 2 * 1024 * SMALL.hidden / LINK  # micro-batch 1, seq 1024
    assert sync.offload_s - overlapped.offload_s == pytest.approx(2 * 2 * move, rel=NEAR)  # 2 micro-batches
    with pytest.raises(ConfigError, match="execution.activation_offload_sync: got true with offload_activations"):
        _execution(activation_offload_sync=True)


def test_a_job_smaller_than_the_node_shares_the_pool_and_drives_among_its_own_gpus():
    """Two GPUs of the 4-GPU node: the closed-form link is the whole-node one (each GPU has its own link here),
    the host pool and the drives are split between the job's two GPUs, not four; a whole node keeps pool_link."""
    c = _cluster(pool=4e9, drive=1e9)
    assert c.pool_link_for_gpus(GPUS) is c.pool_link()
    assert c.pool_link_for_gpus(2).pool_bytes == pytest.approx(4e9 / 2, rel=1e-12)
    assert c.pool_link_for_gpus(2).offload_bytes_per_s == pytest.approx(LINK, rel=1e-12)
    assert nvme_bytes_per_s(c, 2) == pytest.approx((2 * READ / 2, 2 * WRITE / 2), rel=1e-12)
    e = Execution(gpus=2, dp=2, zero=2, micro_batch=1, global_batch=2, offload_optimizer=True, cpu_optimizer=True,
                  offload_tier="nvme")
    state = 12 * SMALL.params() / 2  # the rank's shard
    assert llm_step(SMALL, e, _cluster(drive=state * 2 / 2 * 1.01)).fits  # 2 drives over the job's 2 GPUs
    assert not llm_step(SMALL, e, _cluster(drive=state * 2 / 2 * 0.99)).fits


@pytest.mark.parametrize("first_touch", [LINK / 5, LINK * 5])
def test_first_touch_copies_go_at_the_slower_of_the_link_and_the_host(first_touch):
    """offload_first_touch: each forward's checkpoint copies land in fresh pageable pages, so they take the
    slower of the link and the host's first-touch rate (NOTE [first-touch copies]); the copies back are at the
    link. Synchronous copies: the whole difference shows, per micro-batch the stage's checkpoints
    (b s h 2-byte elements per layer) times 1 / min(link, rate) - 1 / link."""
    fields = dict(recompute="full", offload_activations=True, cpu_optimizer=True, activation_offload_sync=True)
    c = _cluster(peak=1e12, first_touch=first_touch)
    fresh = llm_step(SMALL, _execution(**fields, offload_first_touch=True), c)
    reused = llm_step(SMALL, _execution(**fields), c)
    checkpoints = SMALL.layers * 2 * 1024 * SMALL.hidden  # micro-batch 1, seq 1024
    extra = checkpoints / min(LINK, first_touch) - checkpoints / LINK
    assert fresh.offload_s - reused.offload_s == pytest.approx(2 * extra, rel=NEAR, abs=1e-12)  # 2 micro-batches
    assert (extra > 0) == (first_touch < LINK)


def test_overlapped_first_touch_copies_show_past_the_forward():
    """Overlapped copies (no activation_offload_sync) hide behind the forward's compute, on a single stage its
    logits and loss too: with first-touch pages only what the slower copies outlast that forward by shows,
    ``max(0, bytes / rate - forward)`` per micro-batch, where the link's copies hid whole."""
    fields = dict(recompute="full", offload_activations=True, cpu_optimizer=True)
    rate = LINK / 20
    c = _cluster(peak=1e13, first_touch=rate)
    fresh = llm_step(SMALL, _execution(**fields, offload_first_touch=True), c)
    reused = llm_step(SMALL, _execution(**fields), c)
    checkpoints = SMALL.layers * 2 * 1024 * SMALL.hidden
    costs = stage_costs(SMALL, _execution(**fields, offload_first_touch=True), c)
    forward = costs.layers_per_stage * costs.layer_fwd_s + costs.last_fwd_s
    assert costs.last_fwd_s > 0
    assert checkpoints / LINK < forward < checkpoints / rate  # hidden at the link, not at the host's rate
    assert fresh.offload_s - reused.offload_s == pytest.approx(2 * (checkpoints / rate - forward), rel=NEAR)


def test_first_touch_needs_offloaded_activations_a_host_pool_and_the_hosts_rate():
    with pytest.raises(ConfigError, match="execution.offload_first_touch: got true with offload_activations=false"):
        _execution(offload_first_touch=True)
    e = _execution(recompute="full", offload_activations=True, offload_first_touch=True)
    with pytest.raises(ConfigError, match="execution.offload_first_touch: got true; t gives no "
                                          "node.sockets.first_touch_copy rate"):
        llm_step(SMALL, e, _cluster())
    assert tier_rejection(e, _cluster(first_touch=1e9)) is None
