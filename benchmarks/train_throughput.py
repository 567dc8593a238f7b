"""Training throughput: attnscale's trainer against a plain PyTorch GPT of the same shape.

The baseline is what one would write by hand: token + position embeddings,
pre-LN blocks with fused SDPA attention, fp32, eager, AdamW with clipping and
the same learning-rate schedule. attnscale runs ``train()`` itself, recording
every 10 steps, with the configs its presets use (bf16 autocast, explicit
attention, softmax in fp32). Both train on the embedded character corpus.

Measured side by side: rounds alternate A and B so contention from other
processes hits both alike; the ratio is of medians. One thread each.

    .venv/bin/python benchmarks/train_throughput.py [--rounds 3] [--steps 20] [--widths 128 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnscale.lm.data import batches, load_corpus
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig, lr_at, train


class BaselineBlock(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x_BTC):
        B, T, C = x_BTC.shape
        q, k, v = self.qkv(self.ln1(x_BTC)).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTC = x_BTC + self.proj(z.transpose(1, 2).reshape(B, T, C))
        return x_BTC + self.down(F.gelu(self.up(self.ln2(x_BTC))))


class BaselineGPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, layers: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(BaselineBlock(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx_BT):
        x = self.tok(idx_BT) + self.pos(torch.arange(idx_BT.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def baseline_seconds(corpus, d: int, cfg: TrainConfig, context: int) -> float:
    torch.manual_seed(cfg.seed)
    model = BaselineGPT(corpus.vocab_size, context, d, 2, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x_BT, y_BT = batches(corpus.train, cfg.batch, context, gen)
        loss = F.cross_entropy(model(x_BT).flatten(0, 1), y_BT.flatten())
        loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
    return time.perf_counter() - t0


def attnscale_seconds(corpus, d: int, cfg: TrainConfig, context: int, impl: str) -> float:
    mcfg = ModelConfig(vocab_size=corpus.vocab_size, context=context, d_model=d, n_layers=2, n_heads=4, impl=impl)
    return train(mcfg, cfg, corpus)["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    args = ap.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus("default")
    context, batch = 64, 32
    tokens = args.steps * batch * context
    base_cfg = TrainConfig(steps=args.steps, batch=batch, warmup=5, record_every=10, eval_batches=1, threads=1)
    variants = {
        "baseline fp32 fused (plain PyTorch)": lambda d: baseline_seconds(corpus, d, base_cfg, context),
        "attnscale fp32 fused": lambda d: attnscale_seconds(corpus, d, base_cfg, context, "fused"),
        "attnscale bf16 explicit (preset)": lambda d: attnscale_seconds(
            corpus, d, TrainConfig(**{**base_cfg.__dict__, "dtype": "bf16"}), context, "explicit"),
        "attnscale bf16 fused": lambda d: attnscale_seconds(
            corpus, d, TrainConfig(**{**base_cfg.__dict__, "dtype": "bf16"}), context, "fused"),
    }
    print(f"torch {torch.__version__}, 1 thread, T={context}, batch={batch}, {args.steps} steps x {args.rounds} rounds, "
          "recording every 10 steps in attnscale, rounds alternate")
    for d in args.widths:
        for fn in variants.values():  # warm-up: allocator, oneDNN kernels
            fn(d)
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(fn(d))
        base = statistics.median(times[next(iter(variants))])
        print(f"\nd_model={d}, 2 layers, 4 heads")
        for name, ts in times.items():
            med = statistics.median(ts)
            spread = (max(ts) - min(ts)) / med
            print(f"  {name:38s} {tokens / med:9.0f} tok/s   x{base / med:5.2f} vs baseline   (range {100 * spread:.0f}%)")


if __name__ == "__main__":
    main()
