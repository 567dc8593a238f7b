"""The watch's saved state (``watch/state.py``): data only, so a checkpoint a user hands back runs no code; and the
plan it keeps, so a resumed run with other alerts or actions is refused, naming both, unless it says
``resume_actions="new"``."""

import base64
import io
import logging
from types import SimpleNamespace

import pytest
import torch

from attnscale.capture.probe import Inputs
from attnscale.errors import ConfigError
from attnscale.lm.checkpoint import Checkpoint
from attnscale.watch.actions import ClipQK
from attnscale.watch.alerts import Collapsed, MaxScore, NonFinite
from attnscale.watch.loop import Watch
from attnscale.watch.state import plain_probe, probe_of
from watch_models import IDS, _model

ANY = 1e-9  # a MaxScore level every head passes


class Marker:
    """A pickled object whose loading writes a file: what a crafted checkpoint would carry."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _crafted(marker) -> bytes:
    buffer = io.BytesIO()
    torch.save({"config": {}, "watch": Marker(marker)}, buffer)
    return buffer.getvalue()


def test_the_crafted_checkpoint_runs_code_when_unpickled(tmp_path):
    """The control: loaded as pickle, the file of the tests below does write its marker."""
    marker = tmp_path / "ran"
    torch.load(io.BytesIO(_crafted(marker)), weights_only=False)
    assert marker.exists()


def test_a_crafted_training_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "checkpoint.pt"
    path.write_bytes(_crafted(marker))
    state, note = Checkpoint(path, {}).load()
    assert state is None and note.startswith("checkpoint.pt could not be read (UnpicklingError: ")
    assert note.endswith("; trained from step 0") and not marker.exists()


def test_a_crafted_trainer_state_is_refused_naming_it_and_runs_nothing(tmp_path):
    pytest.importorskip("transformers")
    from attnscale.watch.callbacks.hf import WatchCallback

    marker = tmp_path / "ran"
    saved = {"WatchCallback": {"args": {}, "attributes": {"watch_state": base64.b64encode(_crafted(marker)).decode()}}}
    state = SimpleNamespace(stateful_callbacks=saved, global_step=3)
    with pytest.raises(ConfigError, match=r"^the checkpoint's WatchCallback state \(trainer_state.json\) is not plain "
                                          r"data a watch wrote \(.*\); it is not read: resume from"):
        WatchCallback(every=2)._resume(SimpleNamespace(), state)
    assert not marker.exists()


def test_a_watch_s_state_is_data_only_and_resumes_with_its_probe_and_actions(tmp_path):
    """An Inputs probe with keyword arguments, an action taken: saved, read back with weights_only=True (which
    refuses any object), and the new watch holds the same probe, actions and clip."""
    model, opt = _model(), None
    probe = Inputs((IDS,), {})
    watch = Watch(model, every=1, probe=probe, alerts=[MaxScore(tau=ANY, action=ClipQK(0.5))])
    model(IDS).sum().backward()
    watch.step(1)
    path = tmp_path / "state.pt"
    torch.save(watch.state_dict(), path)
    state = torch.load(path, weights_only=True)
    again = Watch(_model(), every=1, alerts=[MaxScore(tau=ANY, action=ClipQK(0.5))], optimizer=opt)
    again.load_state_dict(state)
    again.model(IDS.flip(0))  # the resumed run's first batch: the probe stays the first run's
    assert isinstance(again.probe, Inputs) and torch.equal(again.probe.args[0], watch.probe.args[0])
    assert again.actions == watch.actions and again.clip.tau == 0.5 and again.clip_since == 2
    watch.close(), again.close()


@pytest.mark.parametrize("probe", [IDS[:2], Inputs((IDS[:2],), {"mask": None, "n": 3, "flag": True}),
                                   {"input_ids": IDS[:2], "names": ["a", "b"]}, (IDS[:2], IDS[:2]), [IDS[:2]]],
                         ids=["tensor", "inputs", "dict", "tuple", "list"])
def test_a_probe_goes_to_plain_data_and_back_as_it_was(probe):
    plain = plain_probe(probe)
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    back = probe_of(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert type(back) is type(probe)
    assert repr(back) == repr(probe)  # tensors print their values: the same batch, the same containers


def test_a_probe_holding_an_object_is_not_saved_and_is_said(caplog):
    class Cache:
        pass

    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        assert plain_probe(Inputs((IDS,), {"cache": Cache()})) is None
    assert "holds a Cache that a checkpoint keeps only as data it cannot read safely" in caplog.text


def _taken(alerts, steps=2, **options):
    """A plain loop's watch after ``steps`` steps (every step a probe), its state as a checkpoint reads it back."""
    model = _model()
    watch = Watch(model, every=1, probe=IDS, alerts=alerts, **options)
    for step in range(1, steps + 1):
        model(IDS).sum().backward()
        watch.step(step)
    watch.close()
    buffer = io.BytesIO()
    torch.save(watch.state_dict(), buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def test_a_plain_loop_resumed_with_a_tighter_clip_is_refused_naming_both():
    state = _taken([MaxScore(tau=ANY, action=ClipQK(100))])
    resumed = Watch(_model(), every=1, alerts=[MaxScore(tau=ANY, action=ClipQK(1))])
    with pytest.raises(ConfigError, match=r"^the checkpoint's watch had the alerts \[MaxScore\(tau=1e-09, action="
                                          r"ClipQK\(tau=100\.0\)\)\], this one \[MaxScore\(tau=1e-09, action="
                                          r"ClipQK\(tau=1\.0\)\)\]; resume with"):
        resumed.load_state_dict(state)
    assert resumed.clip is None  # nothing of the refused state was taken


def test_with_resume_actions_new_the_old_clip_ends_and_the_new_one_is_taken_at_its_alarm(caplog):
    state = _taken([MaxScore(tau=ANY, action=ClipQK(100))])
    model = _model()
    resumed = Watch(model, every=1, alerts=[MaxScore(tau=ANY, action=ClipQK(1))], resume_actions="new")
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        resumed.load_state_dict(state)
    assert "ends here: QK-Clip at tau 100 since step 2" in caplog.text
    assert resumed.clip is None and [a["tau"] for a in resumed.actions] == [100.0]
    model(IDS).sum().backward()
    resumed.step(3)
    assert resumed.clip.tau == 1.0 and [(a["step"], a["tau"]) for a in resumed.actions] == [(1, 100.0), (3, 1.0)]
    resumed.close()


@pytest.mark.parametrize("before, after, options", [
    ([Collapsed(words=2)], [Collapsed(words=3)], {}),
    ([MaxScore(tau=100)], [MaxScore(tau=200)], {}),
    ([MaxScore(tau=100), NonFinite()], [NonFinite(), MaxScore(tau=100)], {}),
    ([NonFinite(action="warn")], [NonFinite(action="stop")], {}),
    ([NonFinite()], [NonFinite()], {"qk_clip": 50.0}),
], ids=["collapsed-words", "max-score-tau", "order", "warn-to-stop", "qk_clip"])
def test_a_resume_with_any_other_alert_or_option_of_one_is_refused(before, after, options):
    state = _taken(before, steps=1)
    with pytest.raises(ConfigError, match="^the checkpoint's watch had the alerts .*, this one .*; resume with the "
                                          "alerts and actions the run started with"):
        Watch(_model(), every=1, alerts=after, **options).load_state_dict(state)


def test_the_same_plan_resumes_and_resume_actions_takes_only_same_or_new():
    state = _taken([Collapsed(words=2.0)])
    Watch(_model(), every=1, alerts=[Collapsed(words=2)]).load_state_dict(state)  # 2 and 2.0: one plan
    for bad in ("old", True, None, ""):
        with pytest.raises(ConfigError, match="^resume_actions takes 'same' .* or 'new' .*, got "):
            Watch(_model(), every=1, resume_actions=bad)


def test_a_resumed_probe_takes_the_containers_of_the_first_batch_it_sees_and_keeps_its_own_tensors():
    """A dataclass batch (as a Lightning loader may hand it) is saved as plain fields; the resumed watch puts the
    saved tensors in the dataclass of the resumed run's first batch, so the forward gets what it was written for."""
    import dataclasses

    @dataclasses.dataclass
    class Batch:
        ids: torch.Tensor

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _model()

        def forward(self, batch):
            return self.inner(batch.ids)

    model = Model()
    watch = Watch(model, every=1, alerts=[])
    model(Batch(IDS)).sum().backward()
    watch.step(1)
    buffer = io.BytesIO()
    torch.save(watch.state_dict(), buffer)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    again, other = Watch(Model(), every=1, alerts=[]), IDS.flip(0)
    again.load_state_dict(state)
    again.model(Batch(other))
    assert isinstance(again.probe.args[0], Batch) and torch.equal(again.probe.args[0].ids, watch.probe.args[0].ids)
    watch.close(), again.close()
