"""The Blackwell presets (b200, gb300-nvl72) and the FP8 peaks: hand-computed figures, loading at scale."""

import pytest

from mcdla.hardware import LinkKind, MemoryKind, load_cluster, load_system

# Dense FP8 peaks per GPU, FLOP/s, from the sources the preset files cite: H100 SXM 3,958 TFLOP/s with 2:4
# sparsity / 2; GB200 5,000 and HGX B200 4,500 (glennklockwood B200 tables); GB300 NVL72 360 PFLOP/s dense
# over 72 GPUs.
FP8_DENSE = {"dgx-h100": 3958e12 / 2, "h200": 3958e12 / 2, "gh200": 3958e12 / 2, "dgx-gh200": 3958e12 / 2,
             "gb200-nvl72": 5000e12, "b200": 4500e12, "gb300-nvl72": 360e15 / 72}


@pytest.mark.parametrize("name", sorted(FP8_DENSE))
def test_fp8_peak_is_the_sources_dense_figure(name):
    """Each Hopper and Blackwell preset has an ``fp8`` peak, the dense figure of its source, twice its bf16."""
    device = load_cluster(name).device
    assert device.flops_per_s("fp8") == pytest.approx(FP8_DENSE[name], rel=1e-9)
    assert device.flops_per_s("fp8") == pytest.approx(2 * device.flops_per_s("bf16"), rel=0.01)


def test_b200_is_an_8_gpu_nvlink5_server():
    """b200: 8 GPUs of 1,440 GB / 8 = 180 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidir = 900 GB/s per direction
    into one switch, PCIe Gen5 x16 (64 GB/s x 0.8) to the host, one 400 Gb/s rail per GPU."""
    c = load_cluster("b200")
    assert (c.gpus_per_node, c.device.hbm_bytes, c.device.hbm_bytes_per_s) == (8, 1440e9 / 8, 8e12)
    assert c.scale_up is not None and c.scale_up.size == 8 and c.scale_up.bytes_per_s == 1.8e12 / 2
    s = load_system("b200")
    pcie = [l for l in s.links if l.kind is LinkKind.PCIE]
    assert len(pcie) == 8 and {l.bytes_per_s for l in pcie} == {64e9 * 0.8}
    assert c.scale_out is not None and c.scale_out.bytes_per_s == 400e9 / 8


def test_gb300_is_one_nvlink_domain_of_72_with_288gb_each():
    """gb300-nvl72: 72 GPUs of 288 GB in one NVLink domain (130 TB/s / 72 per GPU, bidir), 36 Grace memories of
    17 TB / 36, each the pool of two GPUs; 800 Gb/s = 100 GB/s per GPU rail."""
    c = load_cluster("gb300-nvl72")
    assert c.n_devices == 72 and c.scale_up is not None and c.scale_up.size == 72
    assert c.device.hbm_bytes == 288e9
    assert c.scale_up.bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.02)
    s = load_system("gb300-nvl72")
    graces = [m for m in s.memories if m.kind is MemoryKind.HOST]
    assert len(graces) == 36 and all(m.capacity_bytes == pytest.approx(17e12 / 36, rel=0.01) for m in graces)
    users: dict[str, int] = {}
    for pool in s.pools.values():
        for m in pool:
            users[m] = users.get(m, 0) + 1
    assert set(users.values()) == {2} and len(users) == 36
    assert c.scale_out is not None and c.scale_out.bytes_per_s == 800e9 / 8


@pytest.mark.parametrize("name, gpus, nodes", [("b200", 1024, 128), ("gb300-nvl72", 1152, 16)])
def test_blackwell_presets_load_at_scale(name, gpus, nodes):
    """Sized for a thousand GPUs, each preset is ``gpus / gpus-per-node`` whole nodes of the same GPU."""
    c = load_cluster(name).for_gpus(gpus)
    assert (c.n_devices, c.nodes) == (gpus, nodes)
    assert c.dims[-1].size == nodes


# Special-function exponentials per second, from the sources the preset files cite: H100 SXM5 3.9 T
# (FlashAttention-3), Blackwell 5 T and Blackwell Ultra 10.7 T (NVIDIA's Blackwell Ultra table); H200 has the
# H100's compute (its preset extends dgx-h100), and GH200's Hopper GPU the same peaks.
EXP_RATE = {"dgx-h100": 3.9e12, "h200": 3.9e12, "gh200": 3.9e12, "dgx-gh200": 3.9e12, "b200": 5e12, "gb200-nvl72": 5e12,
            "gb300-nvl72": 10.7e12}


@pytest.mark.parametrize("name", sorted(EXP_RATE))
def test_exp_rate_is_the_sources_figure(name):
    """Each preset that gives a special-function rate gives its source's, and a generated system keeps it."""
    assert load_cluster(name).device.exp_per_s == pytest.approx(EXP_RATE[name], rel=1e-12)
    rates = [d.exp_per_s for d in load_system(name).devices]
    assert rates and all(r == pytest.approx(EXP_RATE[name], rel=1e-12) for r in rates)


def test_exp_rate_round_trips_and_bad_values_are_one_line():
    """``exp_rate`` survives a system file's round trip; a negative rate or a FLOP/s unit is a one-line
    HardwareError naming the field; a device without it charges no exponentials (0)."""
    from mcdla.errors import HardwareError
    from mcdla.hardware.io import system_from_dict, system_to_dict

    data = system_to_dict(load_system("gb300-nvl72"))
    assert data["devices"][0]["exp_rate"] == "1.07e+13exp/s"
    assert {d.exp_per_s for d in system_from_dict(data).devices} == {10.7e12}
    for bad in ("-1Texp/s", "3.9TFLOP/s"):
        data["devices"][0]["exp_rate"] = bad
        with pytest.raises(HardwareError, match=r"exp_rate") as info:
            system_from_dict(data)
        assert "\n" not in str(info.value)
    assert load_cluster("dgx-a100").device.exp_per_s == 0.0
