"""``WatchCallback``: the watch as a Hugging Face ``TrainerCallback``.

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[WatchCallback()])

Every ``every`` optimizer steps (``on_step_end``) it probes the first training batch, as
``Watch`` does, and hands the numbers to every ``report_to`` integration at that step,
beside the loss. The Trainer calls its integrations' ``on_log`` before any user
callback, so the callback sets ``control.should_log`` at a probe step and calls its
own copies of the run's integration callbacks (``get_reporting_integration_callbacks``)
with the watch's numbers at the same ``global_step``: nothing of the Trainer is read or
patched. Why, and what that means for each integration: docs/watch.md. A "stop" alert
sets ``control.should_training_stop``; ``qk_clip=tau`` clips after the optimizer and
scheduler steps. An alert's ``ScaleLR`` or ``SkipStep`` acts on the Trainer's optimizer
(``watch/actions.py``). The watch's state (alerts said, actions taken and in force, the probe
batch) is saved with each checkpoint, in trainer_state.json's ``stateful_callbacks`` (the
callback is an ``ExportableState``), and read back from there by the callback of a run resumed
with ``resume_from_checkpoint``. transformers loads with this module, never with ``attnscale.watch``.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
from pathlib import Path

import torch

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError("attnscale.watch.callbacks.hf needs transformers; install the extra from the clone: pip install -e '.[watch]'") from None

from attnscale.errors import ConfigError
from attnscale.watch.alerts import LOGGER
from attnscale.capture.options import check_flag
from attnscale.watch.callbacks.attach import Attached

__all__ = ["WatchCallback"]


def _tensorboard_dir(args) -> str:
    """The folder the Trainer's own TensorBoard callback writes: its environment variable, else the newest
    folder of event files under OUTPUT_DIR/runs (it opened its writer in on_train_begin, before ours ran)."""
    if os.getenv("TENSORBOARD_LOGGING_DIR"):
        return os.path.expanduser(os.environ["TENSORBOARD_LOGGING_DIR"])
    runs = Path(args.output_dir) / "runs"
    folders = [p for p in runs.glob("*") if p.is_dir() and any(p.glob("events.out.tfevents.*"))]
    if folders:
        return str(max(folders, key=lambda p: p.stat().st_mtime))
    from transformers.integrations.integration_utils import default_logdir

    return os.path.join(args.output_dir, default_logdir())


def _encode(state: dict) -> str:
    """The watch's state (tensors among it: the probe batch) as text trainer_state.json can hold."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _decode(text: str) -> dict:
    """The state ``_encode`` wrote, read as data only (``weights_only``): a checkpoint folder is a file a user
    hands in, and a pickled object in it is refused, never run."""
    try:
        return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True, map_location="cpu")
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ConfigError(f"the checkpoint's WatchCallback state (trainer_state.json) is not plain data a watch wrote "
                          f"({reason}); it is not read: resume from a checkpoint this version wrote, or remove "
                          "the WatchCallback entry of its stateful_callbacks to start the watch afresh") from None


class WatchCallback(Attached, TrainerCallback, ExportableState):
    """A ``TrainerCallback`` that runs a ``Watch`` (same arguments) and reports to the run's integrations.

    ``report=False`` leaves the integrations alone (the numbers go to ``sinks`` only)."""

    takes_records = False

    def __init__(self, *args, report: bool = True, **options):
        super().__init__(*args, **options)
        check_flag("report", report)
        self.report = report
        self._relay: list = []
        self._pending: tuple[int, dict[str, float]] | None = None
        self._baseline: tuple[int, dict[str, float]] | None = None  # the baseline record, not yet relayed

    def state(self) -> dict:
        """For the Trainer's checkpoint (``ExportableState``): the watch's state, readable only by a
        ``WatchCallback`` of the resumed run; its options are the resumed run's own."""
        return {"args": {}, "attributes": {"watch_state": _encode(self.state_dict())}}

    def _resume(self, args, state) -> None:
        """A run resumed from a checkpoint: the watch's state as the checkpoint's trainer_state.json kept it."""
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        saved = saved[0] if isinstance(saved, list) else saved  # one watch per Trainer
        text = (saved or {}).get("attributes", {}).get("watch_state")
        if not text or self.watch is not None or not state.global_step:
            return
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            raise ConfigError("restore_callback_states_from_checkpoint makes a WatchCallback without your options; "
                              "leave it off: the WatchCallback restores its own state on resume")
        self.load_state_dict(_decode(text))

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._resume(args, state)
        self.start(model, state.global_step, optimizer=optimizer)
        if self.report and state.is_world_process_zero:
            self._relay = self._integrations(args)

    def _integrations(self, args) -> list:
        from transformers.integrations import TensorBoardCallback, get_reporting_integration_callbacks

        copies = [cls() for cls in get_reporting_integration_callbacks(args.report_to)]
        for cb in copies:
            if isinstance(cb, TensorBoardCallback) and getattr(cb, "logging_dir", "") is None:  # older: args.logging_dir
                cb.logging_dir = _tensorboard_dir(args)
        return copies

    def on_step_end(self, args, state, control, **kwargs):
        numbers = self.after_step(state.global_step)
        self._baseline = self._baseline or self.take_baseline()
        if numbers is not None:
            self._pending = (state.global_step, numbers)
            control.should_log = True  # the loss is logged at the probe's step too
        if self.should_stop:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        self._relay_baseline(args, state, control, model=model, **kwargs)
        if self._pending is None or self._pending[0] != state.global_step:
            return
        numbers, self._pending = dict(self._pending[1]), None
        for cb in list(self._relay):
            self._relayed(cb, "on_log", args, state, control, logs=dict(numbers), model=model, **kwargs)

    def _relay_baseline(self, args, state, control, **kwargs) -> None:
        """The baseline record to every integration at its own step (0 in a fresh run), with the first log
        after it was written (or at the end of a run that logged nothing after it)."""
        if self._baseline is None:
            return
        (at, numbers), self._baseline = self._baseline, None
        at_state = dataclasses.replace(state, global_step=at)
        for cb in list(self._relay):
            self._relayed(cb, "on_log", args, at_state, control, logs=dict(numbers), **kwargs)

    def _relayed(self, cb, event: str, *args, **kwargs) -> None:
        """One event to one integration copy; one that fails (a full disk) is said once and relayed no more:
        the run and the watch's own sinks go on."""
        try:
            getattr(cb, event)(*args, **kwargs)
        except Exception as e:
            self._relay.remove(cb)
            LOGGER.warning(f"the watch's copy of {type(cb).__name__} failed in {event} ({type(e).__name__}: {e}); "
                           "the watch's numbers go to it no more, and training goes on")

    def on_train_end(self, args, state, control, **kwargs):
        try:
            self._relay_baseline(args, state, control, model=kwargs.get("model"))
            for cb in list(self._relay):
                self._relayed(cb, "on_train_end", args, state, control, **kwargs)  # TensorBoard's closes its writer
        finally:
            self._relay = []
            self.finish()
