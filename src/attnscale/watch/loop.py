"""``Watch``: attention health inside a plain PyTorch training loop.

    watch = Watch(model, sinks=[JsonlSink("watch.jsonl"), TensorBoardSink("tb")])
    for step, batch in enumerate(loader, 1):
        loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
        watch.step(step)            # measures every ``every`` steps; None otherwise
        if watch.should_stop:       # an alert with action "stop" fired
            break
    watch.close()

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
from attnscale.capture.probe import Inputs, first_sequences, measure_heads, stats_of
from attnscale.capture.ranks import TensorParallel
from attnscale.capture.reduce import DEFAULT_MEMORY
from attnscale.capture.route import Route
from attnscale.capture.stats import HeadStats
from attnscale.core.diagnostics import FROZEN_THRESHOLD
from attnscale.errors import ConfigError
from attnscale.watch.alerts import Alert, Alerts, default_alerts
from attnscale.watch.clip.qk_clip import QKClip, check_tau
from attnscale.watch.in_training import TrainingForward
from attnscale.watch.logs.detail import check_detail
from attnscale.watch.logs.line import WatchLine
from attnscale.watch.logs.sinks import Sink, scalars
from attnscale.watch.stages import check_stage, union_of_stages

__all__ = ["Watch", "EVERY", "PROBE_SEQUENCES"]

EVERY = 100
PROBE_SEQUENCES = 4


class Watch:
    """Measures every head of ``model`` every ``every`` steps; see the module docstring.

    ``alerts``: a sequence of ``Alert`` (default ``default_alerts()``, all warning);
    ``sinks``: where records go; ``threshold``: a row's max weight above which it is
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
    index, in the probe, in the training forward and in QK-Clip (``capture.ranks``)."""

    def __init__(self, model: torch.nn.Module, every: int = EVERY, probe: Any = None, sinks: Sequence[Sink] = (),
                 alerts: Sequence[Alert] | None = None, threshold: float = FROZEN_THRESHOLD, *,
                 probe_sequences: int = PROBE_SEQUENCES, capture: str = "auto", adapter: Callable | None = None,
                 drop_keys: Sequence[str] = ("labels",), qk_clip: float | None = None, memory: int = DEFAULT_MEMORY,
                 sample_rows: int | None = None, detail: str = "heads", in_training_forward: bool = False,
                 stage: int | None = None, layer_offset: int | None = None,
                 tensor_parallel: TensorParallel | None = None):
        self.check(every, threshold, probe_sequences, qk_clip, memory, sample_rows, detail=detail,
                   in_training_forward=in_training_forward, stage=stage, layer_offset=layer_offset, probe=probe,
                   tensor_parallel=tensor_parallel)
        self.memory, self.sample_rows, self.route, self.tensor_parallel = memory, sample_rows, Route(), tensor_parallel
        self.model, self.every, self.threshold, self.detail = model, every, threshold, detail
        self.sinks = list(sinks)
        for sink in self.sinks:  # a sink made without a detail writes the watch's
            if getattr(sink, "detail", "") is None:
                sink.detail = detail
        self.alerts = Alerts(default_alerts() if alerts is None else alerts)
        self.probe_sequences, self.capture, self.adapter = probe_sequences, capture, adapter
        self.drop_keys = tuple(drop_keys)
        self.probe = None if probe is None else first_sequences(probe, probe_sequences)
        self.stage, self.layer_offset = stage, layer_offset
        self.seconds = 0.0  # the watch's own time: probes, alerts and sinks
        self._started: float | None = None
        self.training = (TrainingForward(model, threshold, capture, adapter, memory, sample_rows, self.route)
                         if in_training_forward else None)
        catch = self.probe is None and self.training is None
        self._hook = model.register_forward_pre_hook(self._catch, with_kwargs=True) if catch else None
        self.clip = None if qk_clip is None else QKClip(model, qk_clip, capture, adapter, memory, tensor_parallel)
        self._closed = False
        self.expect(1)

    @staticmethod
    def check(every: int, threshold: float, probe_sequences: int, qk_clip: float | None = None,
              memory: int = DEFAULT_MEMORY, sample_rows: int | None = None, *, detail: str = "heads",
              in_training_forward: bool = False, stage: int | None = None, layer_offset: int | None = None,
              probe: Any = None, tensor_parallel: Any = None) -> None:
        """Raise ValueError naming the option, for options no watch can run with."""
        if tensor_parallel is not None and not isinstance(tensor_parallel, TensorParallel):
            raise ValueError(f"tensor_parallel takes an attnscale.watch.TensorParallel, got {type(tensor_parallel).__name__}")
        if qk_clip is not None:
            check_tau(qk_clip)
        for name, value in (("every", every), ("probe_sequences", probe_sequences), ("memory", memory)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} takes a positive integer, got {value!r}")
        if sample_rows is not None and (not isinstance(sample_rows, int) or isinstance(sample_rows, bool) or sample_rows < 2):
            raise ValueError(f"sample_rows takes an integer of at least 2 (None: every row), got {sample_rows!r}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold takes a number between 0 and 1, got {threshold!r}")
        check_detail(detail)
        if not isinstance(in_training_forward, bool):
            raise ValueError(f"in_training_forward takes True or False, got {in_training_forward!r}")
        if in_training_forward and probe is not None:
            raise ValueError("in_training_forward=True measures the training forward's own batches: give no probe=")
        check_stage(stage, layer_offset, in_training_forward)

    @property
    def should_stop(self) -> bool:
        """True once an alert whose action is "stop" has fired."""
        return self.alerts.should_stop

    @torch.compiler.disable  # a compiled model's first call: the batch is kept outside the graph
    def _catch(self, module, args, kwargs):
        """Forward pre-hook: keep the first batch as the probe, as the model was given it (positional and
        keyword arguments, so a padding mask stays with its ids), then remove the hook."""
        kept = {k: v for k, v in kwargs.items() if k not in self.drop_keys}
        batch = args[0] if len(args) == 1 and not kept and torch.is_tensor(args[0]) else Inputs(tuple(args), kept)
        self.probe = first_sequences(batch, self.probe_sequences)
        self._hook.remove()
        self._hook = None

    def expect(self, step: int) -> None:
        """The next ``step`` call will be for ``step``: with ``in_training_forward``, arm the capture of its
        forwards if it is a probe step, else disarm it. ``step`` does this for the step after its own, the Watch
        for step 1; a loop that resumes at step s calls ``expect(s + 1)`` before its first forward."""
        if self.training is None:
            return
        if step % self.every == 0:
            self.training.arm()
        elif self.training.armed:
            self.training.take()  # forwards of no probe step: dropped

    def step(self, step: int) -> dict[str, float] | None:
        """Call after the optimizer step. With QK-Clip, clip every head the step's forward took past tau.
        At a probe step (a multiple of ``every``), measure, check the alerts, write the record to every
        sink and return its flat numbers (as ``detail`` says); else return None."""
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        if self.clip is not None:
            self.clip.step()
        measured = self._measure(step)
        if measured is None:
            if self.clip is not None:
                self.seconds += time.perf_counter() - now
            return None
        stats, probe, inside = measured
        writer = ranks.rank() == 0  # under DDP every rank probes, and rank 0 alone writes
        fired = self.alerts.check(stats, step, say=writer)
        seconds = time.perf_counter() - now + inside
        wall = time.perf_counter() - self._started
        record = WatchLine(
            step=step, time=time.time(), measures=tuple(stats.measures), values=stats.values_LMH.tolist(),
            rows=stats.rows_LH.tolist(), summary=stats.summary(), alerts=[f.to_json() for f in fired],
            watch={"seconds": seconds, "total_seconds": self.seconds + seconds,
                   "share": (self.seconds + seconds) / wall if wall > 0 else 0.0},
            probe=probe, threshold=self.threshold, qk_clip=self.clip.take() if self.clip else {},
            bias=stats.bias_LH2.tolist() if stats.bias_LH2 is not None else [])
        for sink in self.sinks if writer else ():
            sink.write(record)
        self.seconds += time.perf_counter() - now + inside  # sinks included: they are the watch's cost too
        return scalars(record, self.detail)

    def _measure(self, step: int) -> tuple[HeadStats, dict[str, int], float] | None:
        """At a probe step: (the numbers, what was measured, seconds spent inside the training forwards), else None."""
        if self.training is not None:
            due = step % self.every == 0
            taken = self.training.take() if due else None
            inside, self.training.seconds = self.training.seconds, 0.0
            self.expect(step + 1)
            return None if taken is None else (*self._in_training(step, *taken), inside)
        if step % self.every or self.probe is None:
            return None
        with self.clip.paused() if self.clip is not None else contextlib.nullcontext():  # a probe is no training step
            stats = measure_heads(self.model, self.probe, threshold=self.threshold, capture=self.capture,
                                  adapter=self.adapter, across_ranks=True, memory=self.memory,
                                  sample_rows=self.sample_rows, route=self.route, tensor_parallel=self.tensor_parallel)
        return stats, self._probe_shape(), 0.0

    def _in_training(self, step: int, sums: list, names: list[str], seen: dict[str, int]) -> tuple[HeadStats, dict]:
        """The training forwards' sums as the numbers of the whole model: every stage's layers under pipeline
        parallelism, every rank's batches under data parallelism."""
        model = type(self.training.model).__name__
        if not seen["forwards"]:
            raise ConfigError(f"the watch saw no training forward of {model}.forward before step {step} "
                              "(in_training_forward measures the forwards of the model it was given, in train mode "
                              "with gradients on); call that model in the step, or leave in_training_forward off")
        if self.stage is not None:
            sums, names = union_of_stages(sums, names, self.stage, self.layer_offset, self.threshold)
        elif sums:
            ranks.reduce_sums(sums, names, self.tensor_parallel)
        if not sums:
            raise ConfigError(f"no attention call of {model} was seen in its training forward before step {step} "
                              f"(capture {self.capture!r}; a torch.compile'd submodule hides its calls); see "
                              "attnscale.capture.route for what can be read")
        shape = dict(seen)
        return stats_of(sums, names, self.sample_rows), shape if self.sample_rows is None else {
            **shape, "sampled_rows": self.sample_rows}

    def _probe_shape(self) -> dict[str, int]:
        p = self.probe
        values = ([p] if torch.is_tensor(p) else list(p.args) + list(p.kwargs.values()) if isinstance(p, Inputs)
                  else list(p.values()) if isinstance(p, dict) else list(p))
        ids = next((v for v in values if torch.is_tensor(v) and v.ndim >= 2), None)
        shape = {} if ids is None else {"sequences": int(ids.shape[0]), "tokens": int(ids.shape[1])}
        return shape if self.sample_rows is None else {**shape, "sampled_rows": self.sample_rows}

    def close(self) -> None:
        """Flush and close every sink and remove the probe hook; closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.training is not None:
            self.training.close()
        if self.clip is not None:
            self.clip.close()
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
