"""PyTorch's own attention: ``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers built on it, read at
``F.multi_head_attention_forward``.

Every one of them computes its attention in that one function (the layers call their ``self_attn`` and
``multihead_attn``, each an ``nn.MultiheadAttention``), so the SDPA interception (``sdpa.py``) reads its
arguments there, before the function's own SDPA call, which it leaves unread. Under the interception's
TorchFunctionMode torch takes none of its fast paths (``torch._native_multi_head_attention``, the encoder
layer's fused kernel, the encoder's nested tensors: each is skipped where a mode is active), so a model in eval
mode without gradients, which would take them, is measured through the same function, on the same weights.

The call, as the function computes it (``mha_call``): q = x W_qᵀ + b_q and k = x W_kᵀ + b_k, from the packed
``in_proj_weight`` (the first and second thirds) or from ``q_proj_weight`` and ``k_proj_weight`` where
``kdim``/``vdim`` differ from ``embed_dim``; ``num_heads`` heads of ``embed_dim // num_heads``, scale
1/sqrt(head_dim); ``bias_k`` and ``add_zero_attn`` as one more key each, ``static_k`` in place of k. The masks
merged as torch merges them: ``attn_mask`` (boolean True = hidden, or additive float; 2-D or per sequence and
head) plus ``key_padding_mask`` (True or -inf = a padded key), an additive mask whose -inf hides a key (any
other value is a bias, ``call.py``); where torch drops a causal ``attn_mask`` for SDPA's ``is_causal``, so does
the call. In self-attention (query and key the same tensor) a padded token is no query row either, as the
probe treats the padding of a batch.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from attnscale.capture.call import AttentionCall

__all__ = ["mha_call"]

_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def _projections(p: dict, E: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(W_q, b_q, W_k, b_k) as the function takes them: the packed weight's first two thirds, or the separate ones."""
    bias = p["in_proj_bias"]
    b_q, b_k = (None, None) if bias is None else (bias[:E], bias[E:2 * E])
    if p["use_separate_proj_weight"]:
        return p["q_proj_weight"], b_q, p["k_proj_weight"], b_k
    weight = p["in_proj_weight"]
    return weight[:E], b_q, weight[E:2 * E], b_k


def mha_call(*args, name: str = "", module=None, **kwargs) -> AttentionCall:
    """An ``F.multi_head_attention_forward`` call's arguments, read as the function reads them (see the
    module's docstring), as an ``AttentionCall``: q B×H×T×D, k B×H×S×D, the merged mask B×H×T×S or broadcastable."""
    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    p = bound.arguments
    query, key, H = p["query"], p["key"], int(p["num_heads"])
    padding, attn_mask, is_causal = p["key_padding_mask"], p["attn_mask"], bool(p["is_causal"])
    self_attention = query is key
    if query.dim() == 2:  # unbatched: one sequence
        query, key = query.unsqueeze(1), key.unsqueeze(1)
        padding = None if padding is None else padding.unsqueeze(0)
    T, B, E = query.shape
    D = E // H
    padded_BT = None if padding is None else (padding if padding.dtype == torch.bool else padding == float("-inf"))
    padding = F._canonical_mask(mask=padding, mask_name="key_padding_mask", other_type=F._none_or_dtype(attn_mask),
                                other_name="attn_mask", target_type=query.dtype)
    if is_causal and padding is None and not p["need_weights"]:
        attn_mask = None  # torch hands SDPA is_causal instead of the mask
    else:
        is_causal = False
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
    w_q, b_q, w_k, b_k = _projections(p, E)
    q = F.linear(query, w_q, b_q)
    k = F.linear(key, w_k, b_k)
    extra = 0  # keys appended after the sequence's own: bias_k, the zero key
    if p["bias_k"] is not None:
        k = torch.cat([k, p["bias_k"].repeat(1, B, 1)])
        extra += 1
    q_BHTD = q.view(T, B, H, D).permute(1, 2, 0, 3)
    if p["static_k"] is not None:
        k_BHSD = p["static_k"].view(B, H, -1, D)
    else:
        k_BHSD = k.view(k.shape[0], B, H, D).permute(1, 2, 0, 3)
    if p["add_zero_attn"]:
        k_BHSD = torch.cat([k_BHSD, k_BHSD.new_zeros(B, H, 1, D)], dim=2)
        extra += 1
    mask = None
    if attn_mask is not None:
        mask = attn_mask[None, None] if attn_mask.dim() == 2 else attn_mask.view(B, H, T, -1)
        mask = F.pad(mask, (0, extra)) if extra else mask
    if padding is not None:
        padding = F.pad(padding, (0, extra)) if extra else padding
        padding = padding.view(B, 1, 1, -1)
        mask = padding if mask is None else mask + padding
    mask_mod = None
    if self_attention and padded_BT is not None and padded_BT.shape[-1] == T:
        real_BT = ~padded_BT.to(q_BHTD.device)

        def mask_mod(b, h, q_idx, kv_idx):
            return real_BT[b, q_idx]

    return AttentionCall(q_BHTD, k_BHSD, mask=mask, is_causal=is_causal, mask_mod=mask_mod, name=name, module=module)
