"""Which heads of one attention call are sink heads and which previous-token heads (``core/head_kinds.py``'s rule),
read from the call's weights a block of rows at a time, as ``reduce.py`` reads its measures.

The watch reads them once, on its first probe (the baseline record's ``kinds``): a trained model's heads with
the fewest effective words are among them (on SmolLM2-135M every head under 2 words), and the page marks them so
that a reader can tell them from a collapse.
"""

from __future__ import annotations

import torch

from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import DEFAULT_MEMORY, _blocks, with_padding
from attnscale.core.head_kinds import kind_sums

__all__ = ["call_kinds"]


def call_kinds(call: AttentionCall, padding_BT: torch.Tensor | None = None, memory: int = DEFAULT_MEMORY,
               device: torch.device | str | None = None) -> torch.Tensor:
    """3 × H float64 on ``device`` (the call's where None): per query head, the sums over the rows that see two
    keys or more of the weight on the first key each row sees and on the key before its own token, and the
    count of those rows (``core.head_kinds.kind_sums``; ``kinds_of`` reads them). The weights are the model's:
    the call's scale, cap, score_mod, bias, mask and sink; padding (B×T, True = a real token) is neither a row
    nor a key."""
    call = with_padding(call, padding_BT)
    device = call.q.device if device is None else torch.device(device)
    T, S = call.q.shape[-2], call.k.shape[-2]
    offset = call.diagonal if call.is_causal else S - T  # query row i is key i + offset
    out = torch.zeros(3, call.heads, dtype=torch.float64, device=device)
    sink = None if call.sink is None else call.sink.detach().float().flatten().to(device)
    with torch.no_grad():
        for heads, _, scores, visible, bias, logits, rows, keys in _blocks(call, memory, device, where=True):
            z = logits if logits is not None else scores if bias is None else scores + bias
            seen = torch.ones_like(z, dtype=torch.bool) if visible is None else visible.expand_as(z)
            z = z.masked_fill(~seen, -torch.inf)
            if sink is None:
                lse = z.logsumexp(-1, keepdim=True)
            else:  # one more entry of every row's softmax that is no key
                extra = sink[heads].view(1, -1, 1, 1).expand(*z.shape[:-1], 1)
                lse = torch.cat([z, extra], -1).logsumexp(-1, keepdim=True)
            weights = (z - lse).exp().nan_to_num_(0.0)  # a row that sees no key: no weight (never counted)
            index = (torch.arange(rows.start, rows.stop, device=device) if isinstance(rows, slice)
                     else rows.to(device))
            out[:, heads] += kind_sums(weights, seen, index, keys.start, offset).to(device)
    return out
