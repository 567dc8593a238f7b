"""``HeadStats``: the per-head numbers of one measurement, and what a logger takes from them.

It is the one result type of the one reduction (``capture.sums.HeadSums``): a watch probe's, a training
step's record and each scheme of ``attnscale inspect``. ``pack`` lays a forward's ``HeadSums`` out as
one tensor on their device, so that the numbers cross to the host in one transfer (a training step's
is shared with its loss), and ``unpack`` reads them back as ``HeadStats``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnscale.capture.sums import ROW_MEASURES, HeadSums
from attnscale.core.diagnostics import COLLAPSED_WORDS, HEAD_MEASURES, reduce_heads

__all__ = ["HeadStats", "pack", "unpack", "packed_width", "grids"]


@dataclass(frozen=True, eq=False)  # tensors inside: compared by identity
class HeadStats:
    """Per-head measurements of one probe.

    ``values_LMH``: float32 on the CPU (float64 from inspect, whose tables keep every digit of the
    reduction), (layers, len(HEAD_MEASURES), heads); a
    layer is one attention call, in the order the model made them. NaN where a
    head measured nothing (a layer with fewer heads, a head whose every row saw
    fewer than two keys), and also where a head that counted rows met NaN in
    its scores or weights (NaN weights): ``rows_LH`` tells the two apart. It
    holds the rows each head counted (float64), to pool probes weighted by rows. ``layer_names``: where each layer's call came
    from; ``layer_heads``: each layer's head count (where they differ, the
    tensors are as wide as the widest). ``bias_LH2``: each head's smallest and
    largest bias over its visible keys (NaN: no bias), or None where no layer
    has one. ``errors_LRH``: where query rows were sampled, each row measure's
    standard error (``capture.reduce.ROW_MEASURES`` order), else None. ``layer_methods``: how each layer
    was measured, where the probe says (``capture.fused``: "fused", effective words from the kernel's
    log-sum-exp of every row; "replay", every measure from the scores made again), else (). ``lm_head``:
    how the probe spared the model's LM head, which it never reads ("logits_to_keep=1": one position a
    sequence, ``probe.one_logit``), "" where it ran as the model runs it. ``kinds``: where the probe was asked
    (``measure_heads(head_kinds=True)``), per layer and head "sink", "previous" or "" (``core/head_kinds.py``),
    else ()."""

    values_LMH: torch.Tensor
    rows_LH: torch.Tensor
    measures: tuple[str, ...] = HEAD_MEASURES
    layer_names: tuple[str, ...] = ()
    layer_heads: tuple[int, ...] = ()
    bias_LH2: torch.Tensor | None = None
    errors_LRH: torch.Tensor | None = None
    layer_methods: tuple[str, ...] = ()
    lm_head: str = ""
    kinds: tuple[tuple[str, ...], ...] = ()

    @property
    def layers(self) -> int:
        return len(self.values_LMH)  # one row of the table per layer

    @property
    def heads(self) -> int:
        return self.values_LMH.shape[2]

    def get(self, measure: str) -> torch.Tensor:
        """One measure, (layers, heads)."""
        if measure not in self.measures:
            raise KeyError(f"no measure {measure!r}; choose one of {', '.join(self.measures)}")
        return self.values_LMH[:, self.measures.index(measure)]

    def grids(self) -> dict[str, list[list[float]]]:
        """Each measure as a list per layer of its heads' floats, NaN kept and heads a layer lacks left out:
        the rows a training run records (``lm.step_measures``) and inspect's tables read."""
        L, M, _ = self.values_LMH.shape
        return grids(self.values_LMH.flatten().tolist(), self.measures, [self._heads_of(l) for l in range(L)], M)

    def _lists(self, measure: str) -> list[list[float | None]]:
        return [[None if v != v else v for v in layer] for layer in self.get(measure).tolist()]

    def nonfinite_LH(self) -> torch.Tensor:
        """(layers, heads) boolean: heads that counted rows and yet hold a NaN or infinite measure (NaN or inf
        in the model's q or k). A NaN of a head that counted no row is an absence, and is not one of these."""
        return (self.rows_LH > 0) & ~torch.isfinite(self.values_LMH).all(1)

    def _wide(self, measure: str, how: str, weights_LH=None) -> float:
        """``reduce_heads`` over the heads with a value, unless a head that counted rows holds NaN for this
        measure: then NaN, so that a broken head is never dropped from the model's numbers (an infinite value
        goes through max and min as it is)."""
        values = self.get(measure)
        if bool(((self.rows_LH > 0) & torch.isnan(values)).any()):
            return float("nan")
        return reduce_heads(self._lists(measure), how, weights_LH=weights_LH)

    def summary(self) -> dict[str, float]:
        """The model in five numbers: the largest |score| of any head, the fewest
        effective words of any head, the share of frozen rows over all heads
        (weighted by rows), how many heads are collapsed (fewer than
        ``COLLAPSED_WORDS`` effective words) and how many are non-finite
        (``nonfinite_LH``). Where a head that counted rows reads NaN, the first
        three are NaN: a head whose weights went bad shows in them, never vanishes."""
        words = self._lists("effective_words")
        return {
            "attn/max_score": self._wide("max_score", "max"),
            "attn/min_effective_words": self._wide("effective_words", "min"),
            "attn/frozen_fraction": self._wide("frozen_fraction", "mean", weights_LH=self.rows_LH.tolist()),
            "attn/collapsed_heads": float(sum(v is not None and v < COLLAPSED_WORDS for layer in words for v in layer)),
            "attn/nonfinite_heads": float(self.nonfinite_LH().sum()),
        }

    def _heads_of(self, layer: int) -> int:
        return self.layer_heads[layer] if self.layer_heads else self.heads

    def flat(self) -> dict[str, float]:
        """``attn/layer_{l}/head_{h}/{measure}`` for every layer, head and measure (heads a layer lacks left
        out), ``…/bias_min`` and ``…/bias_max`` where a layer has a bias, then ``summary()``."""
        out: dict[str, float] = {}
        values = self.values_LMH.tolist()
        for l, layer in enumerate(values):
            for h in range(self._heads_of(l)):
                for m, name in enumerate(self.measures):
                    out[f"attn/layer_{l}/head_{h}/{name}"] = layer[m][h]
        if self.bias_LH2 is not None:
            for l, layer in enumerate(self.bias_LH2.tolist()):
                for h in range(self._heads_of(l)):
                    if layer[h][0] == layer[h][0]:  # not NaN: the head has a bias
                        out[f"attn/layer_{l}/head_{h}/bias_min"], out[f"attn/layer_{l}/head_{h}/bias_max"] = layer[h]
        out.update(self.summary())
        return out


def grids(values: list[float], measures: tuple[str, ...] | list[str], layer_heads: list[int] | tuple[int, ...],
          width: int) -> dict[str, list[list[float]]]:
    """``HeadStats.grids`` of a flat list laid out (layers, ``width``, heads), ``measures`` its first rows in
    order, heads a layer lacks left out: a packed tensor's ``tolist()`` read without another tensor."""
    heads = len(values) // (len(layer_heads) * width)
    return {name: [values[(l * width + m) * heads:(l * width + m) * heads + n] for l, n in enumerate(layer_heads)]
            for m, name in enumerate(measures)}


def packed_width(errors: bool) -> int:
    """The rows of ``pack``'s middle dim: the measures, the rows counted, the bias range, and the row
    measures' standard errors where ``errors``."""
    return len(HEAD_MEASURES) + 1 + 2 + (len(ROW_MEASURES) if errors else 0)


def pack(sums: list[HeadSums], dtype: torch.dtype = torch.float64, errors: bool = True) -> torch.Tensor:
    """(layers, ``packed_width(errors)``, widest heads) of ``dtype`` on the sums' device, NaN where a layer has
    fewer heads: every layer's measures, rows counted, bias range and (``errors``) standard errors."""
    heads = max(s.heads for s in sums)
    parts = torch.full((len(sums), packed_width(errors), heads), float("nan"), dtype=dtype, device=sums[0].device)
    for i, s in enumerate(sums):
        mine = [s.measures(), s.rows[None], s.bias_range()] + ([s.standard_errors()] if errors else [])
        parts[i, :, :s.heads] = torch.cat(mine)
    return parts


def unpack(parts: torch.Tensor, names: tuple[str, ...], layer_heads: tuple[int, ...],
           errors: bool = False, dtype: torch.dtype = torch.float32, methods: tuple[str, ...] = ()) -> HeadStats:
    """The ``HeadStats`` of ``pack``'s tensor once on the CPU (``errors``: keep the standard errors, where rows
    were sampled and ``pack`` took them), its values of ``dtype``; ``methods``: each layer's, where known."""
    M = len(HEAD_MEASURES)
    parts = parts.double()
    rows = torch.nan_to_num(parts[:, M], nan=0.0)
    bias = parts[:, M + 1:M + 3].transpose(1, 2)
    has_bias = bool(torch.isfinite(bias).any())
    return HeadStats(parts[:, :M].to(dtype), rows, HEAD_MEASURES, tuple(names), tuple(layer_heads),
                     bias_LH2=bias if has_bias else None, errors_LRH=parts[:, M + 3:] if errors else None,
                     layer_methods=tuple(methods))
