"""Every figure of the act study's section (docs/act-study.md), re-derived from its series file alone.

    python tools/act_study_figures.py docs/act-study-series.json.gz          # the tables
    python tools/act_study_figures.py docs/act-study-series.json.gz --json   # the numbers

Each run's outcome is judged again from the losses and held-out loss the file keeps (the warning study's rules,
``analysis.outcomes``), the pilot's alarm level chosen again from its probes, and the study's per-arm endpoints
and decisions computed again (``analysis.act_judging``). The step-time ratios are a measurement, not a series:
``python benchmarks/act_step_cost.py``.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    from attnscale.experiments import act_study

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("series", help="the series file (docs/act-study-series.json.gz)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = p.parse_args(argv)
    fig = act_study.figures(act_study.read_series(args.series))
    print(json.dumps(fig, indent=1, allow_nan=False) if args.json else act_study.format_figures(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
