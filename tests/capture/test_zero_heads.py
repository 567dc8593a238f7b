"""A call of no head, query or key: one ConfigError naming the call and its shapes, where a division by zero deep in
the reduction was (ZeroDivisionError: integer modulo by zero)."""

import pytest
import torch
import torch.nn.functional as F

from attnscale.capture.call import AttentionCall
from attnscale.capture.probe import measure_heads
from attnscale.errors import ConfigError


class NoHeads(torch.nn.Module):
    """An SDPA call with H = 0: q, k and v of shape B×0×T×D (a head count of zero in a config, or a split that
    left this rank none)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = self.proj(x).new_zeros(x.shape[0], 0, x.shape[1], 8)
        return F.scaled_dot_product_attention(q, q, q)


def test_a_probe_of_a_call_of_zero_heads_is_a_config_error_naming_its_shapes():
    with pytest.raises(ConfigError, match=r"^the attention call .* has 0 query and 0 key heads \(q \(2, 0, 5, 8\), k "
                                          r"\(2, 0, 5, 8\)\): a call is measured with one head or more of each"):
        measure_heads(NoHeads(), torch.randn(2, 5, 8))


@pytest.mark.parametrize("hq, hk", [(0, 1), (2, 0)])
def test_a_call_with_no_query_or_no_key_head_is_refused_when_it_is_made(hq, hk):
    with pytest.raises(ConfigError, match=f"has {hq} query and {hk} key heads"):
        AttentionCall(torch.zeros(1, hq, 4, 8), torch.zeros(1, hk, 4, 8), name="layers.0")
