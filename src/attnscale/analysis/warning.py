"""The warning re-read: what the warning study's figures say happened, from every run's published series.

The warning study (docs/warn-study.md) dated a break where the loss began to rise and counted a lead
from the first probe at which an alarm was on while the run was at risk, which in runs past 1e3 from the
moment they learnt is the run's survival after learning. This module reads the runs again so that each
figure says what it measures. Every function is pure, over runs in the published series format
(``docs/act-study-series.json.gz``): dicts with ``run_id``, ``cell``, ``arm``, ``seed``, ``losses`` (the loss
at every step, None where not finite), ``probes`` (a list of {"step", "max_score", …} or one of columns
{"step": [...], "max_score": [...], …}) and ``outcome`` ({"learned_at", "break_step", …}).

- **Landmark leads** (``landmark_leads``): each learned run is looked at from a fixed landmark, ``LANDMARK``
  steps after it learnt (and no earlier than ``WINDOW`` steps after the warm-up, so that no reading falls in
  it); only runs still unbroken there are read. Per level: how many breakers and holders were already over it
  at the landmark, how many crossed it only after, whether it fired between the landmark and the break, and
  the lead (break − first firing at or after the landmark) beside the survival (break − landmark).
- **Breakers against holders at the landmark** (``compare_at_landmark``): each detector's level and its
  slope over the last ``WINDOW`` steps (of log10 where the value is a scale), the difference of means with
  Welch's t interval, and a sentence saying whether any interval leaves out 0.
- **Alarms in runs that held** (``alarm_share``, ``curve``): the share of held runs that alarm, with Wilson's
  interval and their at-risk steps beside it, and hits against that share over thresholds.
- **A discrete-time hazard** (``hazard_rows``, ``logistic``): each run from its landmark in 100-step
  intervals, the chance of a break within one regressed on log10 max |score| at its start and on the
  interval's count (time), the odds ratio per decade of the score with Wald's interval.
- **Break dating** (``dates``, ``dating_sensitivity``): the study's rule beside a smoothed one (the 20-step
  mean's own departure from its minimum) and two others, and how many break steps each moves.
- **The published numbers read again** (``old_leads``, ``silenced``, ``auc_readings``): over the study's
  JSON (``docs/warn-study.json`` ``"recipe"``), which holds each run's learned and break steps but no series.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from attnscale.analysis import detectors as det
from attnscale.analysis import intervals
from attnscale.analysis import outcomes as oc

__all__ = ["LANDMARK", "WINDOW", "WARMUP", "LEVELS", "CURVE_LEVELS", "KEYS", "probes", "points", "landmark",
           "fired", "landmark_leads", "welch", "level_at", "slope_at", "compare_at_landmark", "separation_text",
           "alarm_share", "curve", "DATINGS", "dates", "dating_sensitivity", "old_leads", "silenced",
           "auc_readings", "INTERVAL", "hazard_rows", "logistic", "reread"]

LANDMARK = 200  # steps after a run learnt at which it is looked at
WINDOW = 200  # steps of history a slope is fitted over (and kept clear of the warm-up)
WARMUP = 500  # the recipe's warm-up: no reading falls inside it
LEVELS = (1e2, 1e3, 1e4)  # max |score|: the literature's levels the study judged as they are
CURVE_LEVELS = (10, 30, 100, 300, 1e3, 3e3, 1e4, 3e4, 1e5)  # the study's ladder for a level chosen on data
# the probe's values read at the landmark: (what it is, read as log10 of it)
KEYS: dict[str, tuple[str, bool]] = {
    "max_score": ("largest max |score|", True),
    "min_effective_words": ("fewest effective words", True),
    "grad_norm": ("gradient norm", True),
    "qk_rms_max": ("largest q/k weight RMS", True),
    "log_z": ("mean log Z", False),
    "loss": ("training loss (20-step mean)", False),
}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def probes(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's probes as one dict a probe, sorted by step, whichever of the two layouts it was written in."""
    got = run.get("probes") or []
    if isinstance(got, Mapping):
        steps = got.get("step") or []
        got = [{k: (vs[i] if i < len(vs) else None) for k, vs in got.items()} for i in range(len(steps))]
    return sorted(got, key=lambda p: p["step"])


def points(run: Mapping[str, Any], key: str) -> list[tuple[int, float]]:
    """(step, value) of ``key`` at every probe that has it; a value that is not a finite number reads as NaN."""
    return [(p["step"], float(p[key]) if _finite(p.get(key)) else math.nan) for p in probes(run) if key in p]


def _outcome(run) -> tuple[int | None, int | None]:
    o = run["outcome"]
    return o.get("learned_at"), o.get("break_step")


def _steps(run) -> int:
    return int(run.get("steps") or len(run["losses"]))


def landmark(run: Mapping[str, Any], offset: int = LANDMARK, warmup: int = WARMUP, window: int = WINDOW) -> int | None:
    """The step a learned run is looked at: ``offset`` steps after it learnt, and no earlier than ``window``
    steps after the warm-up (so the slope's window lies after it); None for a run that never learnt, broke at
    or before that step, or ended first."""
    learned, broke = _outcome(run)
    if learned is None:
        return None
    at = max(learned + offset, warmup + window)
    if (broke is not None and broke <= at) or at >= _steps(run):
        return None
    return at


def fired(pts: Sequence[tuple[int, float]], level: float, start: int, end: int) -> int | None:
    """The first probe step in [``start``, ``end``) whose value is above ``level`` or not finite, or None."""
    return next((t for t, v in pts if start <= t < end and (not math.isfinite(v) or v > level)), None)


def _on_at(pts, level: float, at: int) -> bool:
    """Whether the last probe at or before ``at`` is over ``level`` (or not finite)."""
    last = [v for t, v in pts if t <= at]
    return bool(last) and (not math.isfinite(last[-1]) or last[-1] > level)


def _median_ci(items: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """Median of (seed, value) pairs with a seed-bootstrap interval (none from fewer than two values)."""
    values = [v for _, v in items]
    ci = det.bootstrap(items, lambda s: det.quantile([v for _, v in s], 0.5), seed_of=lambda x: x[0]) \
        if len(values) > 1 else None
    return {"n": len(values), "median": det.quantile(values, 0.5), "ci": ci}


def _share(k: int, n: int) -> dict[str, Any]:
    return {"k": k, "n": n, "share": k / n if n else None, "ci": det.wilson(k, n)}


def landmark_leads(runs: Iterable[Mapping[str, Any]], level: float, key: str = "max_score",
                   offset: int = LANDMARK, warmup: int = WARMUP, window: int = WINDOW) -> dict[str, Any]:
    """The level read from each run's landmark (``landmark``): breakers and holders still at risk there, how
    many of each were already over it at the landmark, how many fired between the landmark and the break
    (breakers: a hit, strictly before the break) or the end (holders: an alarm), how many of the hits were a
    fresh crossing (under the level at the landmark), and the hits' lead (break − first firing at or after the
    landmark) beside the breakers' survival from the landmark (break − landmark), medians with seed-bootstrap
    intervals."""
    breakers, holders = [], []
    for r in runs:
        at = landmark(r, offset, warmup, window)
        if at is not None:
            (breakers if _outcome(r)[1] is not None else holders).append((r, at))
    leads, survival, on_b, crossed, hits = [], [], 0, 0, 0
    for r, at in breakers:
        pts, broke = points(r, key), _outcome(r)[1]
        on = _on_at(pts, level, at)
        first = fired(pts, level, at, broke)
        on_b += on
        survival.append((r["seed"], broke - at))
        if first is not None:
            hits += 1
            crossed += not on
            leads.append((r["seed"], broke - first))
    on_h = sum(_on_at(points(r, key), level, at) for r, at in holders)
    alarms = sum(fired(points(r, key), level, at, _steps(r)) is not None for r, at in holders)
    return {"level": level, "key": key, "breakers": len(breakers), "holders": len(holders),
            "on_at_landmark": {"breakers": _share(on_b, len(breakers)), "holders": _share(on_h, len(holders))},
            "hits": _share(hits, len(breakers)), "fresh_crossings": crossed,
            "holders_alarmed": _share(alarms, len(holders)),
            "lead": _median_ci(leads), "survival": _median_ci(survival)}


# ---- breakers against holders at the landmark -------------------------------------------------------------


def welch(a: Sequence[float], b: Sequence[float], level: float = intervals.LEVEL) -> dict[str, Any]:
    """mean(a) − mean(b) with Welch's t interval (Welch–Satterthwaite degrees of freedom); no interval with
    fewer than two values a side, or none where both sides have no spread (the difference is then exact)."""
    na, nb = len(a), len(b)
    out: dict[str, Any] = {"n": [na, nb], "diff": None, "ci": None, "df": None}
    if not na or not nb:
        return out
    ma, mb = math.fsum(a) / na, math.fsum(b) / nb
    out["diff"] = ma - mb
    if na < 2 or nb < 2:
        return out
    va = math.fsum((x - ma) ** 2 for x in a) / (na - 1) / na
    vb = math.fsum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    if va + vb == 0:
        return out
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    half = intervals.t_quantile(1 - (1 - level) / 2, df) * math.sqrt(va + vb)
    out.update(ci=(out["diff"] - half, out["diff"] + half), df=df)
    return out


def _read(run, key: str) -> list[tuple[int, float]]:
    """The (step, value) points a key is read from: the probes', or for the loss its 20-step means; log10 of
    the value where ``KEYS`` says so (a value at or under 0 has none: left out)."""
    if key == "loss":
        return [(t, m) for t, m in enumerate(oc.window_means(run["losses"])) if m is not None]
    log = KEYS[key][1]
    return [(t, math.log10(v) if log else v) for t, v in points(run, key)
            if math.isfinite(v) and (v > 0 or not log)]


def level_at(run: Mapping[str, Any], key: str, at: int) -> float | None:
    """``key``'s reading (``_read``) at the last point at or before step ``at``, or None."""
    got = [v for t, v in _read(run, key) if t <= at]
    return got[-1] if got else None


def slope_at(run: Mapping[str, Any], key: str, at: int, window: int = WINDOW) -> float | None:
    """The least-squares slope of ``key``'s reading over the points in [``at`` − ``window``, ``at``], per 100
    steps; None with fewer than three points."""
    pts = [(t, v) for t, v in _read(run, key) if at - window <= t <= at]
    if len(pts) < 3:
        return None
    mt = math.fsum(t for t, _ in pts) / len(pts)
    mv = math.fsum(v for _, v in pts) / len(pts)
    sxx = math.fsum((t - mt) ** 2 for t, _ in pts)
    return 100 * math.fsum((t - mt) * (v - mv) for t, v in pts) / sxx


def compare_at_landmark(runs: Iterable[Mapping[str, Any]], keys: Sequence[str] = tuple(KEYS),
                        offset: int = LANDMARK, warmup: int = WARMUP, window: int = WINDOW) -> dict[str, Any]:
    """Breakers against holders, each read at its own landmark: per key the level and the slope, breakers'
    mean − holders' mean with Welch's interval (``welch``), and whether the interval leaves out 0."""
    at_risk = [(r, at) for r in runs for at in [landmark(r, offset, warmup, window)] if at is not None]
    out: dict[str, Any] = {}
    for key in keys:
        row = {}
        for what, read in (("level", lambda r, at: level_at(r, key, at)),
                           ("slope", lambda r, at: slope_at(r, key, at, window))):
            b = [x for r, at in at_risk if _outcome(r)[1] is not None for x in [read(r, at)] if x is not None]
            h = [x for r, at in at_risk if _outcome(r)[1] is None for x in [read(r, at)] if x is not None]
            w = welch(b, h)
            w["separates"] = w["ci"] is not None and (w["ci"][0] > 0 or w["ci"][1] < 0)
            row[what] = w
        out[key] = row
    return out


def separation_text(compared: Mapping[str, Any]) -> str:
    """One sentence: which readings' intervals leave out 0, or that none does, and how many were compared."""
    tested = [(k, w) for k, row in compared.items() for w in row.values() if w["ci"] is not None]
    hits = [f"{KEYS[k][0]}'s {what}" for k, row in compared.items() for what, w in row.items() if w["separates"]]
    if not tested:
        return "Too few breakers or holders at the landmark to compare (each side needs two runs with a reading)."
    if not hits:
        return (f"Nothing separates breakers from holders at the landmark: every interval (levels and slopes, "
                f"{len(tested)} in all) holds 0.")
    return (f"{', '.join(hits)} separate{'s' if len(hits) == 1 else ''} breakers from holders at the landmark "
            f"({len(hits)} of {len(tested)} intervals leave out 0; about {0.05 * len(tested):.1f} would by chance).")


# ---- alarms in runs that held -----------------------------------------------------------------------------


def _start(run, warmup: int) -> int:
    """Where a learned run is at risk for the alarm counts: the step it learnt, or the warm-up's end if later."""
    return max(_outcome(run)[0], warmup)


def alarm_share(runs: Iterable[Mapping[str, Any]], level: float, key: str = "max_score",
                warmup: int = WARMUP) -> dict[str, Any]:
    """The runs that learnt and held: how many alarm (``key`` over ``level``) between the step each learnt (the
    warm-up's end, if later) and its end, with Wilson's interval, and those at-risk steps summed beside it."""
    held = [r for r in runs if _outcome(r)[0] is not None and _outcome(r)[1] is None]
    k = sum(fired(points(r, key), level, _start(r, warmup), _steps(r)) is not None for r in held)
    return {"level": level, **_share(k, len(held)),
            "at_risk_steps": sum(max(0, _steps(r) - _start(r, warmup)) for r in held)}


def curve(runs: Iterable[Mapping[str, Any]], levels: Sequence[float] = CURVE_LEVELS,
          key: str = "max_score", warmup: int = WARMUP) -> list[dict[str, Any]]:
    """Per level: the breaks warned (a firing from the step the run learnt, or the warm-up's end if later,
    strictly before its break) against the share of held runs that alarm (``alarm_share``)."""
    runs = list(runs)
    broke = [r for r in runs if _outcome(r)[1] is not None and _outcome(r)[0] is not None]
    out = []
    for level in levels:
        k = sum(fired(points(r, key), level, _start(r, warmup), _outcome(r)[1]) is not None for r in broke)
        out.append({"level": level, "hits": _share(k, len(broke)),
                    "held_alarmed": alarm_share(runs, level, key, warmup)})
    return out


# ---- dating a break ---------------------------------------------------------------------------------------

DATINGS: dict[str, str] = {
    "study": "the step after the last one before the 20-step mean's crossing whose own loss was within 0.1 nats "
             "of the minimum (the study's rule)",
    "smoothed": "the step after the last one before the crossing whose 20-step mean was within 0.1 nats of the "
                "minimum (the smoothed loss's own departure)",
    "crossing": "the step the 20-step mean first stood 0.5 nats above its minimum (the rise's confirmation)",
    "raw_0.2": "as the study's rule, with 0.2 nats in place of 0.1",
}


def dates(losses: Sequence[float | None], level: float) -> dict[str, int] | None:
    """The run's break step under each rule of ``DATINGS``; None where it did not break. A run that broke by
    going non-finite with no rise under way is dated at that step by every rule."""
    broke = oc.mid_run_break(losses, level)
    if broke is None:
        return None
    rise = oc.rise_of(losses, level)
    if rise is None:
        return {name: broke.step for name in DATINGS}
    c, low = rise
    means = oc.window_means(losses)
    return {"study": broke.step,
            "smoothed": max((i for i in range(c) if means[i] is not None and means[i] <= low + oc.BEGIN),
                            default=c - 1) + 1,
            "crossing": c,
            "raw_0.2": oc.mid_run_break(losses, level, begin=0.2).step}


def dating_sensitivity(runs: Iterable[Mapping[str, Any]], level: float) -> dict[str, Any]:
    """Each dating rule against the study's over the runs that broke: how many break steps move, the median
    and the largest shift (rule − study, in steps), and every run's dates."""
    each = [(r["run_id"], d) for r in runs for d in [dates(r["losses"], level)] if d is not None]
    out: dict[str, Any] = {"breaks": len(each), "runs": {rid: d for rid, d in each}, "rules": {}}
    for name in DATINGS:
        if name == "study":
            continue
        shifts = [d[name] - d["study"] for _, d in each]
        out["rules"][name] = {"moved": sum(s != 0 for s in shifts), "median_shift": det.quantile(shifts, 0.5),
                              "largest_shift": max(shifts, key=abs) if shifts else None}
    return out


# ---- a discrete-time hazard with max |score| as a time-varying covariate -------------------------------------

INTERVAL = 100  # steps a hazard interval spans


def hazard_rows(runs: Iterable[Mapping[str, Any]], key: str = "max_score", interval: int = INTERVAL,
                offset: int = LANDMARK, warmup: int = WARMUP, window: int = WINDOW) -> list[tuple[tuple[float, float], int]]:
    """((log10 of ``key`` at the last probe at or before the interval's start, the interval's count from the
    landmark), whether the run broke within it) for each ``interval``-step span of each run from its landmark
    (``landmark``) to its break or its end; a span whose reading is missing or not a positive finite number is
    left out. The count lets the hazard grow with time apart from the score, which grows with time too."""
    rows = []
    for r in runs:
        at = landmark(r, offset, warmup, window)
        if at is None:
            continue
        broke, end = _outcome(r)[1], _steps(r)
        pts = points(r, key)
        for k, t in enumerate(range(at, broke + 1 if broke is not None else end, interval)):
            last = [v for s, v in pts if s <= t]
            event = broke is not None and t <= broke < t + interval
            if last and math.isfinite(last[-1]) and last[-1] > 0:
                rows.append(((math.log10(last[-1]), float(k)), int(event)))
            if event:
                break
    return rows


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """m⁻¹ v by Gaussian elimination with partial pivoting; None for a singular m."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-300:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [a[i][n] / a[i][i] for i in range(n)]


def logistic(rows: Sequence[tuple[Sequence[float], int]], iterations: int = 100) -> dict[str, Any]:
    """The logistic regression of the events on the covariates, P(event) = 1 / (1 + exp(−(a + Σ bⱼ xⱼ))), fitted by
    Newton's method: each coefficient with Wald's 95% interval (from the inverse of the information at the fit),
    and the first covariate's as ``b`` with exp(b), the odds ratio per unit of it. No estimate where there are no
    events or no non-events, a covariate does not vary, or the fit does not converge to finite coefficients (the
    events separated by the covariates)."""
    n, events = len(rows), sum(y for _, y in rows)
    k = len(rows[0][0]) if rows else 0
    out: dict[str, Any] = {"intervals": n, "events": events, "coefficients": None, "se": None, "b": None, "ci": None,
                           "odds_ratio": None, "odds_ratio_ci": None}
    if not events or events == n or any(len({x[j] for x, _ in rows}) < 2 for j in range(k)):
        return out
    beta = [math.log(events / (n - events))] + [0.0] * k
    z = 1.959963984540054
    for _ in range(iterations):
        grad = [0.0] * (k + 1)
        info = [[0.0] * (k + 1) for _ in range(k + 1)]
        for x, y in rows:
            row = (1.0, *x)
            p = 1 / (1 + math.exp(-math.fsum(c * v for c, v in zip(beta, row))))
            for i in range(k + 1):
                grad[i] += (y - p) * row[i]
                for j in range(k + 1):
                    info[i][j] += p * (1 - p) * row[i] * row[j]
        step = _solve(info, grad)
        if step is None or max(abs(c) for c in beta) > 50:
            return out
        beta = [c + d for c, d in zip(beta, step)]
        if max(abs(d) for d in step) < 1e-10:
            se = [math.sqrt(_solve(info, [float(i == j) for i in range(k + 1)])[j]) for j in range(k + 1)]
            b, s = beta[1], se[1]
            out.update(coefficients=beta, se=se, b=b, ci=(b - z * s, b + z * s), odds_ratio=math.exp(b),
                       odds_ratio_ci=(math.exp(b - z * s), math.exp(b + z * s)))
            return out
    return out


# ---- the published study read again (its JSON: learned and break steps, no series) -----------------------


def _cells(result, qk_off: bool) -> list[dict[str, Any]]:
    rungs = result["pilot"]["chosen"]
    return [c for c in result["cells"] if c["lr"] in rungs and c["arm"].startswith("qk-off" if qk_off else "qk-on")]


def old_leads(result: Mapping[str, Any], probe_every: int, steps: int, detector: str = "max_score>1000") -> list[dict]:
    """Per qk-norm-off cell of the chosen rungs: the reported median lead of ``detector`` beside the median
    survival after learning, break − the first probe at or after ``learned_at``; its false alarms per 1,000
    at-risk steps beside 1,000 ÷ the mean at-risk length of the runs that held (what the rate is when every
    one of them alarms); and the sign test's p against the loss's spike beside 2^(1 − n), n the broken seeds."""
    out = []
    for c in _cells(result, qk_off=True):
        runs = [o for o in result["outcomes"] if (o["arm"], o["lr"]) == (c["arm"], c["lr"])]
        broke = [o for o in runs if o["broke"] is not None]
        held = [o for o in runs if o["kind"] == "learned, held"]
        d = c["detectors"][detector]
        survival = [o["broke"] - probe_every * math.ceil(o["learned_at"] / probe_every) for o in broke]
        v = c["versus"]["loss_spike"][detector]
        out.append({"arm": c["arm"], "lr": c["lr"], "breaks": len(broke), "held": len(held),
                    "held_degraded": sum(o["degraded"] for o in held),
                    "lead_median": d["lead"]["median"], "survival_median": det.quantile(survival, 0.5),
                    "false_alarms": d["false_alarms"]["false_alarms"], "per_1000": d["false_alarms"]["per_1000"],
                    "per_mean_at_risk": 1000 * len(held) / sum(steps - o["learned_at"] for o in held) if held else None,
                    "sign_p": v["p"], "two_to_one_minus_n": 2.0 ** (1 - len({o["seed"] for o in broke})) if broke else None,
                    "break_steps": [min(o["broke"] for o in broke), max(o["broke"] for o in broke)] if broke else None,
                    "learned_median": {"breakers": det.quantile([o["learned_at"] for o in broke], 0.5),
                                       "holders": det.quantile([o["learned_at"] for o in held], 0.5)}})
    return out


def silenced(result: Mapping[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """The detectors whose threshold was None in both folds, with why: no threshold of their list stayed within
    the false-alarm budget on either choosing half, where the budget (per 1,000 at-risk steps) over the half's
    held runs' at-risk steps allows the count of alarms given (``alarms_allowed``)."""
    budget = result["max_false_alarms_per_1000"]
    out = {}
    for name, folds in result["folds"].items():
        if any(f["threshold"] is not None for f in folds):
            continue
        at_risk = [sum(steps - o["learned_at"] for o in result["outcomes"]
                       if o["kind"] == "learned, held" and o["seed"] in f["choosing_seeds"]) for f in folds]
        allowed = [math.floor(budget * s / 1000 + 1e-9) for s in at_risk]
        out[name] = {"at_risk_steps": at_risk, "alarms_allowed": allowed,
                     "why": f"silenced by its rule, not silent: on each choosing half every threshold of its list "
                            f"alarmed in more of the runs that held than the budget of {budget:g} per 1,000 at-risk "
                            f"steps allows ({' and '.join(f'{a} in {s:,} steps' for a, s in zip(allowed, at_risk))}), "
                            "so no threshold was chosen and its judged half was read at none"}
    return out


def auc_readings(result: Mapping[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """The early readings' AUC intervals in the qk-norm cells of the chosen rungs: how many there are, how many
    leave out 0.5, how many of those are distinct readings (the max |score| detectors read one number, so
    their intervals coincide), and the step each share reads at beside the warm-up."""
    got, shares = [], set()
    for c in _cells(result, qk_off=False):
        for name, d in c["detectors"].items():
            for share, a in d["predicts_degraded"].items():
                shares.add(share)
                ci = a["ci"]
                got.append({"arm": c["arm"], "lr": c["lr"], "detector": name, "share": share, "auc": a["auc"],
                            "ci": ci, "excludes_half": ci is not None and (ci[0] > 0.5 or ci[1] < 0.5)})

    def distinct(rows):
        return len({(r["arm"], r["lr"], r["share"], r["auc"], None if r["ci"] is None else tuple(r["ci"]))
                    for r in rows})

    excluding = [r for r in got if r["excludes_half"]]
    return {"intervals": len(got), "excluding_half": len(excluding), "distinct_intervals": distinct(got),
            "distinct_excluding_half": distinct(excluding), "which": excluding,
            "shares": {s: {"step": math.floor(float(s) * steps), "inside_warmup": math.floor(float(s) * steps) < warmup}
                       for s in sorted(shares)}}


# ---- all of it ----------------------------------------------------------------------------------------------


def _groups(runs) -> dict[str, list]:
    """The runs by (cell, arm), then each arm over every cell ("all, A")."""
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(f"{r['cell']}, {r['arm']}", []).append(r)
    for r in runs:
        out.setdefault(f"all, {r['arm']}", []).append(r)
    return out


def reread(runs: Sequence[Mapping[str, Any]], level: float, arms: Sequence[str] = ("A", "E"),
           levels: Sequence[float] = LEVELS, offset: int = LANDMARK, warmup: int = WARMUP,
           window: int = WINDOW) -> dict[str, Any]:
    """Every re-read figure of the series' runs of ``arms`` (the runs with no action taken), per cell and arm
    and per arm over the cells: counts, landmark leads per level, breakers against holders, alarm shares and
    the curve, and the dating rules' sensitivity (``level``: the learned level the outcomes were judged at)."""
    runs = [r for r in runs if r["arm"] in arms]
    out: dict[str, Any] = {"landmark": {"offset": offset, "warmup": warmup, "window": window}, "levels": list(levels),
                           "groups": {}}
    for name, rs in _groups(runs).items():
        learned = [r for r in rs if _outcome(r)[0] is not None]
        compared = compare_at_landmark(rs, offset=offset, warmup=warmup, window=window)
        out["groups"][name] = {
            "runs": len(rs), "pilot_runs": sum(bool(r.get("pilot")) for r in rs), "learned": len(learned),
            "mid_run_breaks": sum(_outcome(r)[1] is not None for r in learned),
            "never_learned": len(rs) - len(learned),
            "landmark": {f"{lv:g}": landmark_leads(rs, lv, offset=offset, warmup=warmup, window=window) for lv in levels},
            "compare": compared, "separation": separation_text(compared),
            "held_alarmed": {f"{lv:g}": alarm_share(rs, lv, warmup=warmup) for lv in levels},
            "curve": curve(rs, warmup=warmup), "dating": dating_sensitivity(rs, level),
            "hazard": logistic(hazard_rows(rs, offset=offset, warmup=warmup, window=window))}
    return out
