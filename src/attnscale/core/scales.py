"""Named score-scale schemes: what multiplies (or reshapes) q·k before softmax.

Why 1/sqrt(d) (Vaswani et al. 2017, footnote 4): if the entries of q and k are
independent with mean 0 and variance 1, then q·k = sum_i q_i k_i has variance d,
so its spread grows like sqrt(d); multiplying by 1/sqrt(d) brings it back to 1.

Every scheme is a small ``ScoreScale`` module registered by name, so an
experiment records the scale as a string and the attention code never branches
on it. A scheme may transform q and k before the product (qk-norm), multiply
the product by a factor (fixed or learned), and squash the result (soft-capping):

    scores = cap(factor * (q' @ k'ᵀ)),   (q', k') = prepare(q, k)

References: muP uses 1/d (Yang et al. 2022, "Tensor Programs V"); qk-norm
normalises q and k (Dehghani et al. 2023, "Scaling Vision Transformers to 22B");
tanh soft-capping bounds the scores (Gemma 2, 2024); a learned temperature
(Henry et al. 2020, "Query-Key Normalization for Transformers").
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnscale.errors import ConfigError

__all__ = ["ScoreScale", "SCALES", "DISPLAY_NAMES", "FLOORS", "SOFTCAP_CAP", "register_scale", "check_scale", "get_scale", "scale_names",
           "display_name"]


class ScoreScale(nn.Module):
    """Base scheme: plain product times ``factor`` (override the pieces that differ)."""

    name: str = "base"

    def __init__(self, head_dim: int):
        super().__init__()
        if head_dim < 1:
            raise ValueError(f"head_dim must be a positive integer, got {head_dim}")
        self.head_dim = head_dim

    def prepare(self, q_BHTD: torch.Tensor, k_BHTD: torch.Tensor):
        """Transform q and k before the product (identity unless overridden)."""
        return q_BHTD, k_BHTD

    def factor(self) -> float | torch.Tensor:
        """The multiplier applied to q'·k'."""
        return 1.0

    def cap(self, scores: torch.Tensor) -> torch.Tensor:
        """Element-wise squash after the factor (identity unless overridden)."""
        return scores

    @property
    def fusable(self) -> bool:
        """True when ``F.scaled_dot_product_attention`` can compute this scheme."""
        return type(self).cap is ScoreScale.cap

    def scores(self, q_BHTD: torch.Tensor, k_BHTD: torch.Tensor) -> torch.Tensor:
        """Scaled scores before masking: cap(factor * q' @ k'ᵀ)."""
        q_BHTD, k_BHTD = self.prepare(q_BHTD, k_BHTD)
        return self.cap((q_BHTD @ k_BHTD.mT) * self.factor())

    def pair_scores(self, q_ND: torch.Tensor, k_ND: torch.Tensor) -> torch.Tensor:
        """Scaled score of each (q, k) pair, row by row: cap(factor * Σ q'_i k'_i)."""
        q_ND, k_ND = self.prepare(q_ND, k_ND)
        return self.cap((q_ND * k_ND).sum(-1) * self.factor())

    def extra_repr(self) -> str:
        return f"name={self.name!r}, head_dim={self.head_dim}"


SCALES: dict[str, Callable[[int], ScoreScale]] = {}
# How a reader sees each scheme, in the README, the report and the terminal: what it does, with
# its parameter where it has one ("soft-cap 50"). Records and the command line keep the registry's
# names (``inv_sqrt_d``), which a program matches; a reader should not have to decode them.
DISPLAY_NAMES: dict[str, str] = {}
# Schemes that are a yardstick, not a way to scale: a model trained with one shows what the task is
# worth without the thing under study (``uniform``: attention without scores). Studies that train
# "every scheme" leave them out; they are trained where a floor is asked for.
FLOORS: set[str] = set()


def register_scale(name: str, display: str | None = None, floor: bool = False):
    """Class decorator: make a ``ScoreScale`` subclass available under ``name``, shown to
    readers as ``display`` (default: ``name``); ``floor``: a yardstick (``FLOORS``)."""

    def deco(cls):
        if name in SCALES:
            raise ValueError(f"scale {name!r} is already registered")
        cls.name = name
        SCALES[name] = cls
        DISPLAY_NAMES[name] = display or name
        if floor:
            FLOORS.add(name)
        return cls

    return deco


def scale_names(floors: bool = False) -> list[str]:
    """The registered schemes in order; the yardsticks (``FLOORS``) only with ``floors``."""
    return [s for s in SCALES if floors or s not in FLOORS]


def display_name(name: str) -> str:
    """How the scheme ``name`` reads in tables, plots and messages; a name that is not
    registered (a scheme from an older record) reads as itself."""
    return DISPLAY_NAMES.get(name, name)


def check_scale(name: str) -> str:
    """``name`` when a scheme is registered under it; else a ConfigError naming the choices.
    The one rule every entry point asks (the CLI's --scale, the experiments' configs, ``get_scale``),
    without building the scheme."""
    if name not in SCALES:
        raise ConfigError(f"unknown scale {name!r}; choose one of: {', '.join(SCALES)}")
    return name


def get_scale(name: str, head_dim: int) -> ScoreScale:
    """Build the scheme called ``name`` for heads of width ``head_dim``."""
    return SCALES[check_scale(name)](head_dim)


@register_scale("none")
class NoScale(ScoreScale):
    """Raw q·k: spread sqrt(d) at unit-variance init."""


@register_scale("inv_sqrt_d", "1/√d")
class InvSqrtD(ScoreScale):
    """q·k / sqrt(d): spread 1 at unit-variance init, whatever d (the transformer default)."""

    def factor(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


@register_scale("inv_d", "1/d (muP)")
class InvD(ScoreScale):
    """q·k / d (muP): at init the spread falls like 1/sqrt(d); it is chosen for
    the regime after training, where q and k become correlated and q·k grows like d."""

    def factor(self) -> float:
        return 1.0 / self.head_dim


def fused_rms_norm(x: torch.Tensor) -> bool:
    """Whether qk-norm takes ``F.rms_norm`` for ``x``: where torch has a fused kernel for it (CUDA)."""
    return x.device.type == "cuda"


@register_scale("qk_norm", "qk-norm")
class QKNorm(ScoreScale):
    """RMS-normalise q and k per head (learned gain, init 1), then 1/sqrt(d).

    Normalised vectors have length sqrt(d), so |q'·k'| <= d and, after 1/sqrt(d),
    |score| <= sqrt(d) (with unit gains): the scores are bounded however large
    the projections grow."""

    def __init__(self, head_dim: int, eps: float = 1e-6):
        super().__init__(head_dim)
        self.eps = eps
        self.q_gain = nn.Parameter(torch.ones(head_dim))
        self.k_gain = nn.Parameter(torch.ones(head_dim))

    def _rms(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """x · rsqrt(mean(x²) + eps) · gain. On CUDA ``F.rms_norm``, torch's fused kernel forward and backward,
        with x and the gain in the dtype they promote to (the product's: a bf16 q under autocast with an fp32 gain
        is normalised in fp32). Elsewhere written out: on the CPU (torch 2.13) ``F.rms_norm`` is these same ops,
        with the same values and gradients, but it returns a contiguous tensor where these keep q's layout, so
        the product after it sums in another order and an fp32 run's bits change; and it is no cheaper a step
        (benchmarks/qk_norm_cost.py, docs/speed.md)."""
        if not fused_rms_norm(x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * gain
        dtype = torch.promote_types(x.dtype, gain.dtype)
        return F.rms_norm(x.to(dtype), (x.shape[-1],), gain.to(dtype), self.eps)

    def prepare(self, q_BHTD, k_BHTD):
        return self._rms(q_BHTD, self.q_gain), self._rms(k_BHTD, self.k_gain)

    def factor(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


SOFTCAP_CAP = 50.0  # Gemma 2's attention cap


@register_scale("softcap", f"soft-cap {SOFTCAP_CAP:g}")
class SoftCap(ScoreScale):
    """cap · tanh(s / cap) after 1/sqrt(d): scores stay in (-cap, cap).

    The default cap, ``SOFTCAP_CAP`` (50), is Gemma 2's attention cap."""

    def __init__(self, head_dim: int, cap: float = SOFTCAP_CAP):
        super().__init__(head_dim)
        self.cap_value = float(cap)

    def factor(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def cap(self, scores):
        return self.cap_value * torch.tanh(scores / self.cap_value)


@register_scale("learned_temp", "learned temperature")
class LearnedTemperature(ScoreScale):
    """A learned factor exp(t) per layer, initialised at 1/sqrt(d).

    Learning log-temperature keeps the factor positive and its updates relative."""

    def __init__(self, head_dim: int):
        super().__init__(head_dim)
        self.log_factor = nn.Parameter(torch.tensor(-0.5 * math.log(head_dim)))

    def factor(self) -> torch.Tensor:
        return self.log_factor.exp()


@register_scale("uniform", "uniform (no scores)", floor=True)
class Uniform(ScoreScale):
    """Factor 0: every visible key gets the same weight, so attention is a running mean of
    the values and the model learns nothing through its scores: the no-attention floor.

    The scores are written as zeros rather than 0 · q·k, which would turn an infinite
    product into NaN; and it is not fusable, because SDPA multiplies the masked -inf by
    a scale of 0 and returns NaN."""

    def factor(self) -> float:
        return 0.0

    @property
    def fusable(self) -> bool:
        return False

    def scores(self, q_BHTD: torch.Tensor, k_BHTD: torch.Tensor) -> torch.Tensor:
        return q_BHTD.new_zeros(q_BHTD.shape[:-1] + (k_BHTD.shape[-2],))

    def pair_scores(self, q_ND: torch.Tensor, k_ND: torch.Tensor) -> torch.Tensor:
        return q_ND.new_zeros(torch.broadcast_shapes(q_ND.shape, k_ND.shape)[:-1])
