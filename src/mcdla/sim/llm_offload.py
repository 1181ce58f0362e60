"""ZeRO-Offload and ZeRO-Infinity in the LLM time model: Adam on the host CPU, optimizer state on NVMe.

:mod:`mcdla.sim.llm` charges the rest of an iteration; this module gives what the optimizer step costs when
the execution moves it off the GPU (NOTE [ZeRO-Offload], also ``docs/llm.md``), as DeepSpeed's ZeRO-1/2 CPU
offload runs it (``deepspeed/runtime/zero/stage2.py`` at v0.3.0, ``stage_1_and_2.py`` since):

* Each reduced gradient bucket is cast to the fp32 master dtype on the GPU and copied into the host's fp32
  gradient partition (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``: ``.float()`` at v0.3.0,
  ``.to(master_weights_and_grads_dtype)`` since), so ``MASTER_GRAD_BYTES`` per parameter cross the link. The copies
  run on the reduction stream with ``overlap_comm`` (``dp_overlap``), where the backward hides them up to its
  length, and on the compute stream without it (``reduce_ipg_grads``), where they are exposed whole.
* Before each copy the GPU makes three passes over the gradient of each parameter of the rank's partition
  (``copy_grads_in_partition``, the offload branch): its float64 norm for the clipping
  (``set_norm_for_param_grad_in_gpu``: ``.double()`` reads 2 bytes and writes 8, ``.norm(2)`` reads the 8), the
  overflow check (``_has_inf_or_nan`` at v0.3.0: ``.float()`` 2 + 4, ``.sum()`` 4) and the fp32 cast the copy
  sends (2 + 4): :func:`grad_pass_bytes`, 34 per parameter of a 16-bit gradient (an fp32 one skips the copy and the
  cast: 24), at the GPU's sustained HBM rate (``Device.effective_hbm_bytes_per_s``, as every memory-bound kernel of the
  model), on the same stream as the copies, before them.
* The CPU step first unscales (and clips) the fp32 gradients in host memory (``unscale_and_clip_grads``: one
  ``mul_``, ``UNSCALE_BYTES`` per parameter) at the host DRAM bandwidth the job's GPU gets: its socket's DRAM
  (the socket's share of the host's measured sustained bandwidth, ``node.sockets.sustained_dram``, where the
  preset has one below the peak) over the job's GPUs on that socket
  (:meth:`~mcdla.hardware.cluster.Cluster.paths_for_gpus`). Then DeepSpeedCPUAdam: the node's measured CPU-Adam
  rate (``node.sockets.cpu_adam``) over the job's GPUs on the node where the preset has one, a measurement of the
  whole loop with its memory traffic (``dgx-2-v100``'s moves 28 bytes per parameter at 109 GB/s, above one
  socket's sustained 95 GB/s, so no one socket's figure bounds it), else ``ADAM_TRAFFIC_BYTES`` per parameter
  (reads the gradient, reads and writes the fp32 master weight and both moments, writes the 16-bit weight) at
  that DRAM share.
* The updated 16-bit parameters come back over the link after the CPU step.
* Memory: the copied gradients are freed on the GPU (``param.grad = None`` at v0.3.0, ``clear_grad_attribute``
  since), which keeps only the reduce bucket of ``reduce_bucket_numel`` 16-bit elements (``reduce_bucket_size``;
  two with ``overlap_comm``) instead of the whole gradients (:func:`mcdla.sim.llm.step_record`). v0.3.0 allocated
  each bucket buffer 4.5 times that size (``backward``: "magic 4.5x multiplier"), a few hundred MB not counted.
* With the ``nvme`` tier (ZeRO-Infinity) the optimizer state lives on the node's NVMe drives: the step reads
  and writes it (``OPTIMIZER_BYTES`` each way) at each GPU's share of the drives' sequential bandwidth,
  overlapped chunk by chunk with the CPU's Adam, so the step takes the longer of the two.
* ``delayed_param_update`` (DPU, ZeRO-Offload sec. 5): the CPU step and the parameters' return overlap the
  next iteration's forward and backward; only what exceeds them is exposed.

NOTE [first-touch copies]: a device-to-host copy into pageable memory goes through the driver's pinned staging
buffers, the host thread copying each chunk out while the next one's DMA runs (N. Wilt, *The CUDA Handbook*,
sec. 6.2, "pageable memcpy"), so it takes the slower of the link and that thread. Where the destination pages
are new to the process (a fresh anonymous mapping, as every CPU tensor above glibc's mmap threshold is), the
thread also faults in and zeroes each 4 KiB page as it writes it, and the host sets the rate: dask-cuda
measured a 1 GiB device-to-host copy into an untouched NumPy array at 0.548 s (1.96 GB/s) against 0.100 s into
the same array with its pages written first, on a GV100 workstation (github.com/rapidsai/dask-cuda/pull/98),
and its device-to-host path at 1.5-2.0 GB/s, "the major bottleneck is host memory allocation", on a DGX-1
(github.com/rapidsai/dask-cuda/issues/106). DeepSpeed v0.3.0's ``cpu_checkpointing`` copies each checkpoint with
a blocking ``copy_`` into a CPU tensor ``new_empty`` allocates every iteration
(``runtime/activation_checkpointing/checkpointing.py``; later versions write one byte per page first, "the
pages need to be populated during the cudaMemcpy time which increases the data copy time"), so with
``offload_first_touch`` the forward's copies go at ``min(link, node.sockets.first_touch_copy)``
(:func:`activation_out_bytes_per_s`); the engine runs the host's share as its own op beside each copy, which
ends with the later of the two. The copies back read pages already touched, at the link's rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster
from mcdla.workload.execution import Execution

__all__ = ["ADAM_TRAFFIC_BYTES", "GRAD_BYTES", "MASTER_GRAD_BYTES", "OPTIMIZER_BYTES", "UNSCALE_BYTES",
           "WEIGHT_BYTES", "CpuOptimizerStep", "activation_out_bytes_per_s", "cpu_adam_params_per_s", "cpu_adam_s",
           "cpu_optimizer_step", "first_touch_bytes_per_s", "grad_pass_bytes", "gradient_passes_s",
           "host_dram_bytes_per_s", "nvme_bytes_per_s", "tier_bytes_per_s", "tier_rejection"]

# Adam with mixed precision, per parameter: fp16/bf16 weight and gradient, fp32 master weight, momentum and
# variance (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: 2 + 2 + 12 bytes).
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
# The Adam step reads the gradient (2) and reads and writes master weight, momentum, variance (3 x 8) and
# writes the fp16 weight (2): 28 bytes of memory traffic per parameter, on the GPU or on the CPU.
ADAM_TRAFFIC_BYTES = 28
# The gradient as DeepSpeed's CPU offload sends it to the host and keeps it there: the fp32 master dtype.
MASTER_GRAD_BYTES = 4
# unscale_and_clip_grads: one in-place multiply of the fp32 host gradient, read and written.
UNSCALE_BYTES = 2 * MASTER_GRAD_BYTES


def host_dram_bytes_per_s(cluster: Cluster, gpus: int | None = None) -> float | None:
    """Host DRAM bandwidth the CPU's passes for one GPU get (bytes/s) in a job of ``gpus`` GPUs (a whole node by
    default): the socket memory on the GPU's offload path (:meth:`Cluster.paths_for_gpus`), or the socket's share
    of the host's measured sustained bandwidth where the preset has one and it is lower, over the job's GPUs on
    that socket; None when the pool has no host memory."""
    if cluster.offload is None:
        return None
    paths = cluster.paths if gpus is None else cluster.paths_for_gpus(gpus)
    sustained = cluster.socket_sustained_dram_bytes_per_s
    for res in next(p for p in paths if p.traffic == "offload").resources:
        if res.resource[0] == "dram" and res.resource[1].startswith("host"):
            peak = res.bytes_per_s
            return (peak if sustained is None else min(peak, sustained)) / res.sharers
    return None


def grad_pass_bytes(element_bytes: int = GRAD_BYTES) -> int:
    """HBM bytes per parameter of the GPU's passes over a gradient of ``element_bytes`` before its copy to the host
    (DeepSpeed v0.3.0 ``stage2.py`` ``copy_grads_in_partition``): the float64 norm (read it, write and read the
    float64 copy), the overflow check (an fp32 copy unless already fp32, then its sum) and the cast to the fp32
    master dtype (none for an fp32 gradient)."""
    wide = element_bytes < MASTER_GRAD_BYTES
    norm = element_bytes + 8 + 8
    overflow = (element_bytes + MASTER_GRAD_BYTES if wide else 0) + MASTER_GRAD_BYTES
    cast = element_bytes + MASTER_GRAD_BYTES if wide else 0
    return norm + overflow + cast


def gradient_passes_s(cluster: Cluster, params: float, element_bytes: int = GRAD_BYTES) -> float:
    """Seconds of the GPU's passes over the gradients of ``params`` parameters before they go to the host
    (module docstring): :func:`grad_pass_bytes` each at the device's ``effective_hbm_bytes_per_s``."""
    return grad_pass_bytes(element_bytes) * params / cluster.device.effective_hbm_bytes_per_s


def _job_gpus_on_node(cluster: Cluster, gpus: int | None) -> int:
    """The GPUs of a job of ``gpus`` (a whole node when None) on its first node."""
    return cluster.gpus_per_node if gpus is None else min(gpus, cluster.gpus_per_node)


def cpu_adam_params_per_s(cluster: Cluster, gpus: int | None = None) -> float | None:
    """Parameters per second of the node's measured CPU-Adam rate (``node.sockets.cpu_adam``) one GPU's process
    gets in a job of ``gpus`` GPUs (each runs its own step over the node's cores); None without the figure."""
    rate = cluster.cpu_adam_params_per_s
    return None if rate is None else rate / _job_gpus_on_node(cluster, gpus)


def nvme_bytes_per_s(cluster: Cluster, gpus: int | None = None) -> tuple[float, float] | None:
    """(read, write) bytes/s of one GPU's share of its node's NVMe drives among a job's ``gpus`` GPUs (a whole
    node by default); None without ``node.nvme``."""
    nvme = cluster.nvme
    if nvme is None:
        return None
    n = _job_gpus_on_node(cluster, gpus)
    return nvme.read_bytes_per_s / n, nvme.write_bytes_per_s / n


def tier_rejection(execution: Execution, cluster: Cluster) -> str | None:
    """Why ``cluster`` cannot run the execution's CPU optimizer or NVMe tier, or None."""
    e = execution
    if e.cpu_optimizer and host_dram_bytes_per_s(cluster) is None:
        return (f"execution.cpu_optimizer: got true; the pool of {cluster.name} has no host memory for the "
                "CPU's Adam")
    if e.offload_tier == "nvme" and cluster.nvme is None:
        return f"execution.offload_tier: got 'nvme'; {cluster.name} has no node.nvme drives"
    if e.offload_first_touch and host_dram_bytes_per_s(cluster) is None:
        return (f"execution.offload_first_touch: got true; the pool of {cluster.name} has no host memory to "
                "fault pages in")
    if e.offload_first_touch and cluster.first_touch_copy_bytes_per_s is None:
        return (f"execution.offload_first_touch: got true; {cluster.name} gives no node.sockets.first_touch_copy "
                "rate")
    return None


def first_touch_bytes_per_s(execution: Execution, cluster: Cluster) -> float | None:
    """The host's first-touch rate the forward's activation copies are also bound by (NOTE [first-touch
    copies]), None without ``offload_first_touch``."""
    return cluster.first_touch_copy_bytes_per_s if execution.offload_first_touch else None


def activation_out_bytes_per_s(execution: Execution, cluster: Cluster, link_bytes_per_s: float) -> float:
    """The rate of the forward's activation copies to the pool over a link of ``link_bytes_per_s``: the link's,
    or the slower of it and :func:`first_touch_bytes_per_s`."""
    rate = first_touch_bytes_per_s(execution, cluster)
    return link_bytes_per_s if rate is None else min(link_bytes_per_s, rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuOptimizerStep:
    """The optimizer step's exposed seconds with Adam on the CPU: ``optimizer_s`` (the CPU step, with NVMe
    streaming) and ``transfer_s`` (gradients out with the GPU's passes before them, parameters back)."""

    optimizer_s: float
    transfer_s: float


def cpu_optimizer_step(execution: Execution, cluster: Cluster, params: float, *, last_backward_s: float,
                       iteration_compute_s: float, element_bytes: int = GRAD_BYTES,
                       optimizer_bytes: int = OPTIMIZER_BYTES) -> CpuOptimizerStep:
    """The step of ``params`` parameters (the rank's shard) with Adam on the CPU (module docstring).

    ``last_backward_s``: the first stage's last backward (with its head's on a single stage), which hides the
    gradients' way out with ``dp_overlap``; ``iteration_compute_s``: the forward and backward work of an
    iteration, which hides a delayed update; ``element_bytes``: the run's 16-bit weight element size,
    ``optimizer_bytes`` its Adam state per parameter (the run's precision; mixed precision by default).
    """
    e = execution
    link = cluster.pool_link_for_gpus(e.gpus)
    grads = (gradient_passes_s(cluster, params, element_bytes)
             + MASTER_GRAD_BYTES * params / link.offload_bytes_per_s)
    grads_out = max(0.0, grads - last_backward_s) if e.dp_overlap else grads
    params_in = element_bytes * params / link.prefetch_bytes_per_s
    step = cpu_adam_s(e, cluster, params, optimizer_bytes=optimizer_bytes)
    if not e.delayed_param_update:
        return CpuOptimizerStep(optimizer_s=step, transfer_s=grads_out + params_in)
    exposed = max(0.0, step + params_in - iteration_compute_s)
    optimizer = max(0.0, step - iteration_compute_s)
    return CpuOptimizerStep(optimizer_s=optimizer, transfer_s=grads_out + exposed - optimizer)


def cpu_adam_s(execution: Execution, cluster: Cluster, params: float, *,
               optimizer_bytes: int = OPTIMIZER_BYTES) -> float:
    """Seconds the CPU step takes over ``params`` parameters (module docstring): the gradients' unscale,
    ``UNSCALE_BYTES`` each at the GPU's share of host DRAM (:func:`host_dram_bytes_per_s`), then Adam at the
    node's CPU-Adam rate share where the preset has one, else ``ADAM_TRAFFIC_BYTES`` each at that DRAM share, or
    with the ``nvme`` tier the drives' read and write of the state if longer."""
    dram = host_dram_bytes_per_s(cluster, execution.gpus)
    assert dram is not None  # tier_rejection refused the execution otherwise
    rate = cpu_adam_params_per_s(cluster, execution.gpus)
    adam = ADAM_TRAFFIC_BYTES * params / dram if rate is None else params / rate
    if execution.offload_tier == "nvme":
        rates = nvme_bytes_per_s(cluster, execution.gpus)
        assert rates is not None
        adam = max(adam, optimizer_bytes * params / rates[0] + optimizer_bytes * params / rates[1])
    return UNSCALE_BYTES * params / dram + adam


def tier_bytes_per_s(cluster: Cluster, tier: str, gpus: int | None = None) -> tuple[float, float]:
    """(out, back) bytes/s between a GPU and ``tier`` in a job of ``gpus`` GPUs (a whole node by default): the
    offload link, and for ``nvme`` the slower of the link and the GPU's share of the drives (write out, read
    back)."""
    link = cluster.pool_link() if gpus is None else cluster.pool_link_for_gpus(gpus)
    out, back = link.offload_bytes_per_s, link.prefetch_bytes_per_s
    if tier == "nvme":
        rates = nvme_bytes_per_s(cluster, gpus)
        assert rates is not None
        out, back = min(out, rates[1]), min(back, rates[0])
    return out, back
