"""The divergence study read: each run's series, its break, every detector judged on held-out seeds.

Pure over run records (``runs.record.TrainRun``): what a run is (broken at a step, or healthy) is the
first round's rule in ``outcomes`` (``first_round_break``, withdrawn, kept to draw this round again); each
alert's first alarm and their judging are ``detectors``; ``analyse`` applies them to the study's runs
(``experiments.warn_study`` trains them): thresholds chosen on half the seeds (``detectors.split_seeds``) at
a false-alarm target, rates and lead times read on the other half, with Wilson intervals for the rates and
percentile intervals from resampling seeds for the leads; the best rule, single or a pair; each detector's
lead against the loss's own.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from attnscale.analysis import detectors as det
from attnscale.analysis import outcomes as oc
from attnscale.runs.record import TrainRun

__all__ = ["GROUP", "FAMILY", "FAMILIES", "family_of", "TARGET_FALSE_ALARMS", "STOP_FALSE_ALARMS", "FORMER_DEFAULTS",
           "BASELINE", "WATCH_ALERTS", "series_of", "cell_of", "row", "analyse", "analyse_rows", "default_parts", "rule_text", "breaks_by_cell", "pct_text",
           "steps_text"]


GROUP = "warn"


FAMILY = "tiny LM"  # the tiny LM family's name in a result (the family a record names none of)
FAMILIES = {"tiny": FAMILY, "llama": "Llama under the HF Trainer"}  # a record's model "family" -> its name


TARGET_FALSE_ALARMS = 0.05  # a warning's threshold is chosen to fire on at most 5% of the choosing half's healthy runs


STOP_FALSE_ALARMS = 0.01  # "stop" only for a rule below 1% on the held-out half


# the watch's defaults before this study (MaxScore(100), Collapsed(2), Frozen(0.5), Spike(6 SDs); NonFinite beside
# them), judged on the held-out seeds as they were: what the study's rule replaces
FORMER_DEFAULTS = (("max_score", 100), ("fewest_words", 2), ("frozen", 0.5), ("head_spike", 6))


BASELINE = "loss_spike"  # the loss's own detector: what every alert of the watch must beat


def _number(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def series_of(run: TrainRun, probe_every: int = 5) -> det.Series:
    """A run's loss at every training step, every head's measures at every ``probe_every``-th step
    (flattened over layers; NaN where not finite) and its held-out loss, as ``detectors.Series``."""
    from attnscale.core.diagnostics import HEAD_MEASURES

    steps = run.train_config.steps
    lines = [x for x in run.history if isinstance(x.get("step"), int) and x["step"] < steps]
    by_step = {x["step"]: x for x in lines}
    if run.results.losses:  # every step's loss (records before it: the recording steps' alone)
        losses = tuple(run.results.losses)
        if run.results.diverged_at == len(losses):  # set on diverged runs alone
            losses += (None,)  # the step whose loss was not finite ended the run before it was kept
    else:
        losses = tuple(by_step[s].get("loss") if s in by_step else None
                       for s in (range(max(by_step) + 1) if by_step else ()))
    probes = tuple((s, {**{k: [_number(v) for layer in by_step[s].get(k) or () for v in layer] for k in HEAD_MEASURES},
                        **_probed(by_step[s])})
                   for s in sorted(by_step) if s % probe_every == 0 and by_step[s].get("max_score") is not None)
    return det.Series(losses, probes, run.results.valid_loss)


def _probed(line: dict[str, Any]) -> dict[str, list[float]]:
    """A recording line's ``lm.step_measures.PROBED`` fields as lists of numbers (NaN where not finite;
    absent where the line has none: records before them, or a family that does not record them)."""
    out = {}
    for k in ("grad_norm", "log_z"):
        if k in line:
            out[k] = [_number(line[k])]
    if "q_rms" in line:
        out["qk_rms"] = [_number(v) for v in (line.get("q_rms") or []) + (line.get("k_rms") or [])]
    return out


def family_of(run: TrainRun) -> str:
    """The run's model family: "llama" (``lm.hf_family``), else "tiny" (records before families name none)."""
    return getattr(run.model_config, "family", "tiny")


def cell_of(run: TrainRun) -> dict[str, Any]:
    # a Llama normalises before attention and the MLP with RMSNorm, and its config names no norm
    return {"scale": run.scale, "norm": getattr(run.model_config, "norm", "pre-RMSNorm"), "warmup": run.train_config.warmup,
            "lr": run.lr, "seed": run.seed}


def row(cell: dict[str, Any], run_id: str, series: det.Series, floor: float | None,
        rule: oc.FirstRoundRule = oc.FirstRoundRule()) -> dict[str, Any]:
    """One run as ``analyse_rows`` takes it: its cell (scale, norm, warmup, lr, seed), break and every detector's signal."""
    return {**cell, "run": run_id, "steps": series.steps,
            "break": oc.first_round_break(series.losses, series.final_loss, floor, rule),
            "signals": {d.name: det.signal(d.name, series) for d in det.DETECTORS}, "series": series}


def analyse(runs: Sequence[TrainRun], floor: float | None, probe_every: int = 5,
            rule: oc.FirstRoundRule = oc.FirstRoundRule(), family: str = "tiny") -> dict[str, Any]:
    """``analyse_rows`` of the finished runs of ``runs`` of ``family`` (``series_of`` each)."""
    rows = [row(cell_of(t), t.run_id, series_of(t, probe_every), floor, rule)
            for t in runs if t.status in ("done", "diverged") and family_of(t) == family]
    return analyse_rows(rows, floor, probe_every, rule, family)


def analyse_rows(rows: list[dict[str, Any]], floor: float | None, probe_every: int = 5,
                 rule: oc.FirstRoundRule = oc.FirstRoundRule(), family: str = "tiny") -> dict[str, Any]:
    """``family``'s rows judged (its name in the result's "family", the key in "key"): per detector its curve,
    the threshold chosen on the choosing seeds at ``TARGET_FALSE_ALARMS`` and at ``STOP_FALSE_ALARMS``, and what those read on the held-out seeds (``detectors.judge``, with seed-bootstrap
    intervals); the best rule, single or a pair; each detector's lead against the loss's own."""
    seeds = sorted({r["seed"] for r in rows})
    choosing, held_out = det.split_seeds(seeds)
    return {"family": FAMILIES[family], "key": family, "rule": rule, "floor": floor, "probe_every": probe_every,
            "rows": rows, "choosing_seeds": choosing, "held_out_seeds": held_out,
            **_judged(rows, choosing, held_out)}


def _runs(rows, seeds) -> list[tuple]:
    """(seed, steps, break, signals, first alarms so far) of the rows of ``seeds``: the last, a dict by
    (detector, threshold), spares the pair search asking again, and leaves the rows as they were."""
    return [(r["seed"], r["steps"], r["break"], r["signals"], {}) for r in rows if r["seed"] in seeds]


_BELOW = {d.name: d.below for d in det.DETECTORS}


def _alarm(sig, memo: dict, name: str, threshold: float) -> int | None:
    """The first alarm of ``name`` at ``threshold`` in the run's signals ``sig``, kept in its ``memo``."""
    if (name, threshold) not in memo:
        memo[name, threshold] = det.first_alarm(sig[name], threshold, _BELOW[name])
    return memo[name, threshold]


def _rule_outcomes(runs, parts: Sequence[tuple[str, float]]) -> list[det.Outcome]:
    return [det.Outcome(seed, steps, None if b is None else b.step,
                        det.combine_alarms(*(_alarm(sig, memo, n, th) for n, th in parts)))
            for seed, steps, b, sig, memo in runs]


def _held_out(runs, parts) -> dict[str, Any]:
    out = _rule_outcomes(runs, parts)
    j = det.judge(out)

    def rate(key):
        def f(sample):
            return det.judge(sample)[key]
        return f

    return {"parts": list(parts), **j, "hit_rate_ci": det.wilson(j["hits"], j["broken"]),
            "false_alarm_rate_ci": det.wilson(j["false_alarms"], j["healthy"]),
            "lead_median_ci": det.bootstrap(out, rate("lead_median")),
            "lead_share_median_ci": det.bootstrap(out, rate("lead_share_median")), "outcomes": out}


def _best_pair(runs, target: float):
    """The OR of two detectors, each at one of its thresholds, with the most hits on ``runs`` under ``target``."""
    best = None
    names = [d.name for d in det.DETECTORS if d.name != BASELINE]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for ta in next(d for d in det.DETECTORS if d.name == a).thresholds:
                for tb in next(d for d in det.DETECTORS if d.name == b).thresholds:
                    j = det.judge(_rule_outcomes(runs, ((a, ta), (b, tb))))
                    if j["false_alarm_rate"] is None or j["false_alarm_rate"] > target:
                        continue
                    # the median lead is None exactly where there is no hit: only ever compared with another None
                    key = (j["hits"], j["lead_median"])
                    if best is None or key > best[0]:  # strictly: of equal keys the first pair stays
                        best = (key, ((a, ta), (b, tb)), j)
    return best


def _judged(rows, choosing, held_out) -> dict[str, Any]:
    pick, judge_on = _runs(rows, choosing), _runs(rows, held_out)
    detectors, chosen, stop = {}, {}, {}
    swept = [[r[:4] for r in runs] for runs in (pick, judge_on)]  # the runs without their memo, as sweep takes them
    for d in det.DETECTORS:
        curve_choose, curve_held = (det.sweep(runs, d.name) for runs in swept)
        warn, halt = det.choose(curve_choose, TARGET_FALSE_ALARMS), det.choose(curve_choose, STOP_FALSE_ALARMS)
        detectors[d.name] = {"curve_choosing": curve_choose, "curve_held_out": curve_held,
                             "warn": None if warn is None else {"choosing": warn,
                                                                **_held_out(judge_on, ((d.name, warn["threshold"]),))},
                             "stop": None if halt is None else {"choosing": halt,
                                                                **_held_out(judge_on, ((d.name, halt["threshold"]),))}}
        if warn is not None:
            chosen[d.name] = warn
    # the watch's own rules: the loss's spike detector is the baseline they are held to, not one of them; no hit,
    # no rule (so every single has a median lead)
    singles = [(name, c) for name, c in chosen.items() if c["hits"] > 0 and name != BASELINE]
    best_single = max(singles, key=lambda nc: (nc[1]["hits"], nc[1]["lead_median"])) if singles else None
    pair = _best_pair(pick, TARGET_FALSE_ALARMS)
    combined = None
    # a pair within the false alarms allowed has each part within them, so a pair that warns has a single that does
    if pair is not None and best_single is not None and pair[2]["hits"] > best_single[1]["hits"]:
        combined = {"choosing": pair[2], **_held_out(judge_on, pair[1])}
    best = combined if combined is not None else (detectors[best_single[0]]["warn"] if best_single else None)
    baseline = detectors[BASELINE]["warn"]
    versus = {}
    for name, d in detectors.items():
        if d["warn"] is None or baseline is None or name == BASELINE:
            continue
        versus[name] = _lead_difference(d["warn"]["outcomes"], baseline["outcomes"])
    parts = default_parts(detectors, best)
    former = {name: _held_out(judge_on, (p,)) for name, p in zip(("max_score", "fewest_words", "frozen", "head_spike"),
                                                                    FORMER_DEFAULTS)}
    former["together"] = _held_out(judge_on, FORMER_DEFAULTS + (("non_finite", 0.5),))
    return {"detectors": detectors, "combined": combined, "best": best, "versus_loss": versus, "former": former,
            "default": {"choosing": det.judge(_rule_outcomes(pick, parts)), **_held_out(judge_on, parts)}}


WATCH_ALERTS = {"max_score": "MaxScore", "fewest_words": "Collapsed", "frozen": "Frozen", "head_spike": "Spike",
                "non_finite": "NonFinite"}  # the detectors the watch has an alert for (watch.alerts)


def default_parts(detectors: dict[str, Any], best: dict[str, Any] | None) -> list[tuple[str, float]]:
    """The watch's default rule from the study: the best rule where one warns, with NonFinite beside it (a
    blow-up's own sign, which no healthy run shows); where none warns, every watch alert whose threshold chosen
    at the target warned at least one broken run of the choosing seeds (an alert that warns of nothing would
    bring only its false alarms), and NonFinite."""
    if best is not None and all(n in WATCH_ALERTS for n, _ in best["parts"]):
        parts = list(best["parts"])
    else:
        parts = [p for n, d in detectors.items() if n in WATCH_ALERTS and d["warn"] is not None
                 and d["warn"]["choosing"]["hits"] > 0 for p in d["warn"]["parts"]]
    if not any(n == "non_finite" for n, _ in parts):
        parts.append(("non_finite", 0.5))
    return sorted(parts, key=lambda p: list(WATCH_ALERTS).index(p[0]))


def _lead_difference(a: Sequence[det.Outcome], b: Sequence[det.Outcome]) -> dict[str, Any]:
    """Median lead of ``a`` minus that of ``b`` over the broken runs both judged (a miss counts lead 0:
    no warning), with a seed-bootstrap interval; "earlier", "later" or "inconclusive" by that interval."""
    pairs = [(x.seed, (x.lead or 0) - (y.lead or 0)) for x, y in zip(a, b) if x.broken_at is not None]

    def stat(sample):
        return det.quantile([d for _, d in sample], 0.5)

    value = stat(pairs)
    ci = det.bootstrap(pairs, stat, seed_of=lambda p: p[0])
    if not any(x.hit or y.hit for x, y in zip(a, b)):
        return {"median": None, "ci": None, "verdict": "neither warns", "runs": len(pairs), "mean": None}
    return {"median": value, "ci": ci, "verdict": det.lead_verdict(ci), "runs": len(pairs),
            "mean": sum(d for _, d in pairs) / len(pairs)}  # a hit is a broken run's: pairs is not empty


def pct_text(x, ci=None) -> str:
    if x is None:
        return "—"
    text = f"{100 * x:.0f}%"
    return text + (f" [{100 * ci[0]:.0f}%, {100 * ci[1]:.0f}%]" if ci else "")


def steps_text(x, ci=None) -> str:
    if x is None:
        return "—"
    return f"{x:g}" + (f" [{ci[0]:g}, {ci[1]:g}]" if ci else "")


def rule_text(parts) -> str:
    return " or ".join(f"{n} {'<' if next(d for d in det.DETECTORS if d.name == n).below else '>'} {th:g}"
                       for n, th in parts)


def breaks_by_cell(result) -> list[dict[str, Any]]:
    """Per scale, norm, warm-up and learning rate: runs, broken runs and their reasons."""
    cells: dict[tuple, dict] = {}
    for r in result["rows"]:
        key = (r["scale"], r["norm"], r["warmup"], r["lr"])
        c = cells.setdefault(key, {"scale": key[0], "norm": key[1], "warmup": key[2], "lr": key[3], "runs": 0,
                                   "broken": 0, "reasons": {}})
        c["runs"] += 1
        if r["break"] is not None:
            c["broken"] += 1
            c["reasons"][r["break"].reason] = c["reasons"].get(r["break"].reason, 0) + 1
    return [cells[k] for k in sorted(cells)]
