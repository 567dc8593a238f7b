"""Experiment 2 — a freshly initialised head: does softmax freeze onto one word?

Each of ``words`` queries looks at all ``words`` keys (no causal mask: the
chapter's head weighs 64 words per row). Two initialisations:

- ``unit``: q and k entries i.i.d. N(0, 1), the assumption of Vaswani et al.
  (2017, footnote 4). Raw scores then have spread sqrt(d).
- ``model``: the layer-0 head of the ``TinyLM`` that ``reproduce`` trains
  (the default preset, ``lm.presets``: PyTorch's default init, post-LN, d_model 64),
  fed that model's own input: token + position embeddings of random tokens,
  through the first LayerNorm only where the model is pre-LN.

For a fixed width and seed every scheme sees the same q and k, so the example
row under ``none`` and under ``inv_sqrt_d`` is the same row of the same head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attnscale import limits
from attnscale.core.attention import masked_softmax
from attnscale.core.diagnostics import FROZEN_THRESHOLD, describe_row, effective_words, row_summary
from attnscale.errors import ConfigError
from attnscale.experiments import check_head_dims_and_scales, head_dim_seed
from attnscale.core.hooks import hooked
from attnscale.core.scales import display_name, get_scale
from attnscale.terminal import table

__all__ = ["FreshConfig", "run", "measure", "illustration", "format_table"]

_MODEL_VOCAB = 256  # random tokens for the model-init head; the vocabulary size barely matters at init


@dataclass(frozen=True)
class FreshConfig:
    head_dims: tuple[int, ...] = (4, 32, 64, 128, 256, 512, 1024)
    words: int = 64
    sequences: int = 200
    init: str = "unit"
    scales: tuple[str, ...] = ("none", "inv_sqrt_d")
    threshold: float = FROZEN_THRESHOLD
    seed: int = 0
    example_row: int = 12

    def __post_init__(self):
        check_head_dims_and_scales(self.head_dims, self.scales)
        if self.words < 2:
            raise ConfigError(f"words must be at least 2 (a row needs a choice), got {self.words}")
        if self.sequences < 1:
            raise ConfigError(f"sequences must be a positive integer, got {self.sequences}")
        if self.init not in ("unit", "model"):
            raise ConfigError(f"init must be 'unit' or 'model', got {self.init!r}")
        if not 0 < self.threshold < 1:
            raise ConfigError(f"threshold must lie between 0 and 1, got {self.threshold}")
        limits.check(limits.fresh_cost(self.head_dims, self.words, self.sequences, len(self.scales)),
                     "use fewer words or sequences, or narrower widths")


def _unit_pattern(head_dim: int, scale: str, cfg: FreshConfig) -> torch.Tensor:
    gen = torch.Generator().manual_seed(head_dim_seed(cfg.seed, head_dim))
    q_S1TD = torch.randn(cfg.sequences, 1, cfg.words, head_dim, generator=gen)
    k_S1TD = torch.randn(cfg.sequences, 1, cfg.words, head_dim, generator=gen)
    scores = get_scale(scale, head_dim).scores(q_S1TD, k_S1TD)
    return masked_softmax(scores, None)[:, 0]


def _model_pattern(head_dim: int, scale: str, cfg: FreshConfig) -> torch.Tensor:
    from attnscale.lm.model import ModelConfig, build_model

    mcfg = ModelConfig(**{**_trained_model(), "vocab_size": _MODEL_VOCAB, "context": cfg.words, "head_dim": head_dim,
                          "scale": scale, "n_layers": 1, "impl": "explicit"})
    model = build_model(mcfg, seed=head_dim_seed(cfg.seed, head_dim))
    block = model.blocks[0]
    block.attn.causal = False  # a throwaway head: every row weighs all the words, as in the chapter
    gen = torch.Generator().manual_seed(head_dim_seed(cfg.seed, head_dim))
    # every head of the layer is a sample of a fresh head: draw just enough
    # sequences for ``cfg.sequences`` head-sequences, as many rows as ``unit`` has
    n_seq = -(-cfg.sequences // mcfg.n_heads)
    idx_ST = torch.randint(0, _MODEL_VOCAB, (n_seq, cfg.words), generator=gen)
    with torch.no_grad(), hooked(block.attn, "hook_pattern") as cache:
        x_STC = model.tok_emb(idx_ST) + model.pos_emb(torch.arange(cfg.words))
        block.attn(block.ln1(x_STC) if mcfg.norm == "pre" else x_STC)
    return cache["hook_pattern"].flatten(0, 1)[: cfg.sequences]


def _trained_model() -> dict:
    """ModelConfig fields of the model ``reproduce`` trains (the default preset's)."""
    from attnscale.lm.presets import model_settings

    return model_settings()


def model_init_name() -> str:
    """The init, norm and width of the model whose fresh head ``model`` measures, for the record."""
    m = _trained_model()
    return f"{m['init']} init, {m['norm']}-LN, d_model {m['d_model']}"


def measure(head_dim: int, scale: str, cfg: FreshConfig) -> dict:
    """Row statistics of one fresh head at one width under one scheme."""
    with torch.no_grad():
        p_STT = (_unit_pattern if cfg.init == "unit" else _model_pattern)(head_dim, scale, cfg)
    row = min(cfg.example_row, cfg.words - 1)
    example = p_STT[0, row]
    return {
        "head_dim": head_dim,
        "scale": scale,
        "init": cfg.init,
        "words": cfg.words,
        "sequences": cfg.sequences,
        **row_summary(p_STT, cfg.threshold),
        "example": describe_row(example, row),
        "example_row": example.tolist(),
    }


def illustration(words: int = 64, multipliers=(0.25, 1, 4, 16, 32), seed: int = 0) -> dict:
    """One row of N(0,1) scores under growing multipliers: from a soft blend to one word."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(words, generator=gen)
    weights = [torch.softmax(m * scores, -1) for m in multipliers]
    return {
        "scores": scores.tolist(),
        "multipliers": list(multipliers),
        "weights": [w.tolist() for w in weights],
        "effective_words": [float(effective_words(w)) for w in weights],
    }


FIGURES = ("fresh.png", "illustration.png")  # drawn beside the record by the command line, from the result


def run(cfg: FreshConfig, out: Path | None = None) -> dict:
    """Every width × scheme; with ``out``, the record (``report`` draws the figures from it).
    Returns {"rows", "illustration"}. A folder holding another command's record (or figures) is refused
    before anything is measured."""
    started = time.time()
    if out is not None:
        from attnscale.runs import record as rec, writers

        writers.check_out(out, "fresh", (rec.RECORD, *FIGURES))
    rows = [measure(w, s, cfg) for w in cfg.head_dims for s in cfg.scales]
    result = {"rows": rows, "illustration": illustration(cfg.words, seed=cfg.seed)}
    if cfg.init == "model":
        result["model_init"] = model_init_name()
    if out is not None:
        rec.write(out, rec.new("fresh", cfg, result, started=started))
    return result


def format_table(result: dict) -> str:
    """Per width and scheme: effective words (median, p10, p90), max weight, frozen share, push; one example row."""
    return "\n".join(table(
        ("width", "scale", "eff. words med", "p10", "p90", "max w", "frozen", "push med", "example"),
        ([r["head_dim"], display_name(r["scale"]), f"{r['effective_words_median']:.2f}", f"{r['effective_words_p10']:.2f}",
          f"{r['effective_words_p90']:.2f}", f"{r['max_weight_mean']:.3f}", f"{r['frozen_fraction']:.1%}",
          f"{r['push_median']:.4f}", r["example"]] for r in result["rows"]),
        "><>>>>>><"))
