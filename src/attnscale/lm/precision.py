"""Mixed precision for the training step: bf16 compute on fp32 master weights, and flat gradients.

A model's parameters, or its gradients, made views into one flat tensor can be zeroed, copied, cast
and measured in one call each instead of one per parameter. ``Bf16Copy`` keeps a bf16 copy of a
model's fp32 (master) weights that way, for the step to compute on while the optimiser updates the
masters; ``flat_grads`` and ``clip_`` serve every run, whatever its precision.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch

from attnscale.core import device as dev

__all__ = ["Bf16Copy", "flat_grads", "flat_weights", "views", "clip_", "in_precision"]


@contextlib.contextmanager
def in_precision(precision: "dev.Precision") -> Iterator[None]:
    """TF32 where the precision allows it, and autocast: what evaluation's forwards run under."""
    with dev.tf32(precision), dev.autocast(precision):
        yield


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's gradient made a view into one flat tensor of zeros, returned: the gradients are
    then zeroed, copied and measured in one call each. Autograd adds a step's gradient into a gradient
    that is there (``AccumulateGrad``, in place), so the views stay the gradients from step to step."""
    params = list(model.parameters())
    flat = params[0].new_zeros(sum(p.numel() for p in params))
    for p, view in zip(params, views(flat, params)):
        p.grad = view
    return flat


def clip_(grads: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on gradients that lie in one flat tensor: their 2-norm,
    returned, and the gradients scaled by max_norm / (norm + 1e-6) where that is below 1; one norm and
    one multiply in place of two per parameter."""
    norm = torch.linalg.vector_norm(grads)
    grads.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter of ``model`` made a view into one flat tensor, returned: the whole model is then
    copied, or cast, in one call."""
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    for p, view in zip(params, views(flat, params)):
        p.data = view
    return flat


def views(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views into ``flat``, in order, each shaped as one of ``params``."""
    return [view.view_as(p) for p, view in zip(params, flat.split([p.numel() for p in params]))]


class Bf16Copy:
    """A bf16 copy of a model's fp32 (master) weights for the step to compute on. Weights and gradients
    of both lie in one flat tensor each: the copy is refreshed from the masters in one cast, and hands
    its gradients to the masters' in one more."""

    def __init__(self, master: torch.nn.Module, master_grads: torch.Tensor):
        self.master_flat, self.master_grads = flat_weights(master), master_grads
        self.model = copy.deepcopy(master).to(torch.bfloat16)
        self.flat = flat_weights(self.model)
        self.grads = flat_grads(self.model)

    def refresh(self) -> None:
        """The copy := the masters, cast (after each update, and after a checkpoint is loaded)."""
        with torch.no_grad():
            self.flat.copy_(self.master_flat)

    def gradients_to_masters(self) -> None:
        """The masters' gradients := the copy's, in fp32 (a weight the loss did not reach: 0, as the
        model's own would be); the copy's are zeroed for the next backward to add into."""
        self.master_grads.copy_(self.grads)
        self.grads.zero_()
