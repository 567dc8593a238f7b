"""Watch attention health in a plain PyTorch loop: attnscale's tiny LM on the embedded corpus.

    python examples/plain_loop.py                       # 200 steps, a minute or two on a 2-core CPU
    python examples/plain_loop.py --scale none --width 1024 --init unit   # the unscaled model: alerts fire
    tensorboard --logdir watch-out/plain/tb             # with pip install -e '.[watch]': the heads beside the loss
    attnscale watch-report watch-out/plain/watch.jsonl  # one HTML page

The watch measures every head every ``--every`` steps on the first batch it sees,
writes JSONL and TensorBoard, warns once per head when a head's max |score|
passes QK-Clip's 100 or it collapses onto fewer than 2 words, and with ``--stop``
ends the loop at the first such alert.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from options import alert_tau, run_options, tensorboard_here, tiny_lm_options

from attnscale.lm.data import batches, load_corpus
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.alerts import Collapsed, MaxScore, Spike
from attnscale.watch.loop import Watch
from attnscale.watch.logs.sinks import JsonlSink, TensorBoardSink


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_options(p, "watch-out/plain")
    tiny_lm_options(p)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    corpus = load_corpus("default")
    model = build_model(ModelConfig(vocab_size=corpus.vocab_size, context=args.context, d_model=64, n_layers=2,
                                    n_heads=4, head_dim=args.width, scale=args.scale, init=args.init), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(0)
    action = "stop" if args.stop else "warn"
    alerts = [MaxScore(action, tau=alert_tau(args.qk_clip)), Collapsed(action), Spike("warn", measure="max_score")]
    tensorboard = tensorboard_here(args.out / "tb")
    sinks = [JsonlSink(args.out / "watch.jsonl"), *([TensorBoardSink(args.out / "tb")] if tensorboard else [])]
    with Watch(model, every=args.every, sinks=sinks, alerts=alerts, qk_clip=args.qk_clip) as watch:
        for step in range(1, args.steps + 1):
            x, y = batches(corpus.train, args.batch, args.context, gen)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            numbers = watch.step(step)
            if numbers is not None:
                print(f"step {step}: loss {loss.item():.3f}, max |score| {numbers['attn/max_score']:.3g}, "
                      f"fewest words {numbers['attn/min_effective_words']:.3g}, "
                      f"frozen {100 * numbers['attn/frozen_fraction']:.1f}%, watch {100 * numbers['watch/share']:.2f}% of time")
            if watch.should_stop:
                print(f"stopped at step {step} by an alert")
                break
    print(f"watch log: {args.out / 'watch.jsonl'}" + (f"; TensorBoard: {args.out / 'tb'}" if tensorboard else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
