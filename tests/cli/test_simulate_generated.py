"""``mcdla simulate`` on a generated preset (a node template expanded to a system), run in-process."""

import json

import pytest

from mcdla.workload import zoo

# DGX H100 figures as dgx-h100.yaml states them (H100 SXM datasheet; NVLink4 450 GB/s per direction per GPU).
H100_FP16_FLOPS_PER_S = 989e12 * 0.7  # peak x the preset's compute efficiency
H100_HBM_BYTES_PER_S = 3.35e12 * 0.8  # HBM3 x the preset's memory efficiency
NVLINK_BYTES_PER_S = 450e9
GPUS = 8


def test_simulate_generated_dgx_h100(run_cli) -> None:
    """simulate --system dgx-h100 runs all 8 GPUs: compute is each layer's roofline on the preset's H100, and
    each GPU's NVSwitch port carries the ring all-reduce's 2 (N-1)/N of every gradient byte."""
    code, out, err = run_cli("simulate", "--system", "dgx-h100", "--workload", "vgg-e", "--batch", "32",
                             "--policy", "none", "--json")
    assert code == 0, err
    got = json.loads(out)
    w = zoo.build("vgg-e", batch=32)
    compute = sum(max(l.fwd_flops / H100_FP16_FLOPS_PER_S, l.fwd_bytes_moved / H100_HBM_BYTES_PER_S)
                  + max(l.bwd_flops / H100_FP16_FLOPS_PER_S, l.bwd_bytes_moved / H100_HBM_BYTES_PER_S)
                  for l in w.layers)
    assert got["compute_s"] == pytest.approx(compute, rel=1e-9)
    grads = sum(l.param_bytes for l in w.layers)
    for g in range(GPUS):
        port_bytes = got["link_utilization"][f"gpu{g}->nvswitch"] * got["iteration_time_s"] * NVLINK_BYTES_PER_S
        assert port_bytes == pytest.approx(2 * (GPUS - 1) / GPUS * grads, rel=1e-9)
