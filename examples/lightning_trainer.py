"""Watch attention health in a Lightning run: attnscale's tiny LM on the embedded corpus.

    python examples/lightning_trainer.py                 # 200 steps, about a minute on a 2-core CPU
    python examples/lightning_trainer.py --scale none --width 1024 --init unit --stop   # unscaled: the alert stops the fit
    tensorboard --logdir watch-out/lightning/tb          # with pip install -e '.[watch]': the heads beside the loss
    attnscale watch-report watch-out/lightning/watch.jsonl

The only thing the watch adds to a Lightning script is ``callbacks=[WatchCallback(...)]``:
its numbers go to every logger of the run (here TensorBoard and CSV) at its probe
steps, beside the loss, and to the JSONL log given as a sink. (The file is not named
``lightning.py``: run as a script, it would be imported in place of the package.)
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from options import WATCH_EXTRA, alert_tau, run_options, tensorboard_here, tiny_lm_options

from attnscale.lm.data import load_corpus
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.alerts import Collapsed, MaxScore
from attnscale.watch.logs.sinks import JsonlSink


class Shifted(torch.utils.data.Dataset):
    """Non-overlapping windows of ``context`` tokens and the same window one token on: (input, target)."""

    def __init__(self, ids: torch.Tensor, context: int):
        self.ids, self.context = ids, context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.context
        return self.ids[start:start + self.context], self.ids[start + 1:start + self.context + 1]


def language_model(config: ModelConfig, lr: float):
    """A LightningModule around attnscale's tiny LM: ``training_step`` calls ``self(x)``, as Lightning's
    idiom has it, which is where the watch catches its probe batch."""
    import lightning.pytorch as pl

    class LanguageModel(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = build_model(config, seed=0)

        def forward(self, x_BT):
            return self.model(x_BT)

        def training_step(self, batch, batch_idx):
            x_BT, y_BT = batch
            loss = F.cross_entropy(self(x_BT).flatten(0, 1), y_BT.flatten())
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=lr)

    return LanguageModel()


def main(argv=None) -> int:
    try:
        import lightning.pytorch as pl
    except ImportError:  # `make reproduce`'s set-up installs it; a pip install without the extra may not
        print(f"this example needs Lightning, which is not installed: {WATCH_EXTRA} (from the clone) installs it",
              file=sys.stderr)
        return 2
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from attnscale.watch.callbacks.lightning import WatchCallback

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_options(p, "watch-out/lightning")
    tiny_lm_options(p)
    args = p.parse_args(argv)

    corpus = load_corpus("default")
    config = ModelConfig(vocab_size=corpus.vocab_size, context=args.context, d_model=64, n_layers=2, n_heads=4,
                         head_dim=args.width, scale=args.scale, init=args.init)
    module = language_model(config, args.lr)
    action = "stop" if args.stop else "warn"
    callback = WatchCallback(every=args.every, alerts=[MaxScore(action, tau=alert_tau(args.qk_clip)), Collapsed(action)],
                             sinks=[JsonlSink(args.out / "watch.jsonl")], qk_clip=args.qk_clip)
    loader = torch.utils.data.DataLoader(Shifted(corpus.train, args.context), batch_size=args.batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    loggers = [CSVLogger(args.out, name="csv", version="")]
    if tensorboard_here(args.out / "tb"):
        loggers.insert(0, TensorBoardLogger(args.out, name="tb", version=""))
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, callbacks=[callback], logger=loggers,
                         log_every_n_steps=args.every, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, loader)
    step, numbers = callback.latest or (0, {})
    print(f"trained {trainer.global_step} steps; at step {step}: max |score| {numbers.get('attn/max_score', float('nan')):.3g}, "
          f"fewest words {numbers.get('attn/min_effective_words', float('nan')):.3g}")
    tensorboard = f"; TensorBoard: {args.out / 'tb'}" if len(loggers) > 1 else ""
    print(f"watch log: {args.out / 'watch.jsonl'}{tensorboard}; CSV: {args.out / 'csv' / 'metrics.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
