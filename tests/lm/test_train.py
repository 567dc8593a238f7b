import json
import math

import pytest
import torch

from attnscale.lm.data import Corpus, batches
from reference import head_summary
from attnscale.errors import ConfigError
from attnscale.core.hooks import hooked
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.train import DIAGNOSTICS, TrainConfig, lr_at, train


def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4), **kw})


def tcfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(steps=6, batch=4, lr=1e-2, warmup=2, record_every=3, eval_batches=2, threads=1), **kw})


def test_lr_warms_up_linearly_then_decays_to_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55)
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_same_seed_same_numbers_other_seed_other_numbers(corpus):
    a = train(mcfg(), tcfg(), corpus)
    b = train(mcfg(), tcfg(), corpus)
    c = train(mcfg(), tcfg(seed=1), corpus)
    def numbers(res):  # everything but wall-clock time
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]], res["perplexity"]

    assert numbers(a) == numbers(b)
    assert a["history"][0]["loss"] != c["history"][0]["loss"]


def test_step0_record_is_the_fresh_model_on_the_first_batch(corpus):
    """Recording at step 0 happens on the training step's own forward, before any update."""
    res = train(mcfg(), tcfg(), corpus)
    torch.manual_seed(0)
    model = TinyLM(mcfg())
    x_BT, _ = batches(corpus.train, 4, 8, torch.Generator().manual_seed(0))
    with hooked(model, "blocks.1.attn.hook_*") as cache:
        model(x_BT)
    want = head_summary(cache["blocks.1.attn.hook_scores"], cache["blocks.1.attn.hook_pattern"])
    assert res["history"][0]["spread"][1] == pytest.approx(want["spread"])
    assert res["history"][0]["effective_words"][1] == pytest.approx(want["effective_words"])


def _fp32_recipe(model_cfg: ModelConfig, cfg: TrainConfig, corpus) -> tuple[list[float], list[float]]:
    """fp32 training written out with torch alone: AdamW (decay on matrices, torch's fused kernel, for the
    same bits), gradients set to None before each backward and clipped tensor by tensor by
    ``clip_grad_norm_``; (losses, gradient norms before clipping)."""
    torch.manual_seed(cfg.seed)
    model = TinyLM(model_cfg)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)
    gen, losses, norms = torch.Generator().manual_seed(cfg.seed), [], []
    for step in range(cfg.steps):
        x, y = batches(corpus.train, cfg.batch, model_cfg.context, gen)
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x, y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        opt.step()
        losses.append(loss.item())
    return losses, norms


@pytest.mark.parametrize("lr, clip", [(1e-2, 1.0), (3e-3, 0.05)])
def test_fp32_training_is_adamw_with_clipping_written_out(corpus, lr, clip):
    """The gradients live in one flat tensor and are clipped there; the recipe clips them one by one."""
    cfg = tcfg(lr=lr, clip=clip, steps=8)
    seen = []
    res = train(mcfg(), cfg, corpus, on_step=lambda step, steps, info: seen.append(info))
    want_losses, want_norms = _fp32_recipe(mcfg(), cfg, corpus)
    assert res["status"] == "done"
    assert [i["loss"] for i in seen] == pytest.approx(want_losses, rel=1e-6)
    assert [i["grad_norm"] for i in seen] == pytest.approx(want_norms, rel=1e-5)
    assert any(n > clip for n in want_norms)  # clipping acted on some step


@pytest.mark.parametrize("max_norm", [0.1, 1e6])
def test_one_flat_clip_is_torchs_clip_grad_norm(max_norm):
    from attnscale.lm.precision import clip_, flat_grads

    torch.manual_seed(0)
    model, again = TinyLM(mcfg()), TinyLM(mcfg())
    flat = flat_grads(model)
    for p, q in zip(model.parameters(), again.parameters()):
        p.grad.copy_(torch.randn_like(p))
        q.grad = p.grad.clone()
    norm = clip_(flat, max_norm)
    want = torch.nn.utils.clip_grad_norm_(again.parameters(), max_norm)
    assert float(norm) == pytest.approx(float(want), rel=1e-6)
    for p, q in zip(model.parameters(), again.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
    assert all(p.grad.data_ptr() >= flat.data_ptr() for p in model.parameters())


def test_the_flat_gradients_stay_the_gradients_through_steps(corpus):
    """Autograd adds into a gradient that is there, so each parameter's .grad stays its view into the one
    buffer, and what a step leaves there is that step's gradient alone (zeroed before each backward)."""
    from attnscale.lm import train as T

    run = T.build_run(mcfg(), tcfg(), None)
    views = [p.grad for p in run.model.parameters()]
    for step in range(3):
        T.train_step(run, step, corpus)
    assert all(p.grad is v for p, v in zip(run.model.parameters(), views))
    assert sum(v.numel() for v in views) == run.grads.numel() and float(run.grads.abs().sum()) > 0


def test_bf16_trains_and_records(corpus):
    res = train(mcfg(impl="explicit"), tcfg(dtype="bf16"), corpus)
    assert res["status"] == "done" and math.isfinite(res["valid_loss"])
    assert res["end"]["spread"] > 0


def test_auto_dtype_follows_the_cpu(corpus, monkeypatch):
    from attnscale.core import device as dev

    monkeypatch.setattr(dev, "native_bf16", lambda: False)
    cpu = torch.device("cpu")
    assert dev.resolve_precision("auto", cpu).name == "fp32" and dev.resolve_precision("bf16", cpu).name == "bf16"
    assert train(mcfg(), tcfg(steps=1, dtype="auto"), corpus)["dtype"] == "fp32"
    monkeypatch.setattr(dev, "native_bf16", lambda: True)
    assert train(mcfg(), tcfg(steps=1, dtype="auto"), corpus)["dtype"] == "bf16"


def test_threads_are_restored(corpus):
    before = torch.get_num_threads()
    train(mcfg(), tcfg(steps=1, threads=1), corpus)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "kw, words",
    [({"steps": 0}, "steps"), ({"batch": 0}, "batch"), ({"lr": -1.0}, "lr"),
     ({"dtype": "fp64"}, "bf16"), ({"device": "gpu"}, "device"), ({"attention": "flash"}, "attention"), ({"eval_batches": 0}, "eval_batches"), ({"frozen_threshold": 1.5}, "frozen")],
)
def test_bad_train_config_raises(kw, words):
    with pytest.raises(ConfigError, match=words):
        tcfg(**kw)


def test_corpus_too_small_for_vocab_or_context_raises(corpus):
    with pytest.raises(ConfigError, match="vocab_size"):
        train(mcfg(vocab_size=3), tcfg(), corpus)
    with pytest.raises(ConfigError, match="context"):
        train(mcfg(context=8), tcfg(), Corpus("t", "char", V, corpus.train[:8], corpus.valid, "0" * 64))


def _without_time(res):
    return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in res["history"]]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_deferred_recording_reads_the_device_once_per_step_and_gives_the_same_numbers(corpus, monkeypatch, dtype):
    """On MPS (no float64) each layer's scores and weights wait on the device and travel to the
    CPU with the step's scalars in one transfer, instead of two per layer. Simulated here by
    deferring the CPU itself: the numbers are the same, and ``.cpu()`` runs once per recorded step."""
    from attnscale.lm import step_measures

    cfg, model_cfg = tcfg(record_every=2, dtype=dtype), mcfg(impl="explicit")
    want = train(model_cfg, cfg, corpus)
    calls = [0]
    original = torch.Tensor.cpu

    def counted(self, *a, **k):
        calls[0] += 1
        return original(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(step_measures, "DEFERRED", ("cpu",))
        m.setattr(torch.Tensor, "cpu", counted)
        got = train(model_cfg, cfg, corpus)
    assert _without_time(got) == _without_time(want)
    assert calls[0] == len(got["history"])  # steps 0, 2, 4 and the trained model: one transfer each
