"""Which capture reads a model, and the context that runs it: ``capturing``.

"auto" picks attnscale's hook points where the model has them, else
transformers' AttentionInterface for a Hugging Face model (falling back, in the
same forward, to the attention functions its attention calls directly if none
goes through the interface), else the attention functions a model calls itself
("functions": ``scaled_dot_product_attention`` and ``multi_head_attention_forward``
(``nn.MultiheadAttention``, the ``nn.Transformer*`` layers), flex_attention and
flash-attn, intercepted together in one forward); an ``adapter`` is used where given.
"hooks", "hf", "sdpa", "flex", "flash", "functions" and "adapter" force one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from attnscale.capture.adapter import Adapter, capture_adapter
from attnscale.capture.call import AttentionCall, OnCall
from attnscale.capture.flash import capture_flash
from attnscale.capture.flex import capture_flex
from attnscale.capture.intercept import running_modules
from attnscale.capture.own import attention_modules, capture_hooks
from attnscale.capture.sdpa import capture_sdpa
from attnscale.errors import ConfigError

__all__ = ["CAPTURES", "Route", "capture_functions", "capturing", "choose"]

CAPTURES = ("auto", "hooks", "hf", "sdpa", "flex", "flash", "functions", "adapter")


@contextlib.contextmanager
def capture_functions(model: nn.Module | None, on_call: OnCall) -> Iterator[None]:
    """Every call of ``scaled_dot_product_attention``, flex_attention and flash-attn made inside, named after
    the innermost of the model's modules running (one set of hooks keeps the names for all three)."""
    with (running_modules(model) as where, capture_sdpa(model, on_call, where), capture_flex(model, on_call, where),
          capture_flash(model, on_call, where)):
        yield


def _is_hf(model: nn.Module) -> bool:
    """A transformers PreTrainedModel, told without importing transformers."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(model).__mro__)


def choose(model: nn.Module, capture: str = "auto", adapter: Adapter | None = None) -> str:
    """Which capture a probe of ``model`` uses (see the module's docstring)."""
    if capture not in CAPTURES:
        raise ConfigError(f"capture must be one of {', '.join(CAPTURES)}, got {capture!r}")
    if capture == "adapter" and adapter is None:
        raise ConfigError("capture='adapter' needs an adapter: attnscale.watch.Adapter(modules, read)")
    if capture != "auto":
        return capture
    if adapter is not None:
        return "adapter"
    if attention_modules(model):
        return "hooks"
    return "hf" if _is_hf(model) else "functions"


class Route:
    """What "auto" learned of one model over its probes: once calls have gone through transformers'
    AttentionInterface, later probes leave the attention functions alone (the TorchFunctionMode that
    intercepts SDPA sees every torch call of the forward, about a third of a probe's time on a small Llama).
    A caller that probes the same model again and again (a ``Watch``) keeps one; a fresh one knows nothing."""

    def __init__(self) -> None:
        self.through_interface = False


@contextlib.contextmanager
def capturing(model: nn.Module, on_call: OnCall, capture: str = "auto", adapter: Adapter | None = None,
              route: Route | None = None) -> Iterator[str]:
    """Hand every attention call of ``model`` made inside to ``on_call``; yields the capture used.
    "auto" on a Hugging Face model also intercepts the attention functions in the same forward and hands
    those calls over at the end only if none went through the AttentionInterface (``Route`` remembers which
    it was)."""
    kind = choose(model, capture, adapter)
    if kind == "hooks":
        with capture_hooks(model, on_call):
            yield kind
    elif kind == "adapter":
        with capture_adapter(model, on_call, adapter):
            yield kind
    elif kind != "hf":
        functions = {"sdpa": capture_sdpa, "flex": capture_flex, "flash": capture_flash, "functions": capture_functions}
        with functions[kind](model, on_call):
            yield kind
    else:
        from attnscale.capture.hf import capture_hf

        if capture == "hf" or (route is not None and route.through_interface):
            with capture_hf(model, on_call):
                yield kind
            return
        through_hf: list[AttentionCall] = []
        through_functions: list[AttentionCall] = []
        with capture_hf(model, through_hf.append), capture_functions(model, through_functions.append):
            yield kind
        if through_hf and route is not None:
            route.through_interface = True
        for call in through_hf or through_functions:
            on_call(call)
