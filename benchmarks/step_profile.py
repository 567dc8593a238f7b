"""Where a training step's time goes: attnscale's preset step and nanoGPT's, in CPU time, with torch.profiler.

Both steps run in this process, alternating, at vs_nanogpt.py's shape (2 layers,
4 heads, T 64, batch 32, one token a character: 65 for Tiny Shakespeare):
attnscale's own training step (``lm.train``) with the default preset's choices, in
the precision ``--dtype`` resolves to here (autocast, or with ``--weights bf16`` a bf16 copy of
fp32 masters), recording diagnostics every 10th step, fused AdamW, one read-back per step;
nanoGPT's GPT from its model.py with the body of its train.py loop (fresh np.memmap batch, clipping, foreach AdamW, loss.item()).
CPU time (``time.process_time``) is what the process itself spent, so other
processes on the machine change it far less than wall time.

    python benchmarks/step_profile.py /path/to/nanoGPT --corpus .../tinyshakespeare/input.txt [--d-model 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from attnscale.lm.data import load_corpus

from step_limit import training_step


def attnscale_step(corpus, d: int, dtype: str = "auto", weights: str = "fp32"):
    """Training's own step (``step_limit.training_step``), one a call from step 1 on (every 10th records)."""
    step, counter = training_step(corpus, d, dtype, weights), [0]

    def one():
        counter[0] += 1
        step(counter[0])

    return one


def _module_at(path: Path) -> ModuleType:
    """The Python file at ``path`` as a module, loaded by its path so nothing is put on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = sys.modules[path.stem] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def nanogpt_step(nanogpt: Path, train_bin: Path, vocab_size: int, d: int):
    model_py = _module_at(nanogpt / "model.py")  # nanoGPT's model.py
    GPT, GPTConfig = model_py.GPT, model_py.GPTConfig

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


COPIES = ("aten::copy_", "aten::_to_copy")


def casts_line(events) -> str:
    """Calls and self CPU time of the copies and casts (``COPIES``) in a profile's averages: where
    autocast's casts show."""
    found = {e.key: e for e in events if e.key in COPIES}
    parts = [f"{name} {found[name].count} calls, {found[name].self_cpu_time_total / 1e3:.1f} ms self"
             if name in found else f"{name} 0 calls" for name in COPIES]
    return "copies and casts: " + "; ".join(parts)


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
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"], help="attnscale's precision")
    ap.add_argument("--weights", default="fp32", choices=["fp32", "bf16"], help="what a bf16 step computes on")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from vs_nanogpt import prepare_nanogpt

    with tempfile.TemporaryDirectory() as work:
        prepare_nanogpt(args.nanogpt.resolve(), args.corpus.resolve(), Path(work))
        corpus = load_corpus(str(args.corpus), "char", cache_dir=Path(work) / "cache")
        steps = {"attnscale": attnscale_step(corpus, args.d_model, args.dtype, args.weights),
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
            events = prof.key_averages()
            print(f"\n{k}, 10 steps:")
            print(events.table(sort_by="self_cpu_time_total", row_limit=args.table))
            print(casts_line(events))


if __name__ == "__main__":
    main()
