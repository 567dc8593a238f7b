"""What attention is worth, and the course's end state decided: two of the report's pieces.

``floor_blocks``: beside the width sweep, the no-attention floors (the corpus's unigram and bigram
perplexity, counted; the trained ``uniform`` model of the same shape) and every gap in points and
as a share of V = floor − ppl(1/√d), the course's gaps beside ours read the same way.
``blocks``: the long run of ``attnscale reproduce --end-state`` judged by the rule written before it
ran (``analysis.end_state``), and the layer-0 spread and frozen share at each of its records.
``notes``: what that run says about each end-of-training claim, for the claims' table.
"""

from __future__ import annotations

from typing import Any

from attnscale.analysis import end_state as rule
from attnscale.analysis import gaps as gap_tables
from attnscale.core.scales import FLOORS, display_name
from attnscale.report.blocks import Block, Bullets, Heading, Para, Table

__all__ = ["floor_blocks", "blocks", "notes", "judged"]

SCALED = "inv_sqrt_d"


def _f(x: Any, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def floor_blocks(runs) -> list[Block]:
    """The floors and the gaps as shares of V; nothing where the sweep has neither floor."""
    rows = gap_tables.run_rows(runs.sweep)
    trained = gap_tables.floor_ppl(rows)
    counted = runs.floors
    if trained is None and counted is None:
        return []
    table = gap_tables.gap_table(rows, reference=SCALED)
    by_trained = gap_tables.value_shares(table, trained)
    by_bigram = gap_tables.value_shares(table, counted.bigram_ppl if counted else None)
    course = gap_tables.course_shares()
    first_lr = table["rows"][0]["lr"] if table["rows"] else None
    body = []
    for r in (r for r in table["rows"] if r["lr"] == first_lr):
        w = r["head_dim"]
        body.append([w, _f(r["gap"], "{:+.2f}"), _f(by_trained.get(w), "{:.2f}"), _f(by_bigram.get(w), "{:.2f}"),
                     _f(gap_tables.COURSE_GAPS.get(w), "{:.1f}"), _f(course.get(w), "{:.2f}")])
    where = [t.head_dim for t in runs.sweep if t.scale in FLOORS]
    said = []
    if trained is not None:
        said.append(f"the trained {display_name('uniform')} model, same shape and budget, at width "
                    f"{where[0] if where else '?'}: perplexity {trained:.2f}")
    if counted is not None:
        said.append(f"counted on the corpus ({counted.smoothing}): unigram {counted.unigram_ppl:.2f}, "
                    f"bigram {counted.bigram_ppl:.2f}")
    return [
        Para("What attention is worth. A gap in points means little until it is set against what attention "
             "can win on this corpus at all: V = F − ppl(1/√d), with F a model that cannot use its attention. "
             "The no-attention floors here: " + "; ".join(said) + "."),
        Table(["width d", "gap (points)", "share of V (uniform floor)", "share of V (bigram floor)",
               "course's gap", f"course's share (gap / {gap_tables.COURSE_PLATEAU:g})"], body),
        Para(f"How to read a share: {gap_tables.SHARE_MEANING}. The course gives no floor, so its share is its "
             f"gap over its own plateau of 17–18 points (taken as {gap_tables.COURSE_PLATEAU:g}), the gap where, on "
             "this reading, its unscaled model has lost all that attention is worth. Points differ between corpora; "
             "shares can be compared."),
    ]


def judged(runs) -> dict[str, Any] | None:
    """The end-state run judged by its rule (None where the records hold none)."""
    got = runs.end_state
    return rule.judge([rule.summary(t) for t in got]) if got else None


# the claims' keys (``report.course``) each end-state claim speaks to, in ``rule.judge``'s order
_KEYS = ("end_spread", "end_frozen", "scaled_spread", None, "big_gap")


def notes(runs) -> dict[str, str]:
    """Claim key -> what the end-state run says about it ({} without one)."""
    j = judged(runs)
    if j is None:
        return {}
    out = {}
    met = {True: "met", False: "not met", None: "not measured"}
    for key, c in zip(_KEYS, j["claims"]):
        if key:
            values = ", ".join(_f(v, "{:,.2f}") for v in c["values"])
            out[key] = (f"the end-state run (attnscale reproduce --end-state, 7,200 steps, held then cooled): "
                        f"{c['claim']} {values}, {met[c['met']]}; its pre-stated rule says {j['verdict']}")
    return out


def blocks(runs) -> list[Block]:
    """The end-state section: the verdict, the rule, and the layer-0 spread and frozen share per record."""
    got = runs.end_state
    if not got:
        return []
    j = judged(runs)
    partial = [t.run_id for t in got if t.status != "done"]
    b: list[Block] = [Heading(2, "The course's end state, decided (attnscale reproduce --end-state)")]
    b.append(Para("One long run designed to reach the course's end of training: the learning rate held for 80% "
                  "of 7,200 steps, then cooled linearly to a tenth; width 1,024 without a scale and with 1/√d on "
                  "two seeds, the pair at 128, and the uniform floor at 128. The rule that judges it was written "
                  "before it ran: " + rule.RULE + "."))
    if partial:
        b.append(Para("Partial: " + ", ".join(partial) + " had not finished; the verdict reads their last record."))
    lines = rule.verdict_lines(j)
    if runs.floors is not None:  # the counted floor, shown beside the judged one
        bigram = runs.floors.bigram_ppl
        shares = {w: gap_tables.share_of_value(j["shares"][w]["gap"], bigram, j["shares"][w]["scaled"])
                  for w in sorted(j["shares"])}
        lines.insert(-1, f"beside it, not judged: the bigram floor (counted, {runs.floors.smoothing}) {bigram:.2f}; "
                         "shares against it: " + ", ".join(f"d = {w:,}: {_f(v, '{:.2f}')}" for w, v in shares.items()))
    b.append(Bullets("The verdict, claim by claim:", lines))
    wide = sorted((t for t in got if t.head_dim == rule.COURSE_WIDTH and t.scale in ("none", SCALED)),
                  key=lambda t: (t.scale != "none", t.seed))
    series = {t.run_id: {r["step"]: r for r in rule.summary(t)["series"]} for t in wide}
    steps = sorted({s for v in series.values() for s in v})
    head = ["step", *[f"{t.run_id} spread / frozen" for t in wide]]
    body = [[s, *[(_f(series[t.run_id][s]["spread"], "{:,.1f}") + " / " + _f(series[t.run_id][s]["frozen"], "{:.1%}"))
                  if s in series[t.run_id] else "—" for t in wide]] for s in steps]
    b.append(Table(head, body))
    at = sorted({e["step"] for t in got for e in t.results.evals})
    if at:  # the held-out loss along the way: many epochs of a small corpus, so overfitting would show here
        ppl = {t.run_id: {e["step"]: e.get("perplexity") for e in t.results.evals} for t in got}
        b.append(Table(["run", *[f"held-out ppl at step {s:,}" for s in at]],
                       [[t.run_id, *[_f(ppl[t.run_id].get(s), "{:.2f}") for s in at]] for t in got]))
    return b
