"""The held-out loss of a trained model, and the small helpers the training loop and the Hugging Face family share.

``evaluate`` is the token-weighted mean cross-entropy over the held-out windows, summed on the model's device in
float64 (float32 on MPS, which has none: ``sum_dtype``) and read back once; ``finite`` turns a number JSON cannot
hold into None; ``threads`` sets torch's thread count for a block and restores it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch

from attnscale.core import device as dev
from attnscale.core.diagnostics import measuring_device
from attnscale.lm.data import eval_batches
from attnscale.lm.precision import in_precision

__all__ = ["evaluate", "finite", "sum_dtype", "threads"]


@contextlib.contextmanager
def threads(n: int | None):
    """torch's thread count set to ``n`` (None: left as it is) inside the block, and restored after it."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sum_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the held-out loss's running sum: float64 where the device has it (``measuring_device``),
    float32 on MPS."""
    return torch.float64 if measuring_device(device) is device else torch.float32


def evaluate(model: torch.nn.Module, ids: torch.Tensor, batch: int, max_batches: int | None,
             dtype: "str | dev.Precision" = "fp32", *, context: int | None = None,
             logits: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
    """Held-out mean cross-entropy (nats, token-weighted) and perplexity = exp of it.

    Runs on the model's device; ``dtype`` is a resolved ``Precision``, or a name resolved
    by the rule of the model's device. The sum stays on the device (float64; float32 on MPS,
    which has no float64) and is read back once. No graph is built: the forward runs under
    ``torch.no_grad`` below (not as a decorator, which mutation testing would skip).

    Another module than a ``TinyLM`` (a Hugging Face model: ``lm.hf_family``) gives its
    ``context`` and ``logits`` (ids_BT -> logits_BTV)."""
    context = model.cfg.context if context is None else context
    logits = model if logits is None else logits
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    device = param.device
    precision = dtype if isinstance(dtype, dev.Precision) else dev.resolve_precision(dtype, device)
    total, tokens = param.new_zeros((), dtype=sum_dtype(device)), 0  # on the model's device
    try:
        for i, (x_BT, y_BT) in enumerate(eval_batches(ids, batch, context)):
            if max_batches is not None and i >= max_batches:
                break
            x_BT, y_BT = dev.to_device(device, x_BT, y_BT)
            with torch.no_grad(), in_precision(precision):  # no graph: evaluation never backpropagates
                logits_BTV = logits(x_BT)
            total += torch.nn.functional.cross_entropy(logits_BTV.float().flatten(0, 1), y_BT.flatten(), reduction="sum")
            tokens += y_BT.numel()
    finally:
        model.train(was_training)
    loss = float(total) / tokens
    return {"valid_loss": loss, "perplexity": math.exp(loss) if loss < 700 else math.inf, "eval_tokens": tokens}


def finite(x: Any) -> float | None:
    """``x`` as a float where it is a finite number, else None (None, NaN, ±inf: JSON has no inf)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
