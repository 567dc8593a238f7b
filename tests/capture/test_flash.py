"""capture.flash: flash-attn's flash_attn_func and flash_attn_varlen_func, read as flash-attn documents them.

flash-attn cannot be installed here: a stand-in ``flash_attn`` module with its signatures and semantics,
written with plain torch below, is put in sys.modules for each test; the capture wraps it as it would wrap the
real one. Every measure must equal the materialised reference (1e-5), a packed batch the reference of its
documents each measured alone with their rows pooled, and the model's outputs must not change."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from torch import nn

from attnscale import watch
from attnscale.capture.flash import capture_flash, cu_from_positions, packed
from attnscale.capture.reduce import reduce_call
from modded_reference import assert_close, flash_structure as structure, per_document
from reference import call_measures

H, D = 4, 8
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """The stand-in: flash-attn 2's semantics on B×T×H×D tensors, in plain torch."""
    B, T, Hq, Dq = q.shape
    S, K = k.shape[1], k.shape[2]
    scale = Dq ** -0.5 if softmax_scale is None else softmax_scale
    qh, kh, vh = q.transpose(1, 2), *(x.transpose(1, 2).repeat_interleave(Hq // K, 1) for x in (k, v))
    s = (qh @ kh.transpose(-2, -1)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    seen, distance = structure(T, S, causal, window_size)
    if alibi_slopes is not None:
        slopes = alibi_slopes if alibi_slopes.ndim == 2 else alibi_slopes[None]
        s = s + slopes[:, :, None, None] * distance
    p = torch.softmax(s.masked_fill(~seen, -math.inf), -1).nan_to_num(0.0)
    return (p @ vh).transpose(1, 2)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """The stand-in's varlen form: each document on its own (total tokens × H × D)."""
    out = []
    for d in range(len(cu_seqlens_q) - 1):
        (a, b), (c, e) = cu_seqlens_q[d:d + 2].tolist(), cu_seqlens_k[d:d + 2].tolist()
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.ndim == 1 else alibi_slopes[d:d + 1]
        out.append(flash_attn_func(q[None, a:b], k[None, c:e], v[None, c:e], dropout_p, softmax_scale, causal,
                                   window_size, softcap, slopes)[0])
    return torch.cat(out)


@pytest.fixture
def flash(monkeypatch):
    """The stand-in installed as ``flash_attn`` and ``flash_attn.flash_attn_interface``."""
    interface = types.ModuleType("flash_attn.flash_attn_interface")
    interface.flash_attn_func, interface.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    package = types.ModuleType("flash_attn")
    package.flash_attn_func, package.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    package.flash_attn_interface = interface
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", interface)
    return package


class FlashAttention(nn.Module):
    """An attention layer that calls flash-attn as most training code does: ``import flash_attn`` and B×T×H×D."""

    def __init__(self, d=32, kv_heads=H, **flash_kwargs):
        super().__init__()
        self.kv_heads, self.kw = kv_heads, flash_kwargs
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, 2 * kv_heads * D), nn.Linear(d, d)
        self.seen = None

    def forward(self, x):
        import flash_attn

        B, T, C = x.shape
        q = self.q(x).view(B, T, H, D)
        k, v = self.kv(x).view(B, T, 2, self.kv_heads, D).unbind(2)
        self.seen = (q, k)
        return self.out(flash_attn.flash_attn_func(q, k, v, **self.kw).reshape(B, T, C))


def layer(**kw):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return FlashAttention(**kw).eval()


X = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))

CASES = {
    "causal": dict(causal=True),
    "gqa-window-softcap": dict(kv_heads=2, causal=True, window_size=(3, -1), softcap=1.5, softmax_scale=0.5),
    "two-sided-window-alibi": dict(window_size=(2, 4), alibi_slopes=SLOPES),
    "alibi-per-sequence": dict(causal=True, alibi_slopes=torch.stack([SLOPES, 2 * SLOPES])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_flash_attn_func_measures_as_the_reference_and_keeps_its_outputs(flash, case):
    model = layer(**CASES[case])
    with torch.no_grad():
        want = model(X)
    calls = []
    with capture_flash(model, calls.append), torch.no_grad():
        got = model(X)
    assert torch.equal(got, want) and len(calls) == 1
    kw = CASES[case]
    q, k = (t.transpose(1, 2) for t in model.seen)
    seen, distance = structure(12, 12, kw.get("causal", False), kw.get("window_size", (-1, -1)))
    slopes = kw.get("alibi_slopes")
    bias = None if slopes is None else (slopes if slopes.ndim == 2 else slopes[None])[:, :, None, None] * distance
    cap = (lambda s, c=kw["softcap"]: c * torch.tanh(s / c)) if "softcap" in kw else None
    want = call_measures(q, k, kw.get("softmax_scale", D ** -0.5), seen[None, None], bias, cap)
    for memory in (256 << 20, 1):
        assert_close(reduce_call(calls[0], memory=memory).measures(), want)


def test_bottom_right_causal_with_fewer_queries_than_keys(flash):
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 3, H, D, generator=g), torch.randn(1, 8, H, D, generator=g)
    calls = []
    with capture_flash(None, calls.append):
        flash.flash_attn_interface.flash_attn_func(q, k, k, causal=True)
    seen, _ = structure(3, 8, True, (-1, -1))
    assert seen[0].tolist() == [True] * 6 + [False] * 2  # the first query sees up to key 5 of 8
    assert_close(reduce_call(calls[0]).measures(), call_measures(q.transpose(1, 2), k.transpose(1, 2), D ** -0.5,
                                                                 seen[None, None]))


DOCS = (5, 9, 7)  # three documents packed into one row of 21 tokens


def _packed_qk(seed, K=H):
    g = torch.Generator().manual_seed(seed)
    n = sum(DOCS)
    return torch.randn(n, H, D, generator=g), torch.randn(n, K, D, generator=g), torch.randn(n, K, D, generator=g)


@pytest.mark.parametrize("kw", [dict(), dict(K=2), dict(alibi=True)], ids=["mha", "gqa", "alibi"])
def test_a_packed_varlen_call_equals_its_documents_measured_alone(flash, kw):
    q, k, v = _packed_qk(3, kw.get("K", H))
    cu = torch.tensor([0, 5, 14, 21], dtype=torch.int32)
    slopes = SLOPES if kw.get("alibi") else None
    calls = []
    want_out = flash.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True, alibi_slopes=slopes)
    with capture_flash(None, calls.append):
        out = flash.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True, alibi_slopes=slopes)
    assert torch.equal(out, want_out)
    call = calls[0]
    assert call.q.shape == (1, H, 21, D)
    sums = reduce_call(call, memory=1)
    assert sums.rows.tolist() == [21.0 - 3] * H  # each document's rows once, less its first (one key)
    assert_close(sums.measures(), per_document(q, k, DOCS, slopes=slopes))


def test_the_packed_rule_by_hand():
    cu = torch.tensor([0, 2, 5])
    mask_mod, bias_mod = packed(cu, cu, causal=True, alibi_slopes=torch.tensor([1.0]))
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]).bool()
    assert torch.equal(mask_mod(0, 0, i, j), want)
    assert bias_mod(0, torch.tensor(0), torch.tensor(4), torch.tensor(2)).item() == -2.0
    # queries and keys of other lengths: bottom-right within each document (2 queries over 3 keys, 1 over 2)
    mask_mod, _ = packed(torch.tensor([0, 2, 3]), torch.tensor([0, 3, 5]), causal=True)
    got = mask_mod(0, 0, torch.arange(3)[:, None], torch.arange(5)[None, :]).int().tolist()
    assert got == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]]
    assert cu_from_positions(torch.tensor([[0, 1, 0, 1, 2]])).tolist() == [0, 2, 5]
    assert cu_from_positions(torch.tensor([[3, 4, 5]])) is None  # one document: positions only increase


def test_an_imported_name_is_wrapped_and_everything_is_put_back(flash, monkeypatch):
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "imported", flash.flash_attn_func, raising=False)  # `from flash_attn import ...`
    held = [flash.flash_attn_func]  # in a list: no capture takes it for a holder

    class ByName(nn.Module):
        def forward(self, q, k):
            return here.imported(q, k, k, causal=True)

    q = torch.randn(1, 6, H, D, generator=torch.Generator().manual_seed(4))
    calls = []

    with pytest.raises(KeyError, match="boom"):
        with capture_flash(ByName(), lambda call: (calls.append(call), (_ for _ in ()).throw(KeyError("boom")))):
            assert here.imported is not held[0] and flash.flash_attn_func is not held[0]
            ByName()(q, q)
    assert len(calls) == 1 and calls[0].is_causal
    assert here.imported is flash.flash_attn_func is flash.flash_attn_interface.flash_attn_func is held[0]


def test_auto_reads_flash_calls_and_without_flash_attn_nothing_is_touched(flash, monkeypatch):
    model = layer(causal=True)
    stats = watch.measure_heads(model, X)
    assert stats.layer_names == ("flash_attn call 0",)  # the model itself made it: named by its number
    monkeypatch.delitem(sys.modules, "flash_attn")
    monkeypatch.delitem(sys.modules, "flash_attn.flash_attn_interface")
    with capture_flash(model, lambda call: None):  # a process that never imported flash-attn: nothing to wrap
        pass
