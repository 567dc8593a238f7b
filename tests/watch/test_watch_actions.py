"""Alerts that act (``watch/actions.py``), in a plain loop: each action's effect against a calculation of its own,
taken once per alert, the options refused in one line, and the optimizer given back as it was."""

import math

import pytest
import torch

from attnscale.errors import ConfigError
from attnscale.lm.data import batches, load_corpus
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.actions import ClipQK, ScaleLR, SkipStep
from attnscale.watch.alerts import MaxScore
from attnscale.watch.loop import Watch

ANY = 1e-9  # a MaxScore level every head passes: the alert fires at every probe


def _model():
    vocab = load_corpus("default").vocab_size
    return build_model(ModelConfig(vocab_size=vocab, context=16, d_model=16, n_layers=1, n_heads=2), seed=0)


def _loop(model, opt, steps, watch=None):
    """A plain loop (batches of 4 windows of 16 characters); per step: (weights before, gradients, weights
    after, the optimizer's state after, each group's lr after)."""
    corpus = load_corpus("default")
    gen = torch.Generator().manual_seed(0)
    seen = []
    for step in range(1, steps + 1):
        x, y = batches(corpus.train, 4, 16, gen)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        if watch is not None:
            watch.step(step)
        state = [{k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()]
        seen.append((before, grads, [p.detach().clone() for p in model.parameters()], state,
                     [g["lr"] for g in opt.param_groups]))
    return seen


@pytest.mark.parametrize("make, says", [
    (lambda: ScaleLR(0), "ScaleLR's factor"), (lambda: ScaleLR(math.nan), "ScaleLR's factor"),
    (lambda: ScaleLR(-0.5), "ScaleLR's factor"), (lambda: ScaleLR(math.inf), "ScaleLR's factor"),
    (lambda: ScaleLR(True), "ScaleLR's factor"), (lambda: ScaleLR(0.5, steps=0), "ScaleLR's steps"),
    (lambda: ScaleLR(0.5, steps=1.5), "ScaleLR's steps"), (lambda: ClipQK(0), "ClipQK's tau"),
    (lambda: ClipQK(-1.0), "ClipQK's tau"), (lambda: ClipQK(math.inf), "ClipQK's tau"),
    (lambda: SkipStep(0), "SkipStep's steps"), (lambda: SkipStep(True), "SkipStep's steps")])
def test_an_action_that_cannot_act_is_a_config_error_naming_it(make, says):
    with pytest.raises(ConfigError, match=f"^{says} takes"):
        make()


def test_an_action_on_the_optimizer_needs_one_and_a_clip_is_given_once():
    model = _model()
    with pytest.raises(ConfigError, match="^an alert's SkipStep acts on the optimizer: give the Watch optimizer="):
        Watch(model, alerts=[MaxScore(tau=ANY, action=SkipStep())])
    with pytest.raises(ConfigError, match="^qk_clip= clips from the first step and an alert's ClipQK"):
        Watch(model, alerts=[MaxScore(tau=ANY, action=ClipQK(10))], qk_clip=10.0)
    with pytest.raises(ConfigError, match="optimizer takes a torch.optim.Optimizer"):
        Watch(model, alerts=[MaxScore(tau=ANY, action=SkipStep())], optimizer="adam")


def test_scale_lr_under_sgd_moves_the_weights_by_exactly_the_scaled_update_for_its_steps():
    """ScaleLR(0.5, steps=2) fires at probe 2: updates 3 and 4 are p - 0.05 g, the others p - 0.1 g, and each
    group's lr reads 0.1 after every step. It is taken once, though the alert fires at probes 2 and 4."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    watch = Watch(model, every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.5, steps=2))], optimizer=opt)
    seen = _loop(model, opt, 5, watch)
    for step, (before, grads, after, _, lrs) in enumerate(seen, 1):
        rate = 0.05 if step in (3, 4) else 0.1
        assert all(torch.equal(a, torch.add(b, g, alpha=-rate)) for b, g, a in zip(before, grads, after)), step
        assert lrs == [0.1]
    assert [(a["step"], a["action"], a["factor"], a["steps"]) for a in watch.actions] == [(2, "scale_lr", 0.5, 2)]
    watch.close()
    assert "step" not in vars(opt)  # the class's step again


def test_skip_step_leaves_weights_and_optimizer_state_as_they_were_then_training_goes_on():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Watch(model, every=2, alerts=[MaxScore(tau=ANY, action=SkipStep(2))], optimizer=opt) as watch:
        seen = _loop(model, opt, 5, watch)
    after_2, state_2 = seen[1][2], seen[1][3]
    for step in (3, 4):
        _, _, after, state, _ = seen[step - 1]
        assert all(torch.equal(a, b) for a, b in zip(after, after_2))
        assert all(s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s) for s, t in zip(state, state_2))
    assert not torch.equal(seen[4][2][0], after_2[0]) and int(seen[4][3][0]["step"]) == 3
    assert [(a["step"], a["action"], a["steps"]) for a in watch.actions] == [(2, "skip_step", 2)]


def test_the_optimizer_step_a_scheduler_wrapped_is_put_back_at_close():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    theirs = vars(opt)["step"]
    watch = Watch(model, every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.5))], optimizer=opt)
    _loop(model, opt, 3, watch)
    assert vars(opt)["step"] is not theirs and opt._opt_called  # the scheduler still sees the step called
    watch.close()
    assert vars(opt)["step"] is theirs
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5  # its own value: the factor was put back after each step


def test_a_plain_loop_resumed_from_the_watch_s_state_goes_on_as_the_uninterrupted_one(tmp_path):
    """State saved (torch.save) after step 3, with a ScaleLR, a SkipStep and a clip still in force from probe 2:
    a new model, optimizer and Watch loaded from it give the uninterrupted run's weights, optimizer state and
    actions after step 6, to the bit; the probe is the first run's (its first batch), not the resumed run's."""
    def alerts():
        return [MaxScore(tau=ANY, action=ScaleLR(0.5, steps=3)), MaxScore(tau=ANY, action=SkipStep(2)),
                MaxScore(tau=ANY, action=ClipQK(0.5))]

    def run(steps, state=None, start=0):
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        watch = Watch(model, every=2, alerts=alerts(), optimizer=opt)
        if state is not None:
            watch.load_state_dict(state["watch"])
        corpus = load_corpus("default")
        gen = torch.Generator().manual_seed(0)
        for step in range(1, steps + 1):
            x, y = batches(corpus.train, 4, 16, gen)
            if step <= start:
                continue  # the batches the first run took
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad()
            watch.step(step)
        watch.close()
        return model, opt, watch

    whole = run(6)
    model, opt, watch = run(3)
    path = tmp_path / "state.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "watch": watch.state_dict()}, path)
    resumed = run(6, torch.load(path, weights_only=True), start=3)  # data only: tensors and plain values
    assert all(torch.equal(a, b) for a, b in zip(whole[0].state_dict().values(), resumed[0].state_dict().values()))
    assert all(torch.equal(a, b) for s, t in zip(whole[1].state.values(), resumed[1].state.values())
               for a, b in zip(s.values(), t.values()))
    assert resumed[2].actions == whole[2].actions and len(whole[2].actions) == 3
    assert torch.equal(resumed[2].probe, watch.probe)


def _qk_norm_model():
    vocab = load_corpus("default").vocab_size
    return build_model(ModelConfig(vocab_size=vocab, context=16, d_model=16, n_layers=1, n_heads=2, scale="qk_norm"),
                       seed=0)


QK_NORM_REFUSED = (r"^MaxScore's action ClipQK\(tau=100\) cannot act on TinyLM: .* uses the score scale QKNorm, which "
                   r"prepares q and k itself \(qk-norm\).*; give that alert another action \(ScaleLR, SkipStep")


def test_clip_qk_on_a_qk_norm_model_is_refused_when_the_watch_is_built_not_after_the_alarm():
    """With a probe, when the Watch is made; without one, at the first forward, before any update; in the training
    forward, at step 1's watch.step. Once the alarm's step was where it failed."""
    alerts = [MaxScore(tau=ANY, action=ClipQK(100))]
    corpus = load_corpus("default")
    x, _ = batches(corpus.train, 4, 16, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match=QK_NORM_REFUSED):
        Watch(_qk_norm_model(), every=3, probe=x, alerts=alerts)
    model = _qk_norm_model()
    watch = Watch(model, every=3, alerts=alerts)
    with pytest.raises(ConfigError, match=QK_NORM_REFUSED):
        model(x)  # the first batch, caught and tried before its forward runs
    watch.close()
    model = _qk_norm_model()
    watch = Watch(model, every=3, alerts=alerts, in_training_forward=True)
    model(x).sum().backward()
    with pytest.raises(ConfigError, match=QK_NORM_REFUSED):
        watch.step(1)
    watch.close()
    assert not model._forward_pre_hooks and not model._forward_hooks  # the check's hooks are gone
    Watch(_model(), every=3, probe=x, alerts=alerts).close()  # a model the clip can reach is taken


@pytest.mark.parametrize("action, fix", [(SkipStep, r"action=SkipStep\(\)"), (ClipQK, r"action=ClipQK\(\)"),
                                         (ScaleLR, r"action=ScaleLR\(\)"),
                                         (dict, r"a function of one Firing \(or an instance of dict\)")])
def test_a_class_given_for_an_action_is_refused_naming_the_instance_to_give(action, fix):
    """MaxScore(action=SkipStep) was taken as a function of the Firing: at the alarm the class was called with it,
    the probe was said to fail, and no step was skipped."""
    with pytest.raises(ConfigError, match=f"^an alert's action takes an action, not the class {action.__name__}: "
                                          f"give {fix}$"):
        MaxScore(tau=ANY, action=action)


def test_a_class_given_for_an_alert_or_a_sink_is_refused_naming_the_instance_to_give():
    from attnscale.watch.alerts import NonFinite
    from attnscale.watch.logs.sinks import JsonlSink

    with pytest.raises(ConfigError, match=r"^alerts takes instances, not the class NonFinite: give NonFinite\(...\)$"):
        Watch(_model(), alerts=[NonFinite])
    with pytest.raises(ConfigError, match=r"^alerts takes a list of alerts, got .*; give alerts=\[NonFinite\(...\)\]$"):
        Watch(_model(), alerts=NonFinite)
    with pytest.raises(ConfigError, match=r"^sinks takes instances, not the class JsonlSink: give JsonlSink\(...\)$"):
        Watch(_model(), sinks=[JsonlSink])


def test_a_watch_closed_mid_run_with_a_rate_cut_in_force_says_so_at_the_next_step_once(caplog):
    """The plain loop's close ends the cut: the optimizer's next step runs at its own rate, and that step says
    what ended, once; a watch closed with nothing in force, or a run that takes no step after, says nothing."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    watch = Watch(model, every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.5))], optimizer=opt)
    _loop(model, opt, 3, watch)
    with caplog.at_level("WARNING", logger="attnscale.watch"):
        watch.close()
        assert not [r for r in caplog.records if "was closed with" in r.getMessage()]  # no step yet: nothing said
        before, grads, after, _, lrs = _loop(model, opt, 2, None)[0]
    said = [r.getMessage() for r in caplog.records if "was closed with" in r.getMessage()]
    assert said == ["the watch was closed with the rate times 0.5 to the end of the run in force; the optimizer "
                    "steps at its own rate from here (close the watch after the last step to keep its actions to "
                    "the end)"]
    assert lrs == [0.1]  # and the step moved the weights by the whole rate's update: the cut ended at the close
    assert all(torch.equal(a, torch.add(b, g, alpha=-0.1)) for b, g, a in zip(before, grads, after))

    caplog.clear()
    quiet = _model()
    opt2 = torch.optim.SGD(quiet.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="attnscale.watch"):
        with Watch(quiet, every=2, alerts=[MaxScore(tau=ANY, action=ScaleLR(0.5, steps=1))], optimizer=opt2) as w:
            _loop(quiet, opt2, 4, w)  # the cut of one step ran out before the close
        _loop(quiet, opt2, 1, None)
    assert not [r for r in caplog.records if "was closed with" in r.getMessage()]
