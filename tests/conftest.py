"""Fixtures shared by the layers' tests: a generated cluster built from plain figures (the LLM model's tests)."""

import gc
import math
from collections.abc import Callable

import pytest

from mcdla.hardware.cluster import Cluster, cluster_from_dict



def figures_cluster(*, gpus_per_node: int = 8, nodes: int = 1, peak_flops_per_s: float = 300e12,
                    gemm_peak_fraction: float = 0.5, gemm_half_width: float = 0.0, hbm_bytes: float = 80e9,
                    hbm_bytes_per_s: float = math.inf, nvlink_bytes_per_s: float = math.inf,
                    network_bytes_per_s: float = math.inf, nvlink_latency_s: float = 0.0,
                    network_latency_s: float = 0.0, offload_bytes_per_s: float = 0.0,
                    pool_bytes_per_gpu: float = 1e15, host_dram_bytes_per_s: float = math.inf,
                    nvme_read_bytes_per_s: float = 0.0, nvme_write_bytes_per_s: float = 0.0,
                    via_gpu_link: bool = False, host_call_s: float = 0.0) -> Cluster:
    """A generated cluster with the given figures (bytes, bytes/s, s): ``nodes`` nodes of ``gpus_per_node`` GPUs
    on one NVLink switch and a network rail per GPU; with ``offload_bytes_per_s`` each GPU has its own socket
    link to ``pool_bytes_per_gpu`` of host memory whose DRAM (``host_dram_bytes_per_s``) never binds by default;
    with ``nvme_read_bytes_per_s`` a node's NVMe drives (one drive of those figures); with ``via_gpu_link`` the
    network rail behind the GPU's socket link (a NIC on the GPU's PCIe switch); ``host_call_s`` the GPU's
    ``host_call_time`` (0: not given)."""
    def bw(value: float) -> float | str:
        return "inf" if math.isinf(value) else value  # an idealised link that never binds

    node = {
        "gpus": gpus_per_node, "source": "test figures",
        "gpu": {"peak_flops_per_s": {"bf16": peak_flops_per_s, "fp16": peak_flops_per_s}, "hbm": hbm_bytes,
                "hbm_bandwidth": "inf" if math.isinf(hbm_bytes_per_s) else hbm_bytes_per_s, "source": "test",
                **({"host_call_time": host_call_s} if host_call_s else {})},
        "gemm_efficiency": {"peak_fraction": gemm_peak_fraction, "half_width": gemm_half_width, "source": "test"},
    }
    if gpus_per_node > 1:
        node["scale_up"] = {"bandwidth": bw(nvlink_bytes_per_s), "latency": nvlink_latency_s, "source": "test"}
    if offload_bytes_per_s > 0:
        node["sockets"] = {"count": gpus_per_node, "source": "test",
                           "memory": {"kind": "host", "capacity": pool_bytes_per_gpu,
                                      "dram_bandwidth": bw(host_dram_bytes_per_s), "source": "test"},
                           "gpu_link": {"kind": "pcie", "bandwidth": bw(offload_bytes_per_s), "source": "test"}}
    if nvme_read_bytes_per_s > 0:
        node["nvme"] = {"drives": 1, "capacity": 1e15, "read_bandwidth": nvme_read_bytes_per_s,
                        "write_bandwidth": nvme_write_bytes_per_s, "source": "test"}
    data = {"format": "mcdla-system/1", "name": "figures", "node": node,
            "scale_out": {"name": "net", "nodes": nodes, "bandwidth": bw(network_bytes_per_s),
                          "latency": network_latency_s, "source": "test",
                          **({"via_gpu_link": True} if via_gpu_link else {})}}
    return cluster_from_dict(data, "test cluster")


@pytest.fixture
def llm_cluster() -> Callable[..., Cluster]:
    """:func:`figures_cluster`, the factory of a cluster from plain figures."""
    return figures_cluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``examples(quick, long)`` takes ``examples``, its property's hypothesis example count:
    ``quick`` in the default suite, ``long`` in the slow suite (``make test-slow``)."""
    marker = metafunc.definition.get_closest_marker("examples")
    if marker is not None:
        quick, long = marker.args
        metafunc.parametrize("examples", [pytest.param(quick, id="quick"),
                                          pytest.param(long, id="long", marks=pytest.mark.slow)])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move every object alive after collection (torch, PyTorch's op and module databases, the parametrize
    values) to the collector's permanent generation: they live for the whole run, and without this every
    ``gc.collect()`` the runtime tests call (and every automatic full collection) walks them again."""
    gc.collect()
    gc.freeze()
