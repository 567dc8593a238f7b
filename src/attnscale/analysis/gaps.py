"""The perplexity gap between two scales at each width, and where "large" starts.

One table (``gap_table``) that ``attnscale sweep`` prints and the report's
claims read, so both name the same gaps and the same start. Seeds are paired
(one seed gives both schemes the same batches), so a gap's SE is that of the
per-seed differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnscale.analysis.estimates import mean_se
from attnscale.analysis.intervals import interval
from attnscale.runs.record import FINISHED  # run statuses whose perplexity (or its absence) is final

__all__ = ["run_rows", "gap_table", "gap_by_head_dim", "share_by_head_dim", "first_start", "GAP_THRESHOLD_PPL",
           "GAP_RULE", "share_of_value", "value_shares", "floor_ppl", "COURSE_GAPS", "COURSE_PLATEAU", "course_shares",
           "SHARE_MEANING"]

# Where "large" starts: the first width from which every wider width shows a gap
# above 1 point of perplexity and, with two or more seeds, a 95% t interval of
# the gap (``intervals.interval``, n − 1 degrees of freedom) wholly above 0. 1
# point sits between the course's "no difference" (width 32) and the smallest
# gap it calls a help ("about 2 points", width 128); the interval keeps
# seed-to-seed noise from counting as a gap (with 2 seeds "> 2 SE" happens by
# chance about 30% of the time). A gap above 1 point whose interval reaches 0
# is undecided (``counts`` None), and the start is then given both ways.
# Requiring every wider width to agree keeps one noisy narrow width from starting it early.
GAP_THRESHOLD_PPL = 1.0
GAP_RULE = ("gap > 1 ppl (and, with 2 or more seeds, its 95% t interval above 0) at this width and every "
            "wider one")


def run_rows(runs: Sequence[Any], varied_lr: bool | None = None) -> list[dict[str, Any]]:
    """One row per training run (``runs.record.TrainRun``): {run_id, head_dim, scale, seed, lr,
    valid_ppl, status, diverged_at, train_seconds}, the rows ``gap_table`` reads.

    ``lr`` is the run's learning rate where the runs vary it (``varied_lr``; None:
    where they hold more than one), else None, so a sweep at one rate has one group."""
    runs = list(runs)
    if varied_lr is None:
        varied_lr = len({t.lr for t in runs}) > 1
    return [{"run_id": t.run_id, "head_dim": t.head_dim, "scale": t.scale, "seed": t.seed,
             "lr": t.lr if varied_lr else None, "valid_ppl": t.perplexity, "status": t.status,
             "diverged_at": t.diverged_at, "train_seconds": t.results.train_seconds} for t in runs]


def gap_table(rows: Sequence[dict[str, Any]], baseline: str = "none", reference: str = "inv_sqrt_d",
              threshold: float = GAP_THRESHOLD_PPL) -> dict[str, Any]:
    """Per (lr, width): ppl(baseline) − ppl(reference), mean and SE over paired seeds, the gap as a share of
    the reference's perplexity, and where the gap starts.

    ``rows``: one per run, {"lr", "width", "scale", "seed", "valid_ppl", "status"}
    (``lr`` None unless the sweep varied it). A diverged run has no perplexity: a
    width where only the baseline diverged counts as a gap (``diverged`` says which
    side), with ``gap`` None. Runs not finished are left out."""
    cells: dict[tuple, dict[str, dict[int, float | None]]] = {}
    for r in rows:
        if r["scale"] in (baseline, reference) and r["status"] in FINISHED:
            cells.setdefault((r["lr"], r["head_dim"]), {baseline: {}, reference: {}})[r["scale"]][r["seed"]] = r["valid_ppl"]
    out_rows = []
    for (lr, head_dim) in sorted(cells, key=lambda k: (k[0] is not None, k[0] or 0, k[1])):
        b, ref = cells[(lr, head_dim)][baseline], cells[(lr, head_dim)][reference]
        paired = sorted(set(b) & set(ref))
        if not paired:
            continue
        b_div = [s for s in paired if b[s] is None]
        r_div = [s for s in paired if ref[s] is None]
        both = [s for s in paired if b[s] is not None and ref[s] is not None]
        gap, se = mean_se([b[s] - ref[s] for s in both])
        diverged = ("both" if b_div and r_div else "baseline" if b_div else "reference" if r_div else None)
        if diverged == "baseline":
            counts = True
        elif diverged is not None or gap is None:
            counts = False
        elif gap <= threshold:
            counts = False
        else:  # above the threshold: a gap where the interval excludes 0, undecided where it does not
            ci = interval(gap, se, len(both))
            counts = True if ci is None or ci[0] > 0 else None
        out_rows.append({
            "lr": lr, "head_dim": head_dim, "seeds": len(paired),
            "baseline_ppl": mean_se([b[s] for s in paired if b[s] is not None])[0],
            "reference_ppl": mean_se([ref[s] for s in paired if ref[s] is not None])[0],
            "gap": None if diverged else gap, "gap_se": None if diverged else se,
            "diverged": diverged, "counts": counts,
            "share": None,  # the gap as a share of the reference's perplexity (corpora differ in their perplexity range)
        })
        ref_ppl = out_rows[-1]["reference_ppl"]
        out_rows[-1].update({
            "share": None if diverged else gap / ref_ppl,  # not diverged: every paired seed has both, ppl ≥ 1
        })
    starts = []
    for lr in dict.fromkeys(r["lr"] for r in out_rows):
        group = [r for r in out_rows if r["lr"] == lr]
        starts.append({"lr": lr, "head_dim": _start(group, undecided_counts=False),
                       "head_dim_if_undecided": _start(group, undecided_counts=True)})
    return {
        "baseline": baseline, "reference": reference, "threshold_ppl": threshold, "rule": GAP_RULE,
        "rows": out_rows, "starts": starts,
        "gap_starts_at": starts[0]["head_dim"] if len(starts) == 1 else None,
    }


def _start(group: Sequence[dict[str, Any]], undecided_counts: bool) -> int | None:
    """The narrowest width from which every wider row counts (widest first: extend the run of counting
    widths downwards); ``undecided_counts``: an undecided row (``counts`` None) counts too."""
    start = None
    for r in reversed(group):
        if not (r["counts"] or (undecided_counts and r["counts"] is None)):
            break
        start = r["head_dim"]
    return start


def share_by_head_dim(table: dict[str, Any]) -> dict[int, float]:
    """width -> the gap as a share of the reference's perplexity, at the table's first learning rate."""
    rows = table["rows"]
    first_lr = rows[0]["lr"] if rows else None
    return {r["head_dim"]: r["share"] for r in rows if r["lr"] == first_lr and r["share"] is not None}


def gap_by_head_dim(table: dict[str, Any]) -> dict[int, tuple[float, float | None, int]]:
    """width -> (gap, SE or None, seeds) at the table's first learning rate, widths with a gap only."""
    rows = table["rows"]
    first_lr = rows[0]["lr"] if rows else None
    return {r["head_dim"]: (r["gap"], r["gap_se"], r["seeds"]) for r in rows
            if r["lr"] == first_lr and r["gap"] is not None}


def first_start(table: dict[str, Any], undecided_counts: bool = False) -> int | None:
    """Where the gap starts at the table's first learning rate (None: no width qualifies);
    ``undecided_counts``: where it would start if every undecided gap were a gap."""
    starts = table["starts"]
    return starts[0]["head_dim_if_undecided" if undecided_counts else "head_dim"] if starts else None


# What attention is worth, V = F − ppl(scaled), with F a model that cannot use attention (the no-attention
# floor): a gap as a share of V reads 0 where the unscaled model loses nothing to the scaled one and 1
# where it has fallen all the way to the floor. The course gives no floor, so its gaps are read against
# its own plateau, the "17 to 18 points" from width 256 up (taken as 17.5): the gap where, on that reading,
# its unscaled model has lost all that attention is worth.
COURSE_PLATEAU = 17.5
COURSE_GAPS = {32: 0.0, 128: 2.0, 256: COURSE_PLATEAU, 512: COURSE_PLATEAU, 1024: COURSE_PLATEAU}
SHARE_MEANING = ("a share is how much of what attention is worth (V = floor − ppl with 1/√d) the unscaled model "
                 "gives up: 0, nothing; 1, it does no better than a model whose attention learns nothing")


def share_of_value(gap: float | None, floor: float | None, scaled: float | None) -> float | None:
    """gap / (floor − ppl(scaled)); None where something is missing or the scaled model is not below
    the floor (attention is then worth nothing measurable, and a share means nothing)."""
    if gap is None or floor is None or scaled is None or not floor > scaled:
        return None
    return gap / (floor - scaled)


def value_shares(table: dict[str, Any], floor: float | None) -> dict[int, float]:
    """width -> the gap as a share of V = ``floor`` − ppl(reference), at the table's first learning rate."""
    rows = table["rows"]
    first_lr = rows[0]["lr"] if rows else None
    out = {r["head_dim"]: share_of_value(r["gap"], floor, r["reference_ppl"]) for r in rows if r["lr"] == first_lr}
    return {w: v for w, v in out.items() if v is not None}


def floor_ppl(rows: Sequence[dict[str, Any]], scale: str = "uniform") -> float | None:
    """The mean held-out perplexity of the finished ``scale`` runs (the trained no-attention floor)."""
    got = [r["valid_ppl"] for r in rows if r["scale"] == scale and r["valid_ppl"] is not None]
    return sum(got) / len(got) if got else None


def course_shares() -> dict[int, float]:
    """The course's gaps as shares of its plateau (``COURSE_PLATEAU``): width -> share."""
    return {w: g / COURSE_PLATEAU for w, g in COURSE_GAPS.items()}
