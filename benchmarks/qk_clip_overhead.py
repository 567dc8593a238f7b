"""What QK-Clip costs a training step: the same plain loop with and without ``Watch(qk_clip=tau)``.

QK-Clip needs every head's largest score from every step's own forward: the
attention calls are captured while the model trains and each is reduced to H
numbers with one more q·kᵀ (``capture.smax.head_max``: float32 at these sizes); attnscale's
own models keep their fused path (SDPA), q and k read as each call begins.
This measures that, side by side in one process: for each model, rounds of
``--steps`` training steps (same seed, same batches) without and with the clip,
the order flipped every round, medians of the CPU time of this process
(``time.process_time``, which neighbours on shared cores disturb far less than
wall time) and of the wall time, and the median of each round's own ratio (its
two runs adjacent in time). The watch never probes here (``every`` past the
run): only the clip's own cost is measured. tau is set high (1e9) so no weight
is ever scaled and both runs do the same arithmetic; scaling the rows is a few
in-place multiplies per layer when it happens.

    python benchmarks/qk_clip_overhead.py                  # both models, 3 rounds of 30 steps, one thread
    python benchmarks/qk_clip_overhead.py --models llama --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnscale.lm.data import batches, load_corpus  # noqa: E402
from attnscale.watch.loop import Watch  # noqa: E402

MODELS = ("attnscale", "llama")


def build(name: str, args, vocab: int):
    """(model, loss of a batch of token ids) for one of ``MODELS``, freshly initialised with seed 0."""
    if name == "attnscale":
        from attnscale.lm.model import ModelConfig, build_model

        model = build_model(ModelConfig(vocab_size=vocab, context=args.context, d_model=args.hidden, n_layers=args.layers,
                                        n_heads=args.heads, head_dim=args.hidden // args.heads), seed=0)
        return model, lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "examples" / "tiny_llama.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # loaded by its path, so nothing is put on sys.path
    tiny_llama = example.tiny_llama

    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.heads // 2,
                       context=args.context)
    return model, lambda x, y: model(input_ids=x, labels=x).loss


def one_round(name: str, args, corpus, clipped: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``args.steps`` training steps of a fresh model."""
    model, loss_of = build(name, args, corpus.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    watch = Watch(model, every=10**9, alerts=(), qk_clip=1e9 if clipped else None)
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batches(corpus.train, args.batch, args.context, gen)
        loss_of(x, y).backward()
        opt.step()
        opt.zero_grad()
        watch.step(step)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    watch.close()
    return cpu, wall


def summarize(plain: list[float], clipped: list[float]) -> dict[str, float]:
    """Medians, the ratio of the medians (clipped over plain) and the median of each round's own ratio
    (``paired``: the two runs of a round are adjacent in time, so a drift of the machine's load between rounds
    cancels out of it)."""
    a, b = statistics.median(plain), statistics.median(clipped)
    return {"plain": a, "clipped": b, "ratio": b / a, "paired": statistics.median(c / p for p, c in zip(plain, clipped))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time is not inflated by idle spinning)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    corpus = load_corpus("default")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.steps} steps a round, "
          f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, {args.batch} × {args.context} tokens a step")
    for name in args.models:
        one_round(name, args, corpus, False)  # warm-up: first calls, allocator, lazy imports
        times = {False: [], True: []}
        for r in range(args.rounds):
            for clipped in ((False, True) if r % 2 == 0 else (True, False)):
                times[clipped].append(one_round(name, args, corpus, clipped))
            print(f"{name} round {r + 1}: CPU without {times[False][-1][0]:.2f} s, with {times[True][-1][0]:.2f} s; "
                  f"wall without {times[False][-1][1]:.2f} s, with {times[True][-1][1]:.2f} s")
        cpu = summarize([t[0] for t in times[False]], [t[0] for t in times[True]])
        wall = summarize([t[1] for t in times[False]], [t[1] for t in times[True]])
        print(f"{name} median: CPU without {cpu['plain']:.4f} s, with {cpu['clipped']:.4f} s, ratio {cpu['ratio']:.3f} "
              f"(median of the rounds' own ratios {cpu['paired']:.3f}); "
              f"wall without {wall['plain']:.2f} s, with {wall['clipped']:.2f} s, ratio {wall['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
