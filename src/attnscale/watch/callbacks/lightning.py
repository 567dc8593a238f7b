"""``WatchCallback``: the watch as a Lightning ``Callback`` (the ``lightning`` package).

    trainer = lightning.Trainer(..., logger=[TensorBoardLogger("tb"), CSVLogger("csv")],
                                callbacks=[WatchCallback(every=100)])

After each optimizer step (``on_train_batch_end`` once ``trainer.global_step`` has
moved, so gradient accumulation's batches without a step do not count) it runs
the watch; at a probe step its numbers go to every logger of the run
(``trainer.loggers``: TensorBoard, CSV, W&B, MLflow, ...) with ``log_metrics`` at
that global step k. Lightning logs the loss of batch k + 1 at step k, so the two
numbers at one step come from the same weights. The keys are the watch's
own (``attn/layer_{l}/head_{h}/{measure}``, ``attn/max_score``, ...). Loggers
write on rank 0 only, as Lightning's own logging does.

The probe is the first batch the LightningModule's ``forward`` takes (``self(x)``
in ``training_step``, Lightning's idiom), caught as ``Watch`` catches it; a module
whose ``training_step`` never calls its own forward must be given ``probe=``, a
batch its ``forward`` takes (it says so at the first step otherwise). With
``in_training_forward=True`` the numbers come from that ``forward`` in the probe
step's training batches (every accumulated batch of the step), with no extra one.

An alert whose action is "stop" sets ``trainer.should_stop``: the fit ends after
that batch; an alert's ``ScaleLR`` or ``SkipStep`` acts on the run's optimizer (``watch/actions.py``;
a skipped step still runs Lightning's closure: the forward and backward, no update). The watch's
state (alerts said, actions taken and in force, the probe batch) goes into Lightning's checkpoint
(``state_dict``) and is handed back to the Watch of a fit resumed with ``ckpt_path``. ``qk_clip=tau`` QK-Clips every head after each optimizer step
(``qk_clip.py``); its per-head gamma reaches the loggers with the probes. lightning loads with this module, never with ``attnscale.watch``.
"""

from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError("attnscale.watch.callbacks.lightning needs lightning; install the extra from the clone: pip install -e '.[watch]'") from None

from attnscale.capture.options import check_flag
from attnscale.errors import ConfigError
from attnscale.watch.callbacks.attach import Attached

__all__ = ["WatchCallback"]


class WatchCallback(Attached, Callback):
    """A Lightning ``Callback`` that runs a ``Watch`` (same arguments) and logs through the run's loggers.

    ``report=False`` leaves the loggers alone (the numbers go to ``sinks`` only)."""

    takes_records = False

    def __init__(self, *args, report: bool = True, **options):
        super().__init__(*args, **options)
        check_flag("report", report)
        self.report = report
        self._last_step: int | None = None

    def on_train_start(self, trainer, pl_module):
        optimizers = trainer.optimizers
        acting = next((a.action for a in self.options["alerts"] or () if getattr(a.action, "needs_optimizer", False)),
                      None)
        if acting is not None and len(optimizers) != 1:  # which one it would act on is not ours to guess
            raise ConfigError(f"an alert's {type(acting).__name__} acts on the fit's optimizer, and this fit has "
                              f"{len(optimizers)}; give that alert another action, or fit with one optimizer")
        self.start(pl_module, trainer.global_step, optimizer=optimizers[0] if len(optimizers) == 1 else None)
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:  # no optimizer step in this batch (gradient accumulation)
            return
        self._last_step = step
        numbers = self.after_step(step)
        for given in (self.take_baseline(), None if numbers is None else (step, numbers)) if self.report else ():
            if given is not None:  # the baseline record first, at its own step (0 in a fresh fit)
                for logger in trainer.loggers:
                    logger.log_metrics(given[1], step=given[0])
        if self.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        self.finish()

    def on_exception(self, trainer, pl_module, exception):
        self.finish()  # the sinks keep every probe made before the error
