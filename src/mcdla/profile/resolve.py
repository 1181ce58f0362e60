"""Turn a model spec (``NAME`` or ``python:MODULE:FACTORY``) into a model, example inputs and a loss.

``NAME`` is one of the two extra models (:mod:`mcdla.profile.extra_models`: ``mlp``, ``transformer``) or a
zoo model (:mod:`mcdla.profile.models`, built at the zoo's small CPU scale unless ``scale`` says otherwise).
``python:MODULE:FACTORY`` imports ``MODULE`` and calls ``FACTORY(**scale)``, which must return
``(model, example_inputs)`` or ``(model, example_inputs, loss_fn)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mcdla.errors import ProfileError

__all__ = ["ResolvedModel", "resolve_model", "model_names", "to_device"]


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model ready to profile: its name, the module, forward arguments and loss (None: output is the loss)."""

    name: str
    model: nn.Module
    example_inputs: Any
    loss_fn: Callable[[Any], torch.Tensor] | None


def model_names() -> tuple[str, ...]:
    """Names ``resolve_model`` accepts besides ``python:MODULE:FACTORY``."""
    from mcdla.profile import extra_models
    from mcdla.workload import zoo

    return extra_models.names() + zoo.names()


def resolve_model(spec: str, *, batch: int | None = None, scale: Mapping[str, Any] | None = None) -> ResolvedModel:
    """Build the model ``spec`` names (see the module doc); one-line ProfileError when it cannot."""
    scale = dict(scale or {})
    if not isinstance(spec, str) or not spec:
        raise ProfileError(f"model: got {spec!r}; must be a model name or python:MODULE:FACTORY")
    if spec.startswith("python:"):
        return _from_factory(spec, batch, scale)
    from mcdla.profile import extra_models
    from mcdla.workload import zoo

    if spec in extra_models.names():
        if batch is not None:
            scale["batch"] = batch
        model, inputs, loss = extra_models.build(spec, **scale)
        return ResolvedModel(spec, model, inputs, loss)
    if spec in zoo.names():
        from mcdla.profile import models

        params = zoo.small_scale(spec)
        params.update(scale)
        b = batch if batch is not None else params.pop("batch", None)
        params.pop("batch", None)
        try:
            model, inputs, loss = models.build(spec, batch=b, **params)
        except ProfileError:
            raise
        except Exception as exc:  # noqa: BLE001 - a zoo WorkloadError for a bad scale stays one line
            raise ProfileError(f"model {spec!r}: {exc}") from None
        return ResolvedModel(spec, model, inputs, loss)
    raise ProfileError(
        f"model: got {spec!r}; must be one of {', '.join(model_names())} or python:MODULE:FACTORY"
    )


def _from_factory(spec: str, batch: int | None, scale: dict[str, Any]) -> ResolvedModel:
    parts = spec.split(":")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise ProfileError(f"model: got {spec!r}; must be python:MODULE:FACTORY, e.g. python:mypkg.nets:make")
    _, module_name, factory_name = parts
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError or an error while importing the user's module
        raise ProfileError(f"model {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ProfileError(f"model {spec!r}: module {module_name!r} has no callable {factory_name!r}")
    if batch is not None:
        scale["batch"] = batch
    try:
        made = factory(**scale)
    except Exception as exc:  # noqa: BLE001
        raise ProfileError(f"model {spec!r}: {factory_name}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(made, tuple) or len(made) not in (2, 3) or not isinstance(made[0], nn.Module):
        raise ProfileError(
            f"model {spec!r}: {factory_name}() returned {type(made).__name__}; must return "
            "(model, example_inputs) or (model, example_inputs, loss_fn)"
        )
    loss = made[2] if len(made) == 3 else None
    return ResolvedModel(f"{module_name}:{factory_name}", made[0], made[1], loss)


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def to_device(resolved: ResolvedModel, device: str | torch.device) -> ResolvedModel:
    """The model and its example inputs moved to ``device`` (the loss must follow its input's device)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device: got {str(dev)!r}; CUDA is not available on this machine")
    return ResolvedModel(resolved.name, resolved.model.to(dev), _move(resolved.example_inputs, dev), resolved.loss_fn)
