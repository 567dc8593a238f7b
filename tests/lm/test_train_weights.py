"""Training on a bf16 copy of fp32 master weights (``TrainConfig.weights="bf16"``), against the recipe
written out here with torch alone, and what it changes: no casts of weights or activations in the step."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnscale.errors import ConfigError
from attnscale.lm import train as T
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.data import batches
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)
from attnscale.lm.model import ModelConfig, TinyLM



def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4,
                                 impl="explicit"), **kw})


def tcfg(**kw) -> T.TrainConfig:
    return T.TrainConfig(**{**dict(steps=6, batch=4, lr=1e-2, warmup=2, record_every=3, eval_batches=2, threads=1,
                                   dtype="bf16", weights="bf16"), **kw})


def _recipe_losses(model_cfg: ModelConfig, cfg: T.TrainConfig, corpus) -> list[float]:
    """Mixed precision with master weights, by hand: a bf16 model computes the loss and its gradients, the
    fp32 masters take those gradients, are clipped and stepped by AdamW (decay on matrices), and the bf16
    model is set to the masters again. At training's thread count: another one sums in another order, and a
    last fp32 bit can round a weight to the next bf16 number."""
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _recipe(model_cfg, cfg, corpus)
    finally:
        torch.set_num_threads(before)


def _recipe(model_cfg: ModelConfig, cfg: T.TrainConfig, corpus) -> list[float]:
    torch.manual_seed(cfg.seed)
    master = TinyLM(model_cfg)
    bf16 = TinyLM(model_cfg).to(torch.bfloat16)
    bf16.load_state_dict(master.state_dict())
    groups = [{"params": [p for p in master.parameters() if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in master.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)  # training's kernel, for the same bits
    gen, losses = torch.Generator().manual_seed(cfg.seed), []
    for step in range(cfg.steps):
        x, y = batches(corpus.train, cfg.batch, model_cfg.context, gen)
        loss = F.cross_entropy(bf16(x).float().flatten(0, 1), y.flatten())
        bf16.zero_grad()
        loss.backward()
        for m, b in zip(master.parameters(), bf16.parameters()):
            m.grad = b.grad.float()
        torch.nn.utils.clip_grad_norm_(master.parameters(), cfg.clip)
        for g in opt.param_groups:
            g["lr"] = T.lr_at(step, cfg)
        opt.step()
        with torch.no_grad():
            for m, b in zip(master.parameters(), bf16.parameters()):
                b.copy_(m)
        losses.append(loss.item())
    return losses


def _losses(model_cfg, cfg, corpus, **kw) -> tuple[dict, list[float]]:
    seen: list[float] = []
    res = T.train(model_cfg, cfg, corpus, on_step=lambda step, steps, info: seen.append(info["loss"]), **kw)
    return res, seen


@pytest.mark.parametrize("tied", [False, True])
def test_bf16_weights_train_as_the_recipe_written_out(corpus, tied):
    res, losses = _losses(mcfg(tie_embeddings=tied), tcfg(), corpus)
    want = _recipe_losses(mcfg(tie_embeddings=tied), tcfg(), corpus)
    assert res["weights"] == "bf16" and res["dtype"] == "bf16" and res["status"] == "done"
    assert losses == pytest.approx(want, rel=1e-6)
    assert losses[-1] < losses[0]


def test_autocast_and_bf16_weights_are_two_recipes_with_nearly_the_same_losses(corpus):
    auto, a = _losses(mcfg(), tcfg(weights="fp32"), corpus)
    _, b = _losses(mcfg(), tcfg(), corpus)
    assert auto["weights"] == "fp32"
    assert a != b  # not the same computation: the residual stream is bf16 in one of them
    assert b == pytest.approx(a, rel=5e-3)


def test_fp32_training_keeps_its_weights_whatever_weights_says(corpus):
    res, losses = _losses(mcfg(), tcfg(dtype="auto", weights="bf16"), corpus) if not T.dev.native_bf16() else (None, None)
    if res is None:
        pytest.skip("this CPU has native bf16: auto trains in bf16 here")
    _, plain = _losses(mcfg(), tcfg(dtype="fp32", weights="fp32"), corpus)
    assert res["weights"] == "fp32" and res["dtype"] == "fp32" and losses == plain


def test_a_resumed_bf16_weights_run_gives_the_uninterrupted_numbers(corpus, tmp_path):
    whole, want = _losses(mcfg(), tcfg(checkpoint_every=3), corpus)
    ckpt = tmp_path / "ckpt.pt"
    stops = iter([False] * 3 + [True])
    first = T.train(mcfg(), tcfg(checkpoint_every=3), corpus, checkpoint=ckpt, should_stop=lambda: next(stops))
    assert first["status"] == "stopped" and ckpt.exists()
    again, rest = _losses(mcfg(), tcfg(checkpoint_every=3), corpus, checkpoint=ckpt)
    assert again["resumed_from"] == 3 and rest == want[3:]
    assert again["valid_loss"] == whole["valid_loss"]


class _Casts(TorchDispatchMode):
    """The shapes of every cast (``_to_copy``) run inside it."""

    def __init__(self):
        super().__init__()
        self.shapes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.shapes[tuple(args[0].shape)] += 1
        return func(*args, **(kwargs or {}))


def _casts_of_a_plain_step(weights: str, corpus) -> Counter:
    run = T.build_run(mcfg(), tcfg(weights=weights, record_every=100), None)
    T.train_step(run, 1, corpus)  # a step that does not record
    with _Casts() as casts:
        T.train_step(run, 1, corpus)
    return casts.shapes


def test_a_bf16_weights_step_casts_no_weight_and_no_activation(corpus):
    B, T_, C = 4, 8, 16
    weights = {tuple(p.shape) for p in TinyLM(mcfg()).parameters()}
    autocast, copy = _casts_of_a_plain_step("fp32", corpus), _casts_of_a_plain_step("bf16", corpus)
    assert weights & set(autocast) and (B, T_, C) in autocast  # autocast casts both, every step
    assert not weights & set(copy) and (B, T_, C) not in copy
    # what is left: the scores to fp32 for the softmax and its weights back (per layer), the logits for the loss
    assert copy[(B, 2, T_, T_)] == 2 * 2 * 2 and copy[(B, T_, V)] == 2
    assert sum(copy.values()) < sum(autocast.values()) / 3


def test_weights_bf16_needs_a_bf16_precision():
    with pytest.raises(ConfigError, match="weights 'bf16' need dtype bf16"):
        tcfg(dtype="fp32")
    # bf16 and auto are taken, whether or not this CPU has native bf16 (auto resolves at train time)
    assert tcfg(dtype="bf16").weights == tcfg(dtype="auto").weights == "bf16"
    with pytest.raises(ConfigError, match="weights 'fp8'"):
        tcfg(weights="fp8")


def test_a_config_written_before_weights_existed_is_the_same_run():
    new = {"train": {"steps": 5, "weights": "fp32"}}
    assert comparable_config(new) == comparable_config({"train": {"steps": 5}})
    assert comparable_config({"train": {"steps": 5, "weights": "bf16"}}) != comparable_config({"train": {"steps": 5}})


def test_the_masters_are_the_model_a_bf16_weights_run_saves_and_evaluates(corpus, tmp_path):
    from safetensors.torch import load_file

    res = T.train(mcfg(), tcfg(), corpus, weights=tmp_path / "model.safetensors")
    model = TinyLM(mcfg())
    model.load_state_dict(load_file(tmp_path / "model.safetensors"))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    again = T.evaluate(model, corpus.valid, tcfg().batch, tcfg().eval_batches, "bf16")
    assert again["valid_loss"] == pytest.approx(res["valid_loss"], rel=1e-12)
