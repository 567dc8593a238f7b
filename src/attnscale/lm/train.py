"""Training loop that records the attention diagnostics through the hooks.

``train(model_cfg, train_cfg, corpus)`` trains ``TinyLM`` with AdamW (or Muon beside it:
``lm.optimizers``), a linear
warm-up then a named decay (``train_config.SCHEDULES``: cosine, or warm-up-stable-decay), and
gradient clipping, and returns a plain dict. With ``eval_every`` the held-out
loss is also measured every that many steps (``results["evals"]``).
Every ``record_every`` steps (and at step 0, before any update) the forward
pass of the training step itself is recorded (``lm.step_measures``); the step-0
figures are therefore those of the freshly initialised model on a training
batch. The loop is a few named steps: ``build_run`` (device, precision, model,
optimiser), ``_resume`` (from a ``lm.checkpoint.Checkpoint``), ``train_step`` (one
update), ``_record_trained`` (the trained model's diagnostics), ``evaluate``
(``lm.evaluation``) and ``_results``.

A non-finite loss ends the run as "diverged" at that step and keeps what was
recorded; ``train`` never raises for it (a sweep must finish). In fp16 a step
whose gradients overflow is skipped by the gradient scaler and retried on the
next batch, moving neither the schedule nor the step count.

Determinism: batches come from a local ``torch.Generator`` seeded with
``seed``; the weights from ``torch.manual_seed(seed)`` inside ``train``.
Same config, same machine, same thread count -> the same numbers to the last digit.
Weights and batches are drawn on the CPU and moved to the device, so every
device starts from the same model and sees the same batches; GPU kernels then
agree with the CPU only to float tolerance.

Device and precision (``core.device``) are resolved once per run, recorded in
the results (``"device"``), and passed down. Steps that do not record may take
the fused SDPA path (``TrainConfig.attention``); steps that record always take
the explicit one. Each step reads the device back once, after its update is
queued: the loss, the gradient norm, whether the update was skipped and, on a
recording step, every diagnostic in one transfer.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from attnscale.lm.data import batches, check_length
from attnscale.core import device as dev
from attnscale.errors import ConfigError
from attnscale.core.scales import get_scale
from attnscale.lm.checkpoint import Checkpoint, comparable_config, run_config, save_weights
from attnscale.lm.evaluation import evaluate, finite, sum_dtype, threads
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.optimizers import MuonAdamW, build_optimizer
from attnscale.lm.precision import Bf16Copy, clip_, flat_grads
from attnscale.lm.step_measures import DIAGNOSTICS, probe_row, qk_weight_rms, read_back, recording, summarize
from attnscale.lm.train_config import MAX_SKIPPED, TrainConfig, lr_at

__all__ = ["TrainConfig", "train", "check_watch", "Run", "build_run", "train_step", "loss_and_objective", "step_losses", "attention_impl", "run_config", "comparable_config", "save_weights", "lr_at", "evaluate", "sum_dtype", "DIAGNOSTICS", "summarize"]

# fused SDPA against the explicit products, step and module, fp32 and bf16, as measured: docs/speed.md
def attention_impl(choice: str, model_cfg: ModelConfig, device: torch.device, precision: "dev.Precision") -> str:
    """The path non-recording steps take. "auto": fused SDPA on GPUs (flash and memory-efficient
    kernels) and on the CPU in fp32; the model config's own ``impl`` on the CPU under bf16 autocast."""
    if not get_scale(model_cfg.scale, model_cfg.head_dim).fusable:
        return "explicit"  # SDPA cannot express this scheme; Attention would write it out anyway
    if choice != "auto":
        return choice
    if device.type in ("cuda", "mps") or precision.autocast is None:
        return "fused"
    return model_cfg.impl


def check_watch(watch: Any, train_cfg: TrainConfig) -> None:
    """A ConfigError unless ``watch`` is an ``attnscale.watch.Attached`` that ``train_cfg``'s run can follow (a
    records probe, ``Attached(probe="records")``, at a cadence of whole record steps): found before anything is
    built, by ``train`` and by a sweep before it writes any folder."""
    from attnscale.watch.callbacks.attach import Attached

    if not isinstance(watch, Attached):
        raise ConfigError(f"train's watch= takes an attnscale.watch.Attached(...) (a Watch's options: train "
                          f"builds the model, and the Watch on it), got {type(watch).__name__}")
    if watch.probe_records and watch.options["every"] % train_cfg.record_every:
        raise ConfigError(f"Attached(probe='records') probes at record steps: its every={watch.options['every']} "
                          f"must be a multiple of record_every={train_cfg.record_every}")


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    corpus,
    *,
    log: Callable[[dict[str, Any]], None] | None = None,
    checkpoint: Path | None = None,
    weights: Path | None = None,
    on_step: Callable[[int, int, dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    watch: Any = None,
) -> dict[str, Any]:
    """Train, record diagnostics, evaluate on ``corpus.valid``; return the results
    (the fields of ``runs.record.TrainResults``).

    ``log(line)`` receives each recorded step as it is recorded (a resumed run
    first replays the lines its checkpoint holds). ``on_step(step, steps, info)``
    is called after every step; ``should_stop()`` ends the run early (status "stopped").

    ``watch``: an ``attnscale.watch.Attached`` (a ``Watch``'s options, checked when it was made), attached
    as the Trainer and Lightning callbacks attach it: its ``Watch`` is made on the model the steps run
    when training starts, follows every update, and an alert whose action is "stop" ends the run
    ("stopped"); its sinks are closed when training ends, however it ends. An Attached follows one call
    (each builds its model): one that followed a run is refused. It is handed the run's optimizer, which an
    alert's ``ScaleLR`` or ``SkipStep`` acts on; ``results["actions"]`` lists the actions its alerts took
    (``watch/actions.py``; [] without a watch), and the checkpoint keeps the watch's state, so a run resumed
    with an ``Attached`` of the same options goes on as the uninterrupted one would.

    ``checkpoint``: with ``checkpoint_every`` > 0, the model, optimiser and batch
    generator are saved there every that many steps; a later call with the same
    configs and corpus resumes from it and gives the numbers an uninterrupted run
    gives. A checkpoint that cannot be read, or belongs to another config, is not
    used: the run starts from step 0 and ``results["notes"]`` says why. The file is
    removed when the run ends "done" or "diverged". ``weights``: where a run that
    ends "done" saves its final weights (safetensors, the model's state_dict)."""
    if watch is not None:
        check_watch(watch, train_cfg)
    if getattr(watch, "watch", None) is not None:  # its Watch follows a model this call would not build
        raise ConfigError("this Attached already followed a training run, whose model is gone; give each train() "
                          "call its own Attached(...), a resumed run too")
    if model_cfg.vocab_size < corpus.vocab_size:
        raise ConfigError(f"model vocab_size {model_cfg.vocab_size} is smaller than the corpus's {corpus.vocab_size}")
    check_length(corpus.train, model_cfg.context, "training split")
    check_length(corpus.valid, model_cfg.context, "held-out split")
    ckpt = None
    if checkpoint is not None and train_cfg.checkpoint_every:
        ckpt = Checkpoint(Path(checkpoint), run_config(model_cfg, train_cfg, corpus))
    with threads(train_cfg.threads):
        results = _train(model_cfg, train_cfg, corpus, log, on_step, should_stop, ckpt, weights, watch)
    return results


@dataclass
class Run:
    """One run's moving parts while it trains: what ``_train``'s steps share."""

    model_cfg: ModelConfig
    cfg: TrainConfig
    device: torch.device
    precision: Any  # core.device.Precision
    impl: str  # the attention path of steps that do not record
    model: TinyLM
    opt: "torch.optim.Optimizer | MuonAdamW"
    gen: torch.Generator
    scaler: Any
    log_line: Callable[[dict[str, Any]], None] | None
    grads: torch.Tensor  # every gradient of the model, as one flat tensor (``flat_grads``)
    compute: "Bf16Copy | None" = None  # weights "bf16": the copy the step computes on; the model holds the masters
    history: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out loss every ``eval_every`` steps
    skipped: int = 0  # fp16 steps the gradient scaler skipped (inf/NaN gradients); they do not count
    watch_state: dict | None = None  # a resumed run's watch, as its checkpoint kept it
    t0: float = field(default_factory=time.perf_counter)

    def log(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.log_line is not None:
            self.log_line(row)

    def batch(self, corpus) -> tuple[torch.Tensor, torch.Tensor]:
        return dev.to_device(self.device, *batches(corpus.train, self.cfg.batch, self.model_cfg.context, self.gen))

    @property
    def net(self) -> TinyLM:
        """What the step's forward runs: the bf16 copy where there is one, else the model."""
        return self.model if self.compute is None else self.compute.model

    def forward_precision(self):
        """Autocast around the step's forward, except on the bf16 copy, whose weights are bf16 already."""
        return dev.autocast(self.precision) if self.compute is None else contextlib.nullcontext()

    def refresh(self) -> None:
        if self.compute is not None:
            self.compute.refresh()

    def gradients_to_masters(self) -> None:
        if self.compute is not None:
            self.compute.gradients_to_masters()


def build_run(model_cfg: ModelConfig, cfg: TrainConfig, log_line) -> Run:
    """Device and precision resolved once; the model built from the seed on the CPU, then moved, so every
    device starts from the same weights; the optimiser ``lm.optimizers.build_optimizer`` makes: AdamW with weight
    decay on matrices only, or Muon on the blocks' matrices beside it."""
    device = dev.resolve_device(cfg.device)
    precision = dev.resolve_precision(cfg.dtype, device)
    if device.type == "cpu":
        dev.keep_freed_memory()
    impl = attention_impl(cfg.attention, model_cfg, device, precision)
    torch.manual_seed(cfg.seed)
    model = TinyLM(replace(model_cfg, impl=impl)).to(device)
    grads = flat_grads(model)
    compute = Bf16Copy(model, grads) if cfg.weights == "bf16" and precision.autocast is torch.bfloat16 else None
    # AdamW (and Muon) shrink a weight by lr_t · weight_decay a step; independent decay (Wortsman et al. 2023) by
    # weight_decay · lr_t / lr, which follows the schedule's shape but not the rate's size
    wd = cfg.weight_decay / cfg.lr if cfg.independent_wd else cfg.weight_decay
    # fused AdamW: one kernel per step (~4% faster than foreach on CPU), and it skips an update on the device where
    # told to (found_inf), which MPS's fused kernel ignored until mid-2026 (PyTorch PR 186360): MPS keeps foreach
    opt = build_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=wd, betas=(cfg.beta1, cfg.beta2),
                          eps=cfg.adam_eps, fused=device.type in ("cpu", "cuda"))
    return Run(model_cfg, cfg, device, precision, impl, model, opt, torch.Generator().manual_seed(cfg.seed),
                dev.grad_scaler(precision), log_line, grads, compute)


def _resume(run: Run, ckpt: Checkpoint | None) -> tuple[int, list[str]]:
    """The step to start from (0, or the checkpoint's) and what to say about a checkpoint not used."""
    state, note = ckpt.load() if ckpt is not None else (None, None)
    if state is None:
        return 0, [note] if note else []
    run.model.load_state_dict(state["model"])
    run.refresh()
    run.opt.load_state_dict(state["opt"])
    run.gen.set_state(state["gen"])
    if state.get("scaler"):  # fp16: the loss scale it had reached, not 2**16 again
        run.scaler.load_state_dict(state["scaler"])
    run.skipped = state.get("skipped", 0)
    run.losses = state["losses"]
    run.evals = list(state.get("evals", []))
    run.watch_state = state.get("watch")
    for row in state["history"]:
        run.log(row)
    return state["step"], []


def train_step(run: Run, step: int, corpus) -> tuple[float, float, float, bool]:
    """One update (recording through the hooks when due); (loss, lr, grad norm, skipped).

    Where the loss or a gradient is not finite the update is skipped, the weights left as
    they were. That is decided on the device (the fused optimiser's ``found_inf``, the fp16
    scaler's own check), so the step's one read-back comes after the optimiser step is
    queued: the GPU is never left waiting while the host decides. TF32, where the precision
    allows it, holds for the forward, the backward and the update."""
    cfg = run.cfg
    lr = lr_at(step, cfg)
    for group in run.opt.param_groups:
        group["lr"] = lr
    x_BT, y_BT = run.batch(corpus)
    due = step % cfg.record_every == 0
    with dev.tf32(run.precision):
        with recording(run.net, due, cfg.frozen_threshold, cfg.record_sequences) as rec, run.forward_precision():
            loss, objective, log_z = step_losses(run.net, x_BT, y_BT, cfg.z_loss, with_log_z=due)
        # the weights this step's forward used, before its update: the growth Wortsman et al. 2023 watch
        probed = [log_z, *qk_weight_rms(run.model)] if due else []
        if run.compute is None:
            run.grads.zero_()  # the bf16 copy's gradients were zeroed as they went to the masters
        run.scaler.scale(objective).backward()
        run.gradients_to_masters()
        if run.scaler.is_enabled():  # the scaler skips on inf/NaN gradients alone: a loss that is not finite must too
            run.grads.add_(torch.where(torch.isfinite(loss), 0.0, math.nan))
        run.scaler.unscale_(run.opt)  # clip the true gradients (a no-op without fp16)
        grad_norm = clip_(run.grads, cfg.clip)
        # a gradient is inf or NaN exactly when their norm is (the scaler's own test, for fp16)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        on_device = run.opt.defaults.get("fused")
        if on_device:
            _update(run, bad)
        (value, grad_norm, skipped, *probed), row = read_back(rec, loss, grad_norm, bad, *probed)  # the one sync
        if not on_device:  # foreach AdamW (MPS) and Muon cannot skip on the device: the host decides
            _update(run, bool(skipped))
    skipped = bool(skipped)
    retried = skipped and math.isfinite(value) and run.scaler.is_enabled()  # fp16: the same step, the next batch
    if rec is not None and not retried:
        run.log({"step": step, "loss": finite(value), "lr": lr, "elapsed_s": time.perf_counter() - run.t0, **row,
                 **probe_row(probed, grad_norm)})
    if not skipped:
        run.losses.append(value)
    return value, lr, grad_norm, skipped


def loss_and_objective(net: TinyLM, x_BT: torch.Tensor, y_BT: torch.Tensor, z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy, what the step minimises): the same tensor without z-loss; with it, the
    cross-entropy plus z_loss · mean over tokens of (log Z)², Z the sum of exp(logits), which holds
    the output logits' normaliser near 1 (Wortsman et al. 2023, after PaLM). The loss recorded and
    judged is the cross-entropy alone."""
    loss, objective, _ = step_losses(net, x_BT, y_BT, z_loss)
    return loss, objective


def step_losses(net: TinyLM, x_BT: torch.Tensor, y_BT: torch.Tensor, z_loss: float,
                with_log_z: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``loss_and_objective``'s pair and, ``with_log_z``, the mean over tokens of log Z (detached): the
    output logits' normaliser, whose drift is output-logit divergence (what z-loss holds back)."""
    if not (z_loss or with_log_z):
        loss = net.loss(x_BT, y_BT)
        return loss, loss, None
    logits_BTV = net(x_BT).float()
    loss = torch.nn.functional.cross_entropy(logits_BTV.flatten(0, 1), y_BT.flatten())
    log_z_BT = torch.logsumexp(logits_BTV, -1)
    objective = loss + z_loss * log_z_BT.pow(2).mean() if z_loss else loss
    return loss, objective, (log_z_BT.detach().mean() if with_log_z else None)


def _update(run: Run, skip: "torch.Tensor | bool") -> None:
    """The optimiser step, skipped where ``skip``: a device tensor for a fused optimiser, which
    skips there without the host waiting; a bool decided on the host for any other."""
    if run.scaler.is_enabled():  # fp16: the scaler skips where unscale_ found inf/NaN (``skip`` too), and lowers its scale
        run.scaler.step(run.opt)
        run.scaler.update()
    elif isinstance(skip, torch.Tensor):
        run.opt.found_inf = skip.float()  # what GradScaler hands a fused optimiser: 1 skips the update and its count
        try:
            run.opt.step()
        finally:
            del run.opt.found_inf
    elif not skip:
        run.opt.step()
    run.refresh()  # a skipped update leaves the masters, so the copy, as they were


def _record_trained(run: Run, corpus) -> float:
    """The trained model's diagnostics, on one more training batch, without an update; its loss."""
    x_BT, y_BT = run.batch(corpus)
    cfg = run.cfg
    with torch.no_grad(), recording(run.net, True, cfg.frozen_threshold, cfg.record_sequences) as rec, \
            dev.tf32(run.precision), run.forward_precision():
        (value,), row = read_back(rec, run.net.loss(x_BT, y_BT))
    run.log({"step": run.cfg.steps, "loss": finite(value), "lr": lr_at(run.cfg.steps - 1, run.cfg),
             "elapsed_s": time.perf_counter() - run.t0, **row})
    return value


def _train(model_cfg, cfg, corpus, log_line, on_step, should_stop, ckpt, weights, watch=None) -> dict[str, Any]:
    """Build, resume, step, record the trained model, evaluate, keep the weights: the run's results."""
    run = build_run(model_cfg, cfg, log_line)
    start, notes = _resume(run, ckpt)
    if run.compute is not None and getattr(watch, "clips", False):
        raise ConfigError("QK-Clip scales the weights a step computes on, and weights 'bf16' refreshes that copy "
                          "from its fp32 masters at every step, undoing the clip; train with weights 'fp32' to clip")
    if watch is None:
        if run.watch_state:  # the checkpoint's run was watched: what its actions had in force ends here
            from attnscale.watch.state import in_force

            ending = in_force(run.watch_state)
            if ending:
                notes.append(f"resumed without the watch the checkpoint's run had: {ending} ended at step {start}")
        return {**_steps(run, corpus, start, notes, on_step, should_stop, ckpt, weights), "actions": []}
    watch.load_state_dict(run.watch_state or {})
    watch.start(run.net, start, optimizer=run.opt)
    try:
        results = _steps(run, corpus, start, notes, on_step,
                         lambda: watch.should_stop or (should_stop is not None and should_stop()), ckpt, weights, watch)
    finally:
        watch.finish()
    return {**results, "actions": watch.actions}


def _steps(run: Run, corpus, start: int, notes: list[str], on_step, should_stop, ckpt, weights,
           watch=None) -> dict[str, Any]:
    cfg = run.cfg
    status, diverged_at, step, in_a_row = "done", None, start, 0
    while step < cfg.steps:
        if should_stop is not None and should_stop():
            status = "stopped"
            break
        value, lr, grad_norm, skipped = train_step(run, step, corpus)
        in_a_row = in_a_row + 1 if skipped else 0
        # before the update: the model keeps its last finite weights. Skipped steps are fp16's
        # scaler backing off (it halves its scale each time); outside fp16, or past MAX_SKIPPED
        # in a row (a scale halved to nothing), they mean the run has diverged.
        if not math.isfinite(value) or (skipped and (not run.scaler.is_enabled() or in_a_row > MAX_SKIPPED)):
            status, diverged_at = "diverged", step
            break
        if skipped:  # neither the schedule nor the step count moves
            run.skipped += 1
            continue
        step += 1
        if watch is not None:
            if watch.probe_records and step % cfg.record_every == 0:
                _probe_the_record(run, corpus, watch)
            watch.after_step(step)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:  # the last: the run's own evaluation
            run.evals.append(_held_out(run, corpus, step))  # eval mode, no gradients: no step of QK-Clip's
        if ckpt is not None and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            ckpt.save(step=step, model=run.model.state_dict(), opt=run.opt.state_dict(), gen=run.gen.get_state(),
                      scaler=run.scaler.state_dict(), skipped=run.skipped, losses=run.losses, history=run.history,
                      evals=run.evals, watch=watch.state_dict() if watch is not None else None)
        if on_step is not None:
            on_step(step, cfg.steps, {"loss": value, "lr": lr, "grad_norm": grad_norm})
    if run.skipped:
        notes.append(f"the fp16 gradient scaler skipped {run.skipped} step(s) with inf/NaN gradients; "
                     "they are not counted and did not move the schedule")
    steps_done, train_seconds = len(run.losses), time.perf_counter() - run.t0
    if status == "done" and not math.isfinite(_record_trained(run, corpus)):
        status, diverged_at = "diverged", cfg.steps
    evaluation = {"valid_loss": None, "perplexity": None, "eval_tokens": 0}
    if status == "done":
        evaluation = evaluate(run.model, corpus.valid, cfg.batch, cfg.eval_batches, run.precision)
        if not math.isfinite(evaluation["valid_loss"]):
            status, diverged_at = "diverged", cfg.steps
        evaluation = {k: finite(v) if isinstance(v, float) else v for k, v in evaluation.items()}
        if cfg.eval_every and cfg.steps % cfg.eval_every == 0:
            run.evals.append({"step": cfg.steps, "valid_loss": evaluation["valid_loss"],
                              "perplexity": evaluation["perplexity"]})
    if ckpt is not None and status != "stopped":
        ckpt.remove()
    if weights is not None and status == "done":
        save_weights(run.model, weights)
    return _results(run, status, diverged_at, start, steps_done, train_seconds, evaluation, notes)


def _probe_the_record(run: Run, corpus, watch) -> None:
    """Before a probe after ``k`` updates, a watch that probes the records' own sequence (``Attached(probe="records")``) is
    given the first ``record_sequences`` sequences of step ``k``'s batch: with the weights after ``k`` updates,
    exactly what the record of step ``k`` measures in that step's forward. The batch is drawn from a copy of the
    generator's state, so the run's own batches are untouched."""
    from attnscale.capture.probe import first_sequences

    state = run.gen.get_state()
    x_BT, _ = run.batch(corpus)
    run.gen.set_state(state)
    watch.watch.probe = first_sequences(x_BT, run.cfg.record_sequences)


def _held_out(run: Run, corpus, step: int) -> dict[str, Any]:
    """The held-out loss and perplexity of the weights after ``step`` updates (as the end's evaluation)."""
    got = evaluate(run.model, corpus.valid, run.cfg.batch, run.cfg.eval_batches, run.precision)
    return {"step": step, "valid_loss": finite(got["valid_loss"]), "perplexity": finite(got["perplexity"])}


def _results(run: Run, status, diverged_at, start, steps_done, train_seconds, evaluation, notes) -> dict[str, Any]:
    """The fields of ``runs.record.TrainResults``."""
    cfg, model_cfg = run.cfg, run.model_cfg
    tail = run.losses[-max(1, cfg.record_every):]
    return {
        "status": status,
        "steps_done": steps_done,
        "diverged_at": diverged_at,
        "final_train_loss": sum(tail) / len(tail) if tail else None,
        **evaluation,
        "head_dim": model_cfg.head_dim,
        "scale": model_cfg.scale,
        "init": model_cfg.init,
        "params": run.model.num_params(),
        "resumed_from": start or None,
        "train_seconds": train_seconds,
        "tokens_per_s": (steps_done - start) * cfg.batch * model_cfg.context / max(train_seconds, 1e-9),
        "threads": torch.get_num_threads(),
        "dtype": run.precision.name,
        "attention": run.impl,
        "weights": "fp32" if run.compute is None else "bf16",
        "device": dev.describe_device(run.device, run.precision),
        "start": summarize(run.history[0]) if run.history else None,
        "end": summarize(run.history[-1]) if run.history else None,
        "history": run.history,
        "losses": run.losses,  # the training loss at every step taken (the outcomes' rules read them all)
        "evals": run.evals,
        "notes": notes,
    }
