"""``measure``: per-head attention health of any model, from one forward pass.

    stats = measure_heads(model, batch)     # HeadStats: (layers, measures, heads)
    numbers = measure(model, batch)         # {"attn/layer_0/head_3/max_score": ..., "attn/max_score": ...}

One forward on ``batch`` (a tensor the model takes as its first argument, e.g.
token ids, or the dict a Hugging Face model takes) under ``torch.no_grad()``,
with autocast off and the model in eval mode (each module's mode is restored
after). The q and k of every attention call are captured (``capture.py``) and
the scores recomputed from them in float32, whatever the model runs in, then
reduced per head by ``core.diagnostics`` (``HEAD_MEASURES``: spread, max
|score|, effective words, frozen fraction, push, max weight). Padding (the
``attention_mask`` of a dict batch) is never a row nor a key that counts.

``capture``: "auto" picks attnscale's hook points where the model has them,
else transformers' AttentionInterface for a Hugging Face model (falling back, in
the same forward, to the SDPA calls its attention makes if none goes through
the interface), else the interception of
``torch.nn.functional.scaled_dot_product_attention``; an ``adapter`` is used
where given. "hooks", "hf", "sdpa" and "adapter" force one.

A ``torch.compile``d model is probed through its original module (eagerly, on
the same weights), a (Distributed)DataParallel one through its ``module``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscale.core.diagnostics import COLLAPSED_WORDS, FROZEN_THRESHOLD, HEAD_MEASURES, reduce_heads
from attnscale.errors import ConfigError
from attnscale.watch.capture import Adapter, AttentionCall, attention_modules, capture_adapter, capture_hooks
from attnscale.watch.distributed import reduce_pools
from attnscale.watch.sdpa_capture import capture_sdpa
from attnscale.watch.pool import LayerPools

__all__ = ["CAPTURES", "HeadStats", "capturing", "choose", "forward", "input_device", "measure", "measure_heads", "padding_of",
           "probing", "unwrap"]

CAPTURES = ("auto", "hooks", "hf", "sdpa", "adapter")


@dataclass(frozen=True, eq=False)  # tensors inside: compared by identity
class HeadStats:
    """Per-head measurements of one probe.

    ``values_LMH``: float32 on the CPU, (layers, len(HEAD_MEASURES), heads); a
    layer is one attention call, in the order the model made them. NaN where a
    head measured nothing (a layer with fewer heads, a head whose every row saw
    fewer than two keys). ``rows_LH``: the rows each head counted (float64), to
    pool probes weighted by rows (e.g. over DDP ranks). ``layer_names``: where
    each layer's call came from; ``layer_heads``: each layer's head count (where
    they differ, the tensors are as wide as the widest)."""

    values_LMH: torch.Tensor
    rows_LH: torch.Tensor
    measures: tuple[str, ...] = HEAD_MEASURES
    layer_names: tuple[str, ...] = ()
    layer_heads: tuple[int, ...] = ()

    @property
    def layers(self) -> int:
        return len(self.values_LMH)  # one row of the table per layer

    @property
    def heads(self) -> int:
        return self.values_LMH.shape[2]

    def get(self, measure: str) -> torch.Tensor:
        """One measure, (layers, heads)."""
        if measure not in self.measures:
            raise KeyError(f"no measure {measure!r}; choose one of {', '.join(self.measures)}")
        return self.values_LMH[:, self.measures.index(measure)]

    def _lists(self, measure: str) -> list[list[float | None]]:
        return [[None if v != v else v for v in layer] for layer in self.get(measure).tolist()]

    def summary(self) -> dict[str, float]:
        """The model in four numbers: the largest |score| of any head, the fewest
        effective words of any head, the share of frozen rows over all heads
        (weighted by rows) and how many heads are collapsed (fewer than
        ``COLLAPSED_WORDS`` effective words)."""
        words = self._lists("effective_words")
        return {
            "attn/max_score": reduce_heads(self._lists("max_score"), "max"),
            "attn/min_effective_words": reduce_heads(words, "min"),
            "attn/frozen_fraction": reduce_heads(self._lists("frozen_fraction"), weights_LH=self.rows_LH.tolist()),
            "attn/collapsed_heads": float(sum(v is not None and v < COLLAPSED_WORDS for layer in words for v in layer)),
        }

    def flat(self) -> dict[str, float]:
        """``attn/layer_{l}/head_{h}/{measure}`` for every layer, head and measure
        (heads a layer lacks left out), then ``summary()``."""
        out: dict[str, float] = {}
        values = self.values_LMH.tolist()
        for l, layer in enumerate(values):
            for h in range(self.layer_heads[l] if self.layer_heads else self.heads):
                for m, name in enumerate(self.measures):
                    out[f"attn/layer_{l}/head_{h}/{name}"] = layer[m][h]
        out.update(self.summary())
        return out


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
    return "hf" if _is_hf(model) else "sdpa"


# Hugging Face models whose attention went through the AttentionInterface at an "auto" probe: their
# next probes leave SDPA alone, since the TorchFunctionMode sees every torch call of the forward
# (about a third of a probe's time on a small Llama). measure_heads probes once more with both if
# the interface alone then sees nothing.
_THROUGH_INTERFACE: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


@contextlib.contextmanager
def capturing(model: nn.Module, on_call, capture: str = "auto", adapter: Adapter | None = None) -> Iterator[str]:
    """Hand every attention call of ``model`` made inside to ``on_call``; yields the capture used.
    "auto" on a Hugging Face model also intercepts SDPA in the same forward and hands those
    calls over at the end only if none went through the AttentionInterface; once calls have gone
    through the interface, later "auto" probes of that model use the interface alone."""
    kind = choose(model, capture, adapter)
    if kind == "hooks":
        with capture_hooks(model, on_call):
            yield kind
    elif kind == "adapter":
        with capture_adapter(model, on_call, adapter):
            yield kind
    elif kind == "sdpa":
        with capture_sdpa(model, on_call):
            yield kind
    else:
        from attnscale.watch.hf_capture import capture_hf

        if capture == "hf" or model in _THROUGH_INTERFACE:
            with capture_hf(model, on_call):
                yield kind
            return
        through_hf: list[AttentionCall] = []
        through_sdpa: list[AttentionCall] = []
        with capture_hf(model, through_hf.append), capture_sdpa(model, through_sdpa.append):
            yield kind
        if through_hf:
            _THROUGH_INTERFACE.add(model)
        for call in through_hf or through_sdpa:
            on_call(call)


def _modes(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    return [(m, m.training) for m in model.modules()]


def input_device(model: nn.Module) -> torch.device:
    """Where the inputs go: the input embedding's device (a model spread over devices
    starts there), else the first parameter's, else the CPU."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        emb = None
    for tensor in ([emb.weight] if isinstance(getattr(emb, "weight", None), torch.Tensor) else []) + list(model.parameters()):
        return tensor.device
    return torch.device("cpu")


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device) if isinstance(x, torch.Tensor) else x


@contextlib.contextmanager
def probing(model: nn.Module) -> Iterator[None]:
    """The probe's conditions: eval mode (each module's own mode restored after),
    ``torch.no_grad()`` and autocast off on every device type the model uses."""
    modes = _modes(model)
    types = {"cpu"} | {p.device.type for p in model.parameters()}
    model.eval()
    try:
        with torch.no_grad(), contextlib.ExitStack() as stack:
            for t in sorted(types & {"cpu", "cuda", "mps", "xpu"}):
                stack.enter_context(torch.autocast(t, enabled=False))
            yield
    finally:
        for m, training in modes:
            m.training = training


def forward(model: nn.Module, batch: Any) -> Any:
    """One forward on ``batch``: a dict as keyword arguments, a tuple or list as
    positional ones, anything else as the first argument; tensors go where the model starts."""
    device = input_device(model)
    if isinstance(batch, Mapping):
        return model(**{k: _to(v, device) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return model(*[_to(v, device) for v in batch])
    return model(_to(batch, device))


def padding_of(batch: Any) -> torch.Tensor | None:
    """The B×T padding mask of a dict batch (its ``attention_mask``, True = a real token), if any."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return mask.bool() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None


def unwrap(model: nn.Module) -> nn.Module:
    """The model a probe runs: a ``torch.compile``d module's original (the probe runs eagerly,
    on the same weights) and a (Distributed)DataParallel's own module (its forward would sync
    buffers with ranks that are not probing)."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch._dynamo's OptimizedModule
            model = model._orig_mod
        else:
            return model


def measure_heads(model: nn.Module, batch: Any, *, threshold: float = FROZEN_THRESHOLD, capture: str = "auto",
                  adapter: Adapter | None = None, across_ranks: bool = False) -> HeadStats:
    """Per-head measurements of ``model`` on ``batch`` (see the module's docstring). ``across_ranks``: in a
    process group, every rank calls this on its own batch and gets the numbers of all the ranks' batches
    concatenated, in one collective (``distributed.py``)."""
    model = unwrap(model)
    padding = padding_of(batch)
    while True:
        pools = LayerPools(threshold)
        remembered = capture == "auto" and model in _THROUGH_INTERFACE
        with probing(model), capturing(model, lambda call: pools.add(call, padding), capture, adapter) as kind:
            forward(model, batch)
        if pools or not remembered:
            break
        _THROUGH_INTERFACE.discard(model)  # the interface saw nothing this time: once more with SDPA too
    if not pools:
        raise ConfigError(
            f"no attention call of {type(model).__name__} was seen (capture {kind!r}); the model must use attnscale's "
            "Attention, transformers' AttentionInterface or torch.nn.functional.scaled_dot_product_attention, "
            "or be measured with adapter=attnscale.watch.Adapter(modules, read)")
    if across_ranks:
        reduce_pools(pools.pools)
    values, rows = pools.read()
    return HeadStats(values, rows, HEAD_MEASURES, tuple(pools.names), tuple(p.rows.shape[0] for p in pools.pools))


def measure(model: nn.Module, batch: Any, **kw) -> dict[str, float]:
    """``measure_heads(model, batch, **kw).flat()``: one number per layer, head and
    measure, keyed ``attn/layer_{l}/head_{h}/{measure}``, and the model-wide summary."""
    return measure_heads(model, batch, **kw).flat()
