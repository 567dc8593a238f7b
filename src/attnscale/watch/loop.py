"""``Watch``: attention health inside a plain PyTorch training loop.

    watch = Watch(model, sinks=[JsonlSink("watch.jsonl"), TensorBoardSink("tb")])
    for step, batch in enumerate(loader, 1):
        loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
        watch.step(step)            # measures every ``every`` steps; None otherwise
        if watch.should_stop:       # an alert with action "stop" fired
            break
    watch.close()

Every option is checked when the Watch is made (``capture.options``), and the probe is tried on the
model once before training goes on, so a mistake is one ``ConfigError`` before step 1 (step 1 where the
batch is only known then), never at step ``every``. A probe that fails later never ends the run unless
``on_error="raise"``: it is said once and the watch tries again next time ("warn") or measures no more ("stop").

Every ``every`` steps it runs ``measure_heads`` on a fixed probe batch: one forward
under ``torch.no_grad`` in fp32, the model's train/eval mode put back after, so
training never sees it. The probe is ``probe`` if given, else the first batch the
model sees, caught by a forward pre-hook that removes itself once it has one, cut
to ``probe_sequences`` sequences (a few suffice: the measures are means over rows).
A fixed probe makes the steps comparable: what changes is the model, not the text.

``in_training_forward=True`` measures in the probe step's own training forward instead
(``in_training.py``): no extra forward, the training precision and mode, every forward of
the step counted (gradient accumulation's too), and no probe batch. That is also how a
pipeline-parallel run is watched: ``stage=`` (and ``layer_offset=``) on each stage's
Watch, each stage measuring its own layers, and the record holds every stage's
(``stages.py``).

Under DDP (any ``torch.distributed`` process group) make a Watch on every rank:
each probes its own batch, the numbers are those of all the ranks' probes together
(one collective per probe step, ``capture/ranks.py``), and only rank 0 writes to its
sinks and says its alerts; a stop stops every rank at the same step.

Why every 100 steps by default: one probe costs about one forward of
``probe_sequences`` sequences, a few percent of a training step of a usual batch,
so 1 in 100 keeps the watch under 1% of training time; ``benchmarks/watch_overhead.py``
measures it, and the watch writes its own cost in every record (``watch/seconds``,
``watch/share``: its time over the wall time since it started).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Sequence

import torch

from attnscale.capture import ranks
from attnscale.capture.batch import batch_shape
from attnscale.capture.options import EVERY, PROBE_SEQUENCES, WatchOptions, check_batch, check_model
from attnscale.capture.probe import Inputs, first_sequences, forward, measure_heads, probing, stats_of, unwrap
from attnscale.capture.ranks import TensorParallel
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.route import Route
from attnscale.capture.stats import HeadStats
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError
from attnscale.watch.actions import Acting, ClipQK
from attnscale.watch.alerts import LOGGER, Alert, Alerts, default_alerts
from attnscale.watch.arguments import check_clip_check, clip_fights, one_line, outputs, step_number
from attnscale.watch.clip.qk_clip import QKClip
from attnscale.watch.in_training import TrainingForward, training_forward
from attnscale.watch.logs.line import WatchLine
from attnscale.watch.logs.sinks import Sink, scalars
from attnscale.watch.logs.writing import Writing
from attnscale.watch.stages import union_of_stages
from attnscale.watch.state import check_resume_actions, plain_probe, plan_of, probe_like, probe_of, resumes

__all__ = ["Watch", "EVERY", "PROBE_SEQUENCES"]


class Watch:
    """Measures every head of ``model`` every ``every`` steps; see the module docstring.

    ``alerts``: a sequence of ``Alert`` (default ``default_alerts()``, all warning);
    ``sinks``: a sequence of ``Sink`` where records go; ``threshold``: a row's max weight above which it is
    frozen; ``capture`` and ``adapter``: how q and k are read (``measure_heads``).
    ``drop_keys``: keys of a caught dict batch that the probe leaves out (labels make an
    HF model compute a loss the probe does not need). ``qk_clip``: tau, to QK-Clip every head
    after each step (``clip/qk_clip.py``; off by default); ``step`` must then be called every step.
    ``memory``: the bytes a block of one call's scores may take, in a probe and in QK-Clip
    (``capture.reduce``, default 256 MiB); ``sample_rows``: probe that many query rows of each sequence
    (None: every row), for long contexts, with each row measure's standard error. ``detail``: "heads"
    (default), "layers" or "summary", how much of each record ``step`` returns and the sinks made without a
    ``detail`` of their own write (``logs/detail.py``; the JSONL log keeps every head).
    ``in_training_forward``: measure in the probe step's own training forwards, not in an extra forward of
    a probe batch (``in_training.py``; ``probe`` and ``probe_sequences`` then have no use). ``stage``: this
    rank's pipeline stage (0 first), for pipeline parallelism, with ``in_training_forward``; ``layer_offset``:
    the global index of the stage's first layer (None: stages in order of ``stage``; ``stages.py``).
    ``tensor_parallel`` (``TensorParallel``): heads split over the ranks of a group, each read under its global
    index, in the probe, in the training forward and in QK-Clip (``capture.ranks``).

    Every option is checked when the Watch is made (``capture.options``), and the probe is tried on the model
    once before the first training step (at once if ``probe`` is given, else on the first batch caught, before
    that forward runs; under a process group, at the first ``step``): a mistake is a ``ConfigError`` then,
    never at step ``every``. ``on_error``: what a probe that fails later, during training, does: "warn"
    (default: say it once on the ``attnscale.watch`` logger and try again at the next probe step), "stop" (say
    it and measure no more) or "raise". Training goes on in the first two; ``failures`` lists (step, reason).
    Under a process group, a probe that fails on some ranks only leaves the others waiting in the probe's
    collective until its timeout: ``on_error`` acts on each rank's own failures and cannot prevent that.

    ``optimizer``: the run's optimizer, which an alert's ``ScaleLR`` or ``SkipStep`` acts on (``actions.py``);
    each action taken is a record in ``actions`` and in its probe step's record (``WatchLine.actions``).
    ``state_dict``/``load_state_dict``: the alerts' and actions' state and the probe batch, for a resumed run,
    which must have the alerts and actions (their every option) the run started with, or say
    ``resume_actions="new"`` to end the old ones and take its own (``state.py``)."""

    def __init__(self, model: torch.nn.Module, every: int = EVERY, probe: Any = None, sinks: Sequence[Sink] = (),
                 alerts: Sequence[Alert] | None = None, threshold: float = FROZEN_THRESHOLD, *,
                 probe_sequences: int = PROBE_SEQUENCES, capture: str = "auto", adapter: Callable | None = None,
                 drop_keys: Sequence[str] = ("labels",), qk_clip: float | None = None, memory: int = DEFAULT_MEMORY,
                 sample_rows: int | None = None, detail: str = "heads", in_training_forward: bool = False,
                 stage: int | None = None, layer_offset: int | None = None,
                 tensor_parallel: TensorParallel | None = None, on_error: str = "warn", optimizer: Any = None,
                 resume_actions: str = "same", qk_clip_check: bool = False):
        check_model(model, "Watch")
        check_clip_check(qk_clip_check, qk_clip, alerts)
        check_resume_actions(resume_actions)
        self.resume_actions = resume_actions
        self.options = WatchOptions(
            every=every, threshold=threshold, probe_sequences=probe_sequences, capture=capture, adapter=adapter,
            drop_keys=tuple(drop_keys) if isinstance(drop_keys, (list, tuple)) else drop_keys, qk_clip=qk_clip,
            memory=memory, sample_rows=sample_rows, detail=detail, in_training_forward=in_training_forward,
            stage=stage, layer_offset=layer_offset, tensor_parallel=tensor_parallel, on_error=on_error, probe=probe)
        sinks, alerts = outputs(sinks, alerts)
        self.writing = Writing(sinks)  # rank 0's records to its sinks, a failing sink said and counted
        self.sinks = self.writing.sinks
        self.memory, self.sample_rows, self.route, self.tensor_parallel = memory, sample_rows, Route(), tensor_parallel
        self.model, self.every, self.threshold, self.detail, self.on_error = model, every, threshold, detail, on_error
        for sink in self.sinks:  # a sink made without a detail writes the watch's
            if getattr(sink, "detail", "") is None:
                sink.detail = detail
        self.alerts = Alerts(default_alerts() if alerts is None else alerts)
        self.plan = plan_of(self.alerts.alerts, qk_clip)  # what a resumed run must keep (``state.py``)
        self._check_actions(optimizer, qk_clip)
        self.acting = Acting(optimizer)
        self.actions: list[dict] = []  # every action taken: {"step", "action", "alert", "layer", "head", "value", ...}
        self.clip_since: int | None = None  # the first step a ClipQK action clipped
        self.probe_sequences, self.capture, self.adapter = probe_sequences, capture, adapter
        self.drop_keys = self.options.drop_keys
        self.stage, self.layer_offset = stage, layer_offset
        self.seconds = 0.0  # the watch's own time: probes, alerts and sinks
        self.failures: list[tuple[int, str]] = []  # (step, reason) of each probe that failed during training
        self.measuring = True  # False once a failed probe stopped the watch (on_error="stop")
        self._started = time.perf_counter()  # watch/share's wall clock: from the watch's making, its first probe in
        self._first: tuple | None = None  # the first probe not yet written: (stats, what it read, seconds, counted)
        self.baseline: WatchLine | None = None  # the first probe's record (step 0 for a fresh run), once written
        self._try_seconds = 0.0  # spent in _try, counted in ``seconds`` there
        self._resumed = False  # load_state_dict ran: the run's baseline is in its earlier log
        self._next = 1  # the step the next ``step`` call is for (``expect``)
        self.qk_clip_check = qk_clip_check
        self._step_batch: Inputs | None = None  # the last training forward's inputs, for qk_clip_check
        self._after: torch.Tensor | None = None  # qk_clip_check: each head's largest S_max after the clip, L×H
        self._batch_hook = (unwrap(model).register_forward_pre_hook(self._keep_batch, with_kwargs=True)
                            if qk_clip_check else None)
        self._tried = False  # the probe has run once on the model
        self._closed = False
        self.clip = None
        self.training = None
        self._hook = None
        self._saved_probe = None  # a resumed run's probe, put in the containers of the first batch caught
        self._reach = None  # with in_training_forward, an alert's ClipQK checked on the first training forward
        self.probe = None if probe is None else first_sequences(probe, probe_sequences)
        if self.probe is not None:
            self._try()
        self.training = (TrainingForward(model, threshold, capture, adapter, memory, sample_rows, self.route)
                         if in_training_forward else None)
        catch = self.probe is None and self.training is None
        self._hook = model.register_forward_pre_hook(self._catch, with_kwargs=True) if catch else None
        self.clip = None if qk_clip is None else QKClip(model, qk_clip, capture, adapter, memory, tensor_parallel)
        self._reach = self._clip_reach(model) if in_training_forward else None
        self.expect(1)

    def _clip_reach(self, model) -> QKClip | None:
        """For an alert's ClipQK, a QK-Clip that clips nothing, on for one forward: of the probe batch when the
        watch tries it, or the first training forward, and ``_reached`` looks for each layer's W_q and W_k rows there,
        so a model the clip cannot act on (a qk-norm) is refused before training, not at the step after the alarm."""
        clip = next((a.action for a in self.alerts.alerts if isinstance(a.action, ClipQK)), None)
        return None if clip is None else QKClip(model, clip.tau, self.options.capture, self.options.adapter,
                                                self.options.memory, self.options.tensor_parallel)

    def _reached(self, batch: Any = None) -> None:
        """``_clip_reach``'s check, after one forward of ``batch`` under the probe's conditions if given (apart
        from the probe's: its own capture hides a Hugging Face model's calls from any other), else on the first
        training forward."""
        reach = self._clip_reach(self.model) if batch is not None else self._reach
        if reach is None:
            return
        self._reach = None
        alert = next(a for a in self.alerts.alerts if isinstance(a.action, ClipQK))
        try:
            if batch is not None:
                with reach.checking(), probing(unwrap(self.model)):
                    forward(unwrap(self.model), batch)
            reach.reach()
        except ConfigError as e:
            raise ConfigError(f"{type(alert).__name__}'s action {alert.action!r} cannot act on "
                              f"{type(unwrap(self.model)).__name__}: {e}; give that alert another action (ScaleLR, "
                              "SkipStep, 'warn' or 'stop')") from None
        finally:
            reach.close()

    def _check_actions(self, optimizer, qk_clip) -> None:
        acts = [a.action for a in self.alerts.alerts]
        needs = next((type(a).__name__ for a in acts if getattr(a, "needs_optimizer", False)), None)
        if needs is not None and optimizer is None:
            raise ConfigError(f"an alert's {needs} acts on the optimizer: give the Watch optimizer= (the callbacks "
                              "and train() give theirs)")
        if qk_clip is not None and any(isinstance(a, ClipQK) for a in acts):
            raise ConfigError("qk_clip= clips from the first step and an alert's ClipQK from its alarm: give one")
        clip_fights(self.alerts.alerts, qk_clip)

    @staticmethod
    def check(every: int, threshold: float, probe_sequences: int, qk_clip: float | None = None,
              memory: int = DEFAULT_MEMORY, sample_rows: int | None = None, *, detail: str = "heads",
              in_training_forward: bool = False, stage: int | None = None, layer_offset: int | None = None,
              probe: Any = None, tensor_parallel: Any = None, sinks: Any = (), alerts: Any = None,
              capture: str = "auto", adapter: Any = None, drop_keys: Any = ("labels",),
              on_error: str = "warn", resume_actions: str = "same", qk_clip_check: bool = False) -> None:
        """A ConfigError naming the option, for options no watch can run with (``capture.options``, and the
        sinks and alerts of their kinds)."""
        WatchOptions(every=every, threshold=threshold, probe_sequences=probe_sequences, capture=capture,
                     adapter=adapter, drop_keys=tuple(drop_keys) if isinstance(drop_keys, (list, tuple)) else drop_keys,
                     qk_clip=qk_clip, memory=memory, sample_rows=sample_rows, detail=detail,
                     in_training_forward=in_training_forward, stage=stage, layer_offset=layer_offset,
                     tensor_parallel=tensor_parallel, on_error=on_error, probe=probe)
        outputs(sinks, alerts)
        check_resume_actions(resume_actions)
        check_clip_check(qk_clip_check, qk_clip, alerts)
        clip_fights(alerts, qk_clip)

    def _probe(self, across_ranks: bool, kinds: bool = False) -> HeadStats:
        with self.clip.paused() if self.clip is not None else contextlib.nullcontext():  # a probe is no training step
            return measure_heads(self.model, self.probe, threshold=self.threshold, capture=self.capture,
                                 adapter=self.adapter, across_ranks=across_ranks, memory=self.memory,
                                 sample_rows=self.sample_rows, route=self.route, tensor_parallel=self.tensor_parallel,
                                 head_kinds=kinds)

    def _try(self) -> None:
        """Run the probe on the model once, so that a probe the model cannot take, or a model whose attention
        cannot be read, is a ConfigError now, before training, not at step ``every``. Its time is the watch's
        (``seconds``) and its numbers the run's baseline record (``_write_baseline``)."""
        start = time.perf_counter()
        name = type(unwrap(self.model)).__name__
        check_batch(self.probe, unwrap(self.model))
        try:
            # no collective: ranks may try at different times; the baseline's heads marked sink or previous-token
            stats = self._probe(across_ranks=False, kinds=not self._resumed and self.tensor_parallel is None)
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"the watch's probe batch does not run on {name} ({one_line(e)}); give probe= a batch "
                              "its forward takes, or leave probe out to use the first training batch") from e
        if not bool((stats.rows_LH > 0).any()):  # e.g. a first call of one token: every head would measure nothing
            raise ConfigError(f"no query row of the watch's probe batch sees two keys ({self._probe_shape()} on "
                              f"{name}), so no head can be measured on it; give probe= a batch of sequences of two "
                              "tokens or more")
        self._reached(self.probe)
        self._tried = True
        seconds = time.perf_counter() - start
        self.seconds += seconds
        self._try_seconds += seconds
        if not self._resumed:
            self._first = (stats, self._probe_shape(), seconds, seconds)  # its seconds already in ``seconds``

    @property
    def should_stop(self) -> bool:
        """True once an alert whose action is "stop" has fired."""
        return self.alerts.should_stop

    @torch.compiler.disable  # a compiled model's first call: the batch is kept outside the graph
    def _catch(self, module, args, kwargs):
        """Forward pre-hook: keep the first batch as the probe, as the model was given it (positional and
        keyword arguments, so a padding mask stays with its ids), then remove the hook and try the probe
        before this first forward runs (in one process; under a process group ``step`` tries it)."""
        kept = {k: v for k, v in kwargs.items() if k not in self.drop_keys}
        batch = args[0] if len(args) == 1 and not kept and torch.is_tensor(args[0]) else Inputs(tuple(args), kept)
        self._hook.remove()
        self._hook = None
        self.probe = first_sequences(batch, self.probe_sequences)
        if self._saved_probe is not None:  # the run's first batch, not the resumed run's; the live batch's types
            self.probe, self._saved_probe = probe_like(self._saved_probe, self.probe), None
        if not ranks.active():
            self._try()

    def expect(self, step: int) -> None:
        """The next ``step`` call will be for ``step``: with ``in_training_forward``, arm the capture of its
        forwards if it is a probe step (or the first step, where the capture is tried), else disarm it. ``step``
        does this for the step after its own, the Watch for step 1; a loop that resumes at step s calls
        ``expect(s + 1)`` before its first forward."""
        step = step_number(step)
        self._next = step
        if self.training is None:
            return
        if self.measuring and (step % self.every == 0 or not self._tried):
            self.training.arm()
        elif self.training.armed:
            self.training.take()  # forwards of no probe step: dropped

    def step(self, step: int) -> dict[str, float] | None:
        """Call after the optimizer step. With QK-Clip, clip every head the step's forward took past tau.
        At a probe step (a multiple of ``every``), measure, check the alerts, write the record to every
        sink and return its flat numbers (as ``detail`` says); else return None. A probe that fails does as
        ``on_error`` says, once the probe has run on the model; the first try raises whatever it is. A sink that
        fails to write (a full disk) costs its records, never the run (``lost``; said at once and at ``close``)."""
        step = step_number(step)
        now = time.perf_counter()
        tried = self._try_seconds
        self._write_baseline()  # before this step's clip and record: the baseline is of the weights before it
        if self.clip is not None:
            self.clip.step()
            if self.qk_clip_check:
                self._check_after()
        inside = 0.0
        try:
            measured = self._measure(step) if self.measuring else None
            if measured is not None:
                inside = measured[2]
                record = self._record(step, *measured, now, counted=self._try_seconds - tried)
        except Exception as e:
            if not self._tried or self.on_error == "raise":
                raise
            self._failed(step, e)
            measured = None
        # sinks included: they are the watch's cost too; a first probe tried inside this call counted itself
        self.seconds += time.perf_counter() - now + inside - (self._try_seconds - tried)
        return None if measured is None else scalars(record, self.detail)

    def _keep_batch(self, module, args, kwargs) -> None:
        """qk_clip_check's forward pre-hook: the inputs of the step's (last) training forward, as the model took them."""
        if training_forward(module):
            self._step_batch = Inputs(tuple(args), {k: v for k, v in kwargs.items() if k not in self.drop_keys})

    def _check_after(self) -> None:
        """qk_clip_check: the step's last training batch once more, under the probe's conditions, with the weights
        as the update and then the clip left them: each head's S_max (its max_score), the largest since the last
        probe. The clip's promise is for the scores it read, before the update; this is what the next forward of
        that batch meets."""
        batch, self._step_batch = self._step_batch, None
        if batch is None:
            return
        with self.clip.paused():
            s_LH = measure_heads(self.model, batch, threshold=self.threshold, capture=self.capture, adapter=self.adapter,
                                 across_ranks=True, memory=self.memory, route=self.route,
                                 tensor_parallel=self.tensor_parallel).get("max_score")
        self._after = s_LH if self._after is None else torch.fmax(self._after, s_LH)

    def _write_baseline(self) -> None:
        """The first probe's record, once, before any later one: at the step the weights it read were at (0 in
        a fresh run, the weights before any update), its alerts checked (the first check: every relative
        alert's baseline), its ``watch.seconds`` the first probe's own time. A resumed run writes none: its
        baseline is in the log it goes on."""
        if self._first is None:
            return
        (stats, shape, seconds, counted), self._first = self._first, None
        self.baseline = self._record(self._next - 1, stats, shape, seconds, time.perf_counter(), counted=counted,
                                     act=False)

    def _record(self, step: int, stats: HeadStats, probe: dict[str, int], inside: float, now: float,
                counted: float = 0.0, act: bool = True) -> WatchLine:
        """The probe step's record, its alerts checked and said, written to every sink (rank 0's). ``counted``:
        seconds of ``inside`` or of this call already in ``seconds`` (a first probe's); ``act=False``: the
        baseline's, whose firings are said and recorded but act on nothing (``Alerts.check``)."""
        writer = ranks.rank() == 0  # under DDP every rank probes, and rank 0 alone writes
        fired = self.alerts.check(stats, step, say=writer, act=act)
        clipped = self.clip.take() if self.clip and act else {}  # a baseline's: no step of the clip yet
        if clipped and act and self._after is not None:  # qk_clip_check's, since the last probe
            clipped["s_max_after"], self._after = self._after.tolist(), None
        taken = [self._act(step, action, firing) for action, firing in self.alerts.due]
        seconds = time.perf_counter() - now + inside
        wall = time.perf_counter() - self._started
        record = WatchLine(
            step=step, time=time.time(), measures=tuple(stats.measures), values=stats.values_LMH.tolist(),
            rows=stats.rows_LH.tolist(), summary=stats.summary(), alerts=[f.to_json() for f in fired],
            watch={"seconds": seconds, "total_seconds": self.seconds + seconds - counted,
                   "share": (self.seconds + seconds - counted) / wall if wall > 0 else 0.0},
            probe={**probe, **({"methods": list(stats.layer_methods)} if stats.layer_methods else {}),
                   **({"lm_head": stats.lm_head} if stats.lm_head else {})},  # how the probe spared the LM head
            threshold=self.threshold, qk_clip=clipped,
            bias=stats.bias_LH2.tolist() if stats.bias_LH2 is not None else [], actions=taken,
            kinds=[list(layer) for layer in stats.kinds])
        if writer:
            self.writing.write(record)
        return record

    def _act(self, step: int, action, firing) -> dict:
        """Take ``action`` (its alert fired at probe step ``step``) from the next step on; its record."""
        if isinstance(action, ClipQK):
            if self.clip is None:
                self.clip = QKClip(self.model, action.tau, self.capture, self.adapter, self.memory,
                                   self.tensor_parallel)
                self.clip_since = step + 1
            self.clip.tau = min(self.clip.tau, float(action.tau))  # a second ClipQK: the tighter cap
        else:
            self.acting.take(action)
        taken = {"step": step, "action": action.name, "alert": firing.alert, "layer": firing.layer,
                 "head": firing.head, "value": firing.value, **action.to_json()}
        self.actions.append(taken)
        return taken

    def state_dict(self) -> dict:
        """What a resumed run needs to go on as this one would: the alerts' state, the actions taken and in force
        (the rate factors and skips left, the clip and its counts since the last probe), the probe batch and the
        plan (every alert's and action's configuration): tensors and plain data only (``state.py``)."""
        clip = None if self.clip is None else {  # qk_clip='s (since None) or a ClipQK's
            "tau": self.clip.tau, "since": self.clip_since, "clipped": sorted(self.clip._clipped),
            "told": sorted(self.clip._told), "counts": {k: [t.clone() for t in v] for k, v in self.clip._since.items()}}
        return {"alerts": self.alerts.state_dict(), "actions": [dict(a) for a in self.actions],
                "acting": self.acting.state_dict(), "clip": clip, "probe": plain_probe(self.probe),
                "measuring": self.measuring, "failures": [list(f) for f in self.failures], "plan": self.plan}

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state_dict``'s state, before the resumed run's first step: with the same plan, or with
        resume_actions="new" a plan of its own, what the checkpoint's had in force ended (``state.resumes``)."""
        same = resumes(state, self.plan, [a.name for a in self.alerts.alerts], self.resume_actions)
        if same:
            self.alerts.load_state_dict(state["alerts"])
        self.actions = [dict(a) for a in state["actions"]]  # taken in this run, whichever plan goes on
        if self.acting.optimizer is not None and same:
            self.acting.load_state_dict(state["acting"])
        clip = state.get("clip") if same else None
        if clip is not None and (self.clip is None) == (clip["since"] is not None):  # a ClipQK's, or qk_clip='s
            if self.clip is None:
                self.clip = QKClip(self.model, clip["tau"], self.capture, self.adapter, self.memory,
                                   self.tensor_parallel)
            self.clip.tau, self.clip_since = clip["tau"], clip["since"]
            self.clip._clipped, self.clip._told = set(clip["clipped"]), set(clip["told"])
            self.clip._since = {k: [t.clone() for t in v] for k, v in clip["counts"].items()}
        self._resumed, self._first = True, None  # the run's baseline record is in the log it goes on
        self.measuring, self.failures = bool(state["measuring"]), [tuple(f) for f in state["failures"]]
        if state["probe"] is not None and self.probe is None:
            if self._hook is not None:  # the run's first batch, in the containers of the one caught (``_catch``)
                self._saved_probe = probe_of(state["probe"])
            else:
                self.probe = probe_of(state["probe"])
                self._try()

    def _failed(self, step: int, e: Exception) -> None:
        """A probe that failed during training: said once per reason, and the watch goes on or stops measuring."""
        reason = one_line(e)
        said = any(r == reason for _, r in self.failures)
        self.failures.append((step, reason))
        if self.on_error == "stop":
            self.measuring = False
            if self.training is not None:
                self.training.take()
        if not said or self.on_error == "stop":
            then = ("it measures no more (on_error='stop'); training goes on" if self.on_error == "stop" else
                    "training goes on and the watch tries again at its next probe step (on_error='warn')")
            LOGGER.warning(f"the watch's probe failed at step {step} ({reason}); {then}")

    def _measure(self, step: int) -> tuple[HeadStats, dict[str, int], float] | None:
        """At a probe step: (the numbers, what was measured, seconds spent inside the training forwards), else None."""
        if self.training is not None:
            return self._measure_in_training(step)
        if self.probe is None:
            model = type(unwrap(self.model)).__name__
            raise ConfigError(f"the watch saw no call of {model}.forward before step {step}: it probes the first "
                              "batch that forward takes; give probe= a batch it takes (or call the model you gave "
                              "the watch)")
        if not self._tried:
            self._try()  # under a process group: every rank at the same step
            self._write_baseline()
        if step % self.every:
            return None
        return self._probe(across_ranks=True), self._probe_shape(), 0.0

    def _measure_in_training(self, step: int) -> tuple[HeadStats, dict[str, int], float] | None:
        """``_measure`` from the step's own forwards; the first step's are taken even off the cadence, to check
        once that the training forward can be read."""
        due = step % self.every == 0
        try:
            taken = self.training.take() if due or not self._tried else None
            inside, self.training.seconds = self.training.seconds, 0.0
            if taken is not None and self.training.failed is not None:
                raise self.training.failed  # an error inside a forward, kept there so that the forward went on
            first = not self._tried
            if first:
                self._check_seen(step, *taken)
                self._reached()
                self._tried = True
            measured = self._in_training(step, *taken) if due or first else None
            if first and not self._resumed:  # the first step's forward read the weights before any update
                self._first = (*measured, inside, 0.0)  # inside: counted by ``step`` once
                self._write_baseline()
        finally:
            self.expect(step + 1)
        return (*measured, inside) if due else None

    def _check_seen(self, step: int, sums: list, names: list[str], seen: dict[str, int]) -> None:
        model = type(self.training.model).__name__
        if not seen["forwards"]:
            raise ConfigError(f"the watch saw no training forward of {model}.forward before step {step} "
                              "(in_training_forward measures the forwards of the model it was given, in train mode "
                              "with gradients on); call that model in the step, or leave in_training_forward off")
        if not sums and self.stage is None:  # a pipeline stage may hold no attention layer of its own
            raise ConfigError(f"no attention call of {model} was seen in its training forward before step {step} "
                              f"(capture {self.capture!r}; a torch.compile'd submodule hides its calls); see "
                              "attnscale.capture.route for what can be read")

    def _in_training(self, step: int, sums: list, names: list[str], seen: dict[str, int]) -> tuple[HeadStats, dict]:
        """The training forwards' sums as the numbers of the whole model: every stage's layers under pipeline
        parallelism, every rank's batches under data parallelism."""
        self._check_seen(step, sums, names, seen)
        if self.stage is not None:
            sums, names = union_of_stages(sums, names, self.stage, self.layer_offset, self.threshold)
        elif sums:
            ranks.reduce_sums(sums, names, self.tensor_parallel)
        if not sums:
            model = type(self.training.model).__name__
            raise ConfigError(f"no attention call of any pipeline stage of {model} was seen before step {step} "
                              f"(capture {self.capture!r}); see attnscale.capture.route for what can be read")
        seen = dict(seen)
        methods = seen.pop("methods", ())  # per layer of this rank or stage: said only where the layers are its own
        return stats_of(sums, names, self.sample_rows, methods if self.stage is None else ()), self._sampled(seen)

    def _sampled(self, shape: dict[str, int]) -> dict[str, int]:
        """What a probe measured, with the query rows of each sequence really sampled: ``sample_rows`` or,
        where the sequences are shorter, all their rows."""
        if self.sample_rows is None:
            return shape
        tokens = shape.get("tokens")
        return {**shape, "sampled_rows": self.sample_rows if tokens is None else min(self.sample_rows, tokens)}

    def _probe_shape(self) -> dict[str, int]:
        shape = batch_shape(self.probe)
        return self._sampled({} if shape is None else {"sequences": shape[0], "tokens": shape[1]})

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and close every sink and remove the probe hook; closing twice does nothing. A sink that fails
        to close, or failed to write, is said once with the records it lost: nothing raises out of here (nor out
        of a ``with`` block), so a finished run keeps its results."""
        if self._closed:
            return
        self._write_baseline()  # a run that ended before its first step still has its baseline
        if self._batch_hook is not None:
            self._batch_hook.remove()
            self._batch_hook = None
        self._closed = True
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.training is not None:
            self.training.close()
        if self._reach is not None:
            self._reach.close()
        if self.clip is not None:
            self.clip.close()
        self.acting.close()
        self.writing.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
