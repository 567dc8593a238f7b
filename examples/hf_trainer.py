"""Watch attention health in a Hugging Face Trainer: a small Llama (GQA) on the embedded corpus.

    python examples/hf_trainer.py                       # 200 steps, a minute or two on a 2-core CPU
    python examples/hf_trainer.py --unscaled --init-std 0.5 --stop   # no 1/sqrt(d): the alert stops the Trainer
    tensorboard --logdir watch-out/hf/runs              # with pip install -e '.[watch]': beside the Trainer's loss
    attnscale watch-report watch-out/hf/watch.jsonl

The only line the watch adds to a training script is ``callbacks=[WatchCallback(...)]``;
its numbers go to every ``report_to`` integration (here TensorBoard) at its probe steps,
beside the loss, and to the JSONL log given as a sink.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from options import alert_tau, run_options, tensorboard_here  # noqa: E402
from tiny_llama import corpus_windows, tiny_llama  # noqa: E402

from attnscale.watch.alerts import Collapsed, MaxScore  # noqa: E402
from attnscale.watch.callbacks.hf import WatchCallback  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402


def main(argv=None) -> int:
    from transformers import Trainer, TrainingArguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_options(p, "watch-out/hf")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--unscaled", action="store_true", help="set the model's 1/sqrt(head_dim) to 1")
    p.add_argument("--init-std", type=float, default=0.02,
                   help="initial weight SD (Llama's 0.02 keeps scores near 0 at first; 0.5 makes them large)")
    args = p.parse_args(argv)

    data, vocab = corpus_windows(args.context)
    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, context=args.context,
                       unscaled=args.unscaled, init_std=args.init_std)
    action = "stop" if args.stop else "warn"
    callback = WatchCallback(every=args.every, alerts=[MaxScore(action, tau=alert_tau(args.qk_clip)), Collapsed(action)],
                             sinks=[JsonlSink(args.out / "watch.jsonl")], qk_clip=args.qk_clip)
    tensorboard = tensorboard_here(args.out / "runs")
    training = TrainingArguments(output_dir=str(args.out), max_steps=args.steps, per_device_train_batch_size=args.batch,
                                 learning_rate=3e-3, logging_steps=args.every, save_strategy="no",
                                 report_to=["tensorboard"] if tensorboard else "none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[callback])
    trainer.train()
    step, numbers = callback.latest or (0, {})
    print(f"trained {trainer.state.global_step} steps; at step {step}: max |score| "
          f"{numbers.get('attn/max_score', float('nan')):.3g}, fewest words {numbers.get('attn/min_effective_words', float('nan')):.3g}, "
          f"watch {100 * numbers.get('watch/share', float('nan')):.2f}% of time")
    print(f"watch log: {args.out / 'watch.jsonl'}" + (f"; TensorBoard: {args.out / 'runs'}" if tensorboard else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
