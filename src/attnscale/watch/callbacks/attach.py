"""``Attached``: what every framework's callback does with a ``Watch``, whatever the framework.

The Hugging Face callback (``hf.py``) and the Lightning callback (``lightning.py``)
each translate their framework's events into these four calls, and only that:

    start(model, step, optimizer) when training begins: the Watch is made on the model being trained
    after_step(step)  after each optimizer step: QK-Clip (if on), then a probe at its cadence
    should_stop       an alert whose action is "stop" has fired
    finish()          when training ends: the sinks are flushed and closed

Their options are ``Watch``'s, checked when the callback is made, so a bad option
fails at the line that wrote it, not minutes later inside ``fit``/``train``; the probe
is tried on the model when training begins (a given ``probe=``) or on the first batch,
before its forward runs, so a probe the model cannot take ends the run before step 1.

``state_dict``/``load_state_dict``: the Watch's state (``Watch.state_dict``) for a framework's checkpoint;
one loaded before training begins is handed to the Watch when ``start`` makes it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from attnscale.capture.probe import unwrap
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError
from attnscale.watch.actions import ClipQK
from attnscale.watch.alerts import Alert
from attnscale.watch.loop import EVERY, PROBE_SEQUENCES, Watch
from attnscale.watch.logs.sinks import Sink, scalars

__all__ = ["RECORDS", "Attached"]

# ``Attached(probe=RECORDS)``: under attnscale's own ``train()``, probe the sequence the run's records measure.
RECORDS = "records"


class Attached:
    """A ``Watch`` made when training starts, driven by a framework's events; same options as ``Watch``.
    ``latest``: the last probe, as (step, its flat numbers), or None before the first.

    ``probe="records"`` (``RECORDS``), under attnscale's own ``lm.train.train`` only: at each probe step after
    the first update the probe is the first ``record_sequences`` sequences of that step's batch, with the weights
    after that step's update: what the run's record of that step measures. In float32 (``dtype="fp32"``, as the
    act study trains) these are the very numbers the record holds (to float32's summation order, under 1e-6), so
    an alarm reads what the published series holds; under bf16 autocast the record's forward ran its q·k in
    bfloat16 and the probe runs in float32, and they differ by bfloat16's rounding (3.8e-3 to 5.4e-3 relative in
    max |score| on a two-layer tiny LM). The baseline at step 0 is the watch's own probe of the first batch (its
    ``probe_sequences``), the record's only where ``record_sequences`` is as many. ``every`` must be a multiple of
    the run's ``record_every``. A framework's callback refuses it."""

    takes_records = True  # the framework callbacks have no record steps to probe

    def __init__(self, every: int = EVERY, probe: Any = None, sinks: Sequence[Sink] = (),
                 alerts: Sequence[Alert] | None = None, threshold: float = FROZEN_THRESHOLD, *,
                 probe_sequences: int = PROBE_SEQUENCES, capture: str = "auto", adapter: Callable | None = None,
                 drop_keys: Sequence[str] = ("labels",), qk_clip: float | None = None, memory: int = DEFAULT_MEMORY,
                 sample_rows: int | None = None, detail: str = "heads", in_training_forward: bool = False,
                 stage: int | None = None, layer_offset: int | None = None, tensor_parallel=None,
                 on_error: str = "warn", resume_actions: str = "same", qk_clip_check: bool = False):
        self.probe_records = isinstance(probe, str) and probe == RECORDS
        if self.probe_records and not type(self).takes_records:
            raise ConfigError(f"probe='records' is for attnscale's train() (its record steps); a {type(self).__name__} "
                              "takes a probe batch, or probe=None for the first batch it sees")
        if self.probe_records and in_training_forward:
            raise ConfigError("probe='records' probes the records' sequence after the step; in_training_forward=True "
                              "measures the step's own forward instead: choose one")
        self.options = dict(every=every, probe=None if self.probe_records else probe, sinks=sinks, alerts=alerts, threshold=threshold,
                            probe_sequences=probe_sequences, capture=capture, adapter=adapter, drop_keys=drop_keys,
                            qk_clip=qk_clip, memory=memory, sample_rows=sample_rows, detail=detail,
                            in_training_forward=in_training_forward, stage=stage, layer_offset=layer_offset,
                            tensor_parallel=tensor_parallel, on_error=on_error, resume_actions=resume_actions,
                            qk_clip_check=qk_clip_check)
        Watch.check(**self.options)  # a bad option fails here, not at train()
        self.watch: Watch | None = None
        self.latest: tuple[int, dict[str, float]] | None = None
        self._baseline_given = False
        self._state: dict | None = None  # loaded before the Watch was made

    def start(self, model, step: int = 0, optimizer=None) -> Watch:
        """The run's Watch, made on ``model`` the first time; a second fit of the same model goes on (in a Watch
        made again, its sinks reopened, where the first fit's ended), and another model is refused: a watch follows
        one model. ``step``: the optimizer steps already taken (a resumed run's), so the next is ``step + 1``;
        ``optimizer``: the run's, which an alert's ScaleLR or SkipStep acts on."""
        if self.watch is not None and unwrap(self.watch.model) is not unwrap(model):
            name = type(self).__name__
            raise ConfigError(f"this {name} already followed {type(unwrap(self.watch.model)).__name__}; a watch "
                              f"follows one model: give each model its own {name}(...)")
        if self.watch is not None and self.watch.closed:  # its alerts and actions go on in the new Watch
            for sink in self.options["sinks"]:
                sink.reopen()
            self._state, self.watch = self.watch.state_dict(), None
        if self.watch is None:
            self.watch = Watch(model, **self.options, optimizer=optimizer)
            if self._state is not None:
                self.watch.load_state_dict(self._state)
                self._state = None
        self.watch.expect(step + 1)
        return self.watch

    @property
    def actions(self) -> list[dict]:
        """The actions the alerts took (``Watch.actions``), restored ones included."""
        return list(self.watch.actions) if self.watch is not None else list((self._state or {}).get("actions", []))

    def state_dict(self) -> dict:
        """The Watch's state (``Watch.state_dict``), or the one loaded and not yet handed to it; {} before both."""
        return self.watch.state_dict() if self.watch is not None else dict(self._state or {})

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.watch is not None:
            self.watch.load_state_dict(state)
        else:
            self._state = state

    def after_step(self, step: int) -> dict[str, float] | None:
        """``Watch.step``: the numbers of a probe step (kept as ``latest``), else None."""
        numbers = self.watch.step(step)
        if numbers is not None:
            self.latest = (step, numbers)
        return numbers

    def take_baseline(self) -> tuple[int, dict[str, float]] | None:
        """The baseline record (``Watch.baseline``, the first probe's, at step 0 of a fresh run) as (its step, its
        flat numbers), the first time it is asked once written, else None: the callbacks hand it to the
        framework's loggers at its own step."""
        line = None if self.watch is None or self._baseline_given else self.watch.baseline
        if line is None:
            return None
        self._baseline_given = True
        return line.step, scalars(line, self.watch.detail)

    @property
    def should_stop(self) -> bool:
        return self.watch is not None and self.watch.should_stop

    @property
    def clips(self) -> bool:
        """Whether the watch may QK-Clip the model: ``qk_clip=`` or an alert's ``ClipQK``."""
        return self.options["qk_clip"] is not None or any(isinstance(a.action, ClipQK)
                                                          for a in self.options["alerts"] or ())

    def finish(self) -> None:
        if self.watch is not None:
            self.watch.close()
