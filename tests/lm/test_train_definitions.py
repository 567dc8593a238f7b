"""lm.train's pieces from their definitions, where tests/lm/test_train.py checks them only through a run:
the AdamW groups (weight decay on matrices only), the clip's factor max_norm / (norm + 1e-6) at its
edges, the schedule ``lr_at`` at its corners, the bf16 copy of the master weights, and evaluation's batch
limit and training mode."""

import math

import pytest
import torch

from attnscale.lm import precision as P
from attnscale.lm import train as T
from attnscale.lm.model import ModelConfig, TinyLM
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4), **kw})


@pytest.mark.parametrize("scale, tied", [("learned_temp", False), ("qk_norm", True)])
def test_weight_decay_falls_on_the_matrices_alone(scale, tied):
    """Embeddings, projections and the read-out decay; biases, LayerNorm gains, qk-norm gains and a learned
    temperature (a 0-dim parameter) do not."""
    cfg = T.TrainConfig(weight_decay=0.25, lr=2e-3, beta2=0.95, device="cpu", threads=1)
    run = T.build_run(mcfg(scale=scale, tie_embeddings=tied), cfg, None)
    names = {id(p): n for n, p in run.model.named_parameters()}
    decay, rest = run.opt.param_groups
    assert decay["weight_decay"] == 0.25 and rest["weight_decay"] == 0.0
    matrices = {n for n, p in run.model.named_parameters() if len(p.shape) >= 2}
    assert {names[id(p)] for p in decay["params"]} == matrices
    assert {names[id(p)] for p in rest["params"]} == {n for n, _ in run.model.named_parameters()} - matrices
    assert any(n.endswith(("log_factor", "q_gain")) for n in {names[id(p)] for p in rest["params"]})
    assert "tok_emb.weight" in matrices and ("head.weight" in matrices) != tied  # a tied read-out counted once
    for group in (decay, rest):
        assert group["lr"] == 2e-3 and group["betas"] == (0.9, 0.95)
    assert sum(p.numel() for g in (decay, rest) for p in g["params"]) == run.model.num_params()


def test_the_clip_scales_by_max_norm_over_the_norm_plus_a_millionth():
    grads = torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)
    norm = P.clip_(grads, 1.0)
    assert float(norm) == 5.0
    assert grads.tolist() == pytest.approx([3 / (5 + 1e-6), 4 / (5 + 1e-6), 0.0], rel=1e-15)


def test_the_clip_leaves_gradients_under_the_norm_and_zero_gradients_alone():
    grads = torch.tensor([0.3, -0.4], dtype=torch.float64)
    assert float(P.clip_(grads, 0.5)) == pytest.approx(0.5, rel=1e-15)
    f = 0.5 / (0.5 + 1e-6)  # at exactly max_norm the factor is below 1 by a hair, as torch's
    assert grads.tolist() == pytest.approx([0.3 * f, -0.4 * f], rel=1e-15) and f < 1
    grads = torch.tensor([0.3, -0.4], dtype=torch.float64)
    P.clip_(grads, 0.6)
    assert grads.tolist() == [0.3, -0.4]  # under max_norm: the factor is clamped at 1
    zero = torch.zeros(4)
    assert float(P.clip_(zero, 1.0)) == 0.0 and zero.tolist() == [0.0] * 4  # no 0 / 0


def _lr_by_hand(step, steps, lr, warmup, ratio):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * ratio + (lr - lr * ratio) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("steps, warmup, ratio", [(10, 0, 0.1), (10, 10, 0.1), (10, 9, 0.0), (7, 3, 1.0), (1, 0, 0.5)])
def test_the_schedule_at_its_corners(steps, warmup, ratio):
    cfg = T.TrainConfig(steps=steps, warmup=warmup, lr=0.4, min_lr_ratio=ratio)
    for step in range(steps + 3):
        assert T.lr_at(step, cfg) == pytest.approx(_lr_by_hand(step, steps, 0.4, warmup, ratio), rel=1e-12, abs=1e-15)
    assert T.lr_at(warmup, cfg) == pytest.approx(0.4, rel=1e-12)  # the peak, the first step after warm-up
    assert T.lr_at(steps + 2, cfg) == pytest.approx(0.4 * ratio, abs=1e-15)  # past the end: the floor


def test_the_schedule_is_half_way_down_at_half_the_decay():
    cfg = T.TrainConfig(steps=20, warmup=4, lr=1.0, min_lr_ratio=0.2)
    assert T.lr_at(0, cfg) == 0.25 and T.lr_at(3, cfg) == 1.0
    assert T.lr_at(12, cfg) == pytest.approx(0.6, rel=1e-12)  # progress 1/2: cos = 0, half-way from 1 to 0.2
    assert T.lr_at(8, cfg) == pytest.approx(0.2 + 0.8 * (1 + math.cos(math.pi / 4)) / 2, rel=1e-12)


def test_the_bf16_copy_is_the_masters_cast_and_hands_its_gradients_back_in_fp32():
    torch.manual_seed(0)
    master = TinyLM(mcfg())
    grads = P.flat_grads(master)
    copy = P.Bf16Copy(master, grads)
    for m, c in zip(master.parameters(), copy.model.parameters()):
        assert c.dtype == torch.bfloat16 and torch.equal(c, m.detach().to(torch.bfloat16))
    with torch.no_grad():
        for m in master.parameters():  # an update of the masters, in place, as the optimiser makes it
            m.add_(0.01 * torch.randn_like(m))
    copy.refresh()
    for m, c in zip(master.parameters(), copy.model.parameters()):
        assert torch.equal(c, m.detach().to(torch.bfloat16))
    g = torch.Generator().manual_seed(1)
    want = [torch.randn(c.shape, generator=g).to(torch.bfloat16) for c in copy.model.parameters()]
    for c, w in zip(copy.model.parameters(), want):
        c.grad.copy_(w)
    copy.gradients_to_masters()
    for m, c, w in zip(master.parameters(), copy.model.parameters(), want):
        assert m.grad.dtype == torch.float32 and torch.equal(m.grad, w.float())
        assert torch.equal(c.grad, torch.zeros_like(c.grad))


def test_evaluation_stops_after_max_batches_and_leaves_the_mode_as_it_found_it(corpus):
    torch.manual_seed(0)
    model = TinyLM(mcfg())
    ids = corpus.valid[: 8 * 9 + 1]  # 9 full windows of 8, no remainder
    with torch.no_grad():
        x, y = ids[:-1].view(9, 8), ids[1:].view(9, 8)
        losses = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").double()
    for max_batches, windows in ((1, 2), (2, 4), (5, 9), (None, 9)):
        for training in (True, False):
            model.train(training)
            res = T.evaluate(model, ids, batch=2, max_batches=max_batches)
            assert model.training is training
            assert res["eval_tokens"] == 8 * windows
            assert res["valid_loss"] == pytest.approx(float(losses[: 8 * windows].mean()), rel=1e-6)


def test_finite_numbers_pass_and_the_rest_become_none():
    assert [T.finite(x) for x in (1, 2.5, 0, -3.0)] == [1.0, 2.5, 0.0, -3.0]
    assert [T.finite(x) for x in (None, math.nan, math.inf, -math.inf, "1")] == [None] * 5
