"""A tiny decoder-only language model whose head width head_dim is set apart from d_model.

Token + learned position embeddings, ``n_layers`` blocks of attention and a 4×
MLP, a linear read-out (tied to the token embedding with ``tie_embeddings=True``;
untied by default). Attention is
``attnscale.core.attention.Attention`` at ``blocks.{i}.attn``, so its hook points are
``blocks.{i}.attn.hook_scores`` and friends.

Why head_dim apart from d_model: the course varies the length of q and k (its
"width" d) up to 1,024. Coupling it to the residual stream (d_model = H·head_dim)
would make the widest model ~100× dearer than the narrowest on a laptop CPU;
projecting a small residual stream up to wide heads keeps the variable under
study (the spread of q·k) and the cost flat. ``head_dim=None`` couples them
(head_dim = d_model // n_heads) for fidelity.

Initialisation is a named, recorded choice (``INITS``), because the spread of
the scores at step 0 depends on it as much as on head_dim:

- ``torch``: PyTorch's defaults, nn.Embedding N(0, 1), nn.Linear kaiming-uniform
  (weight variance 1/(3·fan_in)). q and k entries have variance var(x)/3.
- ``gpt2``: N(0, 0.02) everywhere, residual projections N(0, 0.02/sqrt(2·n_layers))
  (Radford et al. 2019). q and k entries are tiny, so scores start near 0 whatever the scale.
- ``unit``: ``gpt2`` elsewhere, but q and k projections N(0, 1/d_model), so with
  unit-variance inputs q and k entries have variance 1, as Vaswani et al.
  (2017, footnote 4) assume.

``norm``: "pre" (GPT-2: LN before each sub-layer, one final LN) or "post"
(Vaswani et al.: LN after each residual sum, so the first attention sees the raw
embeddings, whose variance under ``torch`` init is 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnscale.core.attention import Attention
from attnscale.errors import ConfigError, check_positive_ints
from attnscale.core.scales import SCALES

__all__ = ["ModelConfig", "TinyLM", "INITS", "build_model"]

INIT_NAMES = ("torch", "gpt2", "unit")
NORMS = ("pre", "post")
IMPLS = ("fused", "explicit")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and named choices of the tiny LM. ``head_dim``, the head width (the course's width d,
    the length of each q and k), is set apart from d_model; given as None it is d_model // n_heads,
    and a built config always holds the number."""

    vocab_size: int
    context: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int | None = None
    scale: str = "inv_sqrt_d"
    init: str = "torch"
    norm: str = "pre"
    impl: str = "fused"
    tie_embeddings: bool = False
    mlp_ratio: int = 4

    def __post_init__(self):
        check_positive_ints(self, ("vocab_size", "context", "d_model", "n_layers", "n_heads", "mlp_ratio"), "model")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ConfigError(f"model head_dim must be a positive integer or None (= d_model // n_heads), got {self.head_dim!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"model d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "change one, or set head_dim to decouple the head width"
            )
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.scale not in SCALES:
            raise ConfigError(f"model scale {self.scale!r} is unknown; choose one of: {', '.join(SCALES)}")
        for name, allowed in (("init", INIT_NAMES), ("norm", NORMS), ("impl", IMPLS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model {name} {getattr(self, name)!r} is unknown; choose one of: {', '.join(allowed)}")

    @property
    def d_attn(self) -> int:
        """Width of the concatenated heads (the q/k/v projections' output)."""
        return self.n_heads * self.head_dim


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x_BTC: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x_BTC)))


class Block(nn.Module):
    """One transformer block; ``norm`` decides where the LayerNorms sit."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.head_dim, scale=cfg.scale, causal=True, impl=cfg.impl)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x_BTC: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x_BTC = x_BTC + self.attn(self.ln1(x_BTC))
            return x_BTC + self.mlp(self.ln2(x_BTC))
        x_BTC = self.ln1(x_BTC + self.attn(x_BTC))
        return self.ln2(x_BTC + self.mlp(x_BTC))


class TinyLM(nn.Module):
    """Decoder-only LM: ``forward(idx_BT) -> logits_BTV``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        # post-LN already ends every block with a LayerNorm
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        INITS[cfg.init](self, cfg)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx_BT: torch.Tensor) -> torch.Tensor:
        T = idx_BT.shape[1]
        if T > self.cfg.context:
            raise ConfigError(f"sequence of {T} tokens is longer than the model's context {self.cfg.context}")
        pos_T = torch.arange(T, device=idx_BT.device)
        x_BTC = self.tok_emb(idx_BT) + self.pos_emb(pos_T)
        for block in self.blocks:
            x_BTC = block(x_BTC)
        return self.head(self.ln_f(x_BTC))

    def loss(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats (computed in fp32 under autocast)."""
        logits_BTV = self(idx_BT)
        return F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten())

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ---- named initialisations -------------------------------------------------


def _init_torch(model: TinyLM, cfg: ModelConfig) -> None:
    """Leave PyTorch's module defaults as they are (already applied at construction)."""


def _init_gpt2(model: TinyLM, cfg: ModelConfig) -> None:
    for name, p in model.named_parameters():
        if p.dim() < 2:  # biases and LayerNorm gains keep 0 / 1
            if name.endswith("bias"):
                nn.init.zeros_(p)
            continue
        std = 0.02
        # residual projections: keep the residual stream's variance from growing with depth
        if name.endswith(("attn.o_proj.weight", "mlp.down.weight")):
            std = 0.02 / math.sqrt(2 * cfg.n_layers)
        nn.init.normal_(p, 0.0, std)


def _init_unit(model: TinyLM, cfg: ModelConfig) -> None:
    _init_gpt2(model, cfg)
    # var(q_i) = d_model · var(w) · var(x) = 1 for unit-variance inputs (footnote 4's assumption)
    for block in model.blocks:
        nn.init.normal_(block.attn.q_proj.weight, 0.0, 1 / math.sqrt(cfg.d_model))
        nn.init.normal_(block.attn.k_proj.weight, 0.0, 1 / math.sqrt(cfg.d_model))


INITS: dict[str, Callable[[TinyLM, ModelConfig], None]] = {
    "torch": _init_torch,
    "gpt2": _init_gpt2,
    "unit": _init_unit,
}


def build_model(cfg: ModelConfig, seed: int | None = None) -> TinyLM:
    """Build the model; with ``seed`` the weights come from a local generator
    state (the global RNG is restored afterwards), so building never reseeds the caller."""
    if seed is None:
        return TinyLM(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLM(cfg)
