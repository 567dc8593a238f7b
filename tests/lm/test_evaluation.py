"""lm.evaluation: the held-out loss, computed here batch by batch, its float64 sum, and its perplexity's edge."""

import math

import pytest
import torch

from attnscale.lm.evaluation import evaluate, finite, sum_dtype, threads
from attnscale.lm.model import ModelConfig, TinyLM
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4), **kw})


def test_held_out_loss_is_the_float64_token_weighted_mean_over_all_batches(corpus):
    torch.manual_seed(0)
    model = TinyLM(mcfg())
    ids = corpus.valid[:8 * 7 + 4]  # 7 full windows of 8 (batches of 3, 3, 1), then a (1, 3) remainder
    res = evaluate(model, ids, batch=3, max_batches=None)
    sums, n = [], 0
    with torch.no_grad():
        for lo, hi in ((0, 3), (3, 6), (6, 7)):
            x = ids[lo * 8: hi * 8].view(-1, 8)
            y = ids[lo * 8 + 1: hi * 8 + 1].view(-1, 8)
            sums.append(torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum"))
            n += y.numel()
        x, y = ids[56:59][None], ids[57:60][None]
        sums.append(torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum"))
        n += 3
    assert res["eval_tokens"] == n == 59
    expected = sum(float(s) for s in sums) / n  # float32 batch sums added in float64
    assert res["valid_loss"] == pytest.approx(expected, rel=1e-13, abs=0)
    assert res["perplexity"] == pytest.approx(math.exp(expected), rel=1e-12)


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float64), ("cuda:0", torch.float64), ("mps", torch.float32)])
def test_the_held_out_sum_is_float64_but_float32_on_mps(device, dtype):
    assert sum_dtype(torch.device(device)) is dtype  # a device object needs no such device present


class _FixedLogits(torch.nn.Module):
    """A stand-in model: token 1's logit 0, token 0's at ``gap``, the rest far below, so every
    target 1 has cross-entropy ``gap`` exactly in float32."""

    def __init__(self, gap: float):
        super().__init__()
        self.cfg, self.gap, self.w = mcfg(), gap, torch.nn.Parameter(torch.zeros(()))

    def forward(self, x_BT):
        logits = torch.full((*x_BT.shape, V), -1e4)
        logits[..., 0], logits[..., 1] = self.gap, 0.0
        return logits


@pytest.mark.parametrize("gap, perplexity", [(700.0, math.inf), (699.0, math.exp(699.0))])
def test_perplexity_is_infinite_from_a_loss_of_700(gap, perplexity):
    ids = torch.ones(19, dtype=torch.long)  # every target is token 1: two windows of 8, then a (1, 2) remainder
    res = evaluate(_FixedLogits(gap), ids, batch=2, max_batches=None)
    assert res["valid_loss"] == gap and res["eval_tokens"] == 18
    assert res["perplexity"] == perplexity


@pytest.mark.parametrize("x, want", [(1.5, 1.5), (3, 3.0), (float("nan"), None), (float("inf"), None),
                                     (-float("inf"), None), (None, None), ("1.5", None)])
def test_finite_keeps_only_what_json_can_hold(x, want):
    assert finite(x) == want


def test_threads_sets_and_restores_the_count():
    before = torch.get_num_threads()
    with threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), threads(1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with threads(None):
        assert torch.get_num_threads() == before
