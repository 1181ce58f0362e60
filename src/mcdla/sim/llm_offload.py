"""ZeRO-Offload and ZeRO-Infinity in the LLM time model: Adam on the host CPU, optimizer state on NVMe.

:mod:`mcdla.sim.llm` charges the rest of an iteration; this module gives what the optimizer step costs when
the execution moves it off the GPU (NOTE [ZeRO-Offload], also ``docs/llm.md``):

* The CPU's Adam streams the same bytes per parameter as the GPU's (``ADAM_TRAFFIC_BYTES``: it reads the
  gradient, reads and writes the fp32 master weight and both moments, writes the 16-bit weight), at the host
  memory bandwidth each GPU's share of its socket gets (the socket's DRAM figure over the GPUs on that socket,
  from the offload path of :mod:`mcdla.hardware.traffic`). Memory-bound, as DeepSpeed's vectorised CPU-Adam is
  on these sockets.
* The rank's 16-bit gradient shard goes out over the offload link while the last micro-batch's backward runs
  (DeepSpeed copies each bucket as it is reduced): what that backward does not hide is exposed. The updated
  16-bit parameters come back over the link after the CPU step.
* With the ``nvme`` tier (ZeRO-Infinity) the optimizer state lives on the node's NVMe drives: the step reads
  and writes it (``OPTIMIZER_BYTES`` each way) at each GPU's share of the drives' sequential bandwidth,
  overlapped chunk by chunk with the CPU's Adam, so the step takes the longer of the two.
* ``delayed_param_update`` (DPU, ZeRO-Offload sec. 5): the CPU step and the parameters' return overlap the
  next iteration's forward and backward; only what exceeds them is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcdla.hardware.cluster import Cluster
from mcdla.workload.execution import Execution

__all__ = ["ADAM_TRAFFIC_BYTES", "GRAD_BYTES", "OPTIMIZER_BYTES", "WEIGHT_BYTES", "CpuOptimizerStep",
           "cpu_adam_s", "cpu_optimizer_step", "host_dram_bytes_per_s", "nvme_bytes_per_s", "tier_bytes_per_s",
           "tier_rejection"]

# Adam with mixed precision, per parameter: fp16/bf16 weight and gradient, fp32 master weight, momentum and
# variance (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: 2 + 2 + 12 bytes).
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
# The Adam step reads the gradient (2) and reads and writes master weight, momentum, variance (3 x 8) and
# writes the fp16 weight (2): 28 bytes of memory traffic per parameter, on the GPU or on the CPU.
ADAM_TRAFFIC_BYTES = 28


def host_dram_bytes_per_s(cluster: Cluster) -> float | None:
    """Host DRAM bandwidth one GPU's share of its socket gets (bytes/s), from the offload path's socket
    memory (its figure over the GPUs on that socket); None when the pool has no host memory."""
    if cluster.offload is None:
        return None
    for res in cluster.path("offload").resources:
        if res.resource[0] == "dram" and res.resource[1].startswith("host"):
            return res.bytes_per_s / res.sharers
    return None


def nvme_bytes_per_s(cluster: Cluster) -> tuple[float, float] | None:
    """(read, write) bytes/s of one GPU's share of its node's NVMe drives; None without ``node.nvme``."""
    nvme = cluster.nvme
    if nvme is None:
        return None
    return nvme.read_bytes_per_s / cluster.gpus_per_node, nvme.write_bytes_per_s / cluster.gpus_per_node


def tier_rejection(execution: Execution, cluster: Cluster) -> str | None:
    """Why ``cluster`` cannot run the execution's CPU optimizer or NVMe tier, or None."""
    e = execution
    if e.cpu_optimizer and host_dram_bytes_per_s(cluster) is None:
        return (f"execution.cpu_optimizer: got true; the pool of {cluster.name} has no host memory for the "
                "CPU's Adam")
    if e.offload_tier == "nvme" and cluster.nvme is None:
        return f"execution.offload_tier: got 'nvme'; {cluster.name} has no node.nvme drives"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuOptimizerStep:
    """The optimizer step's exposed seconds with Adam on the CPU: ``optimizer_s`` (the CPU step, with NVMe
    streaming) and ``transfer_s`` (gradients out, parameters back)."""

    optimizer_s: float
    transfer_s: float


def cpu_optimizer_step(execution: Execution, cluster: Cluster, params: float, *, last_backward_s: float,
                       iteration_compute_s: float, element_bytes: int = GRAD_BYTES,
                       optimizer_bytes: int = OPTIMIZER_BYTES) -> CpuOptimizerStep:
    """The step of ``params`` parameters (the rank's shard) with Adam on the CPU (module docstring).

    ``last_backward_s``: the last micro-batch's backward on the stage, which hides the gradients' way out;
    ``iteration_compute_s``: the forward and backward work of an iteration, which hides a delayed update;
    ``element_bytes``: the run's gradient and weight element size, ``optimizer_bytes`` its Adam state per
    parameter (the run's precision; mixed precision by default).
    """
    e = execution
    link = cluster.pool_link()
    grads_out = max(0.0, element_bytes * params / link.offload_bytes_per_s - last_backward_s)
    params_in = element_bytes * params / link.prefetch_bytes_per_s
    step = cpu_adam_s(e, cluster, params, optimizer_bytes=optimizer_bytes)
    if not e.delayed_param_update:
        return CpuOptimizerStep(optimizer_s=step, transfer_s=grads_out + params_in)
    exposed = max(0.0, step + params_in - iteration_compute_s)
    optimizer = max(0.0, step - iteration_compute_s)
    return CpuOptimizerStep(optimizer_s=optimizer, transfer_s=grads_out + exposed - optimizer)


def cpu_adam_s(execution: Execution, cluster: Cluster, params: float, *,
               optimizer_bytes: int = OPTIMIZER_BYTES) -> float:
    """Seconds the CPU's Adam takes over ``params`` parameters (module docstring): ``ADAM_TRAFFIC_BYTES`` each at
    the GPU's share of host DRAM, or with the ``nvme`` tier the drives' read and write of the state if longer."""
    dram = host_dram_bytes_per_s(cluster)
    assert dram is not None  # tier_rejection refused the execution otherwise
    step = ADAM_TRAFFIC_BYTES * params / dram
    if execution.offload_tier == "nvme":
        rates = nvme_bytes_per_s(cluster)
        assert rates is not None
        step = max(step, optimizer_bytes * params / rates[0] + optimizer_bytes * params / rates[1])
    return step


def tier_bytes_per_s(cluster: Cluster, tier: str) -> tuple[float, float]:
    """(out, back) bytes/s between a GPU and ``tier``: the offload link, and for ``nvme`` the slower of the link
    and the GPU's share of the drives (write out, read back)."""
    link = cluster.pool_link()
    out, back = link.offload_bytes_per_s, link.prefetch_bytes_per_s
    if tier == "nvme":
        rates = nvme_bytes_per_s(cluster)
        assert rates is not None
        out, back = min(out, rates[1]), min(back, rates[0])
    return out, back
