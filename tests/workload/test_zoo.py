"""The analytical zoo against published figures and independent closed forms.

Published figures: torchvision model docs (``num_params``; ``GFLOPS`` = multiply-adds per 224x224 image):
AlexNet 61,100,840 / 0.71, VGG-19 143,667,240 / 19.63, ResNet-152 60,192,808 / 11.51. GoogLeNet: Szegedy
et al. 2015 Table 1 ("ops" column, multiply-adds per image). Seq2seq: Sutskever et al. 2014, section 3.4
("384M parameters, of which 64M are pure recurrent connections").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mcdla.errors import WorkloadError
from mcdla.workload import LayerKind, zoo
from mcdla.workload.zoo.__main__ import table

GIB = 2**30
DOCS = Path(__file__).resolve().parents[2] / "docs" / "zoo.md"


def _params(name: str) -> float:
    return zoo.build(name, batch=1, precision="fp32").param_bytes / 4


def _macs(name: str, prefix: str = "") -> float:
    w = zoo.build(name, batch=1)
    return sum(l.fwd_flops for l in w.layers if l.name.startswith(prefix)) / 2


def test_names_are_the_eight_applications() -> None:
    """Four CNNs then four recurrent models, in the documented order."""
    assert zoo.names() == ("alexnet", "googlenet", "vgg-e", "resnet-152", "rnn", "lstm", "gru", "seq-lstm")


@pytest.mark.parametrize(
    ("name", "params"), [("alexnet", 61_100_840), ("vgg-e", 143_667_240), ("resnet-152", 60_192_808)]
)
def test_parameter_count_matches_torchvision(name: str, params: int) -> None:
    """Parameter counts equal torchvision's published num_params exactly."""
    assert _params(name) == params


@pytest.mark.parametrize(("name", "gmacs"), [("alexnet", 0.71), ("vgg-e", 19.63), ("resnet-152", 11.51)])
def test_forward_macs_match_torchvision(name: str, gmacs: float) -> None:
    """Forward multiply-adds per 224x224 image match torchvision's GFLOPS figure to its rounding."""
    assert _macs(name) / 1e9 == pytest.approx(gmacs, abs=0.006)


_GOOGLENET_TABLE1 = {  # name: (in, #1x1, #3x3red, #3x3, #5x5red, #5x5, pool proj, spatial, ops in M)
    "inception3a": (192, 64, 96, 128, 16, 32, 32, 28, 128),
    "inception3b": (256, 128, 128, 192, 32, 96, 64, 28, 304),
    "inception4a": (480, 192, 96, 208, 16, 48, 64, 14, 73),
    "inception4b": (512, 160, 112, 224, 24, 64, 64, 14, 88),
    "inception4c": (512, 128, 128, 256, 24, 64, 64, 14, 100),
    "inception4d": (512, 112, 144, 288, 32, 64, 64, 14, 119),
    "inception4e": (528, 256, 160, 320, 32, 128, 128, 14, 170),
    "inception5a": (832, 256, 160, 320, 32, 128, 128, 7, 54),
    "inception5b": (832, 384, 192, 384, 48, 128, 128, 7, 71),
}


def _inception_weights(cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pp: int) -> int:
    return cin * c1 + cin * c3r + 9 * c3r * c3 + cin * c5r + 25 * c5r * c5 + cin * pp


def test_googlenet_parameters_closed_form() -> None:
    """GoogLeNet's parameters equal Table 1's shapes summed by hand (weights plus one bias per channel)."""
    total = 7 * 7 * 3 * 64 + 64 + 64 * 64 + 64 + 9 * 64 * 192 + 192 + 1024 * 1000 + 1000
    for cin, c1, c3r, c3, c5r, c5, pp, _, _ in _GOOGLENET_TABLE1.values():
        total += _inception_weights(cin, c1, c3r, c3, c5r, c5, pp) + c1 + c3r + c3 + c5r + c5 + pp
    assert _params("googlenet") == total
    assert total / 1e6 == pytest.approx(6.8, rel=0.035)  # Table 1's rounded "6.8M" (its conv1 row reads 2.7K)


@pytest.mark.parametrize("module", list(_GOOGLENET_TABLE1))
def test_googlenet_inception_ops_match_table1(module: str) -> None:
    """Each inception module's multiply-adds match Szegedy et al. Table 1 (given there to ~2 digits)."""
    cin, c1, c3r, c3, c5r, c5, pp, spatial, ops_m = _GOOGLENET_TABLE1[module]
    closed = _inception_weights(cin, c1, c3r, c3, c5r, c5, pp) * spatial * spatial
    assert _macs("googlenet", module + ".") == closed
    assert closed / 1e6 == pytest.approx(ops_m, rel=0.06)


def test_seq2seq_parameters_match_sutskever() -> None:
    """384M parameters in all, 64M of them in the LSTM weights (32M encoder + 32M decoder)."""
    w = zoo.build("seq-lstm", batch=1, precision="fp32")
    assert w.param_bytes / 4 / 1e6 == pytest.approx(384, rel=1e-3)
    lstm = sum(l.param_bytes for l in w.layers if ".ih" in l.name or l.name.endswith(".steps.0")) / 4
    biases = 8 * 2 * 4000
    assert lstm - biases == 64_000_000


_RNN = {"rnn": (1, 2), "lstm": (4, 7), "gru": (3, 7)}  # gates, N x H tensors saved per timestep


@pytest.mark.parametrize("cell", list(_RNN))
def test_recurrent_stack_closed_forms(cell: str) -> None:
    """FLOPs, parameters and saved bytes of a stack equal hand-derived formulas (fp16, odd chunking)."""
    gates, per_step = _RNN[cell]
    n, t, hid, layers, feat, classes, chunk = 3, 7, 16, 3, 12, 5, 3
    w = zoo.build(cell, batch=n, hidden=hid, seq_len=t, layers=layers, input_size=feat, num_classes=classes,
                  chunk=chunk)  # fmt: skip
    gh = gates * hid
    inputs = [feat] + [hid] * (layers - 1)
    fwd = sum(2 * t * n * gh * (i + hid) for i in inputs) + 2 * t * n * hid * classes
    no_grad = 2 * t * n * feat * gh + layers * 2 * n * hid * gh  # first input; each layer's zero h0
    assert (w.fwd_flops, w.bwd_flops) == (fwd, 2 * fwd - no_grad)
    assert w.param_bytes == 2 * (sum(gh * (i + hid) + 2 * gh for i in inputs) + hid * classes + classes)
    step_saved = (t + 1 if cell == "rnn" else per_step * t) * n * hid
    saved = t * n * feat + (layers - 1) * t * n * hid + layers * step_saved + t * n * hid + t * n * classes
    assert w.saved_bytes == 2 * saved
    assert sum(l.kind is LayerKind.RNN_CELL for l in w.layers) == layers * math.ceil(t / chunk)


def test_vgg_saved_bytes_closed_form() -> None:
    """VGG-E saves, once each: the image, every conv's ReLU output, every max-pool's output (the next conv's
    or the classifier's input) and int64 indices, the classifier's ReLU outputs, dropout outputs and bool
    masks, and the log-probabilities."""
    convs = [(64, 224)] * 2 + [(128, 112)] * 2 + [(256, 56)] * 4 + [(512, 28)] * 4 + [(512, 14)] * 4
    pools = [64 * 112**2, 128 * 56**2, 256 * 28**2, 512 * 14**2, 512 * 7**2]
    e = 2
    saved = 3 * 224**2 * e + sum(c * s * s for c, s in convs) * e + sum(pools) * (8 + e)
    saved += 2 * (4096 * e + 4096 * 1 + 4096 * e) + 1000 * e
    assert zoo.build("vgg-e", batch=1).saved_bytes == saved


def test_resnet_residual_relu_reads_both_branches() -> None:
    """Each bottleneck's final ReLU lists bn3 and the identity branch as its inputs."""
    w = zoo.build("resnet-152", batch=1)
    relu3 = [l for l in w.layers if l.name.endswith(".relu3")]
    assert len(relu3) == sum((3, 8, 36, 3))
    for layer in relu3:
        block = layer.name.removesuffix(".relu3")
        assert layer.inputs[0] == f"{block}.bn3" and len(layer.inputs) == 2


@pytest.mark.parametrize("name", zoo.names())
def test_default_batch_footprint_exceeds_16gib(name: str) -> None:
    """At its default batch each workload's fp16 footprint exceeds a 16 GiB device; at half it fits."""
    w = zoo.build(name)
    assert w.batch == zoo.default_batch(name)
    assert w.footprint_bytes() > 16 * GIB >= w.with_batch(w.batch // 2).footprint_bytes()


@pytest.mark.parametrize("name", zoo.names())
def test_with_batch_matches_building_at_that_batch(name: str) -> None:
    """Rescaling with with_batch agrees with building at the new batch (batch-norm statistics aside)."""
    direct, scaled = zoo.build(name, batch=12), zoo.build(name, batch=3).with_batch(12)
    assert [l.fwd_flops for l in direct] == [l.fwd_flops for l in scaled]
    assert [l.bwd_flops for l in direct] == [l.bwd_flops for l in scaled]
    assert [l.output_bytes for l in direct] == [l.output_bytes for l in scaled]
    # batch-norm statistics (8 bytes per channel) do not grow with the batch but with_batch scales them
    assert scaled.saved_bytes == pytest.approx(direct.saved_bytes, rel=5e-3)
    assert scaled.param_bytes == direct.param_bytes


def test_fp32_doubles_parameters_not_flops() -> None:
    """Precision changes bytes per element, not FLOPs."""
    half, full = zoo.build("lstm", batch=2), zoo.build("lstm", batch=2, precision="fp32")
    assert full.param_bytes == 2 * half.param_bytes and full.fwd_flops == half.fwd_flops
    assert full.precision == "fp32"


def test_unknown_name_lists_allowed() -> None:
    """An unknown zoo name gives one line listing every allowed name."""
    with pytest.raises(WorkloadError) as info:
        zoo.build("vgg16")
    message = str(info.value)
    assert message.startswith("zoo workload: got 'vgg16'; must be one of ") and "\n" not in message
    assert all(n in message for n in zoo.names())


def test_unknown_scale_parameter_lists_allowed() -> None:
    """A misspelt scale parameter is named with the allowed ones."""
    expected = r"vgg-e.widht: got 0.5; unknown scale parameter, must be one of resolution, width, num_classes$"
    with pytest.raises(WorkloadError, match=expected):
        zoo.build("vgg-e", widht=0.5)


@pytest.mark.parametrize(("kwargs", "field"), [({"hidden": 0}, "lstm.hidden"), ({"chunk": 2.5}, "lstm.chunk"),
                                               ({"batch": 0}, "lstm.batch")])  # fmt: skip
def test_bad_scale_value(kwargs: dict, field: str) -> None:
    """Scale values out of range name the field and the rule."""
    with pytest.raises(WorkloadError, match=rf"^{field}: got .*; must be an integer >= 1$"):
        zoo.build("lstm", **kwargs)


def test_bad_precision() -> None:
    """Unknown precisions list the allowed ones."""
    with pytest.raises(WorkloadError, match="precision: got 'int8'; must be one of fp16, bf16, fp32"):
        zoo.build("rnn", precision="int8")


def test_resolution_too_small_is_explained() -> None:
    """AlexNet's feature map vanishes below 63 pixels: the error names the layer and the fix."""
    with pytest.raises(WorkloadError, match=r"alexnet at resolution=32.*'features.12'.*larger resolution"):
        zoo.build("alexnet", resolution=32)


def test_docs_table_is_current() -> None:
    """docs/zoo.md contains exactly what ``python -m mcdla.workload.zoo`` prints now."""
    assert table() in DOCS.read_text()


def test_cudnn_max_pool_saves_no_indices() -> None:
    """saves="cudnn" (vDNN's layers): a max-pool keeps x and y, not PyTorch's int64 indices. VGG-E at batch 1
    loses exactly 8 bytes per pooled output element (64x112^2 + 128x56^2 + 256x28^2 + 512x14^2 + 512x7^2 =
    1,530,368 elements), and each pool then saves only its own input (y counts at the next layer)."""
    torch_w = zoo.build("vgg-e", batch=1)
    cudnn_w = zoo.build("vgg-e", batch=1, saves="cudnn")
    pooled = 64 * 112**2 + 128 * 56**2 + 256 * 28**2 + 512 * 14**2 + 512 * 7**2
    assert pooled == 1_530_368
    assert torch_w.saved_bytes - cudnn_w.saved_bytes == 8 * pooled
    inputs = {112 * 2: 64, 56 * 2: 128, 28 * 2: 256, 14 * 2: 512, 7 * 2: 512}  # pool input side -> channels
    pools = [l for l in cudnn_w.layers if l.kind is LayerKind.POOL]
    assert [l.saved_bytes for l in pools] == [2 * c * side * side for side, c in inputs.items()]
    assert [l.name for l in torch_w.layers] == [l.name for l in cudnn_w.layers]
    assert torch_w.fwd_flops == cudnn_w.fwd_flops


def test_saves_must_be_known() -> None:
    with pytest.raises(WorkloadError, match="saves: got 'tf'; must be one of pytorch, cudnn"):
        zoo.build("alexnet", saves="tf")
