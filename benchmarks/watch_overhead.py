"""What the watch costs a Hugging Face Trainer run, with and without WatchCallback in one training run.

A Llama-shaped model (``LlamaForCausalLM`` from a ``LlamaConfig``: RoPE, RMSNorm, SwiGLU,
grouped-query attention) trains on attnscale's embedded corpus with the Trainer. After
``--warmup`` steps, the run is cut into blocks of ``--every`` steps, and a gate lets the
WatchCallback act in every other block (with, without; without, with; ...: ABBA, so a
steady drift of the machine falls on both alike). The Trainer logs every ``--every``
steps throughout, as a run would; in a "with" block the callback probes at its last step.

Why one run and not two, and why not whole blocks: runs of identical work differ by up
to ±10% on a shared machine, and within one run a block's median step drifts by ±20%
over minutes with the machine (lag-1 correlation 0.74 between 100-step blocks in an
A/A run), ten times the 1% to be resolved. So the cost is read where it falls, against
the steps right before it. A probe step, its log and the step after (where caches
refill) are the window; its excess is the sum of those three steps' times minus three
times the median of the ``--local`` steps before it. A "without" block's last step
logs too, so its window holds the same log and no probe. A pair's probe cost is the
"with" window's excess minus the "without" one's, over ``every`` steps at their local
median: the share of the run a probe every ``every`` steps costs. The printed figure
is the mean over pairs with a 95% interval from the t distribution with pairs − 1
degrees of freedom, computed on wall time (what the run pays) and on this process's
CPU time (what it pays where neighbours share the cores; ``--threads 1`` keeps idle
worker threads from spinning into it).

What the callback costs on every other step (its ``on_step_end`` finding nothing to
do) is too small to see in a step's time, so it is timed directly, 20,000 calls, and
added over the median step. The watch's own timer (``watch/seconds``) is printed
beside. ``--aa`` never opens the gate: both windows hold the same work, so its interval
should hold 0, which checks the method on this machine.

    python benchmarks/watch_overhead.py                  # 40 pairs of 100-step blocks at the default cadence
    python benchmarks/watch_overhead.py --aa             # the same with the watch never acting: should read 0
    python benchmarks/watch_overhead.py --report-to tensorboard   # with the integration writing too
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

from attnscale.watch.loop import EVERY  # noqa: E402

WINDOW = 3  # steps from a block's last step on that carry the probe, its log and the refill after
LOCAL = 20  # steps before a window whose median is its baseline: close enough that the machine has not drifted
IDLE_CALLS = 20_000


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


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with ``df`` degrees of freedom: bisection on the CDF, which
    is 1 - I_x(df/2, 1/2) / 2 at x = df / (df + t²), the incomplete beta integrated by Simpson's rule
    after the substitution u = s^(2/df), which removes the integrand's singularity at 0."""
    a = df / 2

    def upper_tail(t: float) -> float:  # P(T > t) for t >= 0
        x = df / (df + t * t)
        n = 2000  # Simpson panels: the integrand below is smooth on [0, x^a]
        top = x ** a
        h = top / n
        f = [(1 - (i * h) ** (1 / a)) ** -0.5 for i in range(n)] + [0.0]
        f[n] = (1 - x) ** -0.5 if x < 1 else 0.0
        area = h / 3 * (f[0] + f[n] + 4 * sum(f[1:n:2]) + 2 * sum(f[2:n:2]))
        beta = math.exp(math.lgamma(a) + math.lgamma(0.5) - math.lgamma(a + 0.5))
        return area / a / beta / 2  # ∫ s^(a-1) (1-s)^(-1/2) ds = (1/a) ∫ (1-u^(1/a))^(-1/2) du

    lo, hi = 0.0, 1.0
    while upper_tail(hi) > 1 - p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if upper_tail(mid) > 1 - p else (lo, mid)
    return (lo + hi) / 2


def gate_on(block: int) -> bool:
    """ABBA: pair k holds blocks 2k and 2k+1; the watch acts in the first of an even pair, the second of an odd one."""
    return (block % 2 == 0) == ((block // 2) % 2 == 0)


def window_excess(intervals: dict[int, float], first: int, every: int, local: int = LOCAL) -> tuple[float, float]:
    """(seconds of the window from the block's last step on, over its baseline; the baseline step): the
    baseline is the median of up to ``local`` steps before the last, none of them in the previous window."""
    last = first + every - 1
    median = statistics.median(intervals[s] for s in range(max(first + WINDOW - 1, last - local), last))
    return sum(intervals[s] - median for s in range(last, last + WINDOW)), median


def pair_overheads(intervals: dict[int, float], warmup: int, every: int, pairs: int,
                   local: int = LOCAL) -> list[float]:
    """Per ABBA pair: the "with" window's excess minus the "without" one's, over ``every`` baseline steps."""
    out = []
    for k in range(pairs):
        got = {gate_on(b): window_excess(intervals, warmup + b * every + 1, every, local) for b in (2 * k, 2 * k + 1)}
        (with_excess, with_step), (without_excess, without_step) = got[True], got[False]
        out.append((with_excess - without_excess) / (every * (with_step + without_step) / 2))
    return out


def idle_call_seconds(callback, training_args, every: int, calls: int = IDLE_CALLS) -> float:
    """Seconds of one ``on_step_end`` of ``callback`` at a step where it does not probe (median of 5 timings)."""
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(global_step=every + 1), TrainerControl()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            callback.on_step_end(training_args, state, control)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def summarize(overheads: list[float]) -> dict[str, float]:
    """Mean of the pairs' overheads and its 95% t interval."""
    n = len(overheads)
    mean = statistics.fmean(overheads)
    half = t_quantile(0.975, n - 1) * statistics.stdev(overheads) / math.sqrt(n) if n > 1 else math.inf
    return {"mean": mean, "low": mean - half, "high": mean + half, "pairs": n}


def verdict(s: dict[str, float], limit: float = 0.01) -> str:
    """What the interval allows about "at most ``limit``"."""
    if s["high"] <= limit:
        return f"at most {100 * limit:g}% (the interval's upper end is {100 * s['high']:+.2f}%)"
    if s["low"] > limit:
        return f"more than {100 * limit:g}% (the interval's lower end is {100 * s['low']:+.2f}%)"
    return f"inconclusive at {100 * limit:g}%: the interval holds values on both sides"


def train(args, out: Path) -> tuple[dict[str, dict[int, float]], float, float]:
    """One gated training run: ({"wall": seconds of each step from its start to the next step's start,
    "cpu": the same in CPU seconds of this process}, the watch's own seconds, the seconds of one of its
    calls at a step where it does not probe)."""
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "examples" / "tiny_llama.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # loaded by its path, so nothing is put on sys.path
    corpus_windows, tiny_llama = example.corpus_windows, example.tiny_llama
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from attnscale.watch.callbacks.hf import WatchCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts: dict[str, dict[int, float]] = {"wall": {}, "cpu": {}}

        def on_step_begin(self, args_, state, control, **kwargs):
            self.starts["wall"][state.global_step + 1] = time.perf_counter()
            self.starts["cpu"][state.global_step + 1] = time.process_time()

    class Gate(TrainerCallback):
        """Forwards the step events to the watch only in "with" blocks; set-up and close always."""

        def __init__(self, inner):
            self.inner = inner

        def acting(self, step: int) -> bool:
            return not args.aa and step > args.warmup and gate_on((step - args.warmup - 1) // args.every)

        def on_train_begin(self, *a, **kw):
            return self.inner.on_train_begin(*a, **kw)

        def on_train_end(self, *a, **kw):
            return self.inner.on_train_end(*a, **kw)

        def on_step_end(self, args_, state, control, **kw):
            return self.inner.on_step_end(args_, state, control, **kw) if self.acting(state.global_step) else None

        def on_log(self, args_, state, control, **kw):
            return self.inner.on_log(args_, state, control, **kw) if self.acting(state.global_step) else None

    data, vocab = corpus_windows(args.context)
    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                       context=args.context, seed=0)
    watch, clock = WatchCallback(every=args.every), StepClock()
    steps = args.warmup + 2 * args.pairs * args.every + WINDOW  # the last window closes inside the run
    training = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=args.batch,
                                 learning_rate=1e-3, logging_steps=args.every, save_strategy="no",
                                 report_to=args.report_to, use_cpu=args.device == "cpu", disable_tqdm=True,
                                 dataloader_num_workers=0, seed=0)
    Trainer(model=model, args=training, train_dataset=data, callbacks=[Gate(watch), clock]).train()
    intervals = {clock_name: {s: starts[s + 1] - starts[s] for s in starts if s + 1 in starts}
                 for clock_name, starts in clock.starts.items()}
    return intervals, watch.watch.seconds, idle_call_seconds(watch, training, args.every)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=int, default=EVERY, help=f"probe (and log) every this many steps; the block length (default {EVERY})")
    p.add_argument("--pairs", type=int, default=40, help="pairs of blocks, one with the watch and one without (default 40)")
    p.add_argument("--warmup", type=int, default=None, help="steps before the first block (default: one block)")
    p.add_argument("--local", type=int, default=LOCAL, help=f"steps before a window whose median is its baseline (default {LOCAL})")
    p.add_argument("--aa", action="store_true", help="never let the watch act: an A/A check of the method")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--report-to", default="none", help="Trainer integrations, e.g. tensorboard (default none)")
    p.add_argument("--device", choices=["cpu", "auto"], default="cpu", help="cpu, or auto (a GPU where there is one)")
    p.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's own choice)")
    p.add_argument("--save", type=Path, default=None, help="write every step's wall and CPU seconds to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.warmup = args.every if args.warmup is None else args.warmup
    if args.every < 2 * WINDOW or args.pairs < 2 or args.warmup % args.every:
        p.error(f"--every takes at least {2 * WINDOW}, --pairs at least 2, and --warmup a multiple of --every")

    print(cpu_line())
    print(f"Llama {args.layers} layers, hidden {args.hidden}, {args.heads} heads over {args.kv_heads} kv heads; "
          f"{args.batch} × {args.context} tokens a step; {args.pairs} pairs of {args.every}-step blocks (ABBA) after "
          f"{args.warmup} warm-up steps; probe every {args.every}; report_to {args.report_to}"
          + ("; A/A: the watch never acts" if args.aa else ""))
    with tempfile.TemporaryDirectory() as tmp:
        intervals, own, idle = train(args, Path(tmp))
    if args.save:
        args.save.write_text(json.dumps({"every": args.every, "warmup": args.warmup, "pairs": args.pairs, "aa": args.aa,
                                         "local": args.local, "watch_seconds": own, "idle_call_seconds": idle,
                                         **intervals}))
    step = statistics.median(intervals["wall"].values())
    per_step = 0.0 if args.aa else idle / step * (args.every - 1) / args.every
    for clock_name, times in intervals.items():
        overheads = pair_overheads(times, args.warmup, args.every, args.pairs, args.local)
        s = summarize([o + per_step for o in overheads])
        print(f"{clock_name} pairs (probe windows): " + " ".join(f"{100 * o:+.2f}%" for o in overheads))
        print(f"{clock_name} overhead: {100 * s['mean']:+.2f}% [95% t interval {100 * s['low']:+.2f}%, "
              f"{100 * s['high']:+.2f}%] over {s['pairs']} pairs, the calls between probes "
              f"({100 * per_step:.4f}%) included")
        print(f"{clock_name} verdict: {verdict(s)}")
    print(f"a call between probes: {1e6 * idle:.2f} µs, against a median step of {1e3 * step:.2f} ms; watch's own "
          f"timer: {own:.3f} s, {100 * own / sum(intervals['wall'].values()):.2f}% of the run's wall time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
