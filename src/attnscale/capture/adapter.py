"""Capture through an ``Adapter``: anything the other captures do not reach."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from attnscale.capture.call import AttentionCall, OnCall
from attnscale.errors import ConfigError

__all__ = ["Adapter", "capture_adapter"]


@dataclass(frozen=True)
class Adapter:
    """How to read the q and k of a model that none of the other captures reach.

    ``modules``: glob patterns of the attention modules' names
    (``model.named_modules()``), e.g. ``"blocks.*.attn"``. ``read(module, args,
    kwargs, output)`` is called after each matching module's forward, with what
    the forward took and gave, and returns either an ``AttentionCall`` or a tuple
    ``(q_BHTD, k_BKSD, mask, scale)``: mask as SDPA takes it (boolean, True =
    may attend, or additive float; None: every key), scale a float (None:
    1/sqrt(D)). It may return None to skip a call. Example, for a module that
    keeps its projections as ``qkv`` and its head count as ``n_head``::

        def read(m, args, kwargs, out):
            x = args[0]
            B, T, C = x.shape
            q, k, _ = m.qkv(x).view(B, T, 3, m.n_head, -1).permute(2, 0, 3, 1, 4)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            return q, k, causal, None

        watch.measure(model, ids, adapter=Adapter("blocks.*.attn", read))
    """

    modules: str | tuple[str, ...]
    read: Callable[[nn.Module, tuple, dict, Any], AttentionCall | tuple | None]

    def __post_init__(self):
        patterns = (self.modules,) if isinstance(self.modules, str) else self.modules
        if not isinstance(patterns, (tuple, list)) or not patterns or not all(isinstance(p, str) and p
                                                                              for p in patterns):
            raise ConfigError(f"Adapter's modules takes a glob pattern of module names or a tuple of them, e.g. "
                              f"'blocks.*.attn', got {self.modules!r}")
        if not callable(self.read):
            raise ConfigError(f"Adapter's read takes a function read(module, args, kwargs, output), got {self.read!r}")


@contextlib.contextmanager
def capture_adapter(model: nn.Module, on_call: OnCall, adapter: Adapter) -> Iterator[None]:
    """Anything else: ``adapter.read`` on the forward of each module it names (a
    forward hook, removed on exit)."""
    patterns = [adapter.modules] if isinstance(adapter.modules, str) else list(adapter.modules)
    matched = [(n, m) for n, m in model.named_modules() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not matched:
        raise ConfigError(f"the adapter names no module of {type(model).__name__} ({', '.join(patterns)}); "
                          "give glob patterns of names from model.named_modules()")

    def hook_for(name: str):
        def hook(module, args, kwargs, output):
            got = adapter.read(module, args, kwargs, output)
            if got is None:
                return
            if not isinstance(got, AttentionCall):
                q, k, mask, scale = got
                got = AttentionCall(q, k, scale=scale, mask=mask, name=name, module=module)
            on_call(got if got.name else dataclasses.replace(got, name=name, module=got.module or module))

        return hook

    handles = []
    try:
        for name, module in matched:
            handles.append(module.register_forward_hook(hook_for(name), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()
