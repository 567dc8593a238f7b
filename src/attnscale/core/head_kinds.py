"""Which heads are sink heads and which previous-token heads (``attnscale inspect`` marks them): what trained
heads look like, not a collapse.

A trained model attends to about one word in many heads from the start (SmolLM2-135M as released has 7 to 31
heads under 2 effective words), and most of them are one of two kinds, read from the weights under the model's
own scale, averaged over the rows that see two keys or more:

- a **sink head** puts at least ``SHARE`` (a half) of a row's weight on the first key the row sees (the
  sequence's first token under a causal mask: the attention sink of Xiao et al. 2023, a fixed key that every
  row sees);
- a **previous-token head** puts at least ``SHARE`` on the key just before the row's own token.

A head that is both (rows of two keys, where the first is the previous) is called a sink. Neither kind is
an alarm: ``Collapsed(relative=True)`` fires only on a head that falls from where it started.
"""

from __future__ import annotations

import torch

__all__ = ["SHARE", "HeadKinds"]

SHARE = 0.5


class HeadKinds:
    """Per layer and head, the mean weight on the first visible key and on the previous key, over the rows
    that see two keys or more; ``add`` a layer's weights and visible keys at a time, ``kinds`` reads them."""

    def __init__(self):
        self._sums: dict[int, torch.Tensor] = {}  # layer -> 3 × H: first-key weight, previous-key weight, rows

    def add(self, layer: int, pattern_BHTS: torch.Tensor, visible_BHTS: torch.Tensor) -> None:
        visible = visible_BHTS.expand_as(pattern_BHTS)
        rows = visible.sum(-1) >= 2  # B×H×T
        first = pattern_BHTS.gather(-1, visible.int().argmax(-1, keepdim=True)).squeeze(-1)  # the first key seen
        T, S = pattern_BHTS.shape[-2:]
        offset = S - T  # a query row i is key i + offset (keys before the queries: a cache)
        prev = torch.zeros_like(first)
        if T > 1 or offset > 0:
            i = torch.arange(T, device=pattern_BHTS.device)
            j = (i + offset - 1).clamp(min=0)
            seen = (i + offset - 1 >= 0).view(1, 1, T) & visible.gather(-1, j.view(1, 1, T, 1).expand(
                *visible.shape[:-1], 1)).squeeze(-1)
            prev = torch.where(seen, pattern_BHTS.gather(-1, j.view(1, 1, T, 1).expand(
                *pattern_BHTS.shape[:-1], 1)).squeeze(-1), prev)
        sums = torch.stack([(first * rows).sum((0, 2)), (prev * rows).sum((0, 2)), rows.sum((0, 2)).to(first.dtype)])
        self._sums[layer] = self._sums[layer] + sums.double().cpu() if layer in self._sums else sums.double().cpu()

    def shares(self, layer: int) -> tuple[list[float], list[float]]:
        """Per head of ``layer``: the mean weight on the first key seen and on the previous key."""
        first, prev, rows = self._sums[layer]
        n = rows.clamp(min=1)
        return (first / n).tolist(), (prev / n).tolist()

    def kinds(self, layer: int) -> list[str]:
        """Per head of ``layer``: "sink", "previous" or "" (neither, or no row that sees two keys)."""
        first, prev = self.shares(layer)
        return ["sink" if f >= SHARE else "previous" if p >= SHARE else "" for f, p in zip(first, prev)]
