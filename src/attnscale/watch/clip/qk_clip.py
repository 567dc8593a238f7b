"""QK-Clip: after each optimizer step, shrink W_q and W_k of every head whose scores passed tau.

Kimi K2 (Moonshot AI 2025, MuonClip) caps each head's largest attention logit
S_max this way: after the optimizer step, per head,

    gamma = min(1, tau / S_max),   W_q rows of the head × sqrt(gamma),   W_k rows × sqrt(gamma),

so that the head's scores, q·k times the model's own scale, are multiplied by
gamma: a head at S_max = 2 tau is brought back to tau, a head under tau is left
alone. With grouped-query attention a key head serves a group of query heads: it
takes the largest S_max of its group (gamma_k = min(1, tau / max S_max)), and
each query head its own (gamma_q), so the scores of query head h move by
sqrt(gamma_q[h] gamma_k[group]) <= tau / S_max[h], and no head stays above tau.
Biases are scaled with their rows; fused qkv projections are found
(``projections.py``).

S_max is the largest |q·kᵀ × scale| of the head (the watch's ``max_score``: over
the keys the mask leaves visible, a finite fill such as -1e9 read as hidden, and
without any bias, which no scaling of W_q and W_k can shrink) in the step's own
training forward: the calls are captured while the model trains (the capture a
probe uses, left in place for the whole run) and each reduced at once to H
numbers, a block of query rows at a time (``capture.smax.head_max``: over a
causal, windowed or key-padded call each block is one product, its hidden part
cut off in place, the factor and soft-cap put on the H maxima). Only
training forwards count, by the rule the watch's training forward keeps
(``in_training.training_forward``: the model in train mode, gradients on): a
forward in eval mode or under no_grad, an evaluation between two steps, is
ignored, and never makes the next step clip. That is the
clip's cost: one more q·kᵀ per attention call per step, without autograd, in
float32, or on a CPU with bfloat16 arithmetic and a long call, screened in
bfloat16 and only the rows that may hold the max made again in float32
(``capture.smax``: the same number); attnscale's own models keep their fused path (SDPA), their q and k read
as each call begins (``Attention.listen``). ``benchmarks/qk_clip_overhead.py``
measures it. Each layer's S_max says how it was had (``take``'s ``method``:
``EXACT``, every score over the visible keys; a bound is never logged as a max).
The clip acts on the S_max of the weights before the step, as Kimi's does: the
step's own update can carry the next forward slightly past tau. Under data
parallelism every rank clips with the largest S_max of any rank (one all-reduce
per step), so the ranks' weights stay equal.

The clip reads the calls as a probe does: the padded rows and keys of a batch
(its ``attention_mask``, B×T) are no score, and a Hugging Face model is read
through its AttentionInterface, or, where no call of a step went through it, by
the attention functions its modules call themselves (remote code). Each layer's
W_q and W_k are looked for on the module that made the call, then on the modules
above it (torchtitan keeps ``wq``/``wk`` one level above its ``inner_attention``).

It never clips nothing in silence: a first step that saw no call, or whose layers
it cannot read, is a ConfigError naming the model or the module; later, a layer
it clipped before and did not see, or a new layer it cannot read, is a warning
naming it, once, and the run goes on.

Logged per head at each probe (``QKClip.take``): the smallest gamma, the largest
S_max and the number of steps that clipped, since the probe before.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from attnscale.capture.adapter import Adapter
from attnscale.capture.call import AttentionCall
from attnscale.capture.options import check_model
from attnscale.capture.probe import Inputs, padding_of, unwrap
from attnscale.capture.ranks import TensorParallel, reduce_max
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.smax import head_max
from attnscale.capture.route import capture_functions, capturing, choose
from attnscale.capture.te import capture_te_max
from attnscale.errors import ConfigError
from attnscale.watch.clip.projections import QKProjections, qk_projections
from attnscale.watch.in_training import training_forward

__all__ = ["EXACT", "KERNEL", "QKClip", "clip_factors", "check_tau"]

# How a layer's S_max was had (``take``'s "method"): every score of the call over its visible keys, a block of
# query rows at a time (``capture.smax.head_max``); or the kernel's own largest score (flex_attention's
# max_scores where the device gives them, Transformer Engine's max_logit), the largest signed score as Kimi K2
# reads S_max. Never a bound: a bound is no max.
EXACT, KERNEL = "exact", "kernel"


def check_tau(tau) -> None:
    """ConfigError (a ValueError) naming the option, for a tau no clip can run with."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau <= 0:
        raise ConfigError(f"qk_clip takes a positive number (tau, the largest score a head may keep; Kimi K2 used "
                          f"100), got {tau!r}")


def _check(memory, tensor_parallel, adapter) -> None:
    if adapter is not None and not isinstance(adapter, Adapter):
        raise ConfigError(f"QK-Clip's adapter takes attnscale.watch.Adapter(modules, read), got {adapter!r}")
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 1:
        raise ConfigError(f"QK-Clip's memory takes a positive number of bytes, got {memory!r}")
    if tensor_parallel is not None and not isinstance(tensor_parallel, TensorParallel):
        raise ConfigError(f"QK-Clip's tensor_parallel takes an attnscale.watch.TensorParallel, got "
                          f"{type(tensor_parallel).__name__}")


def clip_factors(s_max_H: torch.Tensor, kv_heads: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(gamma_q (H,), gamma_k (K,)): each query head's min(1, tau / S_max) and each key head's over the largest
    S_max of its group of H / K query heads (query head h reads key head h // (H / K)). A head whose S_max is
    not a finite number is left alone: no factor brings NaN under tau."""
    s_max_H = s_max_H.float()
    finite = torch.isfinite(s_max_H)
    gamma_q = torch.where(finite, tau / s_max_H.clamp_min(tau), 1.0)  # S_max <= tau: 1
    group_max = torch.where(finite, s_max_H, tau).view(kv_heads, -1).amax(1)  # not finite: no say
    return gamma_q, tau / group_max.clamp_min(tau)


def _callers_level() -> int:
    """The ``stacklevel`` for a warning raised in this module that points at the first frame outside it:
    the line of the user's ``step()``, however deep inside the warning was raised."""
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


class _Seen:
    """One capture's calls since the last step: S_max per query head and (module, heads, head width), by name."""

    def __init__(self) -> None:
        self.s_max: dict[str, torch.Tensor] = {}
        self.calls: dict[str, tuple] = {}
        self.method: dict[str, str] = {}

    def clear(self) -> None:
        self.s_max.clear()
        self.calls.clear()
        self.method.clear()


def _rows_max(max_BHT: torch.Tensor, padding_BT: torch.Tensor | None) -> torch.Tensor:
    """Each head's largest score from a kernel's per-row largest (B×H×T), the padded rows left out."""
    rows = max_BHT.detach().float()
    if padding_BT is not None and tuple(padding_BT.shape) == (rows.shape[0], rows.shape[-1]):
        rows = rows.masked_fill(~padding_BT.to(rows.device).bool()[:, None, :], -math.inf)
    return rows.amax((0, 2))


class _Reader:
    """The clip's reader of one capture's calls (``seen``): each call, or the kernel's own max after it."""

    def __init__(self, clip: "QKClip", seen: _Seen):
        self.clip, self.seen = clip, seen

    def __call__(self, call: AttentionCall) -> None:
        self.clip._on_call(call, self.seen)

    def kernel_max(self, call: AttentionCall, max_BHT: torch.Tensor) -> None:
        """``max_BHT``: each row's largest score (B×H×T), or each head's (H,)."""
        self.clip._on_call(call, self.seen, max_BHT.reshape(1, -1, 1) if max_BHT.ndim == 1 else max_BHT)


class QKClip:
    """QK-Clip at ``tau`` on ``model`` (see the module's docstring). ``step()`` after each optimizer step;
    ``close()`` when training ends. ``capture``/``adapter``: as ``measure_heads`` takes them; ``tensor_parallel``
    (``capture.ranks.TensorParallel``): each rank clips its own heads, S_max maxed over the ranks holding each.
    Every option is checked here, before any step: a mistake is a ConfigError naming it."""

    def __init__(self, model: nn.Module, tau: float, capture: str = "auto", adapter: Adapter | None = None,
                 memory: int = DEFAULT_MEMORY, tensor_parallel: TensorParallel | None = None):
        check_tau(tau)
        _check(memory, tensor_parallel, adapter)
        check_model(model, "QK-Clip", "the torch.nn.Module to clip")
        self.model, self.tau, self.memory, self.tensor_parallel = unwrap(model), float(tau), memory, tensor_parallel
        self._compiled = any(isinstance(getattr(m, "_orig_mod", None), nn.Module)  # torch.compile(m), m.compile()
                             or getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
        self.kind = choose(self.model, capture, adapter)
        self._modules = dict(self.model.named_modules())
        self._seen, self._fallback = _Seen(), _Seen()
        self._projections: dict[str, QKProjections] = {}
        self._since: dict[str, list[torch.Tensor]] = {}  # name -> [smallest gamma, largest S_max, steps clipped]
        self._method: dict[str, set[str]] = {}  # name -> how its S_max were had since the last take
        self._clipped: set[str] = set()  # every layer a step has clipped (or found under tau)
        self._told: set[str] = set()  # layers already warned about: a week-long run is told once
        self._paused = False
        self._checking = False  # inside ``checking``: every forward counts, a probe's too
        self._padding: torch.Tensor | None = None  # the running forward's B×T padding (True = a real token)
        self._kept: list | None = None  # during a forward that is no training one: what the step had before it
        self._hooks: list = []
        self._stack = contextlib.ExitStack()
        self._functions: contextlib.ExitStack | None = None
        try:
            if self.kind == "hf" and capture == "auto":
                # as a probe reads it: the AttentionInterface's calls, else those of the attention functions the
                # modules call themselves; both are read until a step shows which carries the model's calls
                from attnscale.capture.hf import capture_hf

                # (packed documents are the probe's warning: the clip reads the scores the model makes, crossing or not)
                self._stack.enter_context(capture_hf(self.model, _Reader(self, self._seen), packing=False))
                self._functions = contextlib.ExitStack()
                self._functions.enter_context(capture_functions(self.model, _Reader(self, self._fallback)))
            else:
                self._stack.enter_context(capturing(self.model, _Reader(self, self._seen), self.kind, adapter))
            # Transformer Engine's attention built with return_max_logit: its own max, after each call
            self._stack.enter_context(capture_te_max(self.model, _Reader(self, self._seen).kernel_max))
            # on the module the user calls (a compiled or DDP wrapper too): its hooks run eagerly, with its kwargs
            self._hooks = [model.register_forward_pre_hook(self._enter, with_kwargs=True),
                           model.register_forward_hook(self._leave, always_call=True)]
        except BaseException:
            self.close()  # nothing stays attached to a model the clip refused
            raise

    @property
    def _s_max(self) -> dict[str, torch.Tensor]:
        """This step's S_max so far per query head, by layer (from the capture a probe reads first)."""
        return self._seen.s_max

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._padding = padding_of(Inputs(tuple(args), dict(kwargs)))
        # an evaluation between two steps (eval mode or no gradients) is no training forward: what its calls add
        # is taken back when it ends. The mode is read here, in the eager hook, and the calls inside a compiled
        # graph read nothing new, so a graph recompiles no more for it
        self._kept = None if self._checking or training_forward(module) else [
            (dict(s.s_max), dict(s.calls), dict(s.method)) for s in (self._seen, self._fallback)]

    def _leave(self, module: nn.Module, args: tuple, output) -> None:
        self._padding = None
        if self._kept is not None:
            for seen, kept in zip((self._seen, self._fallback), self._kept):
                for now, before in zip((seen.s_max, seen.calls, seen.method), kept):
                    now.clear()
                    now.update(before)
            self._kept = None

    def _on_call(self, call: AttentionCall, seen: _Seen, kernel_max: torch.Tensor | None = None) -> None:
        """Note one call's S_max per query head: from ``kernel_max`` (B×H×T, the kernel's largest score of each
        row) where the kernel gave it, else every score of the call (``head_max``)."""
        # Under torch.compile this runs inside the compiled graph: it reads no state that changes from one
        # step to the next (the dicts are empty when each step's forward starts), so nothing recompiles.
        if self._paused:
            return
        # a call made outside every submodule is numbered anew at each step: it is the model's own (name "")
        name = call.name if call.module is not None or call.name in self._modules else ""
        if call.score_mod is not None:
            where = name or type(self.model).__name__
            raise ConfigError(f"QK-Clip cannot clip {where!r}: its flex_attention score_mod mixes any bias into the "
                              "scores, and the clip cannot tell a bias from a score there; train it without qk_clip, or "
                              "give the bias to SDPA as an additive mask")
        seen.calls[name] = (call.module, call.heads, call.q.shape[-1])  # for step() to find the rows
        if kernel_max is None:
            s_max = head_max(call, self.memory, self._padding)  # padded rows and keys are no score
        else:
            s_max = _rows_max(kernel_max, self._padding)
        seen.s_max[name] = torch.maximum(seen.s_max[name], s_max) if name in seen.s_max else s_max
        seen.method[name] = EXACT if kernel_max is None else KERNEL

    def _chain(self, name: str, module: nn.Module | None) -> list[tuple[str, nn.Module]]:
        """The call's module and every module above it, innermost first, by name."""
        parts = name.split(".") if name else []
        chain = [(name, module if module is not None else self._modules.get(name))]
        chain += [(".".join(parts[:i]), self._modules.get(".".join(parts[:i]))) for i in range(len(parts) - 1, -1, -1)]
        return [(n or type(self.model).__name__, m) for n, m in chain if m is not None]

    def _rows(self, name: str, seen: _Seen) -> QKProjections:
        if name not in self._projections:
            module, heads, head_dim = seen.calls[name]
            chain = self._chain(name, module)
            if not chain:
                raise ConfigError(f"QK-Clip cannot tell which module made the attention call {name!r}; name it "
                                  "through an adapter, or leave qk_clip off for this model")
            self._projections[name] = qk_projections(chain, heads, head_dim)
        return self._projections[name]

    @contextlib.contextmanager
    def _while(self, flag: str) -> Iterator[None]:
        setattr(self, flag, True)
        try:
            yield
        finally:
            setattr(self, flag, False)

    def paused(self) -> contextlib.AbstractContextManager:
        """Forwards made inside (a probe) are not training steps: their scores do not count."""
        return self._while("_paused")

    def checking(self) -> contextlib.AbstractContextManager:
        """Forwards made inside count whatever their mode (a probe's, under no_grad), for ``reach``."""
        return self._while("_checking")

    def reach(self) -> None:
        """Look for the rows of every layer the forwards so far called, clipping nothing: a model whose q and k
        the clip cannot reach (a qk-norm after the projections, rows it cannot find, no call at all) is the
        ConfigError the first step would raise, now, before any step (an alert's ``ClipQK``, checked when the
        watch is built)."""
        seen = self._which()
        try:
            if not seen.s_max:
                raise ConfigError(f"QK-Clip saw no attention call of {type(self.model).__name__} (capture "
                                  f"{self.kind!r}) in its first forward, so it could clip nothing")
            self._readable(seen)
        finally:
            self._seen.clear()
            self._fallback.clear()

    def _which(self) -> _Seen:
        """The calls of this step as a probe would read them: the interface's, else the functions'."""
        if self._functions is not None and self._seen.s_max and not self._compiled:
            # the interface carries this model's calls; a compiled graph keeps both (taking hooks off would
            # recompile it)
            self._functions.close()
            self._functions = None
            self._fallback.clear()
        return self._seen if self._seen.s_max or self._functions is None else self._fallback

    def _tell(self, name: str, message: str) -> None:
        if name not in self._told:
            self._told.add(name)
            warnings.warn(message, RuntimeWarning, stacklevel=_callers_level())

    def _readable(self, seen: _Seen) -> list[str]:
        """The layers of ``seen`` whose rows are known; at the first step a layer that cannot be read is an
        error where none can, later a warning naming it."""
        names, refused = [], []
        for name in seen.s_max:
            try:
                self._rows(name, seen)
                names.append(name)
            except ConfigError as e:
                refused.append((name, e))
        if refused and not names and not self._clipped:
            raise refused[0][1]
        for name, e in refused:
            self._tell(name, f"QK-Clip leaves {name!r} unclipped: {e}")
        return names

    def step(self) -> dict[str, torch.Tensor]:
        """Clip every head seen since the last call; return each layer's factor on its heads' scores,
        sqrt(gamma_q gamma_k) per query head (1 = untouched), by module name. A first step that saw no call is a
        ConfigError; a later one, or a layer clipped before and not seen now, is a warning naming it."""
        seen = self._which()
        try:
            if not seen.s_max:
                what = f"QK-Clip saw no attention call of {type(self.model).__name__} (capture {self.kind!r})"
                if not self._clipped:
                    raise ConfigError(f"{what} in the forwards before its first step, so it can clip nothing; the "
                                      "attention must go through attnscale's Attention, transformers' "
                                      "AttentionInterface, scaled_dot_product_attention, flex_attention or flash-attn, "
                                      "or be given an adapter=attnscale.watch.Adapter(modules, read)")
                self._tell("(no call)", f"{what} since the last step: nothing was clipped (step() must follow a "
                                        "training forward)")
                return {}
            return self._clip(seen)
        finally:
            self._seen.clear()
            self._fallback.clear()

    def _clip(self, seen: _Seen) -> dict[str, torch.Tensor]:
        names = self._readable(seen)
        for name in sorted(self._clipped - set(names) - set(seen.s_max)):
            self._tell(name, f"QK-Clip saw no call of {name!r} since the last step (it clipped it before): that "
                             "layer went unclipped; a layer skipped on purpose is told once")
        scores_factor = {}
        # the same on every rank that holds the head
        s_maxes = [s.float() for s in reduce_max([seen.s_max[n] for n in names], names, self.tensor_parallel)]
        # no head of any layer over tau (NaN is none): every factor is 1, and a factor of 1 leaves a row and the
        # record as they are; told on the CPU only, where reading it waits for no device, in one look at every layer
        calm = (bool(s_maxes) and all(s.device.type == "cpu" for s in s_maxes)
                and not bool((torch.cat(s_maxes) > self.tau).any()))
        for name, s_max_H in zip(names, s_maxes):
            rows = self._projections[name]
            since = self._since.get(name)
            if since is None:  # (not setdefault: its three new tensors would be made at every step)
                since = self._since[name] = [torch.ones_like(s_max_H), torch.zeros_like(s_max_H),
                                             torch.zeros_like(s_max_H)]
            torch.fmax(since[1], s_max_H, out=since[1])
            if calm:
                scores_factor[name] = torch.ones_like(s_max_H)
            else:
                gamma_q, gamma_k = clip_factors(s_max_H, rows.k.heads, self.tau)
                rows.q.scale_(gamma_q.sqrt())
                rows.k.scale_(gamma_k.sqrt())
                factor_H = (gamma_q * gamma_k.repeat_interleave(rows.q.heads // rows.k.heads)).sqrt()
                scores_factor[name] = factor_H
                since[0] = torch.minimum(since[0], factor_H)
                since[2] = since[2] + (factor_H < 1).float()
            self._method.setdefault(name, set()).add(seen.method.get(name, EXACT))
            self._clipped.add(name)
        return scores_factor

    def take(self) -> dict:
        """Since the last ``take``, per layer (in the order the model first called them) and query head: the
        smallest factor on the scores (``gamma``), the largest S_max and the steps that clipped, as lists, and
        how each layer's S_max was had (``method``: ``EXACT``; several joined by "+"); then starts over."""
        names = list(self._since)
        rows = [torch.stack(self._since[n]).tolist() for n in names]
        methods = ["+".join(sorted(self._method.get(n, {EXACT}))) for n in names]
        self._since.clear()
        self._method.clear()
        return {"tau": self.tau, "layers": names, "gamma": [r[0] for r in rows], "s_max": [r[1] for r in rows],
                "clipped_steps": [r[2] for r in rows], "method": methods}

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._functions is not None:
            self._functions.close()
            self._functions = None
        self._stack.close()
