"""The scale-scheme study's numbers: pure functions on plain numbers (no I/O, no plots).

Per run (``run_measures``), from its recorded steps:
- the maximum |attention logit| over training, per layer: attention logit
  growth (Wortsman et al. 2023, "Small-scale proxies for large-scale
  Transformer training instabilities"), read from the recorded ``max_score``
  (max |scaled score| over the scores that count);
- the lowest per-head effective words reached, and how many heads collapse:
  entropy collapse (Zhai et al. 2023, "Stabilizing Transformer Training by
  Preventing Attention Entropy Collapse"); a head has collapsed when, at some
  recorded step, its rows spread on average over fewer than ``COLLAPSE_WORDS``
  effective words.

Per scheme and width (``sensitivity``): learning-rate sensitivity as Wortsman
et al. define it, E over the LR grid of [min(final loss, loss at init) − best
final loss], per seed, then mean and standard error over seeds. A diverged run
has no final loss; it counts as the loss at init (the worst a run is charged).

A recorded step, as ``runs.record.TrainRun`` gives it:
{"step": int, "loss": float | None, "layers": [{"max_score": [per head], "effective_words": [...], ...}]}.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from attnscale.analysis import intervals
from attnscale.analysis.estimates import mean_se

__all__ = ["COLLAPSE_WORDS", "MIN_SEEDS", "ALPHA", "PLATEAU_NATS", "run_measures", "run_row", "sensitivity", "loss_curve",
           "loss_curves", "summary_rows", "pairwise", "unigram_loss", "plateau_ends", "reading"]

# A ranking of schemes by sensitivity is read only from paired-by-seed differences whose Holm-adjusted
# p-value (over every pair of schemes at the width) is below ALPHA, and only with MIN_SEEDS seeds or
# more: with 2 seeds a paired difference has 1 degree of freedom, and its t interval is ± 12.7 SE.
MIN_SEEDS, ALPHA = 3, 0.05
# A final loss within this of a unigram model's held-out loss (or above it) sits on the unigram plateau:
# the model has learnt token frequencies and little more, so the loss there measures under-training (at a
# low learning rate) or a run knocked back to frequencies (at a high one), not a scheme's stability.
PLATEAU_NATS = 0.1

# A head has collapsed when its rows put their weight on fewer than 2 words on
# average: half-way from "one word" (frozen) to "a pair", well under the ~30 a
# fresh scaled head of the tiny model spreads over. Plain and scale-free.
COLLAPSE_WORDS = 2.0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def run_measures(steps: Iterable[Mapping[str, Any]], collapse_words: float = COLLAPSE_WORDS) -> dict[str, Any]:
    """What one run's recorded steps say about logit growth and entropy collapse.

    Returns {"init_loss": loss at the first recorded step (None if absent or not finite),
    "max_logit_by_layer": [max over steps and heads of |scaled score|, per layer],
    "max_logit": their max, "max_logit_steps": [(step, max over layers and heads)],
    "min_effective_words": lowest per-head effective words at any step,
    "collapsed_heads": heads below ``collapse_words`` at some step, "heads": heads in all}.
    Non-finite values (a step that blew up) count as infinitely large logits and as collapse."""
    steps = [s for s in steps if s.get("layers")]
    first = next(iter(steps), None)
    out: dict[str, Any] = {"init_loss": None, "max_logit_by_layer": [], "max_logit": None, "max_logit_steps": [],
                           "min_effective_words": None, "collapsed_heads": 0, "heads": 0}
    if first is None:
        return out
    out["init_loss"] = first["loss"] if _finite(first.get("loss")) and first.get("step", 0) == 0 else None
    n_layers = len(first["layers"])
    by_layer = [-math.inf] * n_layers
    collapsed: set[tuple[int, int]] = set()
    lowest = math.inf
    for s in steps:
        step_max = -math.inf
        for i, layer in enumerate(s["layers"][:n_layers]):
            for v in layer.get("max_score", []):
                v = v if _finite(v) else math.inf
                by_layer[i] = max(by_layer[i], v)
                step_max = max(step_max, v)
            for h, w in enumerate(layer.get("effective_words", [])):
                w = w if _finite(w) else 1.0
                lowest = min(lowest, w)
                if w < collapse_words:
                    collapsed.add((i, h))
        if step_max > -math.inf:
            out["max_logit_steps"].append((s["step"], step_max))
    heads = sum(len(layer.get("effective_words", [])) for layer in first["layers"])
    out.update(max_logit_by_layer=[v if v > -math.inf else None for v in by_layer],
               max_logit=max(by_layer) if by_layer and max(by_layer) > -math.inf else None,
               min_effective_words=lowest if lowest < math.inf else None,
               collapsed_heads=len(collapsed), heads=heads)
    return out


def sensitivity(cells: Mapping[tuple[float, int], tuple[float | None, float]]) -> dict[str, Any]:
    """LR sensitivity of one scheme at one width (Wortsman et al. 2023, section 3.1).

    ``cells``: (lr, seed) -> (final loss or None if the run diverged, loss at init).
    Per seed: mean over the LR grid of min(final, init) − the seed's best final
    loss (a diverged run counts as its loss at init). Only seeds that have every
    LR of the grid count. Returns {"sensitivity", "sensitivity_se", "best_loss",
    "best_loss_se", "best_lr" (the LR of the lowest mean final loss), "seeds",
    "lrs", "runs", "diverged", "per_seed"}; SEs are over seeds, None with one."""
    lrs = sorted({lr for lr, _ in cells})
    seeds = sorted({s for _, s in cells})
    complete = [s for s in seeds if all((lr, s) in cells for lr in lrs)]
    per_seed = []
    for s in complete:
        capped = [min(cells[(lr, s)][0], cells[(lr, s)][1]) if cells[(lr, s)][0] is not None else cells[(lr, s)][1]
                  for lr in lrs]
        best = min(capped)
        per_seed.append({"seed": s, "sensitivity": statistics.fmean(c - best for c in capped), "best_loss": best})
    sens, sens_se = mean_se([p["sensitivity"] for p in per_seed])
    best, best_se = mean_se([p["best_loss"] for p in per_seed])
    curve = loss_curve(cells)
    reached = [(c["mean"], c["lr"]) for c in curve if c["mean"] is not None]
    return {"sensitivity": sens, "sensitivity_se": sens_se, "best_loss": best, "best_loss_se": best_se,
            "best_lr": min(reached)[1] if reached else None, "seeds": len(per_seed), "lrs": lrs,
            "runs": len(cells), "diverged": sum(final is None for final, _ in cells.values()), "per_seed": per_seed}


def loss_curve(cells: Mapping[tuple[float, int], tuple[float | None, float]]) -> list[dict[str, Any]]:
    """Final loss against LR: per LR, mean and SE over the seeds whose run finished, and how many diverged."""
    out = []
    for lr in sorted({lr for lr, _ in cells}):
        finals = [v[0] for (l, _), v in cells.items() if l == lr]
        mean, se = mean_se([f for f in finals if f is not None])
        out.append({"lr": lr, "mean": mean, "se": se, "runs": len(finals), "diverged": sum(f is None for f in finals)})
    return out


def loss_curves(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """``loss_curve`` per (scheme, width), over the (lr, seed) cells of the per-run dicts ``runs``."""
    cells: dict[tuple[str, int], dict[tuple[float, int], tuple[float | None, float]]] = {}
    for r in runs:
        cells.setdefault((r["scale"], r["head_dim"]), {})[(r["lr"], r["seed"])] = (r["final_loss"], r["init_loss"])
    return {key: loss_curve(c) for key, c in cells.items()}


def summary_rows(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scheme, width) from per-run dicts {"scale", "width", "lr", "seed",
    "final_loss" (None if diverged), "init_loss", "diverged_at", and the keys of
    ``run_measures``}: the sensitivity and, at the grid's lowest, middle and highest LR,
    the max |logit| (mean over seeds); the lowest effective words and collapsed heads over all its runs."""
    rows = []
    keys = sorted({(r["scale"], r["head_dim"]) for r in runs}, key=lambda k: (k[1], k[0]))
    for scale, head_dim in keys:
        mine = [r for r in runs if r["scale"] == scale and r["head_dim"] == head_dim]
        sens = sensitivity({(r["lr"], r["seed"]): (r["final_loss"], r["init_loss"]) for r in mine})
        lrs = sens["lrs"]

        def logit_at(lr):
            vals = [r["max_logit"] for r in mine if r["lr"] == lr and r.get("max_logit") is not None]
            return mean_se(vals)

        lows = [r["min_effective_words"] for r in mine if r.get("min_effective_words") is not None]
        rows.append({
            "scale": scale, "head_dim": head_dim, **{k: v for k, v in sens.items() if k != "per_seed"},
            "sensitivity_by_seed": {p["seed"]: p["sensitivity"] for p in sens["per_seed"]},
            "max_logit_low_lr": logit_at(lrs[0]), "max_logit_mid_lr": logit_at(lrs[len(lrs) // 2]),
            "max_logit_high_lr": logit_at(lrs[-1]),
            "min_effective_words": min(lows) if lows else None,
            "collapsed_heads": sum(r.get("collapsed_heads", 0) for r in mine),
            "heads": sum(r.get("heads", 0) for r in mine),
            "diverged_at": sorted(r["diverged_at"] for r in mine if r.get("diverged_at") is not None),
        })
    return rows


def pairwise(rows: Sequence[Mapping[str, Any]], head_dim: int) -> list[dict[str, Any]]:
    """Every pair of schemes at ``head_dim`` compared on sensitivity, paired by seed (``intervals.paired``:
    the mean of the per-seed differences a − b, its SE, two-sided t test with n − 1 degrees of freedom),
    with Holm's adjusted p-value over all the pairs of the width (``intervals.holm``).
    Returns [{"a", "b", "diff", "se", "n", "p", "p_holm", "interval"}] in the rows' order."""
    mine = [r for r in rows if r["head_dim"] == head_dim and r.get("sensitivity_by_seed")]
    pairs = [(a, b) for i, a in enumerate(mine) for b in mine[i + 1:]]
    tests = intervals.paired_holm([(a["sensitivity_by_seed"], b["sensitivity_by_seed"]) for a, b in pairs])
    return [{"a": a["scale"], "b": b["scale"], **t} for (a, b), t in zip(pairs, tests)]


def _ranking(rows, head_dim: int, wide, seeds: int, lrs, fmt) -> str:
    """The sentence on who is least sensitive at ``head_dim``: a ranking only where paired-by-seed
    differences survive Holm's correction with enough seeds; each scheme's best loss beside its
    sensitivity (a scheme that never learns well looks insensitive)."""
    each = "; ".join(f"{r['scale']} {fmt(r)} (best loss {fmt(r, 'best_loss')})" for r in wide)
    head = (f"At head width {head_dim}, across learning rates {lrs[0]:g} to {lrs[-1]:g}, the sensitivity "
            f"(nats above the best loss on average) and best loss of each scheme: {each}.")
    if seeds < MIN_SEEDS:
        return (head + f" With {seeds} seed{'s' if seeds != 1 else ''} no ranking is read from these (a ranking "
                f"needs {MIN_SEEDS} or more seeds: paired differences over 2 seeds have 1 degree of freedom).")
    tests = pairwise(rows, head_dim)
    held = [t for t in tests if t["p_holm"] is not None and t["p_holm"] < ALPHA]
    lo = wide[0]
    beats_all = [t for t in held if lo["scale"] in (t["a"], t["b"])]
    said = (f" Of the {len(tests)} paired comparisons (by seed, Holm-corrected at {ALPHA:.0%}), "
            f"{len(held)} show a difference" + (": " + "; ".join(
                f"{t['a']} − {t['b']} = {t['diff']:+.3f} (adjusted p {t['p_holm']:.2g})" for t in held) if held else "")
            + ".")
    if len(beats_all) == len(wide) - 1 and len(wide) > 1:
        return head + said + f" {lo['scale']} is less sensitive than every other scheme."
    return head + said + " No scheme is shown less sensitive than all the others."


def unigram_loss(train_ids: Sequence[int], valid_ids: Sequence[int], vocab_size: int) -> float:
    """The held-out cross-entropy (nats per token) of a unigram model fitted on ``train_ids``:
    p(t) = (count(t) + 1) / (N + V) (add-one, so a token unseen in training still has a loss),
    averaged over ``valid_ids``. What a model that has learnt only token frequencies scores."""
    counts = [0] * vocab_size
    for t in train_ids:
        counts[int(t)] += 1
    total = len(train_ids) + vocab_size
    return math.fsum(-math.log((counts[int(t)] + 1) / total) for t in valid_ids) / len(valid_ids)


def plateau_ends(rows: Sequence[Mapping[str, Any]], curves: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]],
                 unigram: float, margin: float = PLATEAU_NATS) -> list[tuple[str, int, str, float]]:
    """(scheme, width, "lowest"/"highest", mean final loss) for every end of a scheme's learning-rate grid
    whose mean final loss is within ``margin`` of ``unigram`` or above it. ``curves[(scheme, width)]`` is
    ``loss_curve``'s output."""
    out = []
    for r in rows:
        curve = [c for c in curves.get((r["scale"], r["head_dim"]), []) if c["mean"] is not None]
        if not curve:
            continue
        for end, c in (("lowest", curve[0]), ("highest", curve[-1])):
            if c["mean"] >= unigram - margin:
                out.append((r["scale"], r["head_dim"], end, c["mean"]))
    return out


def reading(rows: Sequence[Mapping[str, Any]], collapse_words: float = COLLAPSE_WORDS,
            unigram: float | None = None, plateau: Sequence[tuple[str, int, str, float]] = ()) -> list[str]:
    """A few plain sentences generated from ``summary_rows``: each scheme's sensitivity and best loss at
    the widest width (a ranking only where the budget supports one), how that moves with width,
    divergences, logit growth, collapse. ``unigram``: a unigram model's held-out loss, and ``plateau``
    (``plateau_ends``) the grid ends at it: where a grid's end sits there, no ranking is read."""
    rows = [r for r in rows if r["sensitivity"] is not None]
    if not rows:
        return ["No scheme has a complete learning-rate grid yet, so no sensitivity can be read."]
    out = []
    head_dims = sorted({r["head_dim"] for r in rows})
    wide = sorted((r for r in rows if r["head_dim"] == head_dims[-1]), key=lambda r: r["sensitivity"])
    seeds = min(r["seeds"] for r in rows)

    def fmt(r, key="sensitivity"):
        se = r[f"{key}_se"]
        return f"{r[key]:.3f}" + (f" ± {se:.3f}" if se is not None else "")

    lrs = wide[0]["lrs"]
    if unigram is not None:
        best = min(r["best_loss"] for r in wide)
        out.append(f"A unigram model (token frequencies alone) scores {unigram:.3f} nats on the held-out split; "
                   f"the best final loss at width {head_dims[-1]} is {unigram - best:.3f} nats below it.")
    if plateau:
        out.append(f"At the unigram plateau (final loss within {PLATEAU_NATS:g} nats of the unigram model's, or "
                   "above): " + "; ".join(f"{s} at width {w}, {end} learning rate ({loss:.3f})"
                                          for s, w, end, loss in plateau)
                   + ". There the loss measures under-training or a run knocked back to token frequencies, not "
                     "a scheme's stability, so the sensitivities below are not read as a ranking.")
        each = "; ".join(f"{r['scale']} {fmt(r)} (best loss {fmt(r, 'best_loss')})" for r in wide)
        out.append(f"At head width {head_dims[-1]}, across learning rates {lrs[0]:g} to {lrs[-1]:g}, the sensitivity "
                   f"and best loss of each scheme: {each}.")
    else:
        out.append(_ranking(rows, head_dims[-1], wide, seeds, lrs, fmt))
    if len(head_dims) > 1:
        moves = []
        for scale in sorted({r["scale"] for r in rows}):
            by_w = {r["head_dim"]: r for r in rows if r["scale"] == scale}
            if head_dims[0] in by_w and head_dims[-1] in by_w:
                a, b = by_w[head_dims[0]], by_w[head_dims[-1]]
                moves.append((b["sensitivity"] - a["sensitivity"], scale, a, b))
        moves.sort(key=lambda m: m[0])
        if moves:
            (d_lo, s_lo, a_lo, b_lo), (d_hi, s_hi, a_hi, b_hi) = moves[0][:4], moves[-1][:4]
            span = f"From width {head_dims[0]} to {head_dims[-1]}, the sensitivity"
            if d_lo >= 0:
                out.append(f"{span} rises for every scheme: most for {s_hi} ({fmt(a_hi)} to {fmt(b_hi)}), "
                           f"least for {s_lo} ({d_lo:+.3f}).")
            elif d_hi <= 0:
                out.append(f"{span} falls for every scheme: most for {s_lo} ({fmt(a_lo)} to {fmt(b_lo)}), "
                           f"least for {s_hi} ({d_hi:+.3f}).")
            else:
                out.append(f"{span} rises most for {s_hi} ({fmt(a_hi)} to {fmt(b_hi)}) and falls most for "
                           f"{s_lo} ({fmt(a_lo)} to {fmt(b_lo)}).")
    best = min(rows, key=lambda r: r["best_loss"] if r["head_dim"] == head_dims[-1] else math.inf)
    out.append(f"The best final loss at width {head_dims[-1]} is {best['scale']}'s, {fmt(best, 'best_loss')} nats "
               f"(at learning rate {best['best_lr']:g}).")
    div = [r for r in rows if r["diverged"]]
    if div:
        out.append("Runs diverged (counted at their loss at init): " + "; ".join(
            f"{r['scale']} at width {r['head_dim']}: {r['diverged']} of {r['runs']}" for r in div) + ".")
    else:
        out.append(f"No run diverged in {sum(r['runs'] for r in rows)}.")
    logit = [r for r in rows if r["head_dim"] == head_dims[-1] and r["max_logit_high_lr"][0] is not None]
    if logit:
        big, small = max(logit, key=lambda r: r["max_logit_high_lr"][0]), min(logit, key=lambda r: r["max_logit_high_lr"][0])
        out.append(f"Attention logits grow most under {big['scale']}: at learning rate {lrs[-1]:g} and width "
                   f"{head_dims[-1]} the largest |scaled score| reached {big['max_logit_high_lr'][0]:,.1f}, against "
                   f"{small['max_logit_high_lr'][0]:,.1f} under {small['scale']}.")
    col = [r for r in rows if r["collapsed_heads"]]
    if col:
        out.append(f"Heads collapsed (fewer than {collapse_words:g} effective words at some recorded step): " + "; ".join(
            f"{r['scale']} at width {r['head_dim']}: {r['collapsed_heads']} of {r['heads']} head-runs" for r in col) + ".")
    else:
        out.append(f"No head fell below {collapse_words:g} effective words in any run.")
    return out


def run_row(t: Any) -> dict[str, Any]:
    """One run of the study (a ``runs.record.TrainRun``) as plain numbers: its settings, final held-out
    loss (None unless done), the loss at init and ``run_measures``. Reads the run by its attributes only.

    The loss at init is the first recorded training loss (step 0, before any update:
    the model has seen nothing, so train and held-out loss agree there); where it is
    missing, ln(vocab), the loss of a uniform guess."""
    measures = run_measures(t.recorded)
    init = measures["init_loss"] if measures["init_loss"] is not None else math.log(t.model_config.vocab_size)
    final = t.results.valid_loss if t.status == "done" else None
    return {
        "run": t.run_id, "scale": t.scale, "head_dim": t.head_dim, "seed": t.seed, "lr": t.lr,
        "status": t.status, "final_loss": final, "diverged_at": t.diverged_at,
        "context": t.model_config.context, **measures, "init_loss": init,
    }
