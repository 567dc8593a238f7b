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
from pathlib import Path
from typing import Any

from attnscale.analysis import warning
from attnscale.errors import ConfigError
from attnscale.terminal import table

__all__ = ["RECIPE_STEPS", "RECIPE_WARMUP", "RECIPE_PROBE_EVERY", "read_series", "reread_files", "format_reread",
           "reread_json"]

RECIPE_STEPS, RECIPE_WARMUP, RECIPE_PROBE_EVERY = 1500, 500, 10  # the published study's runs (warn_study.recipe_train)


def _load(path: Path) -> Any:
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}; give the path of a series file "
                          "(e.g. docs/act-study-series.json.gz)") from None
    try:
        return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not JSON or gzip'd JSON ({e}); give a series file such as "
                          "docs/act-study-series.json.gz") from None


def read_series(path: Path) -> dict[str, Any]:
    """A series file's contents: its ``runs`` and the ``learned_level`` its outcomes were judged at."""
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ConfigError(f"{path} holds no list of runs under \"runs\": it is not a series file "
                          "(docs/act-study-series.json.gz is one)")
    if not isinstance(data.get("learned_level"), (int, float)):
        raise ConfigError(f"{path} names no learned_level: the break dating needs the level its runs learnt at")
    need = ("run_id", "cell", "arm", "seed", "losses", "probes", "outcome")
    for r in data["runs"]:
        missing = [k for k in need if k not in r]
        if missing:
            raise ConfigError(f"{path}: run {r.get('run_id', '?')} lacks {', '.join(missing)}; every run of a "
                              f"series file holds {', '.join(need)}")
    return data


def reread_files(series: Path | None, published: Path | None = None) -> dict[str, Any]:
    """The re-read of ``series`` (arms A and E: no action taken) and of the ``published`` study's JSON."""
    if series is None and published is None:
        raise ConfigError("--reread needs a series file, or --published the study's JSON, or both")
    out: dict[str, Any] = {"reread": True}
    if series is not None:
        data = read_series(series)
        out["series"] = {"path": str(series), **warning.reread(data["runs"], data["learned_level"])}
    if published is not None:
        data = _load(published)
        if not isinstance(data, dict) or "recipe" not in data:
            raise ConfigError(f"{published} has no \"recipe\" study: give docs/warn-study.json")
        r = data["recipe"]
        out["published"] = {"path": str(published),
                            "leads": warning.old_leads(r, RECIPE_PROBE_EVERY, RECIPE_STEPS),
                            "silenced": warning.silenced(r, RECIPE_STEPS),
                            "auc": warning.auc_readings(r, RECIPE_STEPS, RECIPE_WARMUP)}
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
