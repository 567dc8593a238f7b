"""`attnscale warn-study --reread SERIES`: the warning study's figures re-derived from published series.

Reads a series file (``docs/act-study-series.json.gz``: gzip'd or plain JSON, {"learned_level": …,
"runs": [...]}) and, with ``--published``, the warning study's own JSON (``docs/warn-study.json``), and
returns what ``analysis.warning`` makes of them: landmark leads, breakers against holders, alarms in the
runs that held, the hazard of a break against max |score|, the dating rules' sensitivity; the published study's leads read as survival, its silenced
detectors and its AUC readings counted again. Nothing is trained.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path
from typing import Any

from attnscale.analysis import warning
from attnscale.errors import ConfigError
from attnscale.terminal import table

__all__ = ["RECIPE_STEPS", "RECIPE_WARMUP", "RECIPE_PROBE_EVERY", "read_series", "reread_files", "format_reread",
           "reread_json"]

RECIPE_STEPS, RECIPE_WARMUP, RECIPE_PROBE_EVERY = 1500, 500, 10  # the published study's runs (warn_study.recipe_train)


class _NotFinite(ValueError):
    pass


def _not_finite(name: str):
    raise _NotFinite(name)


SERIES_HINT = "give a series file such as docs/act-study-series.json.gz"
PUBLISHED_HINT = "give docs/warn-study.json as `attnscale warn-study --study` wrote it"


def _load(path: Path, hint: str = SERIES_HINT) -> Any:
    """``path``'s JSON (gzip'd or not), where every number is finite; a one-line ConfigError ending in ``hint``."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}; {hint}") from None
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        return json.loads(text, parse_constant=_not_finite)
    except _NotFinite as e:
        raise ConfigError(f"{path} holds {e} where a number is meant: its numbers are finite or null; {hint}") from None
    except (OSError, EOFError, zlib.error, ValueError) as e:  # a cut or corrupt gzip, not UTF-8, not JSON
        raise ConfigError(f"{path} is not JSON or gzip'd JSON ({e}); {hint}") from None


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)  # finite: _load refuses NaN and inf


def _step(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _run_problem(r: Any, arms) -> str | None:
    """What is wrong with one run of a series file, or None: the types and ranges the re-read reads."""
    if not isinstance(r, dict):
        return "is not a JSON object"
    need = ("run_id", "cell", "arm", "seed", "losses", "probes", "outcome")
    missing = [k for k in need if k not in r]
    if missing:
        return f"lacks {', '.join(missing)}; every run of a series file holds {', '.join(need)}"
    if not (isinstance(r["run_id"], str) and isinstance(r["cell"], str) and _step(r["seed"])):
        return "has a run_id or cell that is not text, or a seed that is not a whole number"
    if r["arm"] not in arms:
        return f"has the arm {r['arm']!r}, not one of the act study's {', '.join(arms)}"
    losses, steps = r["losses"], r.get("steps")
    if not isinstance(losses, list) or not losses or any(x is not None and not _real(x) for x in losses):
        return "has losses that are not a list of numbers (or null)"
    if steps is not None and not (_step(steps) and len(losses) <= steps):
        return f"has steps {steps!r}, not a whole number at least its {len(losses)} losses"
    probes = r["probes"]
    if isinstance(probes, dict):  # the column layout (warning.probes reads both)
        steps_of = probes.get("step")
        values = [v for k, col in probes.items() if k != "step" for v in (col if isinstance(col, list) else [col])]
        columns = all(isinstance(col, list) for col in probes.values())
    else:
        steps_of = [p.get("step") for p in probes] if isinstance(probes, list) and all(
            isinstance(p, dict) for p in probes) else None
        values = [v for p in probes for k, v in p.items() if k != "step"] if steps_of is not None else []
        columns = True
    if not (columns and isinstance(steps_of, list) and all(_step(t) for t in steps_of)
            and all(v is None or _real(v) for v in values)):
        return "has probes that are not steps (whole numbers) with numbers (or null)"
    o = r["outcome"]
    if not (isinstance(o, dict) and all(o.get(k) is None or _step(o[k]) for k in ("learned_at", "break_step"))):
        return "has an outcome whose learned_at or break_step is not a step (or null)"
    learned, broke, end = o.get("learned_at"), o.get("break_step"), steps if steps is not None else len(losses)
    if broke is not None and (learned is None or not learned < broke <= end):
        return f"breaks at step {broke} but learnt at {learned}: a run breaks after it learnt, within its {end} steps"
    if learned is not None and learned >= end:
        return f"learnt at step {learned}, past its {end} steps"
    return None


def read_series(path: Path) -> dict[str, Any]:
    """A series file's contents: its ``runs`` and the ``learned_level`` its outcomes were judged at, read like
    any user input: a one-line ConfigError where it is not the act study's (``"study": "act"``), where its level
    is not a positive number, or a run is not as ``act_study.write_series`` keeps it or is there twice."""
    from attnscale.experiments.act_study import ARMS

    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ConfigError(f"{path} holds no list of runs under \"runs\": it is not a series file "
                          "(docs/act-study-series.json.gz is one)")
    level = data.get("learned_level")
    if not (_real(level) and level > 0):
        raise ConfigError(f"{path} names no learned_level (a positive loss in nats; it has {level!r}): the break "
                          "dating needs the level its runs learnt at")
    if data.get("study") != "act":
        raise ConfigError(f"{path} is a series of the study {data.get('study')!r}, not the act study's "
                          "(\"study\": \"act\"); give the act study's series, e.g. docs/act-study-series.json.gz")
    if not data["runs"]:
        raise ConfigError(f"{path} holds no runs: nothing to re-read")
    seen: set[str] = set()
    for i, r in enumerate(data["runs"]):
        problem = _run_problem(r, ARMS)
        name = r.get("run_id", f"number {i + 1}") if isinstance(r, dict) else f"number {i + 1}"
        if problem is None and name in seen:
            problem = "is there twice: a series holds each run once"
        if problem is not None:
            raise ConfigError(f"{path}: run {name} {problem}")
        seen.add(name)
    return data


_RECIPE = {"pilot": dict, "cells": list, "outcomes": list, "folds": dict, "max_false_alarms_per_1000": (int, float)}


def _published(path: Path) -> dict[str, Any]:
    """The published study's figures read again, with a one-line ConfigError where its "recipe" study lacks
    what they read (the parts in ``_RECIPE``, and within them the keys ``warning`` reads)."""
    data = _load(path, PUBLISHED_HINT)
    r = data.get("recipe") if isinstance(data, dict) else None
    if not isinstance(r, dict):
        raise ConfigError(f"{path} has no \"recipe\" study: {PUBLISHED_HINT}")
    bad = [k for k, kind in _RECIPE.items() if not isinstance(r.get(k), kind) or isinstance(r.get(k), bool)]
    if bad:
        raise ConfigError(f"{path}: its \"recipe\" study lacks {', '.join(bad)} (or holds the wrong kind of "
                          f"value there): {PUBLISHED_HINT}")
    try:
        return {"path": str(path), "leads": warning.old_leads(r, RECIPE_PROBE_EVERY, RECIPE_STEPS),
                "silenced": warning.silenced(r, RECIPE_STEPS),
                "auc": warning.auc_readings(r, RECIPE_STEPS, RECIPE_WARMUP)}
    except (KeyError, TypeError, IndexError, AttributeError, ValueError, ZeroDivisionError) as e:
        # deeper than the parts: a key missing or a value of the wrong kind inside one, named as Python met it
        raise ConfigError(f"{path}: its \"recipe\" study cannot be read ({type(e).__name__}: {e}): "
                          f"{PUBLISHED_HINT}") from None


def reread_files(series: Path | None, published: Path | None = None) -> dict[str, Any]:
    """The re-read of ``series`` (arms A and E: no action taken) and of the ``published`` study's JSON."""
    if series is None and published is None:
        raise ConfigError("--reread needs a series file, or --published the study's JSON, or both")
    out: dict[str, Any] = {"reread": True}
    if series is not None:
        data = read_series(series)
        out["series"] = {"path": str(series), **warning.reread(data["runs"], data["learned_level"])}
    if published is not None:
        out["published"] = _published(published)
    return out


def _share(s: dict[str, Any]) -> str:
    if not s["n"]:
        return "—"
    lo, hi = s["ci"]
    return f"{s['k']}/{s['n']} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def _median(m: dict[str, Any]) -> str:
    if m["median"] is None:
        return "—"
    ci = m["ci"]
    return f"{m['median']:g}" + (f" (n {m['n']})" if ci is None else f" [{math.floor(ci[0])}, {math.ceil(ci[1])}]")


def _diff(w: dict[str, Any]) -> str:
    if w["diff"] is None:
        return "—"
    ci = w["ci"]
    return f"{w['diff']:+.3g}" + (" (no interval)" if ci is None else f" [{ci[0]:+.3g}, {ci[1]:+.3g}]")


def format_reread(result: dict[str, Any]) -> str:
    """The re-read as tables: per group, landmark leads per level, breakers against holders, alarms in held runs,
    the dating rules; then the published study read again."""
    lines: list[str] = []
    s = result.get("series")
    if s is not None:
        lm = s["landmark"]
        lines.append(f"Series {s['path']}: arms with no action. Each learned run is read at its landmark, "
                     f"{lm['offset']} steps after it learnt and no earlier than step {lm['warmup'] + lm['window']} "
                     f"(warm-up {lm['warmup']} + the {lm['window']}-step slope window).")
        for name, g in s["groups"].items():
            lines.append("")
            lines.append(f"{name}: {g['runs']} runs ({g['pilot_runs']} pilot), {g['learned']} learned, "
                         f"{g['mid_run_breaks']} mid-run breaks, {g['never_learned']} never learned")
            rows = [[f"max |score| > {lv}", f"{d['breakers']} / {d['holders']}",
                     _share(d["on_at_landmark"]["breakers"]), _share(d["on_at_landmark"]["holders"]),
                     _share(d["hits"]), str(d["fresh_crossings"]), _share(d["holders_alarmed"]),
                     _median(d["lead"]), _median(d["survival"])] for lv, d in g["landmark"].items()]
            lines += table(("from the landmark", "breakers / holders", "breakers on at it", "holders on at it",
                            "breaks warned", "fresh", "holders alarmed", "median lead", "median survival"),
                           rows, "<" + ">" * 8)
            rows = [[warning.KEYS[k][0], _diff(c["level"]), _diff(c["slope"])] for k, c in g["compare"].items()]
            lines += table(("breakers − holders at the landmark", "level", "slope per 100 steps"), rows, "<>>")
            lines.append(g["separation"])
            rows = [[f"{c['level']:g}", _share(c["hits"]), _share(c["held_alarmed"]),
                     f"{c['held_alarmed']['at_risk_steps']:,}"] for c in g["curve"]]
            lines += table(("max |score| over", "breaks warned", "held runs that alarm", "their at-risk steps"),
                           rows, "<>>>")
            h = g["hazard"]
            lines.append(f"Hazard from the landmark: {h['events']} breaks in {h['intervals']} 100-step intervals; "
                         + ("no estimate of the odds ratio per decade of max |score| (no events, no variation, or "
                            "the events separated by it)" if h["b"] is None else
                            f"odds ratio of a break per decade of max |score|, time since the landmark beside it, "
                            f"{h['odds_ratio']:.3g} [{h['odds_ratio_ci'][0]:.3g}, {h['odds_ratio_ci'][1]:.3g}] (Wald)")
                         + ".")
            dating = g["dating"]
            if dating["breaks"]:
                lines.append(f"Dating {dating['breaks']} breaks: " + "; ".join(
                    f"{name} moves {r['moved']} (median {r['median_shift']:+g}, largest {r['largest_shift']:+d} steps)"
                    for name, r in dating["rules"].items()) + ".")
    p = result.get("published")
    if p is not None:
        lines.append("")
        lines.append(f"The published study ({p['path']}), read again:")
        rows = [[f"{c['arm']} {c['lr']:g}", f"{c['lead_median']:g}" if c["lead_median"] is not None else "—",
                 f"{c['survival_median']:g}" if c["survival_median"] is not None else "—",
                 "—" if c["per_1000"] is None else f"{c['per_1000']:.2f}",
                 "—" if c["per_mean_at_risk"] is None else f"{c['per_mean_at_risk']:.2f}",
                 f"{c['false_alarms']}/{c['held']}", f"{c['sign_p']:.3g}",
                 "—" if c["two_to_one_minus_n"] is None else f"{c['two_to_one_minus_n']:.3g}"] for c in p["leads"]]
        lines += table(("cell", "median lead", "median survival", "false alarms / 1,000", "1,000 / mean at risk",
                        "held runs alarmed", "sign p", "2^(1-n)"), rows, "<" + ">" * 7)
        for name, sil in p["silenced"].items():
            lines.append(f"{name}: {sil['why']}.")
        a = p["auc"]
        lines.append(f"AUC intervals leaving out 0.5: {a['excluding_half']} of {a['intervals']} "
                     f"({a['distinct_excluding_half']} distinct readings of {a['distinct_intervals']}); "
                     + "; ".join(f"the {float(k):.0%} reading is at step {v['step']}"
                                 + (" (inside the warm-up)" if v["inside_warmup"] else "") for k, v in a["shares"].items()) + ".")
    return "\n".join(lines)


def reread_json(result: dict[str, Any]) -> dict[str, Any]:
    """The re-read as --json prints it (every number; each run's break dates under each rule)."""
    return json.loads(json.dumps(result))
