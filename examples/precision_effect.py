"""What training in one precision costs against another: two sweeps of the same runs, paired by seed.

    attnscale sweep --seeds 0 1 2 -j 2 --dtype bf16 --out runs/precision/bf16
    attnscale sweep --seeds 0 1 2 -j 2 --dtype fp32 --out runs/precision/fp32
    python examples/precision_effect.py runs/precision/bf16 runs/precision/fp32

or two ways of training in bf16 (``--weights bf16`` against autocast's fp32 weights), likewise.

Both folders hold finished training runs (any attnscale command's); a run of one
is matched with the run of the same head width, scale and seed in the other (the
same seed gives the same initial weights and batches, so the pair differs only in
what the two folders were trained with). Per width and scale: the mean held-out
perplexity of each, their difference paired by seed, its 95% t interval and the
paired t test's p, adjusted by Holm over every cell compared; "higher", "lower" or
"inconclusive" by that adjusted p. The precision each run trained in is read from
its record, never assumed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from attnscale.lm.checkpoint import comparable_config
from attnscale.analysis.intervals import p_text, paired_holm, reading
from attnscale.runs.record import TrainRun, find


def runs_of(folder: Path) -> dict[tuple[int, str, int], TrainRun]:
    """The finished training runs under ``folder``, by (head_dim, scale, seed)."""
    out = {}
    for path in find(folder):
        run = TrainRun.load(path)
        if run.status == "done":
            out[(run.head_dim, run.scale, run.seed)] = run
    return out


def _apart_from_precision(run: TrainRun) -> dict:
    cfg = comparable_config(run.record.config)
    for key in ("dtype", "weights"):  # the precision, and what a bf16 step computes on
        cfg.get("train", {}).pop(key, None)
    return cfg


def mismatch(a: dict, b: dict) -> str | None:
    """The first pair (same width, scale, seed) whose configs differ in more than the precision, named; else None."""
    for key in sorted(set(a) & set(b)):
        ca, cb = _apart_from_precision(a[key]), _apart_from_precision(b[key])
        if ca != cb:
            fields = sorted(f"{section}.{k}" for section in ca.keys() | cb.keys()
                            for k in (ca.get(section) or {}).keys() | (cb.get(section) or {}).keys()
                            if (ca.get(section) or {}).get(k) != (cb.get(section) or {}).get(k))
            return f"{a[key].run_id} differs in {', '.join(fields) or 'its config'}, not only in its precision"
    return None


def compare(a: dict, b: dict) -> list[dict]:
    """One row per (width, scale) both hold: means, the paired difference a − b, p, Holm's p, a reading."""
    def ppl(runs, width, scale):
        return {seed: r.perplexity for (w, s, seed), r in runs.items() if (w, s) == (width, scale)}

    # a cell counts where both hold a run of one seed at least (the pairs are those seeds)
    cells = sorted({(w, s) for (w, s, seed) in a if (w, s, seed) in b})
    pairs = [(ppl(a, w, s), ppl(b, w, s)) for w, s in cells]
    rows = []
    for (width, scale), (pa, pb), test in zip(cells, pairs, paired_holm(pairs)):
        both = pa.keys() & pb.keys()
        rows.append({"width": width, "scale": scale, "a": statistics.fmean(pa[k] for k in both),
                     "b": statistics.fmean(pb[k] for k in both), **test, "reading": reading(test)})
    return rows


def precisions(runs: dict) -> str:
    """The precisions the runs trained in, with the bf16 steps that computed on bf16 copies of their weights."""
    return ", ".join(sorted({(r.results.dtype or "?") + (" on bf16 weights" if r.results.weights == "bf16" else "")
                             for r in runs.values()}))


def table(rows: list[dict], name_a: str, name_b: str) -> str:
    lines = [f"| width d | scale | ppl {name_a} | ppl {name_b} | {name_a} − {name_b} (paired by seed) | 95% (t) | "
             f"p | p (Holm over {len(rows)}) | reading |", "|---:|---|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        ci = "" if r["interval"] is None else f"[{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]"
        lines.append(f"| {r['width']} | {r['scale']} | {r['a']:.3f} | {r['b']:.3f} | {r['diff']:+.3f} ({r['n']} seeds) | "
                     f"{ci} | {p_text(r['p'])} | {p_text(r['p_holm'])} | {r['reading']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="a folder of finished runs (the difference is a − b)")
    p.add_argument("b", type=Path, help="the folder to compare it with")
    args = p.parse_args(argv)
    a, b = runs_of(args.a), runs_of(args.b)
    if not a or not b:
        p.error(f"{args.a if not a else args.b} holds no finished training run; give folders a sweep wrote")
    if (why := mismatch(a, b)) is not None:
        p.error(f"{why}; give two sweeps of the same runs in two precisions")
    rows = compare(a, b)
    if not rows:
        p.error("the two folders share no head width and scale; give two sweeps of the same runs")
    print(f"a: {args.a} (trained in {precisions(a)}); b: {args.b} (trained in {precisions(b)})")
    print(table(rows, "a", "b"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
