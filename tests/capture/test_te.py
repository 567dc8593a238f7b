"""capture.te: Transformer Engine's max_logit read from its DotProductAttention's output, with q and k in its
qkv_format, on a stand-in with TE's names (``test_qk_clip_kernels.DotProductAttention``)."""

import pytest
import torch
from torch import nn

from attnscale.capture.te import _te_call, capture_te_max, te_modules
from attnscale.errors import ConfigError
from test_qk_clip_kernels import DotProductAttention


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.core = DotProductAttention(2, 4, return_max_logit=True)
        self.plain = DotProductAttention(2, 4)  # built without return_max_logit: left alone

    def forward(self, q, k, v, **kw):
        self.plain(q, k, v)
        return self.core(q, k, v, **kw)


def test_the_hook_hands_the_call_and_the_max_logit_the_model_gets():
    model = Holder()
    q, k = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)  # B×H×T×D
    got = []
    assert [n for n, _ in te_modules(model)] == ["core"]
    with capture_te_max(model, lambda call, m: got.append((call, m))) as hooked:
        out = model(q.permute(2, 0, 1, 3), k.permute(2, 0, 1, 3), q.permute(2, 0, 1, 3))  # TE's default sbhd
    assert hooked == 1 and len(got) == 1
    call, max_H = got[0]
    torch.testing.assert_close(call.q, q)
    torch.testing.assert_close(call.k, k)
    assert call.scale == 0.5 and call.name == "core" and call.module is model.core and torch.equal(max_H, out[1])
    assert not model.core._forward_hooks and not model.plain._forward_hooks


@pytest.mark.parametrize("layout", ["sbhd", "bshd", "thd"])
def test_each_qkv_format_reads_q_and_k_heads_first(layout):
    B = 1 if layout == "thd" else 3
    q, k = torch.randn(B, 2, 5, 4), torch.randn(B, 2, 5, 4)
    to = {"sbhd": lambda x: x.permute(2, 0, 1, 3), "bshd": lambda x: x.transpose(1, 2), "thd": lambda x: x[0].transpose(0, 1)}
    module = DotProductAttention(2, 4, qkv_format=layout)
    for kwargs in ({"qkv_format": layout}, {}):  # the call's own, else the module's
        call = _te_call(module, "core", (to[layout](q), to[layout](k)), kwargs)
        torch.testing.assert_close(call.q, q)
        torch.testing.assert_close(call.k, k)


def test_a_bias_in_the_max_logit_is_refused_by_name_and_the_hooks_go_on_exit():
    model = Holder()
    x = torch.randn(5, 1, 2, 4)
    with pytest.raises(ConfigError, match="'core'.*bias"):
        with capture_te_max(model, lambda call, m: None):
            model(x, x, x, core_attention_bias_type="post_scale_bias")
    assert not model.core._forward_hooks
    with capture_te_max(nn.Linear(2, 2), lambda call, m: None) as hooked:  # no Transformer Engine: nothing
        assert hooked == 0
