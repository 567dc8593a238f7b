"""What the watch costs a Hugging Face Trainer run: the same training with and without WatchCallback.

A Llama-shaped model (``LlamaForCausalLM`` from a ``LlamaConfig``: RoPE, RMSNorm, SwiGLU,
grouped-query attention) trains on attnscale's embedded corpus with the Trainer, the
same seed and steps in every round; the order flips every round (without, with; with, without;
...) so the machine's drift and neighbours hit both alike, and the medians are
compared. The Trainer logs every ``--every`` steps in both, as a run would; the
callback probes at those steps. Three figures: the ratio of median wall times (what
the run pays), the ratio of median CPU times of the training process (what it pays
where neighbours share the cores: their load moves wall time far more than this
process's own CPU time), and the watch's own timer (``watch/total_seconds`` over
the run's ``train_runtime``).

    python benchmarks/watch_overhead.py                   # default cadence, 3 rounds each
    python benchmarks/watch_overhead.py --report-to tensorboard   # with the integration writing too
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # tiny_llama.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

from attnscale.watch.loop import EVERY  # noqa: E402


def cpu_line() -> str:
    """The CPU, and whether it has native bf16 (avx512_bf16), which decides what a CPU run can use."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        lscpu = ""
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                platform.processor() or "unknown CPU")
    bf16 = "avx512_bf16 present" if "avx512_bf16" in lscpu else "no avx512_bf16"
    return f"{name}, {os.cpu_count()} cores, {bf16}, torch {torch.__version__} with {torch.get_num_threads()} threads"


def one_round(args, watched: bool, out: Path) -> tuple[float, float, float | None]:
    """(train_runtime seconds, CPU seconds of this process in train(), the watch's own seconds or None)
    of one fresh training run."""
    from tiny_llama import corpus_windows, tiny_llama
    from transformers import Trainer, TrainingArguments

    from attnscale.watch.hf import WatchCallback

    data, vocab = corpus_windows(args.context)
    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                       context=args.context, seed=0)
    callbacks = [WatchCallback(every=args.every)] if watched else []
    training = TrainingArguments(output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.batch,
                                 learning_rate=1e-3, logging_steps=args.every, save_strategy="no",
                                 report_to=args.report_to, use_cpu=args.device == "cpu", disable_tqdm=True,
                                 dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks)
    cpu = time.process_time()
    result = trainer.train()
    cpu = time.process_time() - cpu
    runtime = float(result.metrics["train_runtime"])
    if not watched:
        return runtime, cpu, None
    latest = callbacks[0].latest
    return runtime, cpu, (latest[1]["watch/total_seconds"] if latest else 0.0)


def summarize(plain: list[float], watched: list[float], own: list[float]) -> dict[str, float]:
    """Medians of wall (or CPU) seconds, their ratio, the overhead as a share of the unwatched median,
    and the median of the watch's own seconds over each watched run's seconds."""
    p, w = statistics.median(plain), statistics.median(watched)
    return {"plain_s": p, "watched_s": w, "ratio": w / p, "overhead": w / p - 1,
            "own_share": statistics.median(o / t for o, t in zip(own, watched))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per round")
    p.add_argument("--every", type=int, default=EVERY, help=f"probe (and log) every this many steps (default {EVERY})")
    p.add_argument("--rounds", type=int, default=3, help="rounds with and without the watch each")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--report-to", default="none", help="Trainer integrations, e.g. tensorboard (default none)")
    p.add_argument("--device", choices=["cpu", "auto"], default="cpu", help="cpu, or auto (a GPU where there is one)")
    args = p.parse_args(argv)

    print(cpu_line())
    print(f"Llama {args.layers} layers, hidden {args.hidden}, {args.heads} heads over {args.kv_heads} kv heads; "
          f"{args.steps} steps of {args.batch} × {args.context} tokens; probe every {args.every}; "
          f"report_to {args.report_to}")
    plain, watched, own, cpu_plain, cpu_watched = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # the order flips every round (without-with, with-without, ...): whatever drifts over the run
            # (the machine, this process's allocator and caches) falls on both alike
            if r % 2 == 0:
                t_plain, c_plain, _ = one_round(args, False, Path(tmp) / f"p{r}")
                t_watched, c_watched, t_own = one_round(args, True, Path(tmp) / f"w{r}")
            else:
                t_watched, c_watched, t_own = one_round(args, True, Path(tmp) / f"w{r}")
                t_plain, c_plain, _ = one_round(args, False, Path(tmp) / f"p{r}")
            for to, value in ((plain, t_plain), (watched, t_watched), (own, t_own), (cpu_plain, c_plain),
                              (cpu_watched, c_watched)):
                to.append(value)
            print(f"round {r + 1}: without {t_plain:.3f} s, with {t_watched:.3f} s (watch's own timer {t_own:.3f} s); "
                  f"CPU without {c_plain:.3f} s, with {c_watched:.3f} s", flush=True)
    s = summarize(plain, watched, own)
    c = summarize(cpu_plain, cpu_watched, own)
    print(f"median: without {s['plain_s']:.2f} s, with {s['watched_s']:.2f} s, ratio {s['ratio']:.4f} "
          f"(overhead {100 * s['overhead']:+.2f}%); CPU time ratio {c['ratio']:.4f} (overhead {100 * c['overhead']:+.2f}%); "
          f"watch's own timer: {100 * s['own_share']:.2f}% of training time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
