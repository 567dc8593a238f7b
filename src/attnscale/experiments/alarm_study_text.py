"""The alarm study's printout: the pilot's break shares and choice, or the study's endpoints and decision."""

from __future__ import annotations

from typing import Any

from attnscale.analysis import paired

__all__ = ["format_result", "share_text"]


def share_text(s: dict[str, Any]) -> str:
    if s["n"] == 0:
        return "— (none)"
    lo, hi = s["interval"]
    return f"{s['k']}/{s['n']}, {s['share']:.0%} [{lo:.0%}, {hi:.0%}]"


def _pilot(shares: dict, choice: dict) -> list[str]:
    lines = [f"rate {lr if isinstance(lr, str) else f'{lr:g}'}: broke mid-run {share_text(s)} of learned "
             f"({s['never_learned']} never learned)" for lr, s in shares.items()]
    if choice["rate"] is not None:
        lines.append(f"the study's rate: {choice['rate']:g}" + (
            f" (none in 25-75% after the added {choice['added']:g}: the rule takes the rate nearest 50%, a tie to "
            "the lower)" if choice.get("fallback") else ""))
    else:
        lines.append("no rate qualifies" + (f"; the rule adds {choice['add']:g} on the pilot's seeds" if choice["add"] else ""))
    return lines


def format_result(result: dict[str, Any]) -> str:
    if result.get("pilot") is True:
        return "\n".join(["Alarm pilot (arm A):"] + _pilot(result["shares"], result["choice"]))
    lines = [f"Alarm study at {result['rate']:g} ({'interim' if result['interim'] else 'final'}; A on "
             f"{len(result['seeds']['A'])} seeds), level {result['level']:g}:"]
    for dating, s in result["sensitivity"].items():
        lines.append(f"  sensitivity ({dating} dating): {share_text(s)}")
    fa = result["false_alarms"]
    lines.append(f"  false-alarm share among holders: {share_text(fa)}"
                 + (f", the alarm at step {fa['median_step']:,.0f} (median)" if fa.get("median_step") is not None else ""))
    cost = result["false_alarm_cost"]
    lines.append(f"  cost of a false alarm, C − A: {paired.estimate_text(cost['diff'], cost['se'], cost['n'], cost['interval'], signed=True)} nats")
    eq = result["C_vs_B"]
    lines.append(f"  C − B: {eq['verdict']} at ±{eq['margin']:g} nats (90% "
                 f"{'—' if eq['interval_90'] is None else '[{:+.4f}, {:+.4f}]'.format(*eq['interval_90'])})")
    fc = result["F_vs_C"]
    lines.append(f"  F (half the rate) − C: {paired.estimate_text(fc['diff'], fc['se'], fc['n'], fc['interval'], signed=True)} nats; "
                 f"breaks F {result['F_vs_C_breaks']['F']}, C {result['F_vs_C_breaks']['C']}")
    e = result["E_vs_best"]
    lines.append(f"  E (qk-norm) − {e['against']}: {paired.estimate_text(e['diff'], e['se'], e['n'], e['interval'], signed=True)} nats")
    sep = [f"{s['level']:g}" for s in result["separation"] if s["separates"]]
    lines.append(f"  levels that separate breakers from holders: {', '.join(sep) or 'none'}")
    lines.append("  final held-out loss by arm (mean [95% t]; runs, mid-run breaks, never learned):")
    for arm, a in result.get("arms", {}).items():
        loss = a["loss"]
        counts = f"{a['runs']} run{'s' if a['runs'] != 1 else ''}" + (f", {a['breaks']} broke, {a['never_learned']} never learned" if "breaks" in a else "")
        lines.append(f"    {arm:<10} {paired.estimate_text(loss['mean'], loss['se'], loss['n'], loss['interval'])} ({counts})")
    lines.append(f"decision: {result['decision']}")
    return "\n".join(lines)
