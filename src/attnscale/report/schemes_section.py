"""The report section "Beyond the course: which scale?", from the scheme study's run records.

``blocks(runs, out, pngs)`` returns the same block tuples as ``assemble._sections``
and draws its figures into ``out`` (adding them to ``pngs``). The runs are read
as plain numbers by ``analysis.schemes.run_row``; everything after it works on those.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnscale.core.scales import display_name
from attnscale.report.blocks import Block, Para, Bullets, Image, Table, opening
from attnscale.analysis import schemes as sa
from attnscale.analysis.budget import budget, budget_text
from attnscale.analysis.estimates import plus_minus

__all__ = ["GROUP", "TITLE", "unigram", "blocks"]

GROUP = "schemes"
TITLE = "Beyond the course: which scale?"


def _table(summary: list[dict[str, Any]]) -> Table:
    head = ["width d", "scheme", "LR sensitivity ± SE", "best loss ± SE", "best lr", "diverged",
            "max |logit|, lowest lr", "max |logit|, highest lr", "lowest eff. words", "collapsed head-runs", "seeds"]
    rows = [[r["head_dim"], display_name(r["scale"]), plus_minus(r["sensitivity"], r["sensitivity_se"]),
             plus_minus(r["best_loss"], r["best_loss_se"]),
             "—" if r["best_lr"] is None else f"{r['best_lr']:g}",
             f"{r['diverged']} of {r['runs']}" + (f" (steps {', '.join(map(str, r['diverged_at']))})" if r["diverged_at"] else ""),
             plus_minus(*r["max_logit_low_lr"], fmt="{:,.1f}"), plus_minus(*r["max_logit_high_lr"], fmt="{:,.1f}"),
             "—" if r["min_effective_words"] is None else f"{r['min_effective_words']:.2f}",
             f"{r['collapsed_heads']} of {r['heads']}", r["seeds"]] for r in summary]
    return Table(head, rows)


def _in_registry_order(scales) -> list[str]:
    """Schemes in the registry's order (none, 1/√d, then the variants), the order a reader meets
    them in everywhere; one the registry does not know goes last."""
    from attnscale.core.scales import scale_names

    known = scale_names()
    return sorted(dict.fromkeys(scales), key=lambda s: (known.index(s) if s in known else len(known), s))


def _curves(rows: list[dict[str, Any]]) -> dict[int, dict[str, list[dict[str, Any]]]]:
    by_key = sa.loss_curves(rows)
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for head_dim in sorted({w for _, w in by_key}):
        for scale in _in_registry_order(s for s, w in by_key if w == head_dim):
            out.setdefault(head_dim, {})[scale] = by_key[(scale, head_dim)]
    return out


def _logit_series(rows: list[dict[str, Any]], head_dim: int, lr: float) -> dict[str, list[tuple[int, float]]]:
    """Per scheme at ``head_dim`` and ``lr``: (step, max over layers and heads of |logit|), the seeds' mean per step."""
    out = {}
    for scale in _in_registry_order(r["scale"] for r in rows):
        by_step: dict[int, list[float]] = {}
        for r in rows:
            if r["scale"] == scale and r["head_dim"] == head_dim and r["lr"] == lr:
                for step, v in r["max_logit_steps"]:
                    by_step.setdefault(step, []).append(v)
        if by_step:
            out[scale] = [(s, sum(v) / len(v)) for s, v in sorted(by_step.items())]
    return out


def _theory_points(runs, study, rows) -> dict[str, Any]:
    """What the theory overlay draws: fresh heads (unit init) and, per scheme, every
    recorded (spread, effective words) of each head of the study's runs at the
    widest width and the preset's (middle) learning rate, seed by seed; and, per
    recorded step of the first seed, the heads' mean spread, mean effective words and
    mean of the random-score prediction at each head's spread."""
    import numpy as np

    from attnscale.core.gaussian_scores import expected_effective_words

    # unit init: q·k of N(0, 1) entries has spread sqrt(d) (experiment 1), times the scheme's fixed factor
    factor = {"none": lambda d: 1.0, "inv_sqrt_d": lambda d: d ** -0.5, "inv_d": lambda d: 1.0 / d}
    fresh_pts = [(s, math.sqrt(w) * factor[s](w), r["effective_words_median"], r.get("words", 64))
                 for (init, w, s), r in runs.fresh_rows.items() if init == "unit" and s in factor]
    head_dims = sorted({r["head_dim"] for r in rows})
    lrs = sorted({r["lr"] for r in rows})
    mid = lrs[len(lrs) // 2]
    trained: dict[str, list[tuple[float, float, int]]] = {}
    steps: dict[str, list[tuple[int, float, float, float]]] = {}
    context = next((r["context"] for r in rows if r.get("context")), None)
    for t in study:
        if t.head_dim != head_dims[-1] or t.lr != mid:
            continue
        for line in t.recorded:
            pairs = [(sp, ew) for layer in line["layers"] for sp, ew in zip(layer["spread"], layer["effective_words"])
                     if sp is not None and ew is not None and math.isfinite(sp) and math.isfinite(ew)]
            trained.setdefault(t.scale, []).extend((sp, ew, line["step"]) for sp, ew in pairs)
            if pairs and context and t.seed == min(x.seed for x in study if x.scale == t.scale):
                # the heads' mean effective words beside the mean of what each head's own spread predicts
                # (not the prediction at their mean spread: the curve is far from straight)
                predicted = np.atleast_1d(expected_effective_words([p[0] for p in pairs], context, causal=True))
                steps.setdefault(t.scale, []).append((line["step"], sum(p[0] for p in pairs) / len(pairs),
                                                      sum(p[1] for p in pairs) / len(pairs), float(predicted.mean())))
    return {"fresh": fresh_pts, "trained": trained, "steps": steps, "head_dim": head_dims[-1], "lr": mid, "context": context}


def unigram(study) -> float | None:
    """A unigram model's held-out loss on the study's corpus (``analysis.schemes.unigram_loss``), or None
    where it cannot be loaded here as the records name it (``held_out.corpus_of``)."""
    from attnscale.report.held_out import corpus_of

    corpus = corpus_of(study)
    if corpus is None:
        return None
    return sa.unigram_loss(corpus.train.tolist(), corpus.valid.tolist(), corpus.vocab_size)


def blocks(runs, out: Path, pngs: dict[str, Path]) -> list[Block]:
    """The section's blocks (none without a run of the study); its figures are drawn into ``out``
    and added to ``pngs``."""
    from attnscale.report import plots

    study = [t for t in runs.train if t.group == GROUP]
    if not study:  # not a claim of the course: a report without the study simply has no such section
        return []
    b = opening(TITLE, (
        "Every registered score-scale scheme trained at several head widths and learning rates, several seeds "
        "each (`attnscale schemes`). Final loss is the held-out cross-entropy in nats. Learning-rate sensitivity "
        "(Wortsman et al. 2023): the mean, over the learning-rate grid, of min(final loss, loss at init) minus the "
        "best final loss, per seed, then mean ± standard error over seeds; a diverged run counts at its loss at "
        "init. Max |logit| is the largest scaled score any head produced at any recorded step (attention logit "
        "growth). A head has collapsed when its rows spread over fewer than "
        f"{sa.COLLAPSE_WORDS:g} effective words at some recorded step (entropy collapse, Zhai et al. 2023)."))
    # the study's own budget: not the preset's of the course's experiments above
    b.append(Para(f"The study's runs, as their records say: {budget_text(budget(study))}."))
    rows = [sa.run_row(t) for t in study]
    finished = [r for r in rows if r["status"] in ("done", "diverged")]
    unfinished = [f"{r['run']}: {r['status']}" for r in rows if r["status"] not in ("done", "diverged")]
    if unfinished:
        b.append(Bullets("Study runs not finished (not counted):", unfinished))
    if not finished:
        return b
    summary = sa.summary_rows(finished)
    named = [{**r, "scale": display_name(r["scale"])} for r in summary]
    curves = _curves(finished)
    floor = unigram(study)
    ends = [] if floor is None else sa.plateau_ends(
        named, {(display_name(s), w): c for w, by in curves.items() for s, c in by.items()}, floor)
    b.append(Bullets("What the records show (generated from the numbers below):",
                     sa.reading(named, unigram=floor, plateau=ends)))
    pngs["schemes-loss-lr"] = plots.loss_vs_lr(curves, out / "schemes-loss-lr.png")
    b.append(Image("schemes-loss-lr.png", "Final held-out loss against learning rate, one panel per scheme and "
                                            "width (the other schemes in grey), band ± 1 SE over seeds"))
    sens: dict[str, list] = {s: [] for s in _in_registry_order(r["scale"] for r in summary)}
    for r in summary:
        if r["sensitivity"] is not None:
            sens.setdefault(r["scale"], []).append((r["head_dim"], r["sensitivity"], r["sensitivity_se"]))
    sens = {s: pts for s, pts in sens.items() if pts}
    if sens:
        pngs["schemes-sensitivity"] = plots.sensitivity_vs_head_dim(sens, out / "schemes-sensitivity.png")
        b.append(Image("schemes-sensitivity.png", "Learning-rate sensitivity against head width, per scheme, ± 1 SE"))
    widest = max(r["head_dim"] for r in finished)
    lrs = sorted({r["lr"] for r in finished})
    panels = {f"lr {lr:g}": _logit_series(finished, widest, lr) for lr in dict.fromkeys((lrs[len(lrs) // 2], lrs[-1]))}
    if any(panels.values()):
        pngs["schemes-max-logit"] = plots.max_logit_over_steps(panels, out / "schemes-max-logit.png",
                                                               f"Largest |scaled score| over training at width {widest}")
        b.append(Image("schemes-max-logit.png", f"Max |attention logit| per step at width {widest}, the preset's "
                                                  "learning rate and the highest, mean over seeds"))
    b.append(_table(summary))
    theory = _theory_points(runs, study, finished)
    if theory["trained"] or theory["fresh"]:
        pngs["schemes-theory"] = plots.random_score_overlay(theory, out / "schemes-theory.png")
        b += [Para(("Random scores as a yardstick: if a row's n scores were independent Gaussians with spread s, "
                     "how many words would softmax spread over? Each curve is the statistic its points are, "
                     "computed once by a fixed-seed Monte Carlo (`attnscale.core.gaussian_scores`): the median "
                     "row's exp(entropy) for the fresh heads (which report their median row), the mean over a "
                     "causal head's rows of exp(entropy) for the trained heads (which report that mean). Fresh "
                     "heads with unit-variance q and k are the case it describes once d is large (given its "
                     "query, a row's scores are Gaussian with spread |q|, which varies from row to row at small "
                     "d, so the narrowest widths sit above it). A trained head is placed at its pooled spread "
                     "(all its scores together), not at each row's own centred spread, which the records do not "
                     "hold: the pooled spread also counts differences between rows' mean scores, which softmax "
                     "ignores, so it is at or above what the rows see. A head below the curve concentrates more "
                     "than random scores of its spread would (its scores are not random) at either spread; a "
                     "head above it may be at random level by its rows' own spread, so above the curve is not "
                     "read as a finding.")),
              Image("schemes-theory.png", "Effective words against spread, with the random-score curve: fresh "
                                            "heads, trained heads, and effective words over training")]
    return b
