"""A batch as the frameworks hand it to a forward: tensors at any depth of dicts, tuples and lists.

A probe batch is whatever the model's forward took. Lightning hands ``training_step`` its loader's batch and
the idiom ``self(batch)`` passes it on whole, so the forward's one positional argument may be a dict
(``{"input_ids": ..., "attention_mask": ..., "labels": ...}``), a tuple ``(x, y)``, transformers'
``BatchEncoding`` (a mapping) or a dataclass of tensors; the Hugging Face Trainer calls ``model(**inputs)``.
The probe reads them all the same way: every tensor found at any depth of mappings, tuples, lists
(named tuples too) and dataclass fields, the rest left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["batch_shape", "container", "find_key", "handed_padding", "map_tensors", "tensors_in"]


def _dataclass(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def container(x: Any) -> bool:
    """Whether the probe reads into ``x``: a mapping, a tuple or list, or a dataclass instance."""
    return isinstance(x, (Mapping, tuple, list)) or _dataclass(x)


def _items(x: Any) -> list:
    if isinstance(x, Mapping):
        return list(x.values())
    if isinstance(x, (tuple, list)):
        return list(x)
    if _dataclass(x):
        return [getattr(x, f.name) for f in dataclasses.fields(x)]
    return []


def tensors_in(x: Any) -> Iterator[torch.Tensor]:
    """Every tensor of ``x``, depth first in the order the containers hold them."""
    if torch.is_tensor(x):
        yield x
        return
    for item in _items(x):
        yield from tensors_in(item)


def map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``x`` rebuilt with ``fn`` applied to each of its tensors, each container of the type it was where that
    type can be made again from its items (a dict subclass, ``BatchEncoding``, a named tuple, a dataclass), a
    plain dict or tuple otherwise; anything that is no tensor nor container is kept as it is."""
    if torch.is_tensor(x):
        return fn(x)
    if isinstance(x, Mapping):
        items = {k: map_tensors(v, fn) for k, v in x.items()}
        try:
            return type(x)(items)
        except Exception:  # a mapping that cannot be made from a dict: the forward gets a plain one
            return items
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple takes its fields positionally
        return type(x)(*(map_tensors(v, fn) for v in x))
    if isinstance(x, (tuple, list)):
        items = [map_tensors(v, fn) for v in x]
        try:
            return type(x)(items)
        except Exception:
            return tuple(items) if isinstance(x, tuple) else items
    if _dataclass(x):
        changed = {f.name: map_tensors(getattr(x, f.name), fn) for f in dataclasses.fields(x) if f.init}
        return dataclasses.replace(x, **changed)
    return x


def find_key(x: Any, key: str) -> Any:
    """The value under ``key`` in the first mapping (or dataclass field) of ``x`` that holds it, depth first;
    None if none does."""
    if isinstance(x, Mapping) and key in x:
        return x[key]
    if _dataclass(x) and any(f.name == key for f in dataclasses.fields(x)):
        return getattr(x, key)
    for item in _items(x):
        found = find_key(item, key)
        if found is not None:
            return found
    return None


def batch_shape(x: Any) -> tuple[int, int] | None:
    """(sequences, tokens) of the first tensor of ``x`` with two dims or more (the ids, or a pipeline stage's
    activations), or None."""
    first = next((v for v in tensors_in(x) if v.ndim >= 2), None)
    return None if first is None else (int(first.shape[0]), int(first.shape[1]))


def _mask_position(module: nn.Module) -> int | None:
    """The position of ``attention_mask`` among the arguments of ``module.forward``, or None if it takes none."""
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("attention_mask") if "attention_mask" in names else None


@contextlib.contextmanager
def handed_padding(model: nn.Module, found: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While a forward of ``model`` runs: the first B×T padding mask it hands a submodule whose forward takes an
    ``attention_mask`` (a Hugging Face model inside a LightningModule that unpacked its tuple batch itself), to
    ``found`` as booleans, before that submodule's attention runs. For a batch that names no mask of its own."""
    hooks: list = []

    def hook_at(position: int):
        def hook(module, args, kwargs):
            mask = kwargs.get("attention_mask", args[position] if position < len(args) else None)
            if torch.is_tensor(mask) and mask.ndim == 2:
                found(mask.bool())
                for h in hooks:
                    h.remove()
        return hook

    try:
        for module in model.modules():
            position = None if module is model else _mask_position(module)
            if position is not None:
                hooks.append(module.register_forward_pre_hook(hook_at(position), with_kwargs=True))
        yield
    finally:
        for h in hooks:
            h.remove()
