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


def _wsd_by_hand(step, steps, lr, warmup, ratio):
    if step < warmup:
        return lr * (step + 1) / warmup
    stable = math.floor(0.8 * steps)
    if step <= stable:
        return lr
    return lr - (lr - lr * ratio) * min(1.0, (step - stable) / (steps - stable))


@pytest.mark.parametrize("steps, warmup, ratio", [(10, 0, 0.1), (10, 8, 0.1), (5, 0, 0.0), (1, 0, 0.5), (7, 3, 1.0)])
def test_wsd_at_its_corners(steps, warmup, ratio):
    """Held at lr to step floor(0.8 steps), then down in a straight line to the floor, reached at step ``steps``
    and kept after it (5 steps: held to step 4, the floor at 5; 1 step: no hold, the floor at 1)."""
    cfg = T.TrainConfig(steps=steps, warmup=warmup, lr=0.4, min_lr_ratio=ratio, schedule="wsd")
    for step in range(steps + 3):
        assert T.lr_at(step, cfg) == pytest.approx(_wsd_by_hand(step, steps, 0.4, warmup, ratio), rel=1e-12, abs=1e-15)
    assert T.lr_at(steps, cfg) == pytest.approx(0.4 * ratio, abs=1e-15)
    assert T.lr_at(steps + 2, cfg) == pytest.approx(0.4 * ratio, abs=1e-15)


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


# ---- the loop's own steps: the held-out loss along the way, the trained model's row, divergence, resuming --------


def _held_out_by_hand(model, ids, batch, batches, context, dtype):
    """Token-weighted mean cross-entropy over the first ``batches`` held-out batches, the forward autocast to
    ``dtype`` on the CPU, the sum in float64: evaluation written out with torch alone."""
    total, tokens = 0.0, 0
    starts = list(range(0, len(ids) - context - 1, context))  # consecutive windows, as eval_batches cuts them
    windows = [(ids[s:s + context], ids[s + 1:s + context + 1]) for s in starts]
    for i in range(0, min(len(windows), batch * batches), batch):
        x = torch.stack([w[0] for w in windows[i:i + batch]])
        y = torch.stack([w[1] for w in windows[i:i + batch]])
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            logits = model(x)
        total += torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="sum").item()
        tokens += y.numel()
    return total / tokens


def test_the_held_out_loss_on_the_way_is_its_batches_of_those_weights_in_the_runs_precision(corpus, tmp_path):
    """A bf16 run that evaluates at step 2 of 4 on 2 batches: the weights after 2 steps are those a 2-step run
    ends with (a constant rate), evaluated on the first 2 held-out batches under bf16 autocast."""
    from safetensors.torch import load_file

    cfg = T.TrainConfig(steps=4, batch=4, lr=1e-2, warmup=0, min_lr_ratio=1.0, record_every=4, eval_batches=2,
                        eval_every=2, dtype="bf16", device="cpu", threads=1)
    got = T.train(mcfg(), cfg, corpus)
    T.train(mcfg(), T.TrainConfig(**{**cfg.__dict__, "steps": 2, "eval_every": 0}), corpus,
            weights=tmp_path / "w.safetensors")
    model = TinyLM(mcfg())
    model.load_state_dict(load_file(tmp_path / "w.safetensors"))
    want = _held_out_by_hand(model, corpus.valid, 4, 2, mcfg().context, torch.bfloat16)
    first = got["evals"][0]
    assert first["step"] == 2 and first["valid_loss"] == pytest.approx(want, rel=1e-5)
    assert first["perplexity"] == pytest.approx(math.exp(want), rel=1e-5)
    # neither every batch nor fp32 gives it
    assert abs(want - _held_out_by_hand(model, corpus.valid, 4, 10**6, mcfg().context, torch.bfloat16)) > 1e-4
    assert abs(want - _held_out_by_hand(model, corpus.valid, 4, 2, mcfg().context, torch.float32)) > 1e-5


def test_the_trained_models_row_is_its_loss_and_measures_on_the_next_batch_at_the_last_rate(corpus, tmp_path):
    """After the last update the run records the trained model once more, on the batch the generator draws
    next, over its first ``record_sequences`` sequences; its rate is the last step's."""
    import time

    from safetensors.torch import load_file

    from attnscale.core.hooks import hooked
    from attnscale.lm.data import batches
    from reference import head_summary

    cfg = T.TrainConfig(steps=4, batch=4, lr=1e-2, warmup=1, min_lr_ratio=0.1, record_every=4, record_sequences=2,
                        eval_batches=2, device="cpu", threads=1)
    t0 = time.perf_counter()
    got = T.train(mcfg(), cfg, corpus, weights=tmp_path / "w.safetensors")
    wall = time.perf_counter() - t0
    row = got["history"][-1]
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.steps):
        batches(corpus.train, cfg.batch, mcfg().context, gen)
    x, y = batches(corpus.train, cfg.batch, mcfg().context, gen)
    model = TinyLM(mcfg())
    model.load_state_dict(load_file(tmp_path / "w.safetensors"))
    with torch.no_grad(), hooked(model, "blocks.*.attn.hook_*") as cache:
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    # the cosine from step 1 (after one warm-up step) over 3 steps, at step 3: two thirds of the way down
    last_rate = 1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi * 2 / 3))
    assert (row["step"], row["lr"]) == (4, pytest.approx(last_rate, rel=1e-12))
    assert row["loss"] == pytest.approx(loss, rel=1e-5) and 0 < row["elapsed_s"] <= wall
    for layer in range(2):
        want = head_summary(cache[f"blocks.{layer}.attn.hook_scores"][:2].double(),
                            cache[f"blocks.{layer}.attn.hook_pattern"][:2].double())
        assert row["spread"][layer] == pytest.approx(want["spread"], rel=1e-4)
        assert row["effective_words"][layer] == pytest.approx(want["effective_words"], rel=1e-4)


def test_a_gradient_that_is_not_finite_ends_an_fp32_run_as_diverged_at_that_step(corpus, monkeypatch):
    """The loss finite, a gradient not: the update is skipped and, outside fp16, the run ends there."""
    clip, calls = T.clip_, []

    def third_is_inf(grads, max_norm):
        calls.append(1)
        norm = clip(grads, max_norm)
        return torch.full_like(norm, math.inf) if len(calls) == 3 else norm

    monkeypatch.setattr(T, "clip_", third_is_inf)
    got = T.train(mcfg(), T.TrainConfig(steps=6, batch=4, record_every=3, eval_batches=2, threads=1), corpus)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 2, 2)
    assert all(math.isfinite(v) for v in got["losses"])
    from dataclasses import fields

    from attnscale.runs.record import TrainResults

    assert set(got) == {f.name for f in fields(TrainResults)}  # a diverged run's record has every field
    assert (got["valid_loss"], got["perplexity"], got["eval_tokens"]) == (None, None, 0)


def test_a_checkpoint_written_before_skips_and_evals_were_kept_resumes_and_one_with_skips_says_so(corpus, tmp_path):
    cfg = T.TrainConfig(steps=6, batch=4, record_every=3, eval_batches=2, checkpoint_every=2, threads=1)
    path = tmp_path / "c.pt"
    calls = iter(range(100))
    T.train(mcfg(), cfg, corpus, checkpoint=path, should_stop=lambda: next(calls) >= 3)
    state = torch.load(path, weights_only=False)
    whole = T.train(mcfg(), cfg, corpus)
    assert whole["notes"] == []  # no checkpoint, nothing to say
    for key in ("skipped", "evals"):  # an older checkpoint, without either
        state.pop(key)
    torch.save(state, path)
    resumed = T.train(mcfg(), cfg, corpus, checkpoint=path)
    assert resumed["resumed_from"] == 2 and resumed["losses"] == whole["losses"] and resumed["evals"] == []
    # its speed counts the steps it took, not those its checkpoint had
    assert resumed["tokens_per_s"] == pytest.approx((6 - 2) * 4 * 8 / resumed["train_seconds"], rel=1e-9)
    assert not any("skipped" in n for n in resumed["notes"])
    T.train(mcfg(), cfg, corpus, checkpoint=path, should_stop=lambda: next(calls) >= 6)
    state = torch.load(path, weights_only=False)
    torch.save({**state, "skipped": 3}, path)
    again = T.train(mcfg(), cfg, corpus, checkpoint=path)
    assert "the fp16 gradient scaler skipped 3 step(s) with inf/NaN gradients; they are not counted and did not " \
           "move the schedule" in again["notes"]


def test_the_final_training_loss_is_the_mean_of_the_last_record_every_losses(corpus):
    got = T.train(mcfg(), T.TrainConfig(steps=7, batch=4, record_every=2, eval_batches=2, threads=1), corpus)
    last_two = got["losses"][5] + got["losses"][6]
    assert len(got["losses"]) == 7 and got["final_train_loss"] == pytest.approx(last_two / 2, rel=1e-12)


@pytest.mark.parametrize("split", ["train", "valid"])
def test_a_split_too_short_for_one_context_is_named_in_the_refusal(corpus, split):
    from dataclasses import replace

    from attnscale.errors import ConfigError

    short = replace(corpus, **{split: corpus.train[:8]})
    words = {"train": "training split", "valid": "held-out split"}[split]
    with pytest.raises(ConfigError) as err:
        T.train(mcfg(), T.TrainConfig(steps=2, batch=2, threads=1), short)
    assert str(err.value) == (f"the {words} has 8 tokens, not more than one context of 8; "
                              "use a shorter --context or a longer corpus")


def test_a_run_trains_on_its_own_thread_count_and_gives_the_callers_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        T.train(mcfg(), T.TrainConfig(steps=2, batch=2, record_every=2, eval_batches=1, threads=1), _corpus(),
                on_step=lambda *a: seen.append(torch.get_num_threads()))
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _corpus():
    from attnscale.lm.data import Corpus

    ids = torch.arange(400) % V
    return Corpus(name="tiny", tokenizer="char", vocab_size=V, train=ids[:300], valid=ids[300:], sha256="0" * 64)


def test_a_recording_step_measures_the_first_record_sequences_of_its_batch(corpus):
    from attnscale.core.hooks import hooked
    from attnscale.lm.data import batches
    from reference import head_summary

    got = T.train(mcfg(), T.TrainConfig(steps=1, batch=4, record_every=1, record_sequences=2, eval_batches=1,
                                        lr=1e-2, warmup=4, threads=1), corpus)
    assert got["history"][0]["lr"] == pytest.approx(1e-2 / 4, rel=1e-12)  # the first warm-up step's rate
    torch.manual_seed(0)
    model = TinyLM(mcfg())
    x, _ = batches(corpus.train, 4, mcfg().context, torch.Generator().manual_seed(0))
    with torch.no_grad(), hooked(model, "blocks.*.attn.hook_*") as cache:
        model(x)
    want = head_summary(cache["blocks.1.attn.hook_scores"][:2].double(), cache["blocks.1.attn.hook_pattern"][:2].double())
    assert got["history"][0]["step"] == 0 and got["history"][0]["spread"][1] == pytest.approx(want["spread"], rel=1e-4)


def test_a_step_whose_gradients_are_not_finite_leaves_the_weights_as_they_were(corpus, monkeypatch):
    cfg = T.TrainConfig(steps=4, batch=4, record_every=10, eval_batches=1, device="cpu", threads=1)
    run = T.build_run(mcfg(), cfg, None)
    T.train_step(run, 0, corpus)
    before = [p.detach().clone() for p in run.model.parameters()]
    clip = T.clip_

    def poisoned(grads, max_norm):
        grads.view(-1)[0] = math.inf
        return clip(grads, max_norm)

    monkeypatch.setattr(T, "clip_", poisoned)
    value, _, norm, skipped = T.train_step(run, 1, corpus)
    assert skipped and math.isfinite(value) and not math.isfinite(norm)
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def test_the_results_are_the_record_s_fields_each_as_the_run_had_it(corpus):
    """Every key ``runs.record.TrainResults`` keeps, and each value from what the run was given and did:
    the model's settings, its parameters counted by hand, the thread count, the path, the device and its dtype,
    the loss of the last step (record_every 1), and tokens a second as steps × batch × context / seconds."""
    from dataclasses import fields

    from attnscale.runs.record import TrainResults

    model_cfg = mcfg(scale="inv_d", init="unit")
    cfg = T.TrainConfig(steps=3, batch=4, record_every=1, eval_batches=1, dtype="bf16", device="cpu", threads=1,
                        attention="explicit")
    got = T.train(model_cfg, cfg, corpus)
    assert set(got) == {f.name for f in fields(TrainResults)}
    params = sum(p.numel() for p in TinyLM(model_cfg).parameters())
    assert (got["head_dim"], got["scale"], got["init"], got["params"], got["threads"], got["attention"]) == \
        (4, "inv_d", "unit", params, 1, "explicit")
    assert (got["device"]["type"], got["device"]["dtype"], got["dtype"]) == ("cpu", "bf16", "bf16")
    assert got["final_train_loss"] == got["losses"][-1]
    assert got["tokens_per_s"] == pytest.approx(3 * 4 * 8 / got["train_seconds"], rel=1e-9)
    assert 0 < got["train_seconds"] < 600 and isinstance(got["eval_tokens"], int) and got["eval_tokens"] == 4 * 8
    assert got["start"]["max_score"] == max(max(layer) for layer in got["history"][0]["max_score"])


@pytest.mark.parametrize("kw, line", [
    ({"steps": 0}, "train steps must be a positive integer, got 0"),
    ({"warmup": -1}, "train warmup must be a non-negative integer, got -1"),
    ({"warmup": 1.5}, "train warmup must be a non-negative integer, got 1.5"),
    ({"lr": 0.0}, "train lr must be a positive number, got 0.0"),
    ({"lr": math.inf}, "train lr must be a positive number, got inf"),
    ({"min_lr_ratio": 1.5}, "train min_lr_ratio must lie in [0, 1], got 1.5"),
    ({"clip": 0.0}, "train weight_decay must be >= 0, clip > 0 and beta2 in [0, 1)"),
    ({"weight_decay": -0.1}, "train weight_decay must be >= 0, clip > 0 and beta2 in [0, 1)"),
    ({"beta2": 1.0}, "train weight_decay must be >= 0, clip > 0 and beta2 in [0, 1)"),
    ({"beta2": 1.5}, "train weight_decay must be >= 0, clip > 0 and beta2 in [0, 1)"),
    ({"dtype": "fp8"}, "train dtype 'fp8' is unknown; choose one of: auto, fp32, bf16, fp16"),
    ({"threads": 1.5}, "train threads must be a positive integer or None, got 1.5"),
    ({"checkpoint_every": 0.5}, "train checkpoint_every must be a non-negative integer (0 = never), got 0.5"),
    ({"attention": "flash"}, "train attention 'flash' is unknown; choose one of: auto, fused, explicit"),
    ({"weights": "fp8"}, "train weights 'fp8' are unknown; choose one of: fp32, bf16"),
    ({"weights": "bf16", "dtype": "fp32"},
     "train weights 'bf16' need dtype bf16 (or auto), not 'fp32'; drop --weights bf16 or train in bf16"),
    ({"z_loss": math.inf}, "train z_loss must be >= 0, beta1 in [0, 1) and adam_eps in (0, 1)"),
    ({"adam_eps": 1.0}, "train z_loss must be >= 0, beta1 in [0, 1) and adam_eps in (0, 1)"),
    ({"adam_eps": 1.5}, "train z_loss must be >= 0, beta1 in [0, 1) and adam_eps in (0, 1)"),
    ({"eval_every": True}, "train eval_every must be a non-negative integer (0 = at the end only), got True"),
    ({"frozen_threshold": 0.0}, "train frozen_threshold must lie in (0, 1), got 0.0"),
    ({"frozen_threshold": 1.0}, "train frozen_threshold must lie in (0, 1), got 1.0"),
])
def test_each_training_refusal_is_the_line_a_user_reads(kw, line):
    from attnscale.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        T.TrainConfig(**kw)
    assert str(err.value) == line


def test_the_edges_a_training_config_accepts():
    cfg = T.TrainConfig(weight_decay=0.0, beta2=0.0, beta1=0.0, min_lr_ratio=1.0, warmup=0, lr=1e-12)
    assert (cfg.weight_decay, cfg.beta2, cfg.beta1, cfg.min_lr_ratio, cfg.warmup) == (0.0, 0.0, 0.0, 1.0, 0)
    assert T.TrainConfig(steps=10, warmup=8, schedule="wsd").warmup == 8  # warm-up ends where the cool-down starts


def test_the_path_of_steps_that_do_not_record():
    """"auto" fuses on GPUs and on the CPU in fp32, and takes the model's own path on the CPU under bf16; a
    scheme SDPA cannot express is always explicit; a path asked for is taken. Only ``device.type`` is read,
    so a GPU's device needs no GPU here."""
    from attnscale.core import device as dev

    fp32, bf16 = (dev.resolve_precision(d, torch.device("cpu")) for d in ("fp32", "bf16"))
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    own = mcfg(impl="explicit")
    assert T.attention_impl("auto", own, cpu, fp32) == "fused"
    assert T.attention_impl("auto", own, cpu, bf16) == "explicit"
    assert T.attention_impl("auto", own, cuda, bf16) == T.attention_impl("auto", own, mps, bf16) == "fused"
    assert T.attention_impl("fused", own, cpu, bf16) == "fused"
    assert T.attention_impl("fused", mcfg(scale="softcap"), cuda, fp32) == "explicit"  # a cap SDPA has no place for


def test_the_optimiser_is_torchs_fused_adamw_on_the_cpu():
    """The fused kernel on the CPU (and CUDA): it skips a step on the device (``found_inf``), with no host sync."""
    run = T.build_run(mcfg(), T.TrainConfig(device="cpu", threads=1), None)
    assert isinstance(run.opt, torch.optim.AdamW) and run.opt.defaults["fused"] is True and run.impl == "fused"


def test_each_step_tells_on_step_its_loss_rate_and_gradient_norm(corpus):
    seen = []
    got = T.train(mcfg(), T.TrainConfig(steps=3, batch=4, lr=1e-2, warmup=3, record_every=1, eval_batches=1,
                                        threads=1), corpus, on_step=lambda *a: seen.append(a))
    assert [(s, n) for s, n, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert [info["lr"] for _, _, info in seen] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2], rel=1e-12)
    assert [info["loss"] for _, _, info in seen] == got["losses"]
    # the update after step k is recorded as step k - 1 (the weights its forward used); the last row is the trained model
    assert [info["grad_norm"] for _, _, info in seen] == pytest.approx([row["grad_norm"] for row in got["history"][:3]])


@pytest.mark.parametrize("where", ["the trained model's row", "the held-out loss"])
def test_a_run_whose_end_is_not_finite_is_diverged_at_its_last_step(corpus, monkeypatch, where):
    if where == "the trained model's row":
        monkeypatch.setattr(T, "_record_trained", lambda run, corpus: math.nan)
    else:
        monkeypatch.setattr(T, "evaluate", lambda *a, **k: {"valid_loss": math.inf, "perplexity": math.inf,
                                                             "eval_tokens": 32})
    got = T.train(mcfg(), T.TrainConfig(steps=2, batch=4, record_every=1, eval_batches=1, threads=1), corpus)
    assert (got["status"], got["diverged_at"], got["steps_done"]) == ("diverged", 2, 2)


def test_a_held_out_loss_too_large_for_a_perplexity_leaves_it_none(corpus, monkeypatch):
    monkeypatch.setattr(T, "evaluate", lambda *a, **k: {"valid_loss": 800.0, "perplexity": math.inf,
                                                         "eval_tokens": 32})
    got = T.train(mcfg(), T.TrainConfig(steps=2, batch=4, record_every=1, eval_batches=1, threads=1), corpus)
    assert (got["status"], got["valid_loss"], got["perplexity"], got["eval_tokens"]) == ("done", 800.0, None, 32)


def test_a_cpu_run_keeps_freed_memory_on_the_heap_before_its_first_step(monkeypatch):
    """core.device.keep_freed_memory is what a CPU training run calls (once, while it builds)."""
    called = []
    monkeypatch.setattr(T.dev, "keep_freed_memory", lambda: called.append(1) or True)
    T.build_run(mcfg(), T.TrainConfig(device="cpu", threads=1), None)
    assert called == [1]
