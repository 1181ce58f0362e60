"""The modern reproduction (report/modern.py) and the LLM time model on the generated presets it compares.

Expected values are worked out from the presets' published figures and the closed forms of the docstrings,
not read back from the code under test.
"""

import dataclasses

import pytest

from mcdla.hardware.cluster import load_cluster
from mcdla.report import modern
from mcdla.sim.llm import llm_step, stage_costs
from mcdla.workload.execution import Execution
from mcdla.workload.transformer import preset

GPT3 = preset("gpt3-175b")
ONE = (modern.Scenario(model="gpt3-175b", global_batch=1536, gpus=1152),)


def _exec(**kw) -> Execution:
    base = dict(gpus=1152, tp=8, pp=12, dp=12, sequence_parallel=True, zero=1, micro_batch=1, global_batch=1536,
                recompute="none", dp_overlap=True)
    return Execution(**{**base, **kw})


def _system(name: str, gpus: int = 1152, offload: bool = True):
    cluster = load_cluster(name).for_gpus(gpus)
    return cluster if offload else cluster.without_offload()


@pytest.mark.parametrize("name", ["dc-dla-2026", "dgx-h100-cxl", "gh200", "dgx-gh200", "gb200-nvl72", "gb200-nvl72-memnode"])
def test_sized_preset_keeps_every_figure(name) -> None:
    """Sizing a preset for 1,152 GPUs adds whole nodes and changes nothing else: the GPU, the fabric figures,
    the GEMM curve and the offload link of one node."""
    one, sized = load_cluster(name), _system(name)
    assert sized.device == one.device and sized.gpus_per_node == one.gpus_per_node
    assert sized.gemm_efficiency == one.gemm_efficiency
    assert [(d.name, d.bytes_per_s, d.latency_s, d.algorithm) for d in sized.dims] == [
        (d.name, d.bytes_per_s, d.latency_s, d.algorithm) for d in one.dims]
    assert sized.offload == one.offload
    assert sized.n_devices >= 1152 and sized.n_devices - 1152 < sized.gpus_per_node  # whole nodes


def test_preset_hand_figures() -> None:
    """The headline links from the preset text: PCIe Gen5 x16 at 0.8 of 64 GB/s; 36 memory-nodes x 600 GB/s of
    NVLink5 shared by 72 GPUs (DRAM 614.4 GB/s each does not bind), 36 x 2 TB over 72 GPUs; H100 80 GB."""
    dc = _system("dc-dla-2026")
    assert dc.offload.offload_bytes_per_s == pytest.approx(0.8 * 64e9)
    assert dc.device.hbm_bytes == 80e9 and dc.scale_up.bytes_per_s == 450e9
    mem = _system("gb200-nvl72-memnode")
    assert mem.offload.offload_bytes_per_s == pytest.approx(36 * 600e9 / 72)
    assert mem.offload.pool_bytes == pytest.approx(36 * 2e12 / 72)
    assert _system("gb200-nvl72-memnode", offload=False).offload is None


def test_dgx_gh200_is_the_gh200_superchip_in_a_256_gpu_nvlink_domain() -> None:
    """dgx-gh200 keeps gh200's GPU, Grace pool and C2C link (450 GB/s per direction, 480 GB per GPU) and adds
    NVLink4 at 450 GB/s per GPU across 256 GPUs: TP 8 runs there and not on gh200 (one GPU per node), and a
    DP group of 8 neighbouring ranks is an in-network all-reduce on NVLink, n/B + 2a, instead of gh200's IB
    ring, 2 (p-1)/p n/B + 2 (p-1) a."""
    one, dgx = _system("gh200", 768), _system("dgx-gh200", 768)
    assert dgx.device == one.device and dgx.gpus_per_node == 256
    assert (dgx.offload.offload_bytes_per_s, dgx.offload.pool_bytes) == (450e9, 480e9) == (
        one.offload.offload_bytes_per_s, one.offload.pool_bytes)
    assert dgx.scale_up.bytes_per_s == 450e9
    scenario = modern.Scenario(model="gpt3-175b", global_batch=1536, gpus=768)
    tps = lambda c: {e.tp for e in modern.search_grid(GPT3, scenario, c, modern.SMALL_GRID).enumeration.executions}
    assert max(tps(dgx)) == 8 and tps(one) == {1}
    e = _exec(gpus=768, tp=1, pp=96, dp=8, sequence_parallel=False)
    g = 2 * (GPT3.params_per_layer() + GPT3.embedding_params())  # bf16 gradients of the first stage's rank
    assert stage_costs(GPT3, e, dgx).dp_full_s == pytest.approx(g / 450e9 + 2 * 1e-6)
    assert stage_costs(GPT3, e, one).dp_full_s == pytest.approx(2 * 7 / 8 * g / 50e9 + 2 * 7 * 5e-6)


def test_fabric_prices_tp_and_dp_collectives_with_the_presets_algorithms() -> None:
    """TP (sequence parallel) on the NVLink SHARP domain: all-gather + reduce-scatter in-network, each
    (p-1)/p n/B + 2a; DP of 12 with stride 8 on 8-GPU nodes: one rank per node, a ring on IB,
    2 (p-1)/p n/B + 2 (p-1) a over the rank's bf16 gradients."""
    c = stage_costs(GPT3, _exec(), _system("dc-dla-2026"))
    n = 2 * 1 * 2048 * 12288
    one = 7 / 8 * n / 450e9 + 2 * 1e-6
    assert c.layer_tp_fwd_s == pytest.approx(2 * (one + one))
    params = (96 // 12 * GPT3.params_per_layer() + GPT3.embedding_params()) / 8
    g = 2 * params
    assert c.dp_full_s == pytest.approx(2 * 11 / 12 * g / 50e9 + 2 * 11 * 5e-6)
    assert c.p2p_s == pytest.approx(5e-6 + n / 8 / 50e9)  # stages 96 ranks apart: across IB


def test_exposed_activation_offload_by_hand() -> None:
    """Offloading activations over PCIe5: per micro-batch a stage moves A = n s b h (34 + 5 a s / h) / t bytes
    (Korthikanti 2022 eq. with SP) out during forward and back during backward; exposed is what n F (forward)
    and 2 n F (backward) of compute do not hide, paid by m micro-batches plus the (p - 1) bubble slots (the
    gradient reduction after the pipeline, so it shares no link with the prefetch)."""
    system = _system("dc-dla-2026")
    plain = _exec(dp_overlap=False, attention="materialized")
    off = _exec(offload_activations=True, dp_overlap=False, attention="materialized")
    F = stage_costs(GPT3, plain, system).layer_fwd_s
    n, s, b, h, a, t = 8, 2048, 1, 12288, 96, 8
    move = n * s * b * h * (34 + 5 * a * s / h) / t / 51.2e9
    exposed = max(0.0, move - n * F) + max(0.0, move - 2 * n * F)
    assert exposed > 0  # the case is not a trivial zero
    m = 1536 // 12
    delta = llm_step(GPT3, off, system).iteration_s - llm_step(GPT3, plain, system).iteration_s
    assert delta == pytest.approx((m + 11) * exposed, rel=1e-9)


def test_faster_offload_link_is_never_slower() -> None:
    """Same GPUs and config: DC-DLA 2026's 51.2 GB/s beats the CXL pool's 32 GB/s per GPU, and doubling any link
    never slows an iteration."""
    dc, cxl = _system("dc-dla-2026"), _system("dgx-h100-cxl")
    spec, grid = GPT3, modern.SMALL_GRID
    execs = modern.search_grid(spec, ONE[0], dc, grid).enumeration.executions
    assert execs
    bw = 2 * dc.offload.offload_bytes_per_s
    faster = dataclasses.replace(dc, offload=dataclasses.replace(dc.offload, offload_bytes_per_s=bw,
                                                                 prefetch_bytes_per_s=bw))
    for e in execs:
        t_dc = llm_step(spec, e, dc).iteration_s
        assert llm_step(spec, e, cxl).iteration_s >= t_dc
        assert llm_step(spec, e, faster).iteration_s <= t_dc


def test_reduced_experiment_is_consistent() -> None:
    rows = modern.run_modern(grid=modern.SMALL_GRID, scenarios=ONE)
    assert [r["system"] for r in rows] == [v.key for v in modern.VARIANTS]
    by = {r["system"]: r for r in rows}
    assert by["dc-dla-2026"]["speedup"] == 1.0
    for r in rows:
        assert r["feasible"] and r["evaluated"] >= r["fitting"] >= 1
        assert r["hbm_used_bytes"] <= r["hbm_bytes"] and r["offload_used_bytes"] <= r["offload_capacity_bytes"]
        assert r["tp"] * r["pp"] * r["dp"] == 1152
        assert r["speedup"] == pytest.approx(by["dc-dla-2026"]["iteration_s"] / r["iteration_s"])
    for key in ("h100-recompute", "dgx-gh200-recompute", "b200-recompute"):  # offload disabled: everything in HBM
        assert by[key]["offloaded"] == "none" and by[key]["offload_used_bytes"] == 0
    # the offload systems search a superset of the no-offload space on the same GPUs
    assert by["dc-dla-2026"]["iteration_s"] <= by["h100-recompute"]["iteration_s"]
    assert by["gb200-nvl72-memnode"]["iteration_s"] <= by["b200-recompute"]["iteration_s"]
    assert by["dgx-gh200"]["iteration_s"] <= by["dgx-gh200-recompute"]["iteration_s"]


def test_best_config_without_offload_fits_hbm_by_independent_count() -> None:
    """Recount the chosen no-offload config's resident bytes: bf16 weights and grads plus ZeRO-1 optimizer shards
    plus min(m, p) micro-batches of stashed activations must be below the H100's 80 GB."""
    system = _system("dc-dla-2026", offload=False)
    best = modern.search_grid(GPT3, ONE[0], system, modern.SMALL_GRID).best
    assert best is not None
    e, step = best.execution, best.step
    assert not (e.offload_activations or e.offload_weights or e.offload_optimizer)
    from mcdla.workload.transformer import activation_bytes_per_layer
    params = (96 // e.pp * GPT3.params_per_layer() + GPT3.embedding_params()) / e.tp
    acts = 96 // e.pp * activation_bytes_per_layer(GPT3, e.micro_batch, tp=e.tp, sp=True, recompute=e.recompute,
                                                 attention=e.attention)
    resident = 4 * params + 12 * params / e.dp + min(e.micro_batches, e.pp) * acts
    assert resident == pytest.approx(step.device_bytes) and resident <= 80e9


def test_contention_column_is_the_time_shared_links_add(monkeypatch) -> None:
    """contention_s is the iteration minus the same closed form priced on idle links (the floor switched off):
    positive on dgx-h100, whose PCIe x16 carries both the activation offload and the NIC's reduction, and shown
    in the modern table's "link contention" column."""
    import mcdla.sim.llm as llm
    from mcdla.sim.llm_floor import LinkFloors

    e = Execution(gpus=16, tp=8, dp=2, micro_batch=1, global_batch=64, recompute="none", dp_overlap=True,
                  offload_activations=True)
    cluster = load_cluster("dgx-h100").for_gpus(16)
    shared = llm_step(GPT3.with_seq_len(2048), e, cluster)
    with monkeypatch.context() as m:
        m.setattr(llm, "link_floors", lambda *a: LinkFloors(stage_s=0.0, dp_exposed_s=0.0))
        idle = llm_step(GPT3.with_seq_len(2048), e, cluster)
    assert shared.contention_s > 0 and idle.contention_s == 0
    assert shared.contention_s == pytest.approx(shared.iteration_s - idle.iteration_s, rel=1e-12)
    row = {"model": "m", "gpus": 16, "system": "s", "feasible": True, "iteration_s": shared.iteration_s,
           "speedup": None, "mfu": shared.mfu, "hbm_used_bytes": 1.0, "hbm_bytes": 2.0, "offload_used_bytes": 0.0,
           "offload_capacity_bytes": 0.0, "offload_bytes_per_s": 0.0, "contention_s": shared.contention_s,
           "tp": 8, "pp": 1, "dp": 2, "virtual_stages": 1, "micro_batch": 1, "recompute": "none", "offloaded": "act"}
    table = modern.modern_table([row])
    column = next(c for c in table.columns if c.header == "link contention")
    assert list(column.cells) == [modern.format_seconds(shared.contention_s)]
