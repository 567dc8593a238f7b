"""Named hook points, and ``hooked``: opt-in hooks on them.

Every tensor worth looking at passes through a ``HookPoint`` (an identity
module), so its name mirrors the module tree: ``blocks.0.attn.hook_pattern``.
``hooked`` is a context manager that always removes its hooks, even on error
(after TransformerLens' ``hook_points.py``).
"""

from __future__ import annotations

import contextlib
import fnmatch
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

__all__ = ["HookPoint", "hook_names", "hooked"]


class HookPoint(nn.Module):
    """Identity module that marks a tensor for hooks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True while some hook is registered here (attention then takes its explicit path)."""
        return bool(self._forward_hooks)


def hook_names(model: nn.Module) -> list[str]:
    """All hook-point names of ``model``, in module order."""
    return [name for name, m in model.named_modules() if isinstance(m, HookPoint)]


@contextlib.contextmanager
def hooked(
    model: nn.Module,
    names: str | Iterable[str] = "*",
    fn: Callable[[str, torch.Tensor], None] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Hook the tensors at the hook points matching ``names`` (glob patterns).

    Without ``fn`` the detached tensors are stored in the yielded dict by hook
    name (the last forward pass wins). With ``fn`` each tensor is handed to
    ``fn(name, tensor)`` instead and nothing is kept, so recording can reduce
    tensors to numbers as they pass. The hooks are removed on exit, always.
    """
    patterns = [names] if isinstance(names, str) else list(names)
    cache: dict[str, torch.Tensor] = {}
    handles = []

    def make_hook(name: str):
        def hook(module, inputs, output):
            if fn is None:
                cache[name] = output.detach()
            else:
                fn(name, output.detach())

        return hook

    try:
        matched = [n for n in hook_names(model) if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not matched:
            raise ValueError(f"no hook point matches {patterns}; available: {hook_names(model)}")
        modules = dict(model.named_modules())
        for name in matched:
            handles.append(modules[name].register_forward_hook(make_hook(name)))
        yield cache
    finally:
        for h in handles:
            h.remove()
