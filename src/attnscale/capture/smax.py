"""Each head's largest |score| over the visible keys (QK-Clip's S_max), exact, in O(T) memory.

``head_max`` runs on every attention call of every training step under QK-Clip.
Where the call's mask is its causal/window structure and a key padding mask,
each block of query rows is one float32 product (``reduce.cut_blocks``): the
hidden rows and keys of q and k set to 0, the structure cut off in place, the
factor and soft-cap (monotone in |q·k|) put on the H maxima. Any other call
takes the general blocks of ``reduce``.

On a CPU with bfloat16 arithmetic (AMX or AVX512-BF16), a long call is
screened first (``screened``): the blocks are made in bfloat16, about twice as
fast as float32 there, and each row's approximate largest |score| is read from
them. The error of a bfloat16 score is bounded, per row, by

    eps_i = C · (‖q_i‖ + t) · (max_j ‖k_j‖ + t),   C = 3u + 2⁻¹² + 4·D·2⁻²⁴,   u = 2⁻⁸,

(q and k each rounded to 8 significant bits, the products exact in float32, D
float32 additions, the result rounded to bfloat16 once; the 2⁻¹² and ``t``
take up the second-order terms, the rounding of eps itself and values below
bfloat16's normal range). With a_i the row's approximate largest |score|, no
row can hold the head's largest unless a_i + eps_i >= max_r (a_r - eps_r), so
only those rows (0.1% of them on random q and k, 0.8% on a freshly initialised
model's call at T = 8,192, ``docs/watch-measured.md``) are made again in float32, and the
number is the float32 one. Where the screen would not pay (a NaN or inf in q
or k, a non-finite approximate score, or a quarter of the rows or more left
in), the float32 blocks run over every row. Either way every visible score is had: the method
is ``exact``, never a bound. The screen runs on the CPU only, whose bfloat16
products (oneDNN) accumulate in float32; a GPU's may reduce in bfloat16, which
the bound does not cover.
"""

from __future__ import annotations

import functools
import math

import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import (DEFAULT_MEMORY, KEPT_BYTES, _block_scores, _buffer, _head_max_blocks, cut,
                                      cut_blocks, tiled, with_padding)
from attnscale.capture.rows import few_key_rows, left_out, seen_keys
from attnscale.capture.sums import largest_abs as _largest_abs
from attnscale.core.device import native_bf16

__all__ = ["SCREEN_FROM", "approximate_rows", "float32_max", "head_max", "screened"]

# The smallest call (query rows × keys × query heads × sequences) screened in bfloat16 first: below it the
# screen's extra operations cost about what its cheaper product saves (benchmarks/smax_screen.py, 8 heads of 64,
# 2 threads of the AMX Xeon: screen/float32 0.8-1.4 at T = 1,024 to 3,072, 0.84-0.85 at 4,096, 0.53 at 8,192)
SCREEN_FROM = 1 << 27
# None: screen where the CPU has bfloat16 arithmetic (``bf16_arithmetic``); True/False: always, never.
SCREEN: bool | None = None
U = 2.0 ** -8  # bfloat16's unit roundoff (8 significant bits, round to nearest)
TINY = 2.0 ** -50  # ``t`` above: what eps adds for values under bfloat16's normal range (and never NaN)
LEFT_IN_AT_MOST = 0.25  # the share of rows the screen may leave to float32 before every row is made in float32


# whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), read once
bf16_arithmetic = functools.cache(native_bf16)


def _screen(q: torch.Tensor, k: torch.Tensor) -> bool:
    if q.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    B, H, T, _ = q.shape
    if B * H * T * k.shape[-2] < SCREEN_FROM:
        return False
    return bf16_arithmetic() if SCREEN is None else SCREEN


def head_max(call: AttentionCall, memory: int = DEFAULT_MEMORY, padding_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Per head, the largest |cap(q·kᵀ × factor)| over the visible keys, biases left out: (H,) float32 on the
    call's device, in blocks of at most ``memory`` bytes, without autograd; ``padding_BT`` (True = a real
    token) hides padded rows and keys as ``with_padding`` does. QK-Clip's S_max, from every training step.

    Where the call's mask is its causal/window structure and a key padding mask (SDPA's, flash-attn's, attnscale's
    own models), a block of query rows is one product with the hidden rows and keys of q and k set to 0 and the
    structure cut off by ``tril_``/``triu_`` in place, screened in bfloat16 first where that pays (see the
    module); the factor (one number a head) and the soft-cap, both monotone in |q·k|, are applied to the H
    maxima (rounding is monotone too, so the number is the one every score would give). Any other call (a mask
    with rows, a mask_mod, a custom cap) takes the general blocks."""
    with torch.no_grad():
        plain = tiled(call, padding_BT)
        if plain is None:
            return _head_max_blocks(with_padding(call, padding_BT), memory)
        q, k, factor, cap = plain
        few = few_key_rows(call, *seen_keys(call, padding_BT))
        out = screened(call, q, k, memory, few) if _screen(q, k) else None
        if out is None:
            out = float32_max(call, q, k, memory, few)
        out = out.mul_(factor)
        return out if cap is None else cap(out)


def float32_max(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, memory: int = DEFAULT_MEMORY,
                few: slice | torch.Tensor | None | bool = True) -> torch.Tensor:
    """Each head's largest |q·kᵀ| (H,) float32 over every block in float32, ``q`` and ``k`` as ``tiled`` gives them,
    over the rows that see two keys (``few``: the rows that see fewer, ``rows.few_key_rows``; True: the call's
    structure's)."""
    B, H, T, _ = q.shape
    K, S = k.shape[1], k.shape[-2]
    few = few_key_rows(call, None, None) if few is True else few
    if B * H * T * S * 4 <= min(memory, KEPT_BYTES) and call.key_range(0, T - 1) == slice(0, S):
        # the whole call in one product, as QK-Clip meets it at every step of a short context: the same
        # arithmetic as ``cut_blocks``' one block, without its slicing and bookkeeping (a dozen small operations)
        buffer = _buffer(B * H * T * S, q.device)
        if q.is_contiguous() and k.is_contiguous():  # cut_blocks' one block, its kᵀ read as k's own transpose
            return _largest_abs(left_out(_block_scores(call, q, k.mT, 0, 0, buffer), few), (0, 2, 3))
        # q and k as a model hands them over (B×T×H×D underneath): one product a head, each reading its strided
        # rows as they are, where one product for all would first copy q and k
        s = buffer[:B * H * T * S].view(H, B, T, S)
        keys = k.mT.unbind(1)
        for h, (q_h, s_h) in enumerate(zip(q.unbind(1), s.unbind(0))):
            torch.bmm(q_h, keys[h * K // H], out=s_h)
        return _largest_abs(left_out(cut(call, s, 0, 0), few, heads_first=True), (1, 2, 3))
    out = torch.zeros(H, device=q.device)
    for heads, seqs, r0, _, s in cut_blocks(call, q, k, memory):
        mine = few if not torch.is_tensor(few) else few[seqs if few.shape[0] > 1 else slice(None),
                                                          heads if few.shape[1] > 1 else slice(None)]
        out[heads] = torch.maximum(out[heads], _largest_abs(left_out(s, mine, r0), (0, 2, 3)))
    return out


def screened(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, memory: int = DEFAULT_MEMORY,
             few: slice | torch.Tensor | None | bool = True) -> torch.Tensor | None:
    """Each head's largest |q·kᵀ| (H,) float32 over the rows that see two keys (``few`` as ``float32_max``
    takes it), with ``q`` and ``k`` as ``tiled`` gives them (float32, hidden rows and keys 0): the bfloat16
    screen, then the rows it leaves in made again in float32. None where the screen does not pay (a NaN or inf
    in q or k, a non-finite approximate score, or ``LEFT_IN_AT_MOST`` of the rows or more left in)."""
    approx, eps = approximate_rows(call, q, k, memory)
    few = few_key_rows(call, None, None) if few is True else few
    ok = torch.ones(q.shape[:3], dtype=torch.bool, device=q.device)  # rows that see one key: left out
    left_out(ok[..., None], few)
    # a NaN or inf in q or k makes a norm, hence a bound, non-finite (even in a row that sees no key, which the
    # bound would then say nothing of); a score past bfloat16's range makes an approximate max inf: float32 says
    if not (bool(torch.isfinite(approx).all()) and bool(torch.isfinite(eps).all())):
        return None
    B, H, T, _ = q.shape
    K = k.shape[1]
    G = H // K
    floor = (approx - eps).masked_fill_(~ok, -math.inf).amax(dim=(0, 2))  # H: no head's largest |score| is below it
    left = (ok & (approx + eps >= floor[None, :, None])).nonzero()  # (b, h, t) of the rows that may hold it
    if left.shape[0] >= LEFT_IN_AT_MOST * B * H * T:
        return None
    out = torch.zeros(H, device=q.device)
    groups = left[:, 0] * K + left[:, 1] // G  # each row's (sequence, key head)
    for g in torch.unique(groups).tolist():
        rows = left[groups == g]
        heads, ts = rows[:, 1], rows[:, 2]
        _rows_max(call, q[g // K, heads, ts], k[g // K, g % K], heads, ts, out, memory)
    return out


def approximate_rows(call: AttentionCall, q: torch.Tensor, k: torch.Tensor,
                     memory: int = DEFAULT_MEMORY) -> tuple[torch.Tensor, torch.Tensor]:
    """(approx, eps), both B×H×T float32: each row's largest |q·kᵀ| over its visible keys from bfloat16 q and k
    (0 for a row that sees no key), and the bound on its error (see the module). ``q`` and ``k`` as ``tiled``
    gives them."""
    B, H, T, D = q.shape
    G = H // k.shape[1]
    bits = torch.zeros(B, H, T, dtype=torch.int16, device=q.device)
    as_bf16 = dict(dtype=torch.bfloat16, memory_format=torch.contiguous_format)
    for heads, seqs, r0, _, s in cut_blocks(call, q.to(**as_bf16), k.to(**as_bf16), memory):
        # |x| of a bfloat16 is its bits less the sign, and the order of those bits (as int16) is the order of |x|
        # (NaN above inf): one pass for the largest |x| of each row, in place in the block's buffer
        bits[seqs, heads, r0:r0 + s.shape[2]] = s.view(torch.int16).bitwise_and_(0x7FFF).amax(-1)
    C = 3 * U + 2.0 ** -12 + 4 * D * 2.0 ** -24
    q_norm = torch.linalg.vector_norm(q, dim=-1)  # B×H×T
    k_norm = torch.linalg.vector_norm(k, dim=-1).amax(-1).repeat_interleave(G, dim=1)  # B×H, hidden keys 0
    return bits.view(torch.bfloat16).float(), C * (q_norm + TINY) * (k_norm[:, :, None] + TINY)


def _rows_max(call: AttentionCall, q_nD: torch.Tensor, k_SD: torch.Tensor, heads: torch.Tensor, ts: torch.Tensor,
              out: torch.Tensor, memory: int) -> None:
    """The rows ``q_nD`` (query heads ``heads``, rows ``ts``) over the keys they see, in float32: each row's
    largest |score| into ``out`` (H,) by head, in chunks of rows under ``memory`` bytes."""
    S = k_SD.shape[0]
    chunk = max(1, memory // max(1, 8 * S))
    j = torch.arange(S, device=k_SD.device)
    for c0 in range(0, q_nD.shape[0], chunk):
        qc, hc, tc = q_nD[c0:c0 + chunk], heads[c0:c0 + chunk], ts[c0:c0 + chunk]
        keys = call.key_range(int(tc.min()), int(tc.max()))
        if keys.stop <= keys.start:  # rows that see no key (left in by their norm alone)
            continue
        s = qc @ k_SD[keys].mT  # n × S' float32
        first = tc[:, None] + call.diagonal  # key j is seen from row i where j <= i + diagonal
        jj = j[keys][None, :]
        hidden = torch.zeros_like(s, dtype=torch.bool)
        if call.is_causal:
            hidden |= jj > first
        if call.window is not None:
            hidden |= jj < first - call.window + 1
        row = s.abs_().masked_fill_(hidden, 0.0).amax(-1)
        out.scatter_reduce_(0, hc, row, reduce="amax")
