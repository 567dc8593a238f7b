"""TrainConfig(optimizer="muon"): Muon on the blocks' matrices, AdamW on the rest (lm/optimizers.py). The split,
one step against torch's Muon and AdamW stepped by hand, a run that learns, a resume to the bit, the host's skip,
the watch's rate factor on every group, QK-Clip holding tau under Muon, the record, and bad values."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from attnscale.errors import ConfigError
from attnscale.lm import train as T
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.model import ModelConfig, build_model
from attnscale.lm.optimizers import MuonAdamW, build_optimizer
from attnscale.watch.actions import Acting, ScaleLR, SkipStep
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)

torch.set_num_threads(1)
BLOCK_MATRICES = {f"blocks.{i}.{m}.weight" for i in range(2)
                  for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.up", "mlp.down")}


def mcfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4), **kw})


def tcfg(**kw) -> T.TrainConfig:
    return T.TrainConfig(**{**dict(steps=6, batch=4, lr=1e-2, warmup=2, record_every=3, eval_batches=2, threads=1,
                                   device="cpu", optimizer="muon"), **kw})


@pytest.mark.parametrize("tied", [False, True])
def test_muon_takes_the_blocks_matrices_and_adamw_every_other_parameter(corpus, tied):
    run = T.build_run(mcfg(scale="qk_norm", tie_embeddings=tied), tcfg(weight_decay=0.25), None)
    names = {id(p): n for n, p in run.model.named_parameters()}
    assert isinstance(run.opt, MuonAdamW) and isinstance(run.opt.muon, torch.optim.Muon)
    (muon,) = run.opt.muon.param_groups
    decay, rest = run.opt.adamw.param_groups
    assert {names[id(p)] for p in muon["params"]} == BLOCK_MATRICES
    assert muon["adjust_lr_fn"] == "match_rms_adamw" and muon["weight_decay"] == decay["weight_decay"] == 0.25
    assert {names[id(p)] for p in decay["params"]} == {"tok_emb.weight", "pos_emb.weight"} | (
        set() if tied else {"head.weight"})  # a tied read-out is the token embedding, counted once
    assert rest["weight_decay"] == 0.0 and all(p.dim() < 2 for p in rest["params"])
    assert any(names[id(p)].endswith("q_gain") for p in rest["params"])  # the score scale's gains: AdamW
    assert (decay["betas"], decay["eps"]) == ((0.9, 0.99), 1e-8)
    assert sum(p.numel() for g in run.opt.param_groups for p in g["params"]) == run.model.num_params()
    assert not run.opt.defaults["fused"]  # the host decides a skip
    T.train_step(run, 0, corpus)
    assert {g["lr"] for g in run.opt.param_groups} == {T.lr_at(0, run.cfg)}  # the schedule sets Muon's rate too


def test_a_step_is_torchs_muon_on_the_block_matrices_and_adamw_on_the_rest(corpus):
    """The step's clipped gradients, handed to a torch Muon (match_rms_adamw) and AdamW built by hand on a copy of
    the weights before it, give the weights after it."""
    cfg = tcfg(weight_decay=0.05, clip=0.5)
    run = T.build_run(mcfg(), cfg, None)
    before = copy.deepcopy(run.model)
    T.train_step(run, 1, corpus)
    grads = {n: p.grad.clone() for n, p in run.model.named_parameters()}
    params = dict(before.named_parameters())
    for n, p in params.items():
        p.grad = grads[n]
    lr = T.lr_at(1, cfg)
    mats = [params[n] for n in sorted(BLOCK_MATRICES)]
    torch.optim.Muon(mats, lr=lr, weight_decay=0.05, adjust_lr_fn="match_rms_adamw").step()
    others = [p for n, p in params.items() if n not in BLOCK_MATRICES]
    torch.optim.AdamW([{"params": [p for p in others if p.dim() >= 2], "weight_decay": 0.05},
                       {"params": [p for p in others if p.dim() < 2], "weight_decay": 0.0}],
                      lr=lr, betas=(0.9, 0.99), eps=1e-8).step()
    for n, p in run.model.named_parameters():
        assert torch.allclose(p, params[n], rtol=1e-5, atol=1e-7), n


def test_a_muon_run_learns(corpus):
    got = T.train(mcfg(), tcfg(steps=40, warmup=4, record_every=20), corpus)
    assert got["status"] == "done"
    first, last = sum(got["losses"][:5]) / 5, sum(got["losses"][-5:]) / 5
    assert last < first - 0.5


def test_a_resumed_muon_run_gives_the_uninterrupted_numbers_to_the_bit(corpus, tmp_path):
    """The checkpoint keeps Muon's momentum and AdamW's moments; on resume the rate the schedule sets reaches the
    groups the inner optimisers step (a cosine rate: a stale group would step at another)."""
    cfg = tcfg(steps=8, checkpoint_every=3)
    whole = T.train(mcfg(), cfg, corpus, weights=tmp_path / "whole.st")
    calls = iter(range(100))
    first = T.train(mcfg(), cfg, corpus, checkpoint=tmp_path / "c.pt", should_stop=lambda: next(calls) >= 4)
    assert first["status"] == "stopped"
    state = torch.load(tmp_path / "c.pt", weights_only=True)["opt"]
    assert len(state["muon"]["state"]) == len(BLOCK_MATRICES)  # a momentum buffer each
    resumed = T.train(mcfg(), cfg, corpus, checkpoint=tmp_path / "c.pt", weights=tmp_path / "resumed.st")
    assert resumed["resumed_from"] == 3 and resumed["losses"] == whole["losses"]
    assert resumed["valid_loss"] == whole["valid_loss"]
    w, r = load_file(tmp_path / "whole.st"), load_file(tmp_path / "resumed.st")
    assert all(torch.equal(w[k], r[k]) for k in w)


def test_the_host_skips_a_muon_step_whose_gradients_are_not_finite(corpus, monkeypatch):
    after, step, losses = [], T.train_step, T.step_losses

    def stepped(run, s, corpus):
        got = step(run, s, corpus)
        after.append([p.detach().clone() for p in run.model.parameters()])
        return got

    def nan_at_2(net, x, y, z, with_log_z=False):
        loss, objective, log_z = losses(net, x, y, z, with_log_z)
        return loss, objective * (float("nan") if len(after) == 2 else 1.0), log_z

    monkeypatch.setattr(T, "train_step", stepped)
    monkeypatch.setattr(T, "step_losses", nan_at_2)
    got = T.train(mcfg(), tcfg(), corpus)
    assert (got["status"], got["diverged_at"]) == ("diverged", 2) and len(after) == 3
    assert not all(torch.equal(a, b) for a, b in zip(after[1], after[0]))
    assert all(torch.equal(a, b) for a, b in zip(after[2], after[1]))  # step 2 left every weight as it was


def test_the_watchs_rate_factor_reaches_muons_group_and_adamws():
    model = build_model(mcfg(), seed=0)
    opt = build_optimizer(model, "muon", lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8, fused=False)
    seen = []
    for inner in (opt.adamw, opt.muon):
        inner.step = lambda closure=None, inner=inner: seen.extend(g["lr"] for g in inner.param_groups)
    acting = Acting(opt)
    acting.take(ScaleLR(0.25, steps=1))
    opt.step()
    opt.step()
    acting.close()
    assert seen == [2.5e-3] * 3 + [1e-2] * 3 and [g["lr"] for g in opt.param_groups] == [1e-2] * 3


@pytest.mark.parametrize("actions, qk_clip", [((ScaleLR(0.5, steps=3),), 0.05), ((SkipStep(2),), None)],
                         ids=["rate-cut-and-qk_clip", "skip"])
def test_a_muon_run_resumed_with_the_watchs_actions_in_force_goes_on_as_the_uninterrupted_one(
        corpus, tmp_path, actions, qk_clip):
    """Actions taken at probe step 2, still in force at the checkpoint (step 3): the rate factor reaches Muon's
    group, a skipped step leaves its momentum, and the clip scales the weights it keeps momentum for; the resumed
    run's losses and weights are the uninterrupted run's to the bit, and the actions changed the run."""
    from attnscale.watch import Attached
    from attnscale.watch.alerts import MaxScore

    cfg = tcfg(steps=8, checkpoint_every=3)

    def attached():
        return Attached(every=2, alerts=[MaxScore(tau=1e-9, action=a) for a in actions], qk_clip=qk_clip)

    whole = T.train(mcfg(), cfg, corpus, watch=attached(), weights=tmp_path / "whole.st")
    calls = iter(range(100))
    T.train(mcfg(), cfg, corpus, checkpoint=tmp_path / "c.pt", watch=attached(), should_stop=lambda: next(calls) >= 3)
    resumed = T.train(mcfg(), cfg, corpus, checkpoint=tmp_path / "c.pt", watch=attached(),
                      weights=tmp_path / "resumed.st")
    assert resumed["resumed_from"] == 3 and resumed["losses"] == whole["losses"] and whole["actions"]
    w, r = load_file(tmp_path / "whole.st"), load_file(tmp_path / "resumed.st")
    assert all(torch.equal(w[k], r[k]) for k in w)
    assert whole["losses"] != T.train(mcfg(), cfg, corpus)["losses"]


def test_qk_clip_holds_a_muon_trained_models_heads_at_tau():
    """An unscaled model trained by Muon on one batch: without the clip its largest score passes tau by half;
    with it, by no more than the one step's growth the clip leaves (it acts on the scores before the step:
    up to 9% here)."""
    from attnscale.capture.probe import measure_heads
    from attnscale.watch.clip.qk_clip import QKClip

    def maxes(tau):
        model = build_model(ModelConfig(vocab_size=40, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=8,
                                        scale="none"), seed=0)
        ids = torch.randint(0, 40, (8, 9), generator=torch.Generator().manual_seed(0))
        opt = build_optimizer(model, "muon", lr=2e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, fused=False)
        clip = QKClip(model, tau) if tau else None
        got = []
        for _ in range(20):
            got.append(measure_heads(model, ids[:, :8]).get("max_score").max().item())
            model.loss(ids[:, :-1], ids[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
            if clip:
                clip.step()
        if clip:
            clip.close()
        return got

    tau, free, clipped = 4.5, maxes(None), maxes(4.5)
    assert free[0] < tau < tau * 1.4 < max(free)
    assert max(clipped) <= tau * 1.1 and min(clipped[-5:]) >= tau * 0.9  # held at tau, not pushed below it


def test_the_record_says_which_optimizer_and_a_record_from_before_reads_adamw(corpus, tmp_path):
    from attnscale.runs import record as rec
    from attnscale.runs.trainer import train_run

    run = train_run(mcfg(), tcfg(steps=2, warmup=1), corpus, tmp_path / "run")
    assert json.loads((tmp_path / "run" / rec.RECORD).read_text())["config"]["train"]["optimizer"] == "muon"
    assert run.train_config.optimizer == "muon"
    data = json.loads((tmp_path / "run" / rec.RECORD).read_text())
    del data["config"]["train"]["optimizer"]
    (tmp_path / "run" / rec.RECORD).write_text(json.dumps(data))
    assert rec.TrainRun.load(tmp_path / "run").train_config.optimizer == "adamw"
    old = {"model": {}, "train": {"steps": 3}, "corpus": {}}
    assert comparable_config(old) == comparable_config({**old, "train": {"steps": 3, "optimizer": "adamw"}})
    assert comparable_config(old) != comparable_config({**old, "train": {"steps": 3, "optimizer": "muon"}})


@pytest.mark.parametrize("bad", ["sgd", "", "Muon", None, 1, ["muon"]])
def test_an_unknown_optimizer_is_one_line_naming_the_choices(bad):
    with pytest.raises(ConfigError, match=r"^train optimizer .* is unknown; choose one of: adamw, muon$"):
        T.TrainConfig(optimizer=bad)


def test_the_llama_family_refuses_muon():
    from attnscale.lm.hf_family import check_train

    with pytest.raises(ConfigError, match="leave optimizer at the defaults"):
        check_train(T.TrainConfig(checkpoint_every=0, optimizer="muon"))
