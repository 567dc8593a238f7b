"""lm/train's knobs for Wortsman et al. 2023's recipe (the warn study): z-loss against the sum written
out in float64, independent weight decay against AdamW's update written out step by step, the defaults
that leave the loop as it was, and bad values."""

import copy

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.lm import train as tr
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.data import batches
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.train import TrainConfig
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def mcfg() -> ModelConfig:
    return ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=1, n_heads=2, head_dim=4)


def test_z_loss_is_the_mean_squared_log_normaliser_added_to_the_cross_entropy():
    torch.manual_seed(0)
    net = TinyLM(mcfg())
    with torch.no_grad():
        net.head.weight.mul_(20)  # log Z well away from log V, so the term is not a constant
    x = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(2))
    loss, objective = tr.loss_and_objective(net, x, y, 1e-2)
    logits = net(x).double().flatten(0, 1).tolist()
    total_ce, total_z = 0.0, 0.0
    for row, target in zip(logits, y.flatten().tolist()):
        top = max(row)
        log_z = top + torch.tensor([v - top for v in row], dtype=torch.float64).exp().sum().log().item()
        total_ce += log_z - row[target]
        total_z += log_z ** 2
    n = len(logits)
    assert loss.item() == pytest.approx(total_ce / n, rel=1e-5)
    assert objective.item() == pytest.approx(total_ce / n + 1e-2 * total_z / n, rel=1e-5)
    assert objective.item() - loss.item() > 1e-3  # the term is there
    plain, same = tr.loss_and_objective(net, x, y, 0.0)
    assert plain is same and plain.item() == pytest.approx(net.loss(x, y).item(), rel=0, abs=0)


def _hand_adamw(model, cfg: TrainConfig, corpus, steps: int) -> dict[str, torch.Tensor]:
    """AdamW written out in float64 (decay first, as torch does), with independent weight decay on the
    matrices: w ← w·(1 − weight_decay · lr_t / lr) − lr_t · m̂ / (sqrt(v̂) + eps). Gradients from autograd on
    the fp32 weights, the same batches as the loop draws."""
    gen = torch.Generator().manual_seed(cfg.seed)
    state = {n: (torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64),
                 p.detach().double().clone()) for n, p in model.named_parameters()}
    for t in range(1, steps + 1):
        lr_t = tr.lr_at(t - 1, cfg)
        x, y = batches(corpus.train, cfg.batch, model.cfg.context, gen)
        model.zero_grad()
        model.loss(x, y).backward()
        for n, p in model.named_parameters():
            m, v, w = state[n]
            g = p.grad.double()
            m.mul_(cfg.beta1).add_((1 - cfg.beta1) * g)
            v.mul_(cfg.beta2).add_((1 - cfg.beta2) * g * g)
            shrink = cfg.weight_decay * lr_t / cfg.lr if p.dim() >= 2 else 0.0
            w.mul_(1 - shrink)
            w.sub_(lr_t * (m / (1 - cfg.beta1 ** t)) / ((v / (1 - cfg.beta2 ** t)).sqrt() + cfg.adam_eps))
            with torch.no_grad():
                p.copy_(w)
    return {n: w for n, (_, _, w) in state.items()}


def test_independent_weight_decay_is_adamw_with_the_decay_not_multiplied_by_the_rate(corpus):
    cfg = TrainConfig(steps=3, batch=4, lr=1e-2, warmup=2, min_lr_ratio=1.0, weight_decay=0.05, clip=1e9,
                      beta1=0.8, beta2=0.95, adam_eps=1e-6, independent_wd=True, record_every=100, threads=1,
                      device="cpu", dtype="fp32", attention="explicit")
    run = tr.build_run(mcfg(), cfg, None)
    start = copy.deepcopy(run.model)
    for step in range(3):
        tr.train_step(run, step, corpus)
    want = _hand_adamw(start, cfg, corpus, 3)
    for n, p in run.model.named_parameters():
        assert torch.allclose(p.detach().double(), want[n], rtol=1e-5, atol=1e-7), n
    # coupled decay would have shrunk the matrices by lr_t · 0.05 (≤ 5e-4) a step, not 0.05 · lr_t/lr (≤ 5e-2):
    # the two differ by far more than the tolerance above
    w = run.model.head.weight.detach().double()
    assert (w - want["head.weight"]).abs().max() < 1e-5 < 1e-2 * want["head.weight"].abs().max()


def test_the_recipes_defaults_change_nothing(corpus):
    cfg = TrainConfig()
    assert (cfg.z_loss, cfg.beta1, cfg.adam_eps, cfg.independent_wd) == (0.0, 0.9, 1e-8, False)
    run = tr.build_run(mcfg(), TrainConfig(device="cpu", threads=1), None)
    group = run.opt.param_groups[0]
    assert group["betas"] == (0.9, 0.99) and group["eps"] == 1e-8 and group["weight_decay"] == 0.1
    # a record written before these fields existed is the same run as one with them at their defaults
    old = {"model": {}, "train": {"steps": 3, "weights": "fp32"}, "corpus": {}}
    new = {"model": {}, "train": {"steps": 3, "weights": "fp32", "z_loss": 0.0, "beta1": 0.9, "adam_eps": 1e-8,
                                  "independent_wd": False}, "corpus": {}}
    assert comparable_config(old) == comparable_config(new)
    assert comparable_config(old) != comparable_config({**new, "train": {**new["train"], "z_loss": 1e-4}})


@pytest.mark.parametrize("kw", [dict(z_loss=-1e-4), dict(beta1=1.0), dict(adam_eps=0.0), dict(independent_wd="yes")])
def test_bad_recipe_values_say_what_is_wrong(kw):
    with pytest.raises(ConfigError, match="train (z_loss|independent_wd)"):
        TrainConfig(**kw)


def test_the_llama_family_refuses_the_knobs_it_would_ignore():
    from attnscale.lm.hf_family import check_train

    check_train(TrainConfig(checkpoint_every=0))  # the defaults pass
    with pytest.raises(ConfigError, match="leave z_loss, independent_wd at the defaults"):
        check_train(TrainConfig(checkpoint_every=0, z_loss=1e-4, independent_wd=True))
