"""A Llama-shaped Hugging Face model trained by transformers' ``Trainer``: a run of the runs/ layer.

``LlamaModelConfig`` describes a ``LlamaForCausalLM`` built from a ``LlamaConfig`` (no download:
RoPE, RMSNorm, SwiGLU, no qk-norm, Llama's own 1/sqrt(head_dim)); ``train`` trains it with
``transformers.Trainer`` on a corpus's training split and returns what ``lm.train.train`` returns
(the fields of ``runs.record.TrainResults``), so that ``runs.trainer.train_run``, and with it every
executor, resume and the record, take either family. The loss is logged at every step (the
Trainer's own log, ``logging_steps=1``, without its NaN/inf filter) and the watch (``WatchCallback``,
watch/callbacks/hf.py, its fixed fp32 probe of the first batch's first ``record_sequences``
sequences) every ``record_every`` steps.

Steps, as the tiny LM's metrics lines count them: line ``s`` holds the loss of the step's forward
taken after ``s`` updates (the Trainer's log at global step s + 1) and, at a probe step, the watch's
measures of the model after ``s`` updates (its probe at global step s); the last line (step = steps)
holds the trained model's probe. A run whose loss is not finite stops there, "diverged".

Training batches are windows at uniform random starts (``lm.data.batches``' rule) drawn from the
seed, in the order the Trainer's sampler (seeded too) gives them; the held-out loss is the tiny LM's:
every held-out token after the first predicted once (``lm.data.eval_batches``). A run cut short is
trained again from step 0 (no checkpoint: a run is seconds long), so ``checkpoint_every`` must be 0; bf16 is
the Trainer's autocast over fp32 weights, so ``weights`` must be "fp32".
transformers loads only when a run trains.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from attnscale.core import device as dev
from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.errors import ConfigError, check_positive_ints
from attnscale.lm.checkpoint import save_weights
from attnscale.lm.data import check_length
from attnscale.lm.step_measures import summarize
from attnscale.lm.evaluation import evaluate, finite, threads

__all__ = ["FAMILY", "LlamaModelConfig", "train", "build", "check_train"]

FAMILY = "llama"


@dataclass(frozen=True)
class LlamaModelConfig:
    """Shape of the Llama: ``d_model`` is its hidden size, ``mlp_ratio`` × it the SwiGLU's width,
    ``kv_heads`` the key/value heads (None: one per query head), ``init_std`` the weights' initial SD
    (Llama's ``initializer_range``). The names are the tiny LM's, so the runs/ layer reads both alike."""

    vocab_size: int
    context: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int | None = None
    kv_heads: int | None = None
    mlp_ratio: int = 4
    init_std: float = 0.02
    scale: str = "inv_sqrt_d"  # Llama's own 1/sqrt(head_dim): recorded by name, as every run's scale is
    family: str = FAMILY  # in the record, so a reader tells the families apart

    def __post_init__(self):
        check_positive_ints(self, ("vocab_size", "context", "d_model", "n_layers", "n_heads", "mlp_ratio"), "llama")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ConfigError(f"llama d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                                  "change one, or set head_dim")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.n_heads)
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"llama n_heads={self.n_heads} must be a multiple of kv_heads={self.kv_heads}")
        if not 0 < self.init_std < math.inf:
            raise ConfigError(f"llama init_std must be a positive number, got {self.init_std!r}")
        if self.scale != "inv_sqrt_d" or self.family != FAMILY:
            raise ConfigError("the llama family has Llama's own score scale (inv_sqrt_d) and family 'llama'")


def build(cfg: LlamaModelConfig, seed: int):
    """A fresh ``LlamaForCausalLM`` of ``cfg``, its weights drawn from ``seed`` on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_ratio * cfg.d_model,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=cfg.context,
                         initializer_range=cfg.init_std, tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


class _Windows(torch.utils.data.Dataset):
    """``n`` windows of ``context`` tokens at random starts drawn from ``seed``; labels are the inputs (the
    model shifts them)."""

    def __init__(self, ids: torch.Tensor, context: int, n: int, seed: int):
        self.ids, self.context = ids, context
        self.starts = torch.randint(len(ids) - context, (n,), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.ids[int(self.starts[i]):int(self.starts[i]) + self.context]
        return {"input_ids": x, "labels": x}


def _grids(record) -> dict[str, list[list[float | None]]]:
    """A watch record's measures as the metrics line keeps them: [layer][head], null where not finite."""
    return {m: [[finite(v) for v in heads] for heads in record.grid(m)] for m in HEAD_MEASURES}


def _callbacks(steps: int, log: Callable, on_step, should_stop, t0: float):
    """The Trainer callback that turns its loss logs and the watch's records into metrics lines, and the
    watch's sink; (callback, sink, state)."""
    from transformers import TrainerCallback

    from attnscale.watch.logs.sinks import Sink

    state: dict[str, Any] = {"probes": {}, "lines": [], "status": "done", "diverged_at": None, "losses": []}

    class Probes(Sink):
        def write(self, record) -> None:
            state["probes"][record.step] = _grids(record)

    class Lines(TrainerCallback):
        def on_step_end(self, args, st, control, **kwargs):
            if should_stop is not None and should_stop():
                state["status"] = "stopped"
                control.should_training_stop = True

        def on_log(self, args, st, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            s, loss = st.global_step - 1, float(logs["loss"])
            line = {"step": s, "loss": finite(loss), "lr": logs.get("learning_rate"),
                    "elapsed_s": time.perf_counter() - t0, **state["probes"].get(s, {})}
            state["lines"].append(line)
            log(line)
            if not math.isfinite(loss):
                state["status"], state["diverged_at"] = "diverged", s
                control.should_training_stop = True
                return
            state["losses"].append(loss)
            if on_step is not None:
                on_step(s + 1, steps, {"loss": loss, "lr": logs.get("learning_rate"), "grad_norm": logs.get("grad_norm")})

    return Lines(), Probes(), state


def check_train(train_cfg) -> None:
    """A ConfigError for a ``TrainConfig`` this family cannot train as asked (a sweep checks before any run)."""
    if train_cfg.checkpoint_every:
        raise ConfigError("the llama family restarts a cut run from step 0 and saves no checkpoint: "
                          "set checkpoint_every to 0")
    if getattr(train_cfg, "weights", "fp32") != "fp32":
        raise ConfigError("the llama family's bf16 is the Trainer's autocast over fp32 weights: set weights to fp32")
    # the Trainer's own AdamW and loss: lm.train's recipe knobs would be ignored, so they are refused
    recipe = [k for k, v in (("z_loss", 0.0), ("beta1", 0.9), ("adam_eps", 1e-8), ("independent_wd", False),
                             ("optimizer", "adamw")) if getattr(train_cfg, k, v) != v]
    if recipe:
        raise ConfigError(f"the llama family trains without lm.train's recipe knobs: leave {', '.join(recipe)} "
                          "at the defaults")


def train(model_cfg: LlamaModelConfig, train_cfg, corpus, *, log: Callable[[dict[str, Any]], None] | None = None,
          checkpoint: Path | None = None, weights: Path | None = None,
          on_step: Callable[[int, int, dict], None] | None = None,
          should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train ``model_cfg`` with ``train_cfg`` (an ``lm.train.TrainConfig``: steps, batch, lr, warm-up then a
    constant rate where ``min_lr_ratio`` is 1, else cosine to lr·min_lr_ratio, AdamW's weight decay, beta2
    and clip, seed, dtype, device, threads; ``record_every``: the watch's cadence, ``record_sequences``: its
    probe's sequences) on ``corpus``; the results ``lm.train.train`` gives (the module's docstring)."""
    if not isinstance(model_cfg, LlamaModelConfig):
        raise ConfigError(f"hf_family.train takes a LlamaModelConfig, got {type(model_cfg).__name__}")
    if model_cfg.vocab_size < corpus.vocab_size:
        raise ConfigError(f"model vocab_size {model_cfg.vocab_size} is smaller than the corpus's {corpus.vocab_size}")
    check_train(train_cfg)
    check_length(corpus.train, model_cfg.context, "training split")
    check_length(corpus.valid, model_cfg.context, "held-out split")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from its config: nothing to fetch
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    device = dev.resolve_device(train_cfg.device)
    precision = dev.resolve_precision(train_cfg.dtype, device)
    with threads(train_cfg.threads):
        return _train(model_cfg, train_cfg, corpus, log or (lambda line: None), weights, on_step, should_stop,
                      device, precision)


def _train(model_cfg, cfg, corpus, log, weights, on_step, should_stop, device, precision) -> dict[str, Any]:
    import transformers
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from attnscale.watch.callbacks.hf import WatchCallback

    transformers.logging.set_verbosity_error()  # the Trainer's per-run notices, a hundred times over
    t0 = time.perf_counter()
    model = build(model_cfg, cfg.seed)
    lines, probes, state = _callbacks(cfg.steps, log, on_step, should_stop, t0)
    watch = WatchCallback(every=cfg.record_every, probe_sequences=cfg.record_sequences, sinks=[probes], alerts=(),
                          threshold=cfg.frozen_threshold, report=False)
    constant = cfg.min_lr_ratio == 1.0
    with tempfile.TemporaryDirectory(prefix="attnscale-trainer-") as scratch:
        args = TrainingArguments(
            output_dir=scratch, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr,
            lr_scheduler_type="constant_with_warmup" if constant else "cosine_with_min_lr",
            lr_scheduler_kwargs={} if constant else {"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=cfg.warmup,
            weight_decay=cfg.weight_decay, max_grad_norm=cfg.clip, adam_beta1=0.9, adam_beta2=cfg.beta2,
            optim="adamw_torch", logging_steps=1, logging_nan_inf_filter=False, save_strategy="no", report_to="none",
            use_cpu=device.type == "cpu", disable_tqdm=True, dataloader_num_workers=0, seed=cfg.seed,
            data_seed=cfg.seed, bf16=precision.name == "bf16", fp16=precision.name == "fp16")
        data = _Windows(corpus.train, model_cfg.context, cfg.steps * cfg.batch, cfg.seed)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[watch, lines])
        trainer.remove_callback(PrinterCallback)  # the loss reaches the metrics lines, not stdout
        trainer.train()
    final = state["probes"].get(cfg.steps)
    if state["status"] == "done" and final is not None:  # the trained model's probe, as the tiny LM's last line
        line = {"step": cfg.steps, "loss": None, "lr": state["lines"][-1]["lr"] if state["lines"] else None,
                "elapsed_s": time.perf_counter() - t0, **final}
        state["lines"].append(line)
        log(line)
    train_seconds = time.perf_counter() - t0
    status, diverged_at = state["status"], state["diverged_at"]
    evaluation = {"valid_loss": None, "perplexity": None, "eval_tokens": 0}
    model = trainer.model
    if status == "done":
        evaluation = evaluate(model, corpus.valid, cfg.batch, cfg.eval_batches, "fp32", context=model_cfg.context,
                              logits=lambda x_BT: model(input_ids=x_BT).logits)
        evaluation = {k: finite(v) if isinstance(v, float) else v for k, v in evaluation.items()}
        if evaluation["valid_loss"] is None:
            status, diverged_at = "diverged", cfg.steps
    if weights is not None and status == "done":
        save_weights(model, weights)
    done = len(state["losses"])
    tail = state["losses"][-max(1, cfg.record_every):]
    probed = [x for x in state["lines"] if "spread" in x]
    return {"status": status, "steps_done": done, "diverged_at": diverged_at,
            "final_train_loss": sum(tail) / len(tail) if tail else None, **evaluation,
            "head_dim": model_cfg.head_dim, "scale": model_cfg.scale, "init": f"normal({model_cfg.init_std:g})",
            "params": sum(p.numel() for p in model.parameters()), "resumed_from": None,
            "train_seconds": train_seconds,
            "tokens_per_s": done * cfg.batch * model_cfg.context / max(train_seconds, 1e-9),
            "threads": torch.get_num_threads(), "dtype": precision.name, "attention": "sdpa (transformers)",
            "device": dev.describe_device(device, precision),
            "start": summarize(probed[0]) if probed else None, "end": summarize(probed[-1]) if probed else None,
            "history": state["lines"], "notes": [], "actions": []}
