"""Where a training step's time goes: attnscale's preset step and nanoGPT's, in CPU time, with torch.profiler.

Both steps run in this process, alternating, at vs_nanogpt.py's shape (2 layers,
4 heads, T 64, batch 32, one token a character: 65 for Tiny Shakespeare):
attnscale's TinyLM with the default preset's choices, recording diagnostics
every 10th step as train.py does, fused AdamW, one read-back per step;
nanoGPT's GPT from its model.py with the body of its train.py loop (fresh np.memmap batch, clipping, foreach AdamW, loss.item()).
CPU time (``time.process_time``) is what the process itself spent, so other
processes on the machine change it far less than wall time.

    python benchmarks/step_profile.py /path/to/nanoGPT --corpus .../tinyshakespeare/input.txt [--d-model 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from attnscale.lm.data import batches, load_corpus
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.presets import budget
from attnscale.lm.step_measures import read_back, recording
from attnscale.lm.train import _attention_impl
from attnscale.core.device import resolve_precision


def attnscale_step(corpus, d: int, impl: str | None = None):
    """One training step a call (the first does not record, every 10th does); ``impl``: the attention path
    of the steps that do not record (None: what training picks for the preset here)."""
    preset = budget("default", corpus.vocab_size)  # what `attnscale sweep` trains
    cfg = replace(preset.train, batch=32, device="cpu", record_every=10)
    torch.manual_seed(0)
    mcfg = ModelConfig(vocab_size=corpus.vocab_size, head_dim=None, **{**preset.model, "d_model": d})
    if impl is None:
        impl = _attention_impl(cfg.attention, mcfg, torch.device("cpu"), resolve_precision(cfg.dtype, torch.device("cpu")))
    model = TinyLM(replace(mcfg, impl=impl))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(0)
    counter = [0]

    def step():
        i = counter[0] = counter[0] + 1
        x, y = batches(corpus.train, 32, 64, gen)
        with recording(model, i % cfg.record_every == 0, cfg.frozen_threshold, cfg.record_sequences) as rec:
            loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        read_back(rec, loss, norm)
        opt.step()

    return step


def nanogpt_step(nanogpt: Path, train_bin: Path, vocab_size: int, d: int):
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    torch.manual_seed(1337)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=d, block_size=64, bias=False, vocab_size=vocab_size, dropout=0.0))
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")

    def get_batch():  # train.py's get_batch
        data = np.memmap(train_bin, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - 64, (32,))
        x = torch.stack([torch.from_numpy((data[i:i + 64]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + 64]).astype(np.int64)) for i in ix])
        return x, y

    batch = [get_batch()]

    def step():  # train.py's loop body with gradient_accumulation_steps=1, no GradScaler (fp32)
        _, loss = model(*batch[0])
        batch[0] = get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    return step


def _vocab(work: Path) -> int:
    """The characters of the whole text, as prepare_nanogpt counted them (the ids in train.bin lie below it)."""
    with open(work / "data/shakespeare_char/meta.pkl", "rb") as f:
        return pickle.load(f)["vocab_size"]


def cpu_ms(step, n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        step()
    return 1000 * (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nanogpt", type=Path)
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="steps a round (a multiple of 10)")
    ap.add_argument("--table", type=int, default=16, help="rows of each profiler table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_nanogpt import prepare_nanogpt

    with tempfile.TemporaryDirectory() as work:
        prepare_nanogpt(args.nanogpt.resolve(), args.corpus.resolve(), Path(work))
        corpus = load_corpus(str(args.corpus), "char", cache_dir=Path(work) / "cache")
        steps = {"attnscale": attnscale_step(corpus, args.d_model),
                 "nanoGPT": nanogpt_step(args.nanogpt.resolve(), Path(work) / "data/shakespeare_char/train.bin",
                                         _vocab(Path(work)), args.d_model)}
        for fn in steps.values():
            cpu_ms(fn, 10)  # warm-up
        times = {k: [] for k in steps}
        for _ in range(args.rounds):
            for k, fn in steps.items():
                times[k].append(cpu_ms(fn, args.steps))
        print(f"d_model {args.d_model}, {args.threads} thread(s), CPU ms a step (median of {args.rounds} alternating rounds):")
        for k, ts in times.items():
            print(f"  {k:10s} {statistics.median(ts):7.1f}   rounds {[round(t, 1) for t in ts]}")
        a, n = statistics.median(times["attnscale"]), statistics.median(times["nanoGPT"])
        print(f"  nanoGPT / attnscale = {n / a:.2f}")
        for k, fn in steps.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    fn()
            print(f"\n{k}, 10 steps:")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.table))


if __name__ == "__main__":
    main()
