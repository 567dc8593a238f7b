"""What the captures of attention functions share: a wrapper put in the place of a function for a probe's
duration, the places that hold a function, the name of the module running at each call, and a pause.

A wrapper stands, under the function's own name, wherever the function is held (a library module's attribute,
a model file's ``from … import`` global, a class attribute, or the entry of a registry such as transformers'
``AttentionInterface``), hands each call over and then makes the call itself unchanged. Probes in several
threads (or nested) share one wrapper: the last one out puts the original back, even on error.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from attnscale.core.hooks import HookPoint

__all__ = ["WRAPPED", "Namer", "holders", "install", "install_at", "installed", "is_paused", "original_of", "paused",
           "release", "running_modules", "wrapper", "wrapping"]

WRAPPED = "__attnscale_watch_wraps__"

# True while a capture one level up (transformers' AttentionInterface, flex_attention, flash-attn) reads the call.
_PAUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("attnscale_watch_sdpa_paused", default=False)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Attention-function calls made inside are not captured again: a capture that reads a call one level up,
    with more to say, runs the function under this (a flex_attention call is not also an SDPA call)."""
    token = _PAUSED.set(True)
    try:
        yield
    finally:
        _PAUSED.reset(token)


def is_paused() -> bool:
    return _PAUSED.get()


# The wrappers in place: (id(where), name) -> [probes using it, how to put the original back].
_INSTALLED: dict[tuple[int, str], list] = {}
_LOCK = threading.Lock()


def install(where: Any, name: str, wrap: Callable[[Callable], Callable], get: Callable[[], Any],
            put: Callable[[Any], None], drop: Callable[[Any], None]) -> tuple[int, str] | None:
    """Put ``wrap(original)`` where ``get()`` reads the original at ``name`` in ``where`` (``put`` sets it,
    ``drop(original)`` puts the original back), or join the wrapper already there. None: nothing to wrap."""
    key = (id(where), name)
    with _LOCK:
        if key in _INSTALLED:
            _INSTALLED[key][0] += 1
            return key
        original = get()
        if not callable(original) or hasattr(original, WRAPPED):
            return None
        wrapper = wrap(original)
        setattr(wrapper, WRAPPED, original)
        put(wrapper)
        _INSTALLED[key] = [1, lambda: drop(original)]
        return key


def release(key: tuple[int, str]) -> None:
    with _LOCK:
        entry = _INSTALLED[key]
        entry[0] -= 1
        if entry[0] == 0:
            del _INSTALLED[key]
            entry[1]()


@contextlib.contextmanager
def installed(keys: list) -> Iterator[None]:
    """Release every wrapper of ``keys`` (None entries skipped) on exit, the last installed first."""
    try:
        yield
    finally:
        for key in reversed(keys):
            if key is not None:
                release(key)


def _is(value: Any, originals: tuple) -> bool:
    """``value`` is one of ``originals``, or a ``torch.compile`` of one (dynamo keeps the function it wraps),
    or a wrapper of either already in place (a probe in another thread)."""
    value = value.__func__ if isinstance(value, staticmethod) else value
    value = getattr(value, WRAPPED, value)
    return any(value is o or getattr(value, "_torchdynamo_orig_callable", None) is o for o in originals)


def holders(model: nn.Module | None, originals: tuple, libraries: list[tuple[Any, str]]) -> list[tuple[Any, str]]:
    """(object, attribute) that hold one of ``originals`` or a compiled copy: the ``libraries``' own attributes
    (where they hold one), and the globals of each python module that defines a class of ``model``'s modules
    (``from flash_attn import flash_attn_func``) and the attributes of those classes (torchtitan keeps a
    compiled flex_attention on its class)."""
    found: dict[tuple[int, str], tuple[Any, str]] = {}
    for owner, name in libraries:
        if _is(getattr(owner, name, None), originals):
            found[(id(owner), name)] = (owner, name)
    classes = {c for m in (model.modules() if model is not None else []) for c in type(m).__mro__
               if c.__module__ != "builtins" and not c.__module__.startswith("torch.")}
    spaces = [sys.modules[c.__module__] for c in classes if c.__module__ in sys.modules] + list(classes)
    for owner in spaces:
        for name, value in list(vars(owner).items()):
            if callable(value) or isinstance(value, staticmethod):
                if _is(value, originals):
                    found.setdefault((id(owner), name), (owner, name))
    return list(found.values())


def install_at(owner: Any, name: str, wrap: Callable[[Callable], Callable]) -> tuple[int, str] | None:
    """``install`` at an attribute (a module's global, a class's attribute, kept a staticmethod where it was)."""
    held = vars(owner).get(name) if isinstance(owner, type) else None
    static = isinstance(held, staticmethod)

    def put(f):
        setattr(owner, name, staticmethod(f) if static else f)

    return install(owner, name, wrap, lambda: held.__func__ if static else getattr(owner, name),
                   put, put)


@contextlib.contextmanager
def running_modules(model: nn.Module | None, where: list[str] | None = None) -> Iterator[list[str]]:
    """A list that holds, while each module of ``model`` runs, the names of the modules running (innermost
    last): pre- and post-forward hooks keep it, removed on exit. Without a model: always empty. ``where``:
    a list some capture around this one already keeps (no second set of hooks)."""
    if where is not None:
        yield where
        return
    where = []

    def enter(name: str):
        def hook(module, args) -> None:
            where.append(name)

        return hook

    def leave(module, args, output) -> None:  # returns None: the output stays the module's
        if where:
            where.pop()

    handles = []
    try:
        for name, module in (model.named_modules() if model is not None else []):
            if name and not isinstance(module, HookPoint):  # a hooked HookPoint would switch attnscale off SDPA
                handles.append(module.register_forward_pre_hook(enter(name)))
                handles.append(module.register_forward_hook(leave, always_call=True))
        yield where
    finally:
        for h in handles:
            h.remove()


class Namer:
    """Names each call after the innermost running module, else by its number: only calls made outside every
    module are numbered (under torch.compile a counter read on every call would be a guard that fails on the
    next step, and the graph would recompile each time)."""

    def __init__(self, where: list[str], kind: str):
        self.where, self.kind, self.calls = where, kind, 0

    def __call__(self) -> str:
        if self.where:
            return self.where[-1]
        name, self.calls = f"{self.kind} call {self.calls}", self.calls + 1
        return name


def original_of(function: Any) -> Any:
    """The function a wrapper of ours stands for (a function that is none: itself)."""
    return getattr(function, WRAPPED, function)


# (on_call, namer) of a capture in progress in this context, one variable per kind of function
Active = contextvars.ContextVar


def wrapper(original: Callable, active: Active, read: Callable) -> Callable:
    """A stand-in for ``original``: inside a capture (``active`` set in this context, not paused) it hands
    ``read(args, kwargs, namer)`` to the capture's ``on_call`` (unless it reads None), then calls
    ``original`` unchanged, with the function captures paused (its own torch calls are not the model's)."""

    @functools.wraps(original, updated=())  # not its __dict__: a compiled copy's marks stay its own
    def attention(*args, **kwargs):
        got = active.get()
        if got is not None and not is_paused():
            call = read(args, kwargs, got[1])
            if call is not None:
                got[0](call)
        with paused():
            return original(*args, **kwargs)

    return attention


@contextlib.contextmanager
def wrapping(model: nn.Module | None, targets: list[tuple[tuple, list[tuple[Any, str]], Callable]], active: Active,
             on_call: Callable, kind: str, where: list[str] | None = None) -> Iterator[None]:
    """For each (originals, libraries, wrap) of ``targets``, ``wrap`` put wherever ``holders`` finds one of
    ``originals``, for the duration; ``active`` holds ``on_call`` and the namer meanwhile, in this context."""
    keys: list = []
    with installed(keys), running_modules(model, where) as where:
        for originals, libraries, wrap in targets:
            for owner, name in holders(model, originals, libraries):
                keys.append(install_at(owner, name, wrap))
        token = active.set((on_call, Namer(where, kind)))
        try:
            yield
        finally:
            active.reset(token)
