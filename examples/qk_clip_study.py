"""Does QK-Clip stand in for the 1/sqrt(d) scale, and at what tau? A Llama-shaped model trained from scratch.

    python examples/qk_clip_study.py                          # 5 ways × 10 seeds, 600 steps each: runs/qk-clip
    python examples/qk_clip_study.py --taus 20 50 --seeds 3 --out runs/qk-clip-20-50

The model is ``tiny_llama`` (``LlamaForCausalLM`` from its config: RoPE, RMSNorm, SwiGLU,
4 query heads on 2 key/value heads), trained with the Hugging Face Trainer on the
embedded corpus, the same seeds and batches for each way:
1. ``scaled``: the model's own 1/sqrt(head_dim);
2. ``unscaled``: its scale set to 1, as the course warns against;
3. ``unscaled+qk-clip τ=T``, one way per ``--taus`` value: the same, with QK-Clip at T after every step.
The watch probes every ``--every`` steps, with a max-score alert at ``--alert-tau`` (twice a way's clip tau where that is as high)
(a warning; 100 by default, the tau Kimi K2 trained with). Per run: held-out
perplexity (exp of the mean next-token cross-entropy on the corpus's held-out
split), the step of the first alert, every layer's largest max score and mean
effective words at each probe, and the watch log. Per way: the mean perplexity ±
its standard error over seeds, with a 95% interval from Student's t. Everything
goes to the run folder ``--out``: ``results.json``, ``summary.md``, ``by-layer.png``
(max score and effective words by layer over steps, every way) and each run's
``watch.jsonl`` (``attnscale watch-report`` draws one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from options import alert_tau  # noqa: E402
from tiny_llama import Windows, corpus_windows, tiny_llama  # noqa: E402

from attnscale.lm.data import load_corpus  # noqa: E402
from attnscale.analysis.estimates import mean_se  # noqa: E402
from attnscale.analysis.intervals import interval, p_text, paired_holm, reading  # noqa: E402
from attnscale.watch.alerts import MaxScore  # noqa: E402
from attnscale.watch.logs.line import read_log  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402

CLIPPED = "unscaled+qk-clip τ="


def ways(taus) -> list[str]:
    """The ways to train, in order: the model as made, unscaled, then unscaled with QK-Clip at each tau."""
    return ["scaled", "unscaled", *(f"{CLIPPED}{tau:g}" for tau in taus)]


def clip_tau(way: str) -> float | None:
    return float(way[len(CLIPPED):]) if way.startswith(CLIPPED) else None


def folder_of(way: str) -> str:
    """The way's folder name in the run folder: "unscaled+qk-clip τ=10" is "unscaled+qk-clip-tau-10"."""
    return way.replace(" ", "").replace("τ=", "-tau-")


def by_layer(records) -> dict[str, list[list[float]]]:
    """Per probe and layer: the largest max score over the layer's heads, and its heads' mean effective words."""
    def per_layer(r, measure, reduce):
        return [reduce([v for v in heads if v is not None]) for heads in r.grid(measure)]

    return {"max_score": [per_layer(r, "max_score", max) for r in records],
            "effective_words": [per_layer(r, "effective_words", lambda v: sum(v) / len(v)) for r in records]}


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

    from attnscale.watch.callbacks.hf import WatchCallback

    data, vocab = corpus_windows(args.context)
    model = tiny_llama(vocab, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, context=args.context,
                       seed=seed, unscaled=way != "scaled")
    folder = out / folder_of(way) / f"seed-{seed}"
    callback = WatchCallback(every=args.every, alerts=[MaxScore(tau=alert_tau(clip_tau(way), args.alert_tau), action="warn")],
                             sinks=[JsonlSink(folder / "watch.jsonl")], report=False, qk_clip=clip_tau(way))
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
            "steps": [r.step for r in records], "by_layer": by_layer(records)}


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per way: mean perplexity, its standard error and 95% interval (Student's t), and the first alerts."""
    out = {}
    for way in dict.fromkeys(r["way"] for r in runs):
        rows = [r for r in runs if r["way"] == way]
        mean, se = mean_se([r["perplexity"] for r in rows])
        bounds = interval(mean, se, len(rows))
        half = None if bounds is None else bounds[1] - mean
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


def versus(runs: list[dict], reference: str = "scaled") -> dict[str, dict]:
    """Every other way against ``reference``, paired by seed (same seed, same init and batches): the mean
    perplexity difference, its SE and 95% t interval, the paired t test's p, that p adjusted by Holm over
    the ways compared, and a reading: "lower" or "higher" where the adjusted p is under 1 − LEVEL, else
    "inconclusive"."""
    by = {}
    for r in runs:
        by.setdefault(r["way"], {})[r["seed"]] = r["perplexity"]
    others = [w for w in by if w != reference]
    tests = paired_holm([(by[w], by[reference]) for w in others])
    return {way: {**t, "reading": reading(t)} for way, t in zip(others, tests)}


def versus_table(compared: dict[str, dict], reference: str = "scaled") -> str:
    lines = [f"Against `{reference}`, paired by seed (Holm over the {len(compared)} ways):", "",
             "| way | seeds | perplexity − scaled's | 95% (t) | p | p (Holm) | reading |", "|---|---|---|---|---|---|---|"]
    for way, c in compared.items():
        ci = "" if c["interval"] is None else f"[{c['interval'][0]:+.3f}, {c['interval'][1]:+.3f}]"
        lines.append(f"| {way} | {c['n']} | {c['diff']:+.3f} | {ci} | {p_text(c['p'])} | {p_text(c['p_holm'])} | "
                     f"{c['reading']} |")
    return "\n".join(lines) + "\n"


def figure(runs: list[dict], path: Path) -> Path:
    """Max score (log scale) and mean effective words by layer over steps: a column a layer, a colour a way,
    each seed thin and the median over seeds thick."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = len(runs[0]["by_layer"]["max_score"][0])
    names = list(dict.fromkeys(r["way"] for r in runs))
    colours = dict(zip(names, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(2, layers, figsize=(4.2 * layers, 6.4), squeeze=False, sharex=True)
    for row, measure in enumerate(("max_score", "effective_words")):
        for layer in range(layers):
            ax = axes[row][layer]
            for way in names:
                mine = [r for r in runs if r["way"] == way]
                traces = [[probe[layer] for probe in r["by_layer"][measure]] for r in mine]
                for r, trace in zip(mine, traces):
                    ax.plot(r["steps"], trace, color=colours[way], lw=0.6, alpha=0.35)
                ax.plot(mine[0]["steps"], [statistics.median(at) for at in zip(*traces)], color=colours[way], lw=2.2,
                        label=way)
    for layer in range(layers):
        axes[0][layer].set_yscale("log")
        axes[0][layer].set_title(f"layer {layer}: largest max |score| of its heads", fontsize=10)
        axes[1][layer].set_title(f"layer {layer}: its heads' mean effective words", fontsize=10)
        axes[1][layer].set_xlabel("step")
    axes[0][0].legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=50, help="probe every this many steps")
    p.add_argument("--taus", type=float, nargs="+", default=[10.0, 30.0, 100.0],
                   help="QK-Clip's cap on each head's max score: one clipped way per value")
    p.add_argument("--alert-tau", type=float, default=100.0, help="the max-score alert's threshold, in every way (twice a clip's tau where that is as high)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows the perplexity is taken over")
    p.add_argument("--out", type=Path, default=Path("runs/qk-clip"))
    args = p.parse_args(argv)
    if args.seeds < 1 or args.steps < args.every or min(args.taus) <= 0:
        p.error("--seeds takes at least 1, --steps at least --every (one probe per run), --taus positive numbers")

    runs = [one_run(way, seed, args, args.out) for seed in range(args.seeds) for way in ways(args.taus)]
    summary, compared = summarize(runs), versus(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "summary": summary, "versus_scaled": compared,
                                                       "runs": runs}, indent=1))
    figure(runs, args.out / "by-layer.png")
    text = table(summary, f"QK-Clip at tau {', '.join(f'{t:g}' for t in args.taus)}, alert at {args.alert_tau:g}, "
                          f"{args.seeds} seeds, {args.steps} steps of {args.batch} × {args.context} "
                          f"tokens, {args.layers} layers, hidden {args.hidden}, lr {args.lr}")
    if compared:
        text += "\n" + versus_table(compared)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
