"""The probe's fused route: every row's effective words from the attention kernel's log-sum-exp.

One fused attention call with the keys as values (V = K) gives each row's
log-sum-exp and o = softmax(s)·K, so its entropy without the weights:

    entropy = lse - E_p[s],   E_p[s] = scale · q·o,   effective words = exp(entropy)

(lse and o in float32 from the kernel, the dot and the difference in float64,
the entropy held within [0, log(visible keys)]; a row whose scores are past what
float32 holds, ``LSE_TOLERANCE``, is replayed). A sink z is one more entry of
the row's softmax: the keys keep the share w = exp(lse - logaddexp(lse, z)) and
their entropy is w · (entropy - log w). The spread and max |score| come from the
one-product blocks QK-Clip's S_max reads (``reduce.cut_blocks``): each row's
scores less the row's mean, summed squared in float32, rows merged in float64
(no digit lost to a large mean). Frozen share, push and max weight lose their
digits on a frozen row when read from a log-sum-exp, so they are replayed
(``reduce_call``) on the sampled rows.

A call takes this route (``measure_call`` says "fused") where rows are sampled
(the replay of every row would give the same numbers and cost more) and the
call is one the kernel computes as it is: its visible keys a causal/window
structure and a key padding mask, one factor per head, no cap, soft-cap, bias,
score_mod or mask_mod, GQA and a sink allowed, on a device with a kernel that
returns its log-sum-exp (SDPA's flash kernel on the CPU, its memory-efficient
kernel on CUDA). Every other call is replayed ("replay").
"""

from __future__ import annotations

import contextlib
import math

import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import DEFAULT_MEMORY, cut, cut_blocks, reduce_call, tiled
from attnscale.capture.rows import counted, counted_top, key_counts, seen_keys
from attnscale.capture.sums import ROW_MEASURES, HeadSums

__all__ = ["FUSED", "REPLAY", "REPLAYED", "lse_attention", "measure_call", "qualifies"]

FUSED, REPLAY = "fused", "replay"
# the row measures the fused route leaves to the replay of the sampled rows
REPLAYED = tuple(m for m in ROW_MEASURES if m != "effective_words")
# A row's entropy read as lse - scale·q·o is off by at most about LSE_ERROR · (r + log n) nats, r = |scale|·‖q_i‖·
# max_j ‖k_j‖ (>= every |score| of the row), n its keys: lse and o are float32 (u = 2⁻²⁴ each, of magnitude r)
# and the kernel rescales o block by block; measured at most 3.7·u·r (tests/capture/test_fused.py), 16·u leaves
# room. A row where that passes LSE_TOLERANCE (r over about 1,000) is replayed: its words exact at any score.
LSE_ERROR = 16 * 2.0 ** -24
LSE_TOLERANCE = 1e-3


def measure_call(call: AttentionCall, sums: HeadSums, *, padding_BT: torch.Tensor | None = None,
                 memory: int = DEFAULT_MEMORY, sample_rows: int | None = None, seed: int = 0) -> str:
    """Every head measure of ``call`` folded into ``sums``, as ``reduce_call`` takes the arguments; "fused"
    where the fused route served it (effective words from every row, spread and max |score| from every score
    (max |score| of the rows that see two keys),
    the other row measures from the ``sample_rows`` rows), "replay" where ``reduce_call`` did all of it."""
    with torch.no_grad():
        sampled = sample_rows is not None and sample_rows < call.q.shape[-2]
        ready = qualifies(call, padding_BT, sums.device) if sampled else None
        words = None if ready is None else _effective_words(call, *ready, memory)
        if words is None:
            reduce_call(call, sums, padding_BT=padding_BT, memory=memory, sample_rows=sample_rows, seed=seed)
            return REPLAY
        _score_measures(call, sums, *ready, memory)
        sums.add_rows("effective_words", *words)
    reduce_call(call, sums, padding_BT=padding_BT, memory=memory, sample_rows=sample_rows, seed=seed, measures=REPLAYED)
    return FUSED


def qualifies(call: AttentionCall, padding_BT: torch.Tensor | None, device: torch.device | None = None) -> tuple | None:
    """(q and k float32 with hidden rows and keys 0, as ``tiled`` gives them, each query head's signed factor
    (H,) float32, which keys the rows may see B'×H'×S boolean or None, which rows are real B×T boolean or None) where the kernel computes ``call`` as it is (see the module's docstring) on
    ``device`` (the sums'; the call's where None), else None."""
    if call.mask_mod is not None or call.score_mod is not None or call.cap is not None or call.softcap:
        return None
    if call.bias is not None or call.bias_mod is not None or call.has_bias():
        return None
    if (device is not None and torch.device(device) != call.q.device) or call.q.device.type not in ("cpu", "cuda"):
        return None
    H, qk = call.heads, tiled(call, padding_BT)
    if qk is None:  # (a mask with rows, or parts of a group of query heads)
        return None
    f = call.factor
    f = (f.detach().float().reshape(-1).to(call.q.device).expand(H) if isinstance(f, torch.Tensor)
         else torch.full((H,), float(f), device=call.q.device))
    return (qk[0], qk[1], f, *seen_keys(call, padding_BT))


def _effective_words(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, factor: torch.Tensor,
                     seen: torch.Tensor | None, rows: torch.Tensor | None,
                     memory: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(each row's effective words B×H×T float64, which rows count: B×H×T boolean) from the fused call, or None
    where the device's kernel refuses it."""
    q = q * factor.view(1, -1, 1, 1)
    B, H, T, D = q.shape
    S = k.shape[-2]
    hide = None if seen is None else torch.zeros(seen.shape, device=q.device).masked_fill_(~seen, -math.inf)[:, :, None]
    if call.window is None and (not call.is_causal or call.diagonal == 0):  # the kernel's own structure
        got = lse_attention(q, k, hide, call.is_causal)
        if got is None:
            return None
        o, lse = got
    else:  # a block of rows at a time, the structure as a mask (R×S' floats a block)
        o, lse = torch.zeros_like(q), torch.zeros(B, H, T, device=q.device)
        step = max(1, memory // (4 * S * (1 if hide is None else hide.shape[0] * hide.shape[1])))
        for r0 in range(0, T, step):
            r1 = min(T, r0 + step)
            keys = call.key_range(r0, r1 - 1)
            if keys.stop <= keys.start:  # rows that see no key: not counted
                continue
            shown = cut(call, torch.ones(r1 - r0, keys.stop - keys.start, device=q.device), r0, keys.start) > 0
            mask = torch.zeros(shown.shape, device=q.device).masked_fill_(~shown, -math.inf)[None, None]
            got = lse_attention(q[:, :, r0:r1], k[:, :, keys], mask if hide is None else mask + hide[..., keys], False)
            if got is None:
                return None
            o[:, :, r0:r1], lse[:, :, r0:r1] = got
    n = key_counts(call, seen, rows).expand(B, H, T)
    entropy = lse.double() - _dots(q, o, memory)
    entropy = torch.minimum(entropy.clamp_min(0.0), n.clamp_min(1).double().log())  # within [0, log n]
    sink = None if call.sink is None else call.sink.detach().to(q.device).double().view(1, H, 1)
    if sink is not None:
        log_share = lse.double() - torch.logaddexp(lse.double(), sink)
        entropy = log_share.exp() * (entropy - log_share)
    rows = counted(n)
    # rows whose scores are past what the float32 lse and o hold (``LSE_ERROR``): replayed exactly
    far = rows & (_entropy_error(q, k, n) > LSE_TOLERANCE)
    if bool(far.any()):
        entropy[far] = _replayed_entropy(call, q, k, seen, sink, far, memory)
    return entropy.exp(), rows


def _entropy_error(q: torch.Tensor, k: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Each row's bound on the error of its entropy read from the float32 lse and o, B×H×T float64 (see
    ``LSE_ERROR``), ``q`` with the factor on it, hidden keys of ``k`` 0."""
    G = q.shape[1] // k.shape[1]
    top = torch.linalg.vector_norm(k, dim=-1).amax(-1).repeat_interleave(G, dim=1)  # B×H: max ‖k_j‖
    reach = torch.linalg.vector_norm(q, dim=-1).double() * top.double()[..., None]  # >= every |score| of the row
    return LSE_ERROR * (reach + n.clamp_min(1).double().log())


def _replayed_entropy(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, seen: torch.Tensor | None,
                      sink: torch.Tensor | None, far: torch.Tensor, memory: int) -> torch.Tensor:
    """The entropy of each row where ``far`` (B×H×T), in ``far.nonzero()``'s order, from its scores made again
    in float32 (``q`` with the factor on it) and its softmax in float64, as the replay reads it: a frozen row
    reads 0 at any score."""
    G, S = q.shape[1] // k.shape[1], k.shape[-2]
    at = far.nonzero()
    out = torch.empty(at.shape[0], dtype=torch.float64, device=q.device)
    j = torch.arange(S, device=q.device)
    chunk = max(1, memory // max(1, 32 * S))
    pair = at[:, 0] * q.shape[1] + at[:, 1]  # (sequence, head) of each row, in ``at``'s order
    for g in torch.unique(pair).tolist():
        b, h = divmod(g, q.shape[1])
        mine = (pair == g).nonzero()[:, 0]
        for c0 in range(0, len(mine), chunk):
            idx = mine[c0:c0 + chunk]
            t = at[idx, 2]
            s = (q[b, h, t] @ k[b, h // G].mT).double()  # float32 products, as the replay's
            i = t[:, None] + call.diagonal
            hidden = (j[None] > i) if call.is_causal else torch.zeros_like(s, dtype=torch.bool)
            if call.window is not None:
                hidden |= j[None] <= i - call.window
            if seen is not None:
                hidden |= ~seen[b if seen.shape[0] > 1 else 0, h if seen.shape[1] > 1 else 0][None]
            s.masked_fill_(hidden, -math.inf)
            whole = s if sink is None else torch.cat([s, sink[0, h].expand(len(t), 1)], -1)
            gap = s - whole.logsumexp(-1, keepdim=True)  # log p of each key
            out[idx] = -torch.where(hidden, 0.0, gap.exp() * gap).sum(-1)
    return out


def _dots(q: torch.Tensor, o: torch.Tensor, memory: int) -> torch.Tensor:
    """Row by row q·o (B×H×T×D each) in float64, B×H×T, a chunk of rows of at most ``memory`` bytes at a time."""
    D = q.shape[-1]
    qf, of = q.reshape(-1, D), o.reshape(-1, D)
    out = torch.empty(qf.shape[0], dtype=torch.float64, device=q.device)
    step = max(1, memory // (16 * D))
    for r0 in range(0, qf.shape[0], step):
        out[r0:r0 + step] = (qf[r0:r0 + step].double() * of[r0:r0 + step].double()).sum(-1)
    return out.view(q.shape[:-1])


def lse_attention(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                  is_causal: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(softmax(q·kᵀ + mask)·k, its log-sum-exp B×H×T) from the device's fused kernel, float32, the scale already
    in ``q`` (``mask``: additive, broadcastable to B×H×T×S; ``is_causal``: key j seen from row i where j <= i);
    None where the device has no such kernel or its kernel refuses the call."""
    kind = q.device.type
    with torch.autocast(kind, enabled=False) if kind in ("cpu", "cuda") else contextlib.nullcontext():
        try:
            if kind == "cpu":
                o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, k, 0.0, is_causal, attn_mask=mask, scale=1.0)
                return o, lse
            if kind == "cuda":  # the memory-efficient kernel: float32, a bias, its log-sum-exp (rows padded to 32)
                H, T = q.shape[1], q.shape[2]
                k = k.repeat_interleave(H // k.shape[1], dim=1) if k.shape[1] != H else k
                bias = None if mask is None else mask.expand(q.shape[0], H, T, k.shape[2])
                o, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q.contiguous(), k.contiguous(), k.contiguous(), bias, True, 0.0, is_causal, scale=1.0)[:2]
                return o, lse[..., :T]
        except (RuntimeError, NotImplementedError):  # the kernel refuses this call: it is replayed
            return None
    return None


def _score_measures(call: AttentionCall, sums: HeadSums, q: torch.Tensor, k: torch.Tensor, factor: torch.Tensor,
                    seen: torch.Tensor | None, rows: torch.Tensor | None, memory: int) -> None:
    """Spread of every visible score and max |score| of the rows that see two keys (``rows.py``) into ``sums``,
    from one product a block (``cut_blocks``): each row's scores less the row's mean in float32 (hidden ones 0),
    squared and summed per row, the rows merged in float64 (Chan et al.), the factor put on the H totals."""
    H = q.shape[1]
    counts = key_counts(call, seen, rows)
    raw = HeadSums(H, sums.threshold, sums.device)
    for heads, seqs, r0, k0, s in cut_blocks(call, q, k, memory):
        R = s.shape[2]
        n = counts[seqs if counts.shape[0] > 1 else slice(None), heads if counts.shape[1] > 1 else slice(None),
                   r0:r0 + R].expand(s.shape[:3]).double()
        top = counted_top(s, n)  # before the mean is taken off; rows that see one key left out
        mu = s.sum(-1).double() / n.clamp_min(1)  # hidden scores are 0 here: the sum is the visible ones'
        s.sub_(mu.float()[..., None])
        cut(call, s, r0, k0)
        if seen is not None:
            shown = seen[seqs if seen.shape[0] > 1 else slice(None), heads if seen.shape[1] > 1 else slice(None)]
            s.masked_fill_(~shown[:, :, None, k0:k0 + s.shape[-1]], 0.0)
        sq = torch.einsum("bhrs,bhrs->bhr", s, s).double()  # Σ (s - mu)² per row: a batched dot, no temporary
        total = n.sum((0, 2))
        mean = (n * mu).sum((0, 2)) / total.clamp_min(1)
        m2 = sq.sum((0, 2)) + (n * (mu - mean[None, :, None]) ** 2).sum((0, 2))
        whole = [torch.zeros(H, dtype=torch.float64, device=sums.device) for _ in range(4)]
        for t, v in zip(whole, (total, mean, m2, top.double())):
            t[heads] = v
        raw.add_moments(*whole)
    f = factor.double().to(sums.device)
    sums.add_moments(raw.entries, raw.mean * f, raw.m2 * f**2, raw.max_abs * f.abs())
