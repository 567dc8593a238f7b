"""A probe: per-head attention health of any model, from one forward pass.

    stats = measure_heads(model, batch)     # HeadStats: (layers, measures, heads)
    numbers = measure(model, batch)         # {"attn/layer_0/head_3/max_score": ..., "attn/max_score": ...}

One forward on ``batch`` (a tensor the model takes as its first argument, a
dict of keyword arguments, a tuple of positional ones, or ``Inputs`` holding
both) under ``torch.no_grad()``, with autocast off and the model in eval mode
(each module's mode restored after). Every attention call is captured
(``route.py``) and reduced per head by ``reduce.py``, in blocks of at most
``memory`` bytes, in float32 whatever the model runs in. Padding (an
``attention_mask`` of shape B×T among the keyword arguments) is never a row nor
a key that counts.

A ``torch.compile``d model is probed through its original module (eagerly, on
the same weights), a (Distributed)DataParallel one through its ``module``. A
model whose forward takes ``logits_to_keep`` (transformers' causal LMs) is asked
for one position's logits a sequence (``one_logit``): the LM head is spared,
and ``HeadStats.lm_head`` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnscale.capture.adapter import Adapter
from attnscale.capture.batch import container, find_key, handed_padding, map_tensors, tensors_in
from attnscale.capture.options import WatchOptions, check_batch, check_flag, check_model
from attnscale.capture.ranks import TensorParallel, reduce_sums
from attnscale.capture.fused import measure_call
from attnscale.capture.kinds import call_kinds
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.sums import HeadSums
from attnscale.capture.route import Route, capturing
from attnscale.capture.stats import HeadStats, pack, unpack
from attnscale.core.diagnostics import FROZEN_THRESHOLD, measuring_device
from attnscale.core.head_kinds import kinds_of
from attnscale.errors import ConfigError

__all__ = ["LOGITS_TO_KEEP", "Inputs", "first_sequences", "forward", "input_device", "measure", "measure_heads",
           "one_logit", "padding_of", "probing", "stats_of", "unwrap"]


@dataclass(frozen=True)
class Inputs:
    """A forward's arguments as the model was given them: ``model(*args, **kwargs)``."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def first_sequences(batch: Any, n: int) -> Any:
    """The first ``n`` sequences of a batch (a tensor; ``Inputs``; a dict, tuple, list or dataclass of tensors,
    at any depth: ``capture.batch``): detached copies of every tensor that shares the batch dim, the rest as
    it is. The probe must not keep the training step's graph or see later in-place changes."""
    if torch.is_tensor(batch):
        return batch[:n].detach().clone()
    if not container(batch):
        raise TypeError(f"a probe batch is a tensor, a dict, tuple, list or dataclass of tensors, or "
                        f"attnscale.watch.Inputs, got {type(batch).__name__}")
    sizes = [v.shape[0] for v in tensors_in(batch) if v.ndim]
    rows = min(sizes) if sizes else None
    return map_tensors(batch, lambda v: v[:n].detach().clone() if v.ndim and v.shape[0] == rows else v)


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
    return map_tensors(x, lambda v: v.to(device))


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
    """One forward on ``batch``: ``Inputs`` as the call they hold, a dict as keyword arguments, a tuple or
    list as positional ones, anything else as the first argument; tensors go where the model starts."""
    device = input_device(model)
    if isinstance(batch, Inputs):
        return model(*[_to(v, device) for v in batch.args], **{k: _to(v, device) for k, v in batch.kwargs.items()})
    if isinstance(batch, Mapping):
        return model(**{k: _to(v, device) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return model(*[_to(v, device) for v in batch])
    return model(_to(batch, device))


# The keyword by which a transformers causal LM computes the logits of its last positions only.
LOGITS_TO_KEEP = ("logits_to_keep", "num_logits_to_keep")


def one_logit(model: nn.Module, batch: Any) -> tuple[Any, str]:
    """``batch`` asking ``model`` for the logits of one position a sequence, where its forward takes
    ``logits_to_keep`` (transformers' causal LMs) and the batch does not set it: the probe reads attention and
    never the logits, and the LM head over every position is the dearest layer of a small model (a 49k-word
    vocabulary on SmolLM2-135M). Its ``labels`` go (their loss would need every position's logits; nothing
    before the head reads them). (the batch, "logits_to_keep=1"), or (the batch as it is, "") elsewhere."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return batch, ""
    key = next((k for k in LOGITS_TO_KEEP if k in params), None)
    if isinstance(batch, Inputs):
        args, kwargs = batch.args, dict(batch.kwargs)
    elif isinstance(batch, Mapping) and all(isinstance(k, str) for k in batch):
        args, kwargs = (), dict(batch)
    elif isinstance(batch, (tuple, list)) or torch.is_tensor(batch):
        args, kwargs = (tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)), {}
    else:
        return batch, ""
    if key is None or any(k in kwargs for k in LOGITS_TO_KEEP):
        return batch, ""
    kwargs.pop("labels", None)
    return Inputs(args, {**kwargs, key: 1}), f"{key}=1"


def padding_of(batch: Any) -> torch.Tensor | None:
    """The B×T padding mask of a batch (its ``attention_mask``, True = a real token, in a dict at any depth: a
    keyword argument, or a dict the forward takes whole), if any."""
    mask = find_key(batch, "attention_mask")
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


@contextlib.contextmanager
def _integer_ids(model: nn.Module) -> Iterator[None]:
    """A ConfigError naming the fix where one of ``model``'s embeddings is handed ids that are no integers, at
    the call that hands them (torch's own error comes from deep inside the embedding)."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, nn.Embedding)}

    def check(module: nn.Module, args: tuple) -> None:
        ids = args[0] if args else None
        if torch.is_tensor(ids) and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
            raise ConfigError(f"the embedding {names[module]!r} of {type(model).__name__} takes integer token ids, "
                              f"got {ids.dtype} ones; give the ids as integers: ids.long()")

    hooks = [m.register_forward_pre_hook(check) for m in names]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


class _Layers:
    """The probe's calls as they come: each reduced at once into its own ``HeadSums``, on one device (the first
    call's; the CPU for MPS)."""

    def __init__(self, threshold: float, padding: torch.Tensor | None, memory: int, sample_rows: int | None,
                 kinds: bool = False):
        self.threshold, self.padding, self.memory, self.sample_rows = threshold, padding, memory, sample_rows
        self.kinds: list[torch.Tensor] | None = [] if kinds else None  # per call, ``capture.kinds.call_kinds``
        self.sums: list[HeadSums] = []
        self.names: list[str] = []
        self.methods: list[str] = []

    def pad(self, mask: torch.Tensor) -> None:
        """The padding mask the forward handed a submodule (``capture.batch.handed_padding``)."""
        self.padding = mask

    def __call__(self, call) -> None:
        device = self.sums[0].device if self.sums else measuring_device(call.q.device)
        sums = HeadSums(call.heads, self.threshold, device)
        self.methods.append(measure_call(call, sums, padding_BT=self.padding, memory=self.memory,
                                         sample_rows=self.sample_rows, seed=len(self.sums)))
        if self.kinds is not None:
            self.kinds.append(call_kinds(call, self.padding, self.memory, device))
        self.sums.append(sums)
        self.names.append(call.name or f"call {len(self.names)}")

    def stats(self) -> HeadStats:
        stats = stats_of(self.sums, self.names, self.sample_rows, self.methods)
        if self.kinds is None:
            return stats
        return dataclasses.replace(stats, kinds=tuple(tuple(kinds_of(k)) for k in self.kinds))


def stats_of(sums: list[HeadSums], names: list[str], sample_rows: int | None = None,
             methods: list[str] | tuple[str, ...] = ()) -> HeadStats:
    """The ``HeadStats`` of layers reduced one ``HeadSums`` each (with its name), read back to the CPU in one
    transfer: a probe's own, or those of a caller that captures the forward itself (the watch in the
    training forward). ``sample_rows``: whether rows were sampled (the row measures' standard errors);
    ``methods``: how each layer was measured (``capture.fused``: "fused" or "replay"), where known."""
    return unpack(pack(sums).cpu(), tuple(names), tuple(s.heads for s in sums), errors=sample_rows is not None,
                  methods=tuple(methods))


def measure_heads(model: nn.Module, batch: Any, *, threshold: float = FROZEN_THRESHOLD, capture: str = "auto",
                  adapter: Adapter | None = None, across_ranks: bool = False, memory: int = DEFAULT_MEMORY,
                  sample_rows: int | None = None, route: Route | None = None,
                  tensor_parallel: TensorParallel | None = None, head_kinds: bool = False) -> HeadStats:
    """Per-head measurements of ``model`` on ``batch`` (see the module's docstring). ``memory``: the bytes a
    block of scores may take (``capture.reduce``); ``sample_rows``: measure that many query rows of each
    sequence (drawn at random, the same each probe), with each row measure's standard error. ``across_ranks``:
    in a process group, every rank calls this on its own batch and gets the numbers of all the ranks' batches
    together, in one collective (``ranks.py``); with ``tensor_parallel`` (``ranks.TensorParallel``) each rank's
    heads are read under their global index, so every rank gets every head of the group. ``route``: what
    earlier probes of this model learned. ``head_kinds``: also mark each head a sink, a previous-token head or
    neither (``HeadStats.kinds``: ``core/head_kinds.py``'s rule on this batch's weights, this rank's batch
    alone; every row's scores are made again, about a replayed probe's cost more; not with
    ``tensor_parallel``, whose ranks hold parts of the heads)."""
    WatchOptions(threshold=threshold, capture=capture, adapter=adapter, memory=memory, sample_rows=sample_rows,
                 tensor_parallel=tensor_parallel)  # a bad option is refused here, before any forward
    check_model(model, "measure_heads", "the torch.nn.Module to measure")
    check_flag("across_ranks", across_ranks)
    check_flag("head_kinds", head_kinds)
    if head_kinds and tensor_parallel is not None:
        raise ConfigError("head_kinds reads whole heads, and under tensor_parallel each rank holds part of them: "
                          "leave head_kinds off there")
    model = unwrap(model)
    check_batch(batch, model)
    route = Route() if route is None else route
    lean, lm_head = one_logit(model, batch)
    while True:
        layers = _Layers(threshold, padding_of(batch), memory, sample_rows, head_kinds)
        remembered = capture == "auto" and route.through_interface
        with probing(model), _integer_ids(model), capturing(model, layers, capture, adapter, route) as kind, \
                handed_padding(model, layers.pad) if layers.padding is None else contextlib.nullcontext():
            forward(model, lean)
        if layers.sums or not remembered:
            break
        route.through_interface = False  # the interface saw nothing this time: once more with SDPA too
    if not layers.sums:
        raise ConfigError(
            f"no attention call of {type(model).__name__} was seen (capture {kind!r}); the model must use attnscale's "
            "Attention, transformers' AttentionInterface, torch.nn.functional.scaled_dot_product_attention, "
            "torch.nn.MultiheadAttention, flex_attention or flash-attn's flash_attn_func, or be measured with adapter=attnscale.watch.Adapter(modules, read)")
    if across_ranks:
        reduce_sums(layers.sums, layers.names, tensor_parallel)
    return dataclasses.replace(layers.stats(), lm_head=lm_head)


def measure(model: nn.Module, batch: Any, **kw) -> dict[str, float]:
    """``measure_heads(model, batch, **kw).flat()``: one number per layer, head and
    measure, keyed ``attn/layer_{l}/head_{h}/{measure}``, and the model-wide summary."""
    return measure_heads(model, batch, **kw).flat()
