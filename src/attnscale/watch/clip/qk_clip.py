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
numbers, a block of query rows at a time (``capture.reduce.head_max``). That is
the clip's cost: one more q·kᵀ in float32 per attention call per step,
and, for attnscale's own models, its explicit attention path instead of SDPA
(the hook points need the scores); ``benchmarks/qk_clip_overhead.py`` measures it.
The clip acts on the S_max of the weights before the step, as Kimi's does: the
step's own update can carry the next forward slightly past tau. Under data
parallelism every rank clips with the largest S_max of any rank (one all-reduce
per step), so the ranks' weights stay equal.

Logged per head at each probe (``QKClip.take``): the smallest gamma, the largest
S_max and the number of steps that clipped, since the probe before.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from attnscale.capture.adapter import Adapter
from attnscale.capture.call import AttentionCall
from attnscale.capture.probe import unwrap
from attnscale.capture.ranks import TensorParallel, reduce_max
from attnscale.capture.reduce import DEFAULT_MEMORY, head_max
from attnscale.capture.route import capturing, choose
from attnscale.errors import ConfigError
from attnscale.watch.clip.projections import QKProjections, qk_projections

__all__ = ["QKClip", "clip_factors", "check_tau"]


def check_tau(tau) -> None:
    """ValueError naming the option, for a tau no clip can run with."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"qk_clip takes a positive number (tau, the largest score a head may keep; Kimi K2 used 100), got {tau!r}")


def clip_factors(s_max_H: torch.Tensor, kv_heads: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(gamma_q (H,), gamma_k (K,)): each query head's min(1, tau / S_max) and each key head's over the largest
    S_max of its group of H / K query heads (query head h reads key head h // (H / K)). A head whose S_max is
    not a finite number is left alone: no factor brings NaN under tau."""
    s_max_H = s_max_H.float()
    ok = torch.isfinite(s_max_H) & (s_max_H > tau)
    gamma_q = torch.where(ok, tau / s_max_H.clamp_min(tau), torch.ones_like(s_max_H))
    group_max = torch.where(torch.isfinite(s_max_H), s_max_H, 0.0).view(kv_heads, -1).amax(1)
    gamma_k = torch.where(group_max > tau, tau / group_max.clamp_min(tau), torch.ones_like(group_max))
    return gamma_q, gamma_k


class QKClip:
    """QK-Clip at ``tau`` on ``model`` (see the module's docstring). ``step()`` after each optimizer step;
    ``close()`` when training ends. ``capture``/``adapter``: as ``measure_heads`` takes them; ``tensor_parallel``
    (``capture.ranks.TensorParallel``): each rank clips its own heads, S_max maxed over the ranks holding each."""

    def __init__(self, model: nn.Module, tau: float, capture: str = "auto", adapter: Adapter | None = None,
                 memory: int = DEFAULT_MEMORY, tensor_parallel: TensorParallel | None = None):
        check_tau(tau)
        self.model, self.tau, self.memory, self.tensor_parallel = unwrap(model), float(tau), memory, tensor_parallel
        self._modules = dict(self.model.named_modules())
        self._s_max: dict[str, torch.Tensor] = {}  # attention module name -> this step's S_max per query head
        self._calls: dict[str, tuple] = {}  # name -> (module or None, query heads, head width), this step
        self._projections: dict[str, QKProjections] = {}
        self._since: dict[str, list[torch.Tensor]] = {}  # name -> [smallest gamma, largest S_max, steps clipped]
        self._paused = False
        self._stack = contextlib.ExitStack()
        # a Hugging Face model: its AttentionInterface alone, the call its modeling file makes
        self._stack.enter_context(capturing(self.model, self._on_call, choose(self.model, capture, adapter), adapter))

    def _on_call(self, call: AttentionCall) -> None:
        # Under torch.compile this runs inside the compiled graph: it reads no state that changes from one
        # step to the next (the dicts are empty when each step's forward starts), so nothing recompiles.
        if self._paused:
            return
        name = call.name
        if call.score_mod is not None:
            raise ConfigError(f"QK-Clip cannot clip {name!r}: its flex_attention score_mod mixes any bias into the "
                              "scores, and the clip cannot tell a bias from a score there; train it without qk_clip, or "
                              "give the bias to SDPA as an additive mask")
        self._calls[name] = (call.module, call.heads, call.q.shape[-1])  # for step() to find the rows
        s_max = head_max(call, self.memory)
        self._s_max[name] = torch.maximum(self._s_max[name], s_max) if name in self._s_max else s_max

    def _rows(self, name: str) -> QKProjections:
        if name not in self._projections:
            module, heads, head_dim = self._calls[name]
            module = module if module is not None else self._modules.get(name)
            if module is None:
                raise ConfigError(f"QK-Clip cannot tell which module made the attention call {name!r}")
            self._projections[name] = qk_projections(module, heads, head_dim, name)
        return self._projections[name]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards made inside (a probe) are not training steps: their scores do not count."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def step(self) -> dict[str, torch.Tensor]:
        """Clip every head seen since the last call; return each layer's factor on its heads' scores,
        sqrt(gamma_q gamma_k) per query head (1 = untouched), by module name. Nothing seen: nothing done."""
        scores_factor = {}
        names = list(self._s_max)
        # the same on every rank that holds the head
        for name, s_max_H in zip(names, reduce_max([self._s_max[n] for n in names], names, self.tensor_parallel)):
            rows = self._rows(name)
            gamma_q, gamma_k = clip_factors(s_max_H, rows.k.heads, self.tau)
            rows.q.scale_(gamma_q.sqrt())
            rows.k.scale_(gamma_k.sqrt())
            factor_H = (gamma_q * gamma_k.repeat_interleave(rows.q.heads // rows.k.heads)).sqrt()
            scores_factor[name] = factor_H
            since = self._since.setdefault(name, [torch.ones_like(factor_H), torch.zeros_like(factor_H),
                                                  torch.zeros_like(factor_H)])
            since[0] = torch.minimum(since[0], factor_H)
            since[1] = torch.fmax(since[1], s_max_H.float())
            since[2] = since[2] + (factor_H < 1).float()
        self._s_max.clear()
        self._calls.clear()
        return scores_factor

    def take(self) -> dict:
        """Since the last ``take``, per layer (in the order the model first called them) and query head: the
        smallest factor on the scores (``gamma``), the largest S_max and the steps that clipped, as lists;
        then starts over."""
        names = list(self._since)
        rows = [torch.stack(self._since[n]).tolist() for n in names]
        self._since.clear()
        return {"tau": self.tau, "layers": names, "gamma": [r[0] for r in rows], "s_max": [r[1] for r in rows],
                "clipped_steps": [r[2] for r in rows]}

    def close(self) -> None:
        self._stack.close()
