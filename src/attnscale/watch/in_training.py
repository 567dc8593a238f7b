"""The watch in the training forward: a probe step's numbers from the step's own forward, with no extra one.

``Watch(model, in_training_forward=True)``. ``Watch.step(k)`` comes after step k's optimizer step, so the
forward of step k runs between ``step(k - 1)`` and ``step(k)``: when k is a probe step, ``step(k - 1)`` arms
this capture (the Watch itself, for step 1) and ``step(k)`` reads it and disarms it. Armed, the model has a
forward pre-hook and a forward hook, and each forward of the model in train mode with gradients on (a training
forward: an evaluation between two steps is none) runs inside ``capture.route.capturing``, each attention call
reduced at once (``capture.fused.measure_call``, the probe's route: without gradients, in float32 with autocast off, from the q
and k the model made in its own precision) into its layer's ``HeadSums``. So the numbers are those of the
weights the step trained, in the training precision and mode; a model with dropout in its attention would be
measured with it, where a probe turns it off.

With gradient accumulation (or a pipeline's micro-batches) a step runs several forwards, and all count: the
i-th attention call of each forward folds into layer i's sums, as one forward on their batches concatenated
would give. A recomputation in the backward (activation checkpointing) is no forward of the model itself and
does not count. Between probe steps nothing is hooked and nothing costs, but for the first step, captured
once so that a training forward the watch cannot read is a ``ConfigError`` at step 1, not at step ``every``.
An error met while reducing a call is kept (``failed``) and never raised inside the training forward: the
Watch handles it at its step as its ``on_error`` says. A ``torch.compile``d model is
refused: its graph was compiled without the capture, which would see no call (the default probe runs the
original module eagerly instead).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn

from attnscale.capture.batch import batch_shape, handed_padding
from attnscale.capture.call import AttentionCall
from attnscale.capture.probe import Inputs, padding_of, unwrap
from attnscale.capture.fused import measure_call
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.sums import HeadSums
from attnscale.capture.route import Route, capturing
from attnscale.errors import ConfigError

__all__ = ["TrainingForward", "training_forward"]

AUTOCAST_TYPES = ("cpu", "cuda", "mps", "xpu")


def training_forward(module: nn.Module) -> bool:
    """Whether a forward of ``module`` starting now is a training one: the module in train mode with gradients
    on. An evaluation between two steps (eval mode, or ``torch.no_grad``) is none; QK-Clip counts by it too."""
    return module.training and torch.is_grad_enabled()


def _compiled(model: nn.Module) -> bool:
    """A ``torch.compile``d model, inside any (Distributed)DataParallel."""
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return isinstance(getattr(model, "_orig_mod", None), nn.Module)


class TrainingForward:
    """The capture of the training forwards between two ``Watch.step`` calls (see the module's docstring).
    ``arm()``; the forwards run; ``take()`` gives (sums, names, what the forwards were) and disarms."""

    def __init__(self, model: nn.Module, threshold: float, capture: str = "auto", adapter: Any = None,
                 memory: int = DEFAULT_MEMORY, sample_rows: int | None = None, route: Route | None = None):
        if _compiled(model):
            raise ConfigError("in_training_forward cannot measure inside a torch.compile'd graph (it was compiled "
                              "without the capture); watch the model with the default probe, which runs the original "
                              "module eagerly")
        self.model = unwrap(model)  # DDP's module: the forward that runs the layers
        self.threshold, self.capture, self.adapter, self.route = threshold, capture, adapter, route
        self.memory, self.sample_rows = memory, sample_rows
        self.seconds = 0.0  # spent reducing calls inside the forwards: the watch's cost too
        self.failed: Exception | None = None
        self._hooks: list = []
        self._open: contextlib.ExitStack | None = None
        self._reset()

    def _reset(self) -> None:
        self.sums: list[HeadSums] = []
        self.names: list[str] = []
        self.methods: list[str] = []  # each layer's route (``capture.fused``), "mixed" where its calls differed
        self._seen = {"forwards": 0, "sequences": 0}
        self._padding: torch.Tensor | None = None
        self._call = 0
        self._error: Exception | None = None

    @property
    def armed(self) -> bool:
        return bool(self._hooks)

    def arm(self) -> None:
        """Measure every training forward from now until ``take``."""
        if not self._hooks:
            self._hooks = [self.model.register_forward_pre_hook(self._enter, with_kwargs=True),
                           self.model.register_forward_hook(self._leave, always_call=True)]

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._open is not None or not training_forward(module):
            return
        self._padding = padding_of(Inputs(tuple(args), dict(kwargs)))
        self._call = 0
        shape = batch_shape((args, kwargs))  # at any depth: a dict the forward takes whole
        if shape is not None:
            self._seen["sequences"] += shape[0]
            self._seen["tokens"] = shape[1]
        self._seen["forwards"] += 1
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(capturing(self.model, self._on_call, self.capture, self.adapter, self.route))
            if self._padding is None:  # a batch the forward unpacks itself: the mask it hands its inner model
                stack.enter_context(handed_padding(self.model, self._pad))
        except Exception as e:  # kept for ``take``: the training forward goes on without the capture
            self._error = self._error or e
            stack.close()
            return
        self._open = stack

    def _pad(self, mask: torch.Tensor) -> None:
        self._padding = mask

    def _leave(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._open is not None:
            stack, self._open = self._open, None
            stack.close()  # "auto" on a Hugging Face model hands its calls over here

    def _on_call(self, call: AttentionCall) -> None:
        """Reduce one call; an error is kept for ``take`` (``failed``), never raised inside the training forward,
        whose step must go on whatever the watch meets."""
        if self._error is not None:
            return
        try:
            self._reduce(call)
        except Exception as e:
            self._error = e

    def _reduce(self, call: AttentionCall) -> None:
        start = time.perf_counter()
        i, self._call = self._call, self._call + 1
        name = call.name or f"call {i}"
        if i == len(self.sums):
            self.sums.append(HeadSums(call.heads, self.threshold, self.sums[0].device if self.sums else call.q.device))
            self.names.append(name)
        elif (self.names[i], self.sums[i].heads) != (name, call.heads):
            raise ConfigError(f"the training forwards of one step made different attention calls (call {i}: "
                              f"{self.names[i]!r} with {self.sums[i].heads} heads, then {name!r} with {call.heads}); "
                              "in_training_forward needs each forward of a step to call the same layers")
        with contextlib.ExitStack() as stack:  # the reduction in float32, whatever autocast the forward runs under
            for kind in sorted({"cpu", call.q.device.type} & set(AUTOCAST_TYPES)):
                stack.enter_context(torch.autocast(kind, enabled=False))
            method = measure_call(call, self.sums[i], padding_BT=self._padding, memory=self.memory,
                                  sample_rows=self.sample_rows, seed=i)
        if i == len(self.methods):
            self.methods.append(method)
        elif self.methods[i] != method:
            self.methods[i] = "mixed"
        self.seconds += time.perf_counter() - start

    def take(self) -> tuple[list[HeadSums], list[str], dict[str, int]]:
        """Disarm; the sums of every layer over the forwards since ``arm``, their names, and what the forwards
        were ({"forwards": n, "sequences": their sequences together, "tokens": the last one's length, "methods":
        each layer's route, "fused" or "replay", or "mixed" where the forwards' calls of a layer took both}).
        ``failed`` is then the first error met in those forwards, or None."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._open is not None:  # a forward that never came back (an error inside it)
            self._open.close()
            self._open = None
        out = (self.sums, self.names, {**self._seen, "methods": tuple(self.methods)})
        self.failed = self._error
        self._reset()
        return out

    def close(self) -> None:
        self.take()
