"""Does QK-Clip stand in for the 1/sqrt(d) scale? A Llama-shaped model trained from scratch three ways.

    python examples/qk_clip_study.py                    # 3 ways × 2 seeds, 150 steps each: ~20 min on 2 busy cores
    python examples/qk_clip_study.py --tau 20 --seeds 3 --out runs/qk-clip-20

The model is ``tiny_llama`` (``LlamaForCausalLM`` from its config: RoPE, RMSNorm, SwiGLU,
4 query heads on 2 key/value heads), trained with the Hugging Face Trainer on the
embedded corpus, the same seeds and batches for each way:
1. ``scaled``: the model's own 1/sqrt(head_dim);
2. ``unscaled``: its scale set to 1, as the course warns against;
3. ``unscaled+qk-clip``: the same, with QK-Clip at ``--tau`` after every step.
The watch probes every ``--every`` steps, with a max-score alert at tau (a warning).
Per run: held-out perplexity (exp of the mean next-token cross-entropy on the
corpus's held-out split), the step of the first alert, and the watch log. Per way:
the mean perplexity ± its standard error over seeds, with a 95% interval from
Student's t. Everything goes to the run folder ``--out``: ``results.json``,
``summary.md`` and each run's ``watch.jsonl`` (``attnscale watch-report`` draws one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_llama.py, beside this file
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from tiny_llama import Windows, corpus_windows, tiny_llama  # noqa: E402

from attnscale.lm.data import load_corpus  # noqa: E402
from attnscale.report.analysis import mean_se  # noqa: E402
from attnscale.watch.alerts import MaxScore  # noqa: E402
from attnscale.watch.record import read_log  # noqa: E402
from attnscale.watch.sinks import JsonlSink  # noqa: E402

WAYS = ("scaled", "unscaled", "unscaled+qk-clip")
# Student's t, 97.5% quantile, by degrees of freedom (a 95% two-sided interval from n seeds: df = n - 1)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def held_out_perplexity(model, ids: torch.Tensor, context: int, windows: int) -> float:
    """exp(mean next-token cross-entropy, nats) over the first ``windows`` windows of the held-out split."""
    data = Windows(ids, context)
    batch = torch.stack([data[i]["input_ids"] for i in range(min(windows, len(data)))])
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=batch, labels=batch).loss.item()  # the model shifts the labels itself
    return math.exp(loss)


def one_run(way: str, seed: int, args, out: Path) -> dict:
    from transformers import Trainer, TrainingArguments

    from attnscale.watch.hf import WatchCallback

    data, vocab = corpus_windows(args.context)
    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, context=args.context,
                       seed=seed, unscaled=way != "scaled")
    folder = out / way / f"seed-{seed}"
    callback = WatchCallback(every=args.every, alerts=[MaxScore(tau=args.tau, action="warn")],
                             sinks=[JsonlSink(folder / "watch.jsonl")], report=False,
                             qk_clip=args.tau if way.endswith("qk-clip") else None)
    training = TrainingArguments(output_dir=str(folder), max_steps=args.steps, per_device_train_batch_size=args.batch,
                                 learning_rate=args.lr, logging_steps=args.every, save_strategy="no", report_to="none",
                                 use_cpu=True, disable_tqdm=True, seed=seed, data_seed=seed)
    Trainer(model=model, args=training, train_dataset=data, callbacks=[callback]).train()
    records = read_log(folder / "watch.jsonl")
    alerted = [r.step for r in records if r.alerts]
    return {"way": way, "seed": seed,
            "perplexity": held_out_perplexity(model, load_corpus("default").valid, args.context, args.eval_windows),
            "first_alert_step": alerted[0] if alerted else None,
            "max_score": [r.summary["attn/max_score"] for r in records],
            "min_effective_words": [r.summary["attn/min_effective_words"] for r in records],
            "steps": [r.step for r in records]}


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per way: mean perplexity, its standard error and 95% interval (Student's t), and the first alerts."""
    out = {}
    for way in WAYS:
        rows = [r for r in runs if r["way"] == way]
        if not rows:
            continue
        mean, se = mean_se([r["perplexity"] for r in rows])
        half = T_975[len(rows) - 1] * se if se is not None and len(rows) - 1 in T_975 else None
        out[way] = {"runs": len(rows), "perplexity": mean, "se": se, "ci95": half,
                    "first_alert_steps": [r["first_alert_step"] for r in rows],
                    "final_max_score": [r["max_score"][-1] for r in rows]}
    return out


def table(summary: dict[str, dict], title: str) -> str:
    """The summary as a Markdown table under ``title``."""
    lines = [title, "",
             "| way | seeds | held-out perplexity | ± SE | 95% (t) | first alert (step) | final max score |",
             "|---|---|---|---|---|---|---|"]
    for way, s in summary.items():
        se = "" if s["se"] is None else f"{s['se']:.3f}"
        ci = "" if s["ci95"] is None else f"± {s['ci95']:.3f}"
        alerts = ", ".join("none" if a is None else str(a) for a in s["first_alert_steps"])
        peaks = ", ".join(f"{m:.1f}" for m in s["final_max_score"])
        lines.append(f"| {way} | {s['runs']} | {s['perplexity']:.3f} | {se} | {ci} | {alerts} | {peaks} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--every", type=int, default=25, help="probe every this many steps")
    p.add_argument("--tau", type=float, default=10.0, help="QK-Clip's cap on each head's max score, and the alert's")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows the perplexity is taken over")
    p.add_argument("--out", type=Path, default=Path("runs/qk-clip"))
    args = p.parse_args(argv)
    if args.seeds < 1 or args.steps < args.every:
        p.error("--seeds takes at least 1, and --steps at least --every (one probe per run)")

    runs = [one_run(way, seed, args, args.out) for seed in range(args.seeds) for way in WAYS]
    summary = summarize(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "summary": summary, "runs": runs}, indent=1))
    text = table(summary, f"tau {args.tau}, {args.seeds} seeds, {args.steps} steps of {args.batch} × {args.context} "
                          f"tokens, {args.layers} layers, hidden {args.hidden}, lr {args.lr}")
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
