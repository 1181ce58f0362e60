"""Running one training step of a user's model with checked inputs and one-line errors.

A *step* here is what mcdla profiles, simulates and runs: forward, loss, backward (gradients set to None
first). No optimizer step: it does not touch saved activations, and leaving it out keeps "the same step"
identical for the profiler, the runtime and the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from mcdla.errors import ProfileError

__all__ = ["StepInputs", "normalize_inputs", "run_forward", "compute_loss", "zero_grads", "precision_of", "infer_batch"]

LossFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Positional and keyword arguments of the model's forward."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def normalize_inputs(example_inputs: Any) -> StepInputs:
    """Accept a tensor, a tuple/list of positional arguments, or a dict of keyword arguments."""
    if isinstance(example_inputs, torch.Tensor):
        return StepInputs((example_inputs,), {})
    if isinstance(example_inputs, Mapping):
        return StepInputs((), dict(example_inputs))
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, (str, bytes)):
        return StepInputs(tuple(example_inputs), {})
    raise ProfileError(
        f"example_inputs: got {type(example_inputs).__name__}; must be a tensor, a tuple of forward arguments "
        "or a dict of keyword arguments"
    )


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[0].split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_forward(model: nn.Module, inputs: StepInputs, where: Callable[[], str | None] = lambda: None) -> Any:
    """Run the model's forward; a failure becomes one ProfileError line naming the innermost module."""
    try:
        return model(*inputs.args, **inputs.kwargs)
    except ProfileError:
        raise
    except Exception as exc:  # noqa: BLE001 - any user-model failure becomes one line
        module = where()
        place = f" in module {module!r}" if module else ""
        raise ProfileError(f"model {type(model).__name__}: forward failed{place}: {_first_line(exc)}") from None


def compute_loss(output: Any, loss_fn: LossFn | None) -> torch.Tensor:
    """The scalar loss of ``output``: ``loss_fn(output)``, or the output itself when no loss_fn is given.

    Raises ProfileError when the loss is not a 0-dim floating tensor that requires grad.
    """
    if loss_fn is None:
        loss, what = output, "model output (no loss_fn given)"
    else:
        try:
            loss = loss_fn(output)
        except Exception as exc:  # noqa: BLE001
            raise ProfileError(f"loss_fn: raised {_first_line(exc)}") from None
        what = "loss_fn result"
    if not isinstance(loss, torch.Tensor):
        raise ProfileError(f"{what}: got {type(loss).__name__}; must be a scalar tensor")
    if loss.dim() != 0:
        raise ProfileError(f"{what}: got a tensor of shape {tuple(loss.shape)}; must be a scalar (0-dim) tensor")
    if not loss.dtype.is_floating_point:
        raise ProfileError(f"{what}: got dtype {loss.dtype}; must be a floating-point scalar")
    if not loss.requires_grad:
        raise ProfileError(f"{what}: does not require grad; the model has no trainable parameter on the loss path")
    return loss


def zero_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


_PRECISIONS = MappingProxyType({
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp64",
})


def precision_of(model: nn.Module, inputs: StepInputs) -> str:
    """The workload precision from the dtype of the first floating parameter (else the first float input)."""
    for p in model.parameters():
        if p.dtype.is_floating_point:
            return _PRECISIONS.get(p.dtype, "fp32")
    for t in (*inputs.args, *inputs.kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            return _PRECISIONS.get(t.dtype, "fp32")
    return "fp32"


def infer_batch(inputs: StepInputs) -> int:
    """Dimension 0 of the first tensor argument (1 when there is none)."""
    for t in (*inputs.args, *inputs.kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 1
