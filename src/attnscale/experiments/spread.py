"""Experiment 1 — how loud are raw scores? Spread of q·k over random pairs, per width.

With q and k of d independent N(0,1) entries, q·k is a sum of d products of
unit variance, so its standard deviation is sqrt(d): about 2, 8, 16, 32 for
d = 4, 64, 256, 1024. Times 1/sqrt(d) it is 1 at every width.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attnscale import limits
from attnscale.core.diagnostics import spread
from attnscale.errors import ConfigError
from attnscale.experiments import check_head_dims_and_scales, head_dim_seed
from attnscale.core.scales import ScoreScale, display_name, get_scale
from attnscale.terminal import table

__all__ = ["SpreadConfig", "run", "measure", "format_table"]

_CHUNK = 1 << 22  # numbers drawn at once: bounds memory at ~32 MB whatever the width


@dataclass(frozen=True)
class SpreadConfig:
    head_dims: tuple[int, ...] = (4, 32, 64, 128, 256, 512, 1024)
    pairs: int = 20000
    scales: tuple[str, ...] = ("inv_sqrt_d",)
    seed: int = 0

    def __post_init__(self):
        check_head_dims_and_scales(self.head_dims, self.scales)
        if self.pairs < 2:
            raise ConfigError(f"pairs must be at least 2 to measure a spread, got {self.pairs}")
        limits.check(limits.spread_cost(self.head_dims, self.pairs, len(self.scales), _CHUNK),
                     "use fewer pairs or narrower widths")


def _std_error(x: torch.Tensor) -> float:
    """Standard error of the sample std, by the delta method: SE(s) = sqrt(Var(x²)/n) / (2s)."""
    x = x.double() - x.double().mean()
    m2 = x.pow(2).mean()
    m4 = x.pow(4).mean()
    return float(((m4 - m2**2) / x.numel()).sqrt() / (2 * m2.sqrt()))


@torch.no_grad()  # a measurement: a learned scheme's factor is read, never trained
def measure(head_dim: int, pairs: int, scales: tuple[str, ...], seed: int) -> list[dict]:
    """Rows for one width: raw spread, scaled spread per scheme, sqrt(d) beside them."""
    gen = torch.Generator().manual_seed(head_dim_seed(seed, head_dim))
    modules = [get_scale(s, head_dim) for s in scales]
    raw, scaled = [], [[] for _ in modules]
    step = max(1, _CHUNK // head_dim)
    for start in range(0, pairs, step):
        n = min(step, pairs - start)
        q_ND = torch.randn(n, head_dim, generator=gen)
        k_ND = torch.randn(n, head_dim, generator=gen)
        raw_N = torch.linalg.vecdot(q_ND, k_ND)
        raw.append(raw_N)
        for out, m in zip(scaled, modules):
            # a scheme that leaves q and k alone is a function of the raw score: skip the second product
            same_qk = type(m).prepare is ScoreScale.prepare
            out.append(m.cap(raw_N * m.factor()) if same_qk else m.pair_scores(q_ND, k_ND))
    raw_N = torch.cat(raw)
    raw_spread = float(spread(raw_N))
    se = _std_error(raw_N)
    rows = []
    for name, m, chunks in zip(scales, modules, scaled):
        factor = m.factor()
        rows.append({
            "head_dim": head_dim,
            "scale": name,
            "factor": float(factor),
            "pairs": pairs,
            "raw_spread": raw_spread,
            "raw_spread_se": se,
            "scaled_spread": float(spread(torch.cat(chunks))),
            "sqrt_d": math.sqrt(head_dim),
        })
    return rows


FIGURES = ("spread.png",)  # drawn beside the record by the command line, from the rows


def run(cfg: SpreadConfig, out: Path | None = None) -> list[dict]:
    """Measure every width; with ``out``, write the record there (``report`` draws the figure from it).
    A folder holding another command's record (or figure) is refused before anything is measured."""
    started = time.time()
    if out is not None:
        from attnscale.runs import record as rec, writers

        writers.check_out(out, "spread", (rec.RECORD, *FIGURES))
    rows = [row for w in cfg.head_dims for row in measure(w, cfg.pairs, cfg.scales, cfg.seed)]
    if out is not None:
        rec.write(out, rec.new("spread", cfg, rows, started=started))
    return rows


def format_table(rows: list[dict]) -> str:
    """Per width and scheme (as readers know it): the raw spread ± SE beside sqrt(d), and the scaled one."""
    return "\n".join(table(
        ("width", "scale", "raw spread", "± se", "sqrt(d)", "scaled"),
        ([r["head_dim"], display_name(r["scale"]), f"{r['raw_spread']:.3f}", f"{r['raw_spread_se']:.3f}",
          f"{r['sqrt_d']:.3f}", f"{r['scaled_spread']:.3f}"] for r in rows),
        "><>>>>"))
