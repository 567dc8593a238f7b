"""The one per-head reduction: an attention call's q and k to every head measure, in O(T) memory.

A call's scores are never held whole. They are made a block of query rows at a
time (of sequences and heads too, where one row of every head is over the
budget), as the model makes them,

    score = cap(q·kᵀ × factor),   logit = score + bias,   hidden keys left out,

in float32 whatever the model runs in, and each block is folded at once into
its layer's ``HeadSums`` (``sums.py``). Under a causal mask a block computes only
the keys its rows can see.

A ``score_mod`` (flex_attention's) is applied to each block's scores for the
weights: the score measures read the score before it, and the bias range is
what it added (its output less the score), with any bias. A key it takes to
-inf, or ``HIDDEN_AT`` or further below its score, is hidden.

The block is sized by ``memory`` (bytes, ``DEFAULT_MEMORY``), at
``BYTES_PER_ENTRY`` per (row, key, head) entry; ``benchmarks/probe_cost.py``
measures the peak. ``sample_rows`` measures a random subset of each sequence's
query rows; the row measures then carry their standard errors.
"""

from __future__ import annotations

import itertools
import math
import threading

import torch

from attnscale.capture.call import HIDDEN_AT, AttentionCall, hidden_keys
from attnscale.capture.sums import HeadSums
from attnscale.core.diagnostics import FROZEN_THRESHOLD, HEAD_MEASURES, MIN_KEYS

__all__ = ["BYTES_PER_ENTRY", "DEFAULT_MEMORY", "cut_blocks", "dense", "reduce_call", "reduce_scores", "tiled", "with_padding"]

DEFAULT_MEMORY = 256 << 20
# Peak bytes of one (row, key, head) entry of a block: fp32 scores and logits, float64 exponentials, temporaries.
BYTES_PER_ENTRY = 40
# head_max's tiled blocks: the fp32 product (one buffer, reused), and room for q and k's copies beside it.
TILED_BYTES_PER_ENTRY = 16


def _plan(B: int, H: int, G: int, T: int, S: int, memory: int, per_entry: int = BYTES_PER_ENTRY) -> tuple[int, int, int]:
    """(sequences, query heads, rows) per block: whole sequences while they fit, else rows of one sequence,
    and groups of query heads (whole GQA groups of ``G``) only where one row of every head is over budget."""
    per_row = max(1, H * S * per_entry)
    if per_row * T <= memory:
        return max(1, min(B, memory // (per_row * T))), H, T
    if per_row <= memory:
        return 1, H, min(T, memory // per_row)
    heads = max(G, (memory // max(1, S * per_entry)) // G * G)
    return 1, min(H, heads), max(1, min(T, memory // max(1, heads * S * per_entry)))


def _pick_rows(T: int, sample_rows: int | None, device, seed: int) -> torch.Tensor | None:
    if sample_rows is None or sample_rows >= T:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(T, generator=g)[:sample_rows].sort().values.to(device)


def _blocks(call: AttentionCall, memory: int, device, sample_rows: int | None = None, seed: int = 0,
            where: bool = False):
    """(head slice, sequence slice, query heads' scores B×h×R×S float32 before the bias, visible, bias, logits
    or None where they are scores + bias) per block of ``call``; ``where``: and the block's query rows (a slice
    or index tensor) and keys (a slice) in the call."""
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
                raw = (qb.reshape(nb, kv.shape[1], -1, qb.shape[-1]) @ kb.mT).view(nb, nh, R, kb.shape[-2])
                scores = raw.mul_(factor)
                if cap is not None:
                    scores = cap(scores)
                visible = call.visible(rows, device, keys, seqs, heads)
                bias = call.bias_rows(rows, device, keys, seqs, heads)
                logits = None
                if call.score_mod is not None:
                    visible, bias, logits = _modded(call, scores, visible, bias, call.indices(rows, device, keys, seqs, heads))
                yield (heads, seqs, scores, visible, bias, logits, *((rows, keys) if where else ()))


def _modded(call: AttentionCall, scores: torch.Tensor, visible, bias, index):
    """A block under the call's score_mod: (visible, what was added to the scores, logits). A key the score_mod
    takes to -inf, or ``HIDDEN_AT`` or further below its score, is hidden (a NaN logit is not: it reads NaN)."""
    logits = torch.as_tensor(call.score_mod(scores.clone(), *index), dtype=torch.float32, device=scores.device)
    logits = logits.expand_as(scores)
    if bias is not None:
        logits = logits + bias
    added = logits - scores
    shown = ~(added <= HIDDEN_AT)
    visible = shown if visible is None else visible & shown
    return visible, added, logits


def reduce_call(call: AttentionCall, sums: HeadSums | None = None, *, factor=None, threshold: float = FROZEN_THRESHOLD,
                padding_BT: torch.Tensor | None = None, memory: int = DEFAULT_MEMORY, sample_rows: int | None = None,
                seed: int = 0, measures: tuple[str, ...] = HEAD_MEASURES) -> HeadSums:
    """Every head measure of ``call`` folded into ``sums`` (new ones on the call's device, the CPU for MPS,
    if None), in blocks of at most ``memory`` bytes. ``factor`` replaces the call's own (a what-if);
    ``padding_BT`` (True = a real token) takes padding out of the rows and keys where its length is the
    batch's; ``sample_rows``: measure that many query rows of each sequence, drawn with ``seed``; ``measures``:
    those of ``HEAD_MEASURES`` to add (``fused.py`` adds the rest from the fused call)."""
    if factor is not None:
        import dataclasses

        call = dataclasses.replace(call, scale=factor)
    call = with_padding(call, padding_BT)
    if sums is None:
        sums = HeadSums(call.heads, threshold, call.q.device)
    with torch.no_grad():
        sink = None if call.sink is None else call.sink.detach().to(sums.device).float().flatten()
        for heads, _, scores, visible, bias, logits in _blocks(call, memory, sums.device, sample_rows, seed):
            # the block's heads (all, or a group) add to their own sums, written back into theirs: a copy of
            # a few numbers a head, beside the block's scores
            part = HeadSums(heads.stop - heads.start, sums.threshold, sums.device)
            part.data.copy_(sums.data[:, heads])
            part.add_block(scores, _keep(visible, scores), bias, True, logits, None if sink is None else sink[heads],
                           measures)
            sums.data[:, heads] = part.data
    return sums


def _keep(visible: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=scores.device) if visible is None else visible


def with_padding(call: AttentionCall, padding_BT: torch.Tensor | None) -> AttentionCall:
    """``call`` with the batch's padding (B×T, True = a real token) hidden as rows and as keys, where its
    length is the call's (a call of another length, e.g. a cross-attention, keeps its own mask). The padding
    joins the call's ``mask_mod``, read a block of rows at a time like every mask: no B×T×S mask is made."""
    if padding_BT is None:
        return call
    import dataclasses

    pad = padding_BT.to(call.q.device).bool()
    T, S = call.q.shape[-2], call.k.shape[-2]
    if pad.shape[0] != call.q.shape[0] or pad.shape[1] not in (T, S):
        return call
    rows, keys, before = pad.shape[1] == T, pad.shape[1] == S, call.mask_mod

    def real(b, h, q_idx, kv_idx):
        seen = torch.ones((), dtype=torch.bool, device=pad.device)
        if rows:
            seen = seen & pad[b, q_idx]
        if keys:
            seen = seen & pad[b, kv_idx]
        return seen if before is None else seen & before(b, h, q_idx, kv_idx).bool()

    return dataclasses.replace(call, mask_mod=real)


def reduce_scores(scores_BHTT: torch.Tensor, sums: HeadSums | None = None, *, threshold: float = FROZEN_THRESHOLD,
                  memory: int = DEFAULT_MEMORY) -> HeadSums:
    """Scores a model computed itself (hidden keys -inf in every head, ``hidden_keys``; the weights their
    softmax) folded into ``sums``, a block of rows at a time: training's step measures, on the step's own forward."""
    if sums is None:
        sums = HeadSums(scores_BHTT.shape[1], threshold, scores_BHTT.device)
    x = scores_BHTT.detach().to(sums.device)
    B, H, T, S = x.shape
    bs, _, rs = _plan(B, H, 1, T, S, memory)
    with torch.no_grad():
        for b0 in range(0, B, bs):
            for r0 in range(0, T, rs):
                block = x[b0:b0 + bs, :, r0:r0 + rs].float()
                sums.add_block(block, ~hidden_keys(block))  # a NaN or inf score is no hidden key
    return sums


def _plain_factor(call: AttentionCall, H: int) -> torch.Tensor | float | None:
    """|factor|, one number or one per query head (H,) float32, where the factor is one number per head (a
    float, or a tensor of one entry or of one per head), else None."""
    f = call.factor
    if not isinstance(f, torch.Tensor):
        return abs(float(f))
    f = f.detach().float()
    if f.numel() == 1:
        return f.abs().reshape(1).expand(H).to(call.q.device)
    shape = ([1] * (4 - f.ndim) + list(f.shape)) if f.ndim <= 4 else None
    if shape is None or shape[0] != 1 or shape[2] != 1 or shape[3] != 1 or shape[1] != H:
        return None
    return f.abs().reshape(H).to(call.q.device)


def _key_mask(call: AttentionCall, H: int, K: int) -> torch.Tensor | None | bool:
    """The call's mask as which keys each key head's rows see (B'×K'×S×1 boolean, B' and K' 1 or whole),
    where it holds no row dim (a key padding mask), None where there is no mask, False where it has rows or
    parts of a group of query heads."""
    if call.mask is None:
        return None
    m = call.mask
    while m.ndim < 4:
        m = m[None]
    if m.shape[2] != 1 or not (m.shape[1] == 1 or m.shape[1] == H == K):
        return False
    seen = m if m.dtype == torch.bool else ~(m <= HIDDEN_AT)  # NaN: a visible key, as ``AttentionCall.visible`` reads it
    return seen[:, :, 0, :, None]


def tiled(call: AttentionCall, padding_BT: torch.Tensor | None) -> tuple | None:
    """(q, k, |factor| per head, cap) with every hidden row of q and hidden key of k set to 0, for a call whose
    visible keys are its causal/window structure alone once those rows and keys are out, else None."""
    if call.mask_mod is not None or call.score_mod is not None or call.cap is not None:
        return None
    B, H, T, S, K = call.q.shape[0], call.heads, call.q.shape[-2], call.k.shape[-2], call.kv_heads
    factor, keys = _plain_factor(call, H), _key_mask(call, H, K)
    if factor is None or keys is False or H % K:
        return None
    q, k = call.q.float(), call.k.float()  # (run under no_grad)
    if keys is not None:  # a hidden key scores 0 (where, never a product: 0·inf is NaN)
        k = torch.where(keys.to(k.device), k, 0.0)
    if padding_BT is not None:
        pad = padding_BT.to(q.device).bool()
        if pad.shape[0] == B and pad.shape[1] == T:
            q = torch.where(pad[:, None, :, None], q, 0.0)
        if pad.shape[0] == B and pad.shape[1] == S:
            k = torch.where(pad[:, None, :, None], k, 0.0)
    return q, k, factor, call.squash()


# Each thread's last small head_max buffer, by device: the calls of every training step reuse it, where a fresh
# one (over malloc's mmap threshold) page-faults its way in at each call.
_KEPT = threading.local()
KEPT_BYTES = 16 << 20


def _buffer(entries: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A buffer of at least ``entries`` of ``dtype`` (float32 or a narrower one): this thread's kept float32 one
    (viewed as ``dtype``) where it is at most ``KEPT_BYTES`` (never inside a compiled graph, where reading the
    kept one would be a guard that fails at the next step)."""
    per = 4 // dtype.itemsize  # entries of dtype a float32 holds
    words = -(-entries // per)
    if words * 4 > KEPT_BYTES or torch.compiler.is_compiling():
        return torch.empty(words, device=device).view(dtype)
    kept = getattr(_KEPT, "buffers", None)
    if kept is None:
        kept = _KEPT.buffers = {}
    buffer = kept.get(device)
    if buffer is None or buffer.numel() < words:
        buffer = kept[device] = torch.empty(words, device=device)
    return buffer.view(dtype)


def cut_blocks(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, memory: int = DEFAULT_MEMORY):
    """(query heads, sequences, first row, first key, q·kᵀ of the block B'×h×R×S' in q's dtype) per block of ``call``'s
    q and k as ``tiled`` gives them (hidden rows and keys 0): one product into a buffer reused for every block, the keys
    the rows cannot see left out and the causal/window part of the rest cut to 0 in place. The view is
    overwritten by the next block."""
    B, H, T, _ = q.shape
    G, S = H // k.shape[1], k.shape[-2]
    # blocks no larger than the kept buffer: a fresh one page-faults its way in at every call
    kept = KEPT_BYTES // q.element_size() * TILED_BYTES_PER_ENTRY
    if q.dtype == torch.float32:
        bs, hs, rs = _plan(B, H, G, T, S, min(memory, kept), TILED_BYTES_PER_ENTRY)
    else:  # one sequence and one key head's group a block: one 2-D product each (``_block_scores``), of many rows
        _, _, rs = _plan(1, G, G, T, S, min(memory, kept), TILED_BYTES_PER_ENTRY)
        bs, hs = 1, G
    buffer = _buffer(bs * hs * rs * S, q.device, q.dtype)  # one buffer for every block: no page faults
    # kᵀ laid out once (B×K×D×S): a block's keys are then a slice the product reads as it is, where k's own
    # transpose was copied into a contiguous kᵀ inside every block's product
    k_t = k.transpose(-1, -2).contiguous()
    for h0, b0, r0 in itertools.product(range(0, H, hs), range(0, B, bs), range(0, T, rs)):
        heads, seqs = slice(h0, min(H, h0 + hs)), slice(b0, min(B, b0 + bs))
        keys = call.key_range(r0, min(T, r0 + rs) - 1)
        if keys.stop > keys.start:  # else rows that see no key
            kb_t = k_t[seqs, h0 // G:(heads.stop - 1) // G + 1, :, keys]
            yield heads, seqs, r0, keys.start, _block_scores(call, q[seqs, heads, r0:r0 + rs], kb_t, r0, keys.start,
                                                             buffer)


def _block_scores(call: AttentionCall, qb: torch.Tensor, kb_t: torch.Tensor, r0: int, k0: int,
                  buffer: torch.Tensor) -> torch.Tensor:
    """q·k of the block's rows from row ``r0`` on (``qb``, hidden rows 0) over its keys from key ``k0`` on
    (``kb_t``, their kᵀ, hidden keys 0), in ``buffer``, the causal/window part cut to 0."""
    nb, nh, R, D = qb.shape
    shape = (nb, kb_t.shape[1], nh // kb_t.shape[1] * R, kb_t.shape[-1])
    s = buffer[:math.prod(shape)].view(shape)
    q3 = qb.reshape(*shape[:3], D)  # each key head's G query heads in one product
    if qb.dtype == torch.float32:
        torch.matmul(q3, kb_t, out=s)
    else:  # a batched bfloat16 product copies the strided kᵀ slice first (oneDNN); one head at a time reads it as it is
        for b, h in itertools.product(range(shape[0]), range(shape[1])):
            torch.mm(q3[b, h], kb_t[b, h], out=s[b, h])
    return cut(call, s.view(nb, nh, R, shape[-1]), r0, k0)


def cut(call: AttentionCall, s: torch.Tensor, r0: int, k0: int) -> torch.Tensor:
    """``s`` (rows from ``r0``, keys from ``k0``) with what the causal/window structure hides set to 0, in place."""
    first = r0 + call.diagonal - k0  # the block's key j is seen from its row i where j <= i + first
    if call.is_causal:
        s.tril_(first)
    if call.window is not None:
        s.triu_(first - call.window + 1)
    return s


def _head_max_blocks(call: AttentionCall, memory: int) -> torch.Tensor:
    out = torch.zeros(call.heads, device=call.q.device)
    with torch.no_grad():
        for heads, _, scores, visible, _, _ in _blocks(call, memory, call.q.device):
            kept = scores.abs_() if visible is None else scores.abs_().masked_fill_(~visible, 0.0)
            few = (scores.shape[-1] if visible is None else visible.sum(-1)) < MIN_KEYS  # a row of one key: out
            top = kept.amax(-1).masked_fill_(torch.as_tensor(few, device=kept.device), 0.0).amax((0, 2))
            out[heads] = torch.maximum(out[heads], top)
    return out


def dense(call: AttentionCall, factor=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole call at once, for callers who want the tensors themselves (O(T·S) memory): the logits
    (score plus bias, or the score_mod's output, hidden keys -inf) and the weights, B×H×T×S float32 (under a
    sink, a row's weights sum to 1 less the sink's)."""
    from attnscale.core.attention import masked_softmax

    H, K = call.heads, call.kv_heads
    q, k = call.q.detach().float(), call.k.detach().float().repeat_interleave(H // K, dim=1)
    f = call.factor if factor is None else factor
    scores = (q @ k.mT) * (f.detach() if isinstance(f, torch.Tensor) else f)
    cap = call.squash()
    scores = cap(scores) if cap is not None else scores
    bias = call.bias_rows(device=scores.device)
    visible = call.visible(device=scores.device)
    if call.score_mod is not None:
        visible, _, scores = _modded(call, scores, visible, bias, call.indices(device=scores.device))
    elif bias is not None:
        scores = scores + bias
    visible = torch.ones_like(scores, dtype=torch.bool) if visible is None else visible.expand_as(scores)
    scores = scores.masked_fill(~visible, -math.inf)
    if call.sink is None:
        return scores, masked_softmax(scores, visible)
    sink = call.sink.detach().float().to(scores.device).view(1, H, 1, 1).expand(*scores.shape[:-1], 1)
    return scores, (scores - torch.cat([scores, sink], -1).logsumexp(-1, keepdim=True)).exp()
