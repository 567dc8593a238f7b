"""The one per-head reduction: an attention call's q and k to every head measure, in O(T) memory.

A call's scores are never held whole. They are made a block of query rows at a
time (of sequences and heads too, where one row of every head is over the
budget), as the model makes them,

    score = cap(q·kᵀ × factor),   logit = score + bias,   hidden keys left out,

in float32 whatever the model runs in, and each block is folded at once into a
head's running sums (``HeadSums.add_block``, the only code that computes the
measures of ``core.diagnostics.HEAD_MEASURES``):

- spread: count, mean and sum of squared deviations, merged block by block
  (Chan et al. 1979), so a large mean costs no digits;
- max_score: the running max of |score|;
- the row measures, from each row's log-sum-exp in float64 (FlashAttention's
  online softmax, with every key of a row in one block): effective words
  exp(lse - Σ p·z), max weight exp(max z - lse), push from Σp² and Σp³, frozen
  where the max weight passes the threshold; summed (and their squares, for a
  sampled probe's standard errors) over the rows that see ``MIN_KEYS`` keys;
- the bias range over the visible keys, reported apart: a bias enters the
  weights, never the scores.

A ``score_mod`` (flex_attention's) is applied to each block's scores for the
weights: the score measures read the score before it, and the bias range is
what it added (its output less the score), with any bias. A key it takes to
-inf, or ``HIDDEN_AT`` or further below its score, is hidden. An attention
``sink`` z (per head) is one more entry of every row's softmax that is no key:
over a row's visible keys the weights are p_j = e^(z_j) / (Σ_k e^(z_k) + e^z),
summing to 1 - p_sink, and the row measures are those of these weights, the
weights the model puts on its values: effective words exp(-Σ_j p_j log p_j),
the max weight max_j p_j (frozen where it passes the threshold), push the
Frobenius norm of the keys' Jacobian diag(p) - p pᵀ (∂p_j/∂z_i, the sink held
still). The sink is not a score, not in the bias range, and not one of the
``MIN_KEYS`` keys a counted row sees.

The block is sized by ``memory`` (bytes, ``DEFAULT_MEMORY``), at
``BYTES_PER_ENTRY`` per (row, key, head) entry; ``benchmarks/probe_cost.py``
measures the peak. ``sample_rows`` measures a random subset of each sequence's
query rows; the row measures then carry their standard errors.
"""

from __future__ import annotations

import math

import torch

from attnscale.capture.call import HIDDEN_AT, AttentionCall
from attnscale.core.diagnostics import FROZEN_THRESHOLD, HEAD_MEASURES, MIN_KEYS, measuring_device

__all__ = ["BYTES_PER_ENTRY", "DEFAULT_MEMORY", "ROW_MEASURES", "HeadSums", "dense", "head_max", "reduce_call", "reduce_scores",
           "with_padding"]

DEFAULT_MEMORY = 256 << 20
# Peak bytes of one (row, key, head) entry of a block: fp32 scores and logits, float64 exponentials, temporaries.
BYTES_PER_ENTRY = 40
# The measures taken over rows (the others over the scores' entries).
ROW_MEASURES = HEAD_MEASURES[2:]


class HeadSums:
    """Running per-head sums of one layer, from which every head measure is read (``measures``).

    Adding blocks in any split gives the numbers of the whole call to float64 rounding; ``merge`` adds
    another layer's sums (another batch, another rank) as if their blocks had been added here."""

    FIELDS = ("entries", "mean", "m2", "max_abs", "rows", *(f"sum_{m}" for m in ROW_MEASURES),
              *(f"sq_{m}" for m in ROW_MEASURES), "bias_min", "bias_max")

    def __init__(self, heads: int, threshold: float = FROZEN_THRESHOLD, device: torch.device | str | None = None):
        self.threshold = threshold
        self.data = torch.zeros(len(self.FIELDS), heads, dtype=torch.float64, device=measuring_device(device))
        self.data[self.FIELDS.index("bias_min")] = math.inf
        self.data[self.FIELDS.index("bias_max")] = -math.inf

    def __getattr__(self, name: str) -> torch.Tensor:
        fields = type(self).FIELDS
        if name in fields:
            return self.__dict__["data"][fields.index(name)]
        raise AttributeError(name)

    @property
    def heads(self) -> int:
        return self.data.shape[1]

    @property
    def device(self) -> torch.device:
        return self.data.device

    def add_block(self, scores_BHRS: torch.Tensor, keep: torch.Tensor, bias: torch.Tensor | None = None,
                  rows: bool = True, logits: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> None:
        """Fold one block in: ``scores`` (float32; any value where ``keep`` is False), ``keep`` (boolean,
        broadcastable: True = the key is visible to the row), ``bias`` (float32 or None) added for the weights.
        ``logits``: what the weights read where it is not scores + bias (a score_mod's output; ``bias`` then
        says what was added, for the range). ``sink``: the block's heads' sink logits (h,), or None.
        Every visible key of a row must be in the block (``rows=False``: score measures only)."""
        B, H, R, S = scores_BHRS.shape
        keep = keep.expand(B, H, R, S)
        hidden = ~keep
        self._merge_scores(scores_BHRS, keep, hidden)
        if bias is not None:
            b = bias.expand(B, H, R, S)
            self.bias_min.copy_(torch.fmin(self.bias_min, b.masked_fill(hidden, math.inf).amin((0, 2, 3)).double()))
            self.bias_max.copy_(torch.fmax(self.bias_max, b.masked_fill(hidden, -math.inf).amax((0, 2, 3)).double()))
        if rows:
            if logits is None:
                logits = scores_BHRS if bias is None else scores_BHRS + bias
            self._add_rows(logits, keep, hidden, sink)

    def _merge_scores(self, scores: torch.Tensor, keep: torch.Tensor, hidden: torch.Tensor) -> None:
        """Count, mean and squared deviations of the block's visible scores, merged into the running ones.
        Deviations are taken from a shift near the mean (the mean so far, or the block's first row's) in
        float32, summed over each row in float32 and over rows in float64: no float64 copy of the block."""
        n = keep.sum((0, 2, 3)).double()
        first = scores[:, :, :1].masked_fill(hidden[:, :, :1], 0.0).sum((0, 2, 3)).double()
        first = first / keep[:, :, :1].sum((0, 2, 3)).clamp_min(1)
        shift = torch.where(self.entries > 0, self.mean, first).float()[None, :, None, None]
        d = (scores - shift).masked_fill_(hidden, 0.0)
        # the shift lies within the visible scores seen so far, so the hidden zeros (|shift|) never raise the max
        top = torch.maximum(d.amax((0, 2, 3)) + shift.flatten(), -(d.amin((0, 2, 3)) + shift.flatten()))
        self.max_abs.copy_(torch.maximum(self.max_abs, top.double()))
        s1 = d.sum(-1).double().sum((0, 2))
        s2 = d.mul_(d).sum(-1).double().sum((0, 2))
        mean = shift.flatten().double() + s1 / n.clamp_min(1)
        m2 = (s2 - s1**2 / n.clamp_min(1)).clamp_min(0)
        self._chan(n, mean, m2)

    def _chan(self, n: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor) -> None:
        total = self.entries + n
        delta = mean - self.mean
        share = torch.where(total > 0, n / total.clamp_min(1), 0.0)
        self.m2.add_(m2 + delta.pow(2) * self.entries * share)
        self.mean.add_(delta * share)
        self.entries.copy_(total)

    def _add_rows(self, logits: torch.Tensor, keep: torch.Tensor, hidden: torch.Tensor,
                  sink: torch.Tensor | None = None) -> None:
        counted = keep.sum(-1) >= MIN_KEYS  # B×H×R: a row with one choice is neither frozen nor free
        # hidden keys as a number no exp survives (e^-1e30 = 0, and 0 · -1e30 = 0, where -inf would give NaN)
        filled = logits.masked_fill(hidden, -1e30)
        top, top_key = filled.max(-1, keepdim=True)
        y = filled.double().sub_(top.double())  # ≤ 0, in float64 before the top is taken off: no digit lost
        del filled
        e = y.exp()
        e.scatter_(-1, top_key, 0.0)  # the other keys' e (the top's is exactly 1): sums without cancellation
        ones = torch.ones(e.shape[-1], 1, dtype=e.dtype, device=e.device)
        e1 = (e @ ones)[..., 0]  # row sums as matrix products: one pass each, no B×H×R×S temporaries
        e_y = (e.unsqueeze(-2) @ y.unsqueeze(-1))[..., 0, 0]
        e2 = (e.unsqueeze(-2) @ e.unsqueeze(-1))[..., 0, 0]
        e3 = (e.unsqueeze(-2) @ torch.mul(e, e, out=y).unsqueeze(-1))[..., 0, 0]  # y's memory holds e²
        del e, y
        others = e1  # Σ e over the row's entries but the top key: the other keys, and the sink
        if sink is not None:  # its e, from at most 600 nats above the top (the keys' weights are then < e^-600)
            others = e1 + (sink.double()[None, :, None] - top[..., 0].double()).clamp_max(600).exp()
        total = 1 + others  # the softmax's denominator over the top's e
        share = 1.0 if sink is None else (1 + e1) / total  # the keys' weight, 1 - p_sink
        entropy = share * torch.log1p(others) - e_y / total  # -Σ p log p over the keys, p = e / total
        max_weight = 1 / total
        # push² = p_t² (1 - p_t)² + 2 p_t² R2 + R2² + (R2 - 2 R3), R_n = Σ over the other keys of pⁿ: every
        # term ≥ 0, so a frozen row's push keeps its digits (s2 - 2 s3 + s2² cancels to nothing there)
        push_sq = ((others / total) ** 2 / total**2 + (2 * e2 + e2**2) / total**4
                   + (e2 * total - 2 * e3).clamp_min(0) / total**3)
        per_row = {
            "effective_words": entropy.exp(),
            "frozen_fraction": (max_weight > self.threshold).double(),
            "push": push_sq.sqrt(),
            "max_weight": max_weight,
        }
        self.rows.add_(counted.sum((0, 2)).double())
        for m in ROW_MEASURES:
            v = torch.where(counted, per_row[m], 0.0)
            getattr(self, f"sum_{m}").add_(v.sum((0, 2)))
            getattr(self, f"sq_{m}").add_(v.pow(2).sum((0, 2)))

    def merge(self, other: "HeadSums") -> None:
        """Add ``other``'s sums (same heads) to these."""
        o = other.data.to(self.device)
        i = {f: k for k, f in enumerate(self.FIELDS)}
        self._chan(o[i["entries"]], o[i["mean"]], o[i["m2"]])
        self.max_abs.copy_(torch.maximum(self.max_abs, o[i["max_abs"]]))
        self.bias_min.copy_(torch.fmin(self.bias_min, o[i["bias_min"]]))
        self.bias_max.copy_(torch.fmax(self.bias_max, o[i["bias_max"]]))
        additive = [k for f, k in i.items() if f == "rows" or f.startswith(("sum_", "sq_"))]
        self.data[additive] += o[additive]

    def measures(self) -> torch.Tensor:
        """float64 (len(HEAD_MEASURES), H) on the sums' device; NaN where a head saw no entry (score measures)
        or counted no row (row measures)."""
        seen, rows = self.entries > 0, self.rows > 0
        spread = torch.where(seen, (self.m2 / self.entries.clamp_min(1)).sqrt(), math.nan)
        out = [spread, torch.where(seen, self.max_abs, math.nan)]
        out += [torch.where(rows, getattr(self, f"sum_{m}") / self.rows.clamp_min(1), math.nan) for m in ROW_MEASURES]
        return torch.stack(out)

    def standard_errors(self) -> torch.Tensor:
        """float64 (len(ROW_MEASURES), H): each row measure's standard error as a mean over sampled rows
        (sample standard deviation / sqrt(rows)); NaN under two rows. For rows sampled from a sequence, an
        upper bound: the finite-population correction is left out."""
        n = self.rows
        out = []
        for m in ROW_MEASURES:
            mean = getattr(self, f"sum_{m}") / n.clamp_min(1)
            var = (getattr(self, f"sq_{m}") - n * mean**2).clamp_min(0) / (n - 1).clamp_min(1)
            out.append(torch.where(n > 1, (var / n.clamp_min(1)).sqrt(), math.nan))
        return torch.stack(out)

    def bias_range(self) -> torch.Tensor:
        """float64 (2, H): the smallest and largest bias over the visible keys; NaN where there is none."""
        lo, hi = self.bias_min, self.bias_max
        none = ~torch.isfinite(lo)
        return torch.stack([lo.masked_fill(none, math.nan), hi.masked_fill(none, math.nan)])


def _plan(B: int, H: int, G: int, T: int, S: int, memory: int) -> tuple[int, int, int]:
    """(sequences, query heads, rows) per block: whole sequences while they fit, else rows of one sequence,
    and groups of query heads (whole GQA groups of ``G``) only where one row of every head is over budget."""
    per_row = max(1, H * S * BYTES_PER_ENTRY)
    if per_row * T <= memory:
        return max(1, min(B, memory // (per_row * T))), H, T
    if per_row <= memory:
        return 1, H, min(T, memory // per_row)
    heads = max(G, (memory // max(1, S * BYTES_PER_ENTRY)) // G * G)
    return 1, min(H, heads), max(1, min(T, memory // max(1, heads * S * BYTES_PER_ENTRY)))


def _pick_rows(T: int, sample_rows: int | None, device, seed: int) -> torch.Tensor | None:
    if sample_rows is None or sample_rows >= T:
        return None
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randperm(T, generator=g)[:sample_rows].sort().values.to(device)


def _blocks(call: AttentionCall, memory: int, device, sample_rows: int | None = None, seed: int = 0):
    """(head slice, sequence slice, query heads' scores B×h×R×S float32 before the bias, visible, bias, logits
    or None where they are scores + bias) per block of ``call``."""
    q, k = call.q.detach().to(device), call.k.detach().to(device)
    factor = call.factor.detach().to(device) if isinstance(call.factor, torch.Tensor) else call.factor
    cap = call.squash()
    B, H, T = q.shape[0], q.shape[1], q.shape[-2]
    K, S = k.shape[1], k.shape[-2]
    if H % K:
        from attnscale.errors import ConfigError

        raise ConfigError(f"{H} query heads cannot share {K} key heads evenly; give q as B×H×T×D and k as B×K×S×D")
    G = H // K
    bs, hs, rs = _plan(B, H, G, T, S, memory)
    picked = _pick_rows(T, sample_rows, device, seed)
    n_rows = T if picked is None else len(picked)
    for h0 in range(0, H, hs):
        heads = slice(h0, min(H, h0 + hs))
        kv = k[:, h0 // G:(heads.stop - 1) // G + 1].float()
        for b0 in range(0, B, bs):
            seqs = slice(b0, min(B, b0 + bs))
            for r0 in range(0, n_rows, rs):
                rows = slice(r0, min(T, r0 + rs)) if picked is None else picked[r0:r0 + rs]
                first, last = (rows.start, rows.stop - 1) if picked is None else (int(rows[0]), int(rows[-1]))
                keys = call.key_range(first, last)  # a causal block's later keys are hidden from all its rows
                if keys.stop <= keys.start:  # rows that see no key (a causal call with fewer keys than queries)
                    continue
                qb = q[seqs, heads][:, :, rows].float()
                nb, nh, R = qb.shape[0], qb.shape[1], qb.shape[2]
                kb = kv[seqs][:, :, keys]
                # each kv head serves its G query heads: (b, kv, G·R, D) @ (b, kv, D, S), k never repeated
                raw = (qb.reshape(nb, kv.shape[1], -1, qb.shape[-1]) @ kb.transpose(-2, -1)).view(nb, nh, R, kb.shape[-2])
                scores = raw.mul_(factor)
                if cap is not None:
                    scores = cap(scores)
                visible = call.visible(rows, device, keys, seqs, heads)
                bias = call.bias_rows(rows, device, keys, seqs, heads)
                logits = None
                if call.score_mod is not None:
                    visible, bias, logits = _modded(call, scores, visible, bias, call.indices(rows, device, keys, seqs, heads))
                yield heads, seqs, scores, visible, bias, logits


def _modded(call: AttentionCall, scores: torch.Tensor, visible, bias, index):
    """A block under the call's score_mod: (visible, what was added to the scores, logits). A key the score_mod
    takes to -inf, or ``HIDDEN_AT`` or further below its score, is hidden (and NaN is no logit)."""
    logits = torch.as_tensor(call.score_mod(scores.clone(), *index), dtype=torch.float32, device=scores.device)
    logits = logits.expand_as(scores)
    if bias is not None:
        logits = logits + bias
    added = logits - scores
    shown = added > HIDDEN_AT
    visible = shown if visible is None else visible & shown
    return visible, added, logits


def reduce_call(call: AttentionCall, sums: HeadSums | None = None, *, factor=None, threshold: float = FROZEN_THRESHOLD,
                padding_BT: torch.Tensor | None = None, memory: int = DEFAULT_MEMORY, sample_rows: int | None = None,
                seed: int = 0) -> HeadSums:
    """Every head measure of ``call`` folded into ``sums`` (new ones on the call's device, the CPU for MPS,
    if None), in blocks of at most ``memory`` bytes. ``factor`` replaces the call's own (a what-if);
    ``padding_BT`` (True = a real token) takes padding out of the rows and keys where its length is the
    batch's; ``sample_rows``: measure that many query rows of each sequence, drawn with ``seed``."""
    if factor is not None:
        import dataclasses

        call = dataclasses.replace(call, scale=factor)
    call = with_padding(call, padding_BT)
    if sums is None:
        sums = HeadSums(call.heads, threshold, call.q.device)
    with torch.no_grad():
        sink = None if call.sink is None else call.sink.detach().to(sums.device).float().flatten()
        for heads, _, scores, visible, bias, logits in _blocks(call, memory, sums.device, sample_rows, seed):
            block = (scores, _keep(visible, scores), bias, True, logits, None if sink is None else sink[heads])
            if heads == slice(0, sums.heads):
                sums.add_block(*block)
            else:  # a group of heads: their own sums, written back into theirs
                part = HeadSums(heads.stop - heads.start, sums.threshold, sums.device)
                part.data.copy_(sums.data[:, heads])
                part.add_block(*block)
                sums.data[:, heads] = part.data
    return sums


def _keep(visible: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=scores.device) if visible is None else visible


def with_padding(call: AttentionCall, padding_BT: torch.Tensor | None) -> AttentionCall:
    """``call`` with the batch's padding (B×T, True = a real token) hidden as rows and as keys, where its
    length is the call's (a call of another length, e.g. a cross-attention, keeps its own mask)."""
    if padding_BT is None:
        return call
    import dataclasses

    pad = padding_BT.to(call.q.device).bool()
    T, S = call.q.shape[-2], call.k.shape[-2]
    if pad.shape[0] != call.q.shape[0] or pad.shape[1] not in (T, S):
        return call
    hide = torch.zeros(pad.shape[0], 1, T, S, dtype=torch.bool, device=pad.device)
    if pad.shape[1] == T:
        hide |= ~pad[:, None, :, None]
    if pad.shape[1] == S:
        hide |= ~pad[:, None, None, :]
    mask = call.mask
    if mask is None:
        mask = ~hide
    elif mask.dtype == torch.bool:
        mask = mask.to(pad.device) & ~hide
    else:  # additive: the padding is a fill
        mask = mask.to(pad.device).masked_fill(hide, -math.inf)
    return dataclasses.replace(call, mask=mask)


def reduce_scores(scores_BHTT: torch.Tensor, sums: HeadSums | None = None, *, threshold: float = FROZEN_THRESHOLD,
                  memory: int = DEFAULT_MEMORY) -> HeadSums:
    """Scores a model computed itself (hidden keys -inf, the weights their softmax) folded into ``sums``,
    a block of rows at a time: training's step measures, on the step's own forward."""
    if sums is None:
        sums = HeadSums(scores_BHTT.shape[1], threshold, scores_BHTT.device)
    x = scores_BHTT.detach().to(sums.device)
    B, H, T, S = x.shape
    bs, _, rs = _plan(B, H, 1, T, S, memory)
    with torch.no_grad():
        for b0 in range(0, B, bs):
            for r0 in range(0, T, rs):
                block = x[b0:b0 + bs, :, r0:r0 + rs].float()
                sums.add_block(block, torch.isfinite(block))
    return sums


def head_max(call: AttentionCall, memory: int = DEFAULT_MEMORY) -> torch.Tensor:
    """Per head, the largest |cap(q·kᵀ × factor)| over the visible keys, biases left out: (H,) float32 on the
    call's device, in blocks of at most ``memory`` bytes. QK-Clip's S_max, from every training step."""
    out = torch.zeros(call.heads, device=call.q.device)
    with torch.no_grad():
        for heads, _, scores, visible, _, _ in _blocks(call, memory, call.q.device):
            kept = scores.abs_() if visible is None else scores.abs_().masked_fill_(~visible, 0.0)
            out[heads] = torch.maximum(out[heads], kept.amax((0, 2, 3)))
    return out


def dense(call: AttentionCall, factor=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole call at once, for callers who want the tensors themselves (O(T·S) memory): the logits
    (score plus bias, or the score_mod's output, hidden keys -inf) and the weights, B×H×T×S float32 (under a
    sink, a row's weights sum to 1 less the sink's)."""
    from attnscale.core.attention import masked_softmax

    H, K = call.heads, call.kv_heads
    q, k = call.q.detach().float(), call.k.detach().float().repeat_interleave(H // K, dim=1)
    f = call.factor if factor is None else factor
    scores = (q @ k.transpose(-2, -1)) * (f.detach() if isinstance(f, torch.Tensor) else f)
    cap = call.squash()
    scores = cap(scores) if cap is not None else scores
    bias = call.bias_rows(device=scores.device)
    visible = call.visible(device=scores.device)
    if call.score_mod is not None:
        visible, _, scores = _modded(call, scores, visible, bias, call.indices(device=scores.device))
    elif bias is not None:
        scores = scores + bias
    visible = torch.ones_like(scores, dtype=torch.bool) if visible is None else visible.expand_as(scores)
    scores = scores.masked_fill(~visible, float("-inf"))
    if call.sink is None:
        return scores, masked_softmax(scores, visible)
    sink = call.sink.detach().float().to(scores.device).view(1, H, 1, 1).expand(*scores.shape[:-1], 1)
    return scores, (scores - torch.cat([scores, sink], -1).logsumexp(-1, keepdim=True)).exp()
