"""Model specs: extra models, zoo names and python:MODULE:FACTORY."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcdla.errors import ProfileError
from mcdla.profile import extra_models
from mcdla.profile.resolve import resolve_model


@pytest.mark.parametrize("name", extra_models.names())
def test_extra_models_train_one_step(name: str) -> None:
    """The MLP and the transformer build at a small scale and give a scalar loss with gradients."""
    small = {"mlp": {"width": 64, "depth": 2, "in_features": 32}, "transformer": {"d_model": 32, "layers": 1, "seq_len": 16}}
    r = resolve_model(name, batch=4, scale=small[name])
    loss = r.loss_fn(r.model(*r.example_inputs))
    loss.backward()
    assert loss.dim() == 0 and all(p.grad is not None for p in r.model.parameters())


def test_zoo_names_build_at_the_small_scale() -> None:
    """A zoo name resolves to the torch zoo model at its small CPU scale."""
    r = resolve_model("alexnet")
    assert r.name == "alexnet" and isinstance(r.example_inputs[0], torch.Tensor)


def test_python_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """python:MODULE:FACTORY imports the module and calls the factory with the scale."""
    (tmp_path / "my_nets.py").write_text(
        "import torch\n"
        "def make(width=8):\n"
        "    m = torch.nn.Linear(width, 1)\n"
        "    return m, (torch.randn(2, width),), lambda o: o.sum()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    r = resolve_model("python:my_nets:make", scale={"width": 5})
    assert r.model.in_features == 5 and r.name == "my_nets:make"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "must be one of mlp, transformer"),
        ("python:only_module", "must be python:MODULE:FACTORY"),
        ("python:no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("python:math:no_such_factory", "has no callable 'no_such_factory'"),
        ("python:math:floor", "floor() raised"),
    ],
)
def test_bad_specs_are_one_line_errors(spec: str, message: str) -> None:
    """Unknown names, malformed specs, missing modules or factories are one-line ProfileErrors."""
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        resolve_model(spec)
    assert "\n" not in str(info.value)


def test_unknown_scale_parameter_is_rejected() -> None:
    """A scale key the model does not have is named in the error."""
    with pytest.raises(ProfileError, match="unknown scale parameter 'depthh'"):
        resolve_model("mlp", scale={"depthh": 3})
