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

from attnscale.core.diagnostics import counted_rows

__all__ = ["SHARE", "HeadKinds", "kind_sums", "kinds_of"]

SHARE = 0.5


def kind_sums(pattern_BHRS: torch.Tensor, visible_BHRS: torch.Tensor, rows: torch.Tensor | None = None, k0: int = 0,
              offset: int | None = None) -> torch.Tensor:
    """3 × H float64: per head, the sums over the block's rows that see two keys or more of the weight on the
    first key the row sees and on the key just before the row's own token, and the count of those rows.
    ``rows``: the block's query rows' indices in the call (R,; all of them where None), ``k0`` its first key's,
    ``offset`` where query row i is key i + offset (the call's keys less its queries: a cache; S - R of the
    block where None). Every key a row sees must be in the block."""
    visible = visible_BHRS.expand_as(pattern_BHRS)
    R, S = pattern_BHRS.shape[-2:]
    if rows is None:
        rows = torch.arange(R, device=pattern_BHRS.device)
    offset = S - R if offset is None else offset
    counted = counted_rows(visible)  # B×H×R: the rows that see two keys or more, as every row measure counts them
    first = pattern_BHRS.gather(-1, visible.int().argmax(-1, keepdim=True)).squeeze(-1)  # the first key seen
    j = rows.to(pattern_BHRS.device) + offset - 1 - k0  # the previous key, in the block's keys
    inside = (j >= 0) & (j < S)
    at = j.clamp(0, max(S - 1, 0)).view(1, 1, R, 1).expand(*pattern_BHRS.shape[:-1], 1)
    prev = torch.where(inside.view(1, 1, R) & visible.gather(-1, at).squeeze(-1),
                       pattern_BHRS.gather(-1, at).squeeze(-1), 0.0)
    zero = torch.zeros((), dtype=pattern_BHRS.dtype, device=pattern_BHRS.device)
    return torch.stack([torch.where(counted, first, zero).double().sum((0, 2)),  # a row of no key: NaN, not counted
                        torch.where(counted, prev, zero).double().sum((0, 2)), counted.sum((0, 2)).double()])


def kinds_of(sums_3H: torch.Tensor) -> list[str]:
    """Per head of ``kind_sums``' (summed) numbers: "sink", "previous" or "" (neither, or no row that sees two
    keys)."""
    first, prev, rows = sums_3H.double().cpu()
    n = rows.clamp(min=1)
    return ["sink" if r > 0 and f >= SHARE else "previous" if r > 0 and p >= SHARE else ""
            for f, p, r in zip((first / n).tolist(), (prev / n).tolist(), rows.tolist())]


class HeadKinds:
    """Per layer and head, the mean weight on the first visible key and on the previous key, over the rows
    that see two keys or more; ``add`` a layer's weights and visible keys at a time, ``kinds`` reads them."""

    def __init__(self):
        self._sums: dict[int, torch.Tensor] = {}  # layer -> 3 × H: first-key weight, previous-key weight, rows

    def add(self, layer: int, pattern_BHTS: torch.Tensor, visible_BHTS: torch.Tensor) -> None:
        sums = kind_sums(pattern_BHTS, visible_BHTS).cpu()
        self._sums[layer] = self._sums[layer] + sums if layer in self._sums else sums

    def shares(self, layer: int) -> tuple[list[float], list[float]]:
        """Per head of ``layer``: the mean weight on the first key seen and on the previous key."""
        first, prev, rows = self._sums[layer]
        n = rows.clamp(min=1)
        return (first / n).tolist(), (prev / n).tolist()

    def kinds(self, layer: int) -> list[str]:
        """Per head of ``layer``: "sink", "previous" or "" (neither, or no row that sees two keys)."""
        return kinds_of(self._sums[layer])
