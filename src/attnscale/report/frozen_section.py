"""The report's table of the frozen share at the end by threshold, from final weights in fp32.

The course's "99.9% of rows end frozen" is judged at a threshold of 0.99 from
the training record: the first 4 sequences of a batch, in the precision the run
trained in. This table reads the unscaled d=1,024 dynamics runs' final weights
again in float32 over ``SEQUENCES`` held-out sequences (``headcheck.thresholds``)
at four thresholds, so a reader sees whether "frozen" depends on where the line
is drawn. Runs without final weights (``model.safetensors``), or whose corpus
this machine cannot load, are left out and the table says so.
"""

from __future__ import annotations

from typing import Any

from attnscale.report import course
from attnscale.report.blocks import Block, Para, Table
from attnscale.analysis.estimates import mean_se, plus_minus

__all__ = ["SEQUENCES", "blocks"]

SEQUENCES = 32  # held-out sequences of the model's context: 8× what the record measures


def blocks(runs) -> list[Block]:
    """A paragraph and a table (none where no unscaled d=1,024 dynamics run kept its final weights)."""
    from attnscale.headcheck.thresholds import THRESHOLDS, frozen_by_threshold
    from attnscale.report.held_out import corpus_of, sequences

    got = [t for t in runs.dynamics if t.head_dim == course.COURSE_WIDTH and t.scale == "none"
           and (t.path / "model.safetensors").is_file()]
    if not got:
        return []
    corpus = corpus_of(got)
    if corpus is None:
        return [Para("The frozen share by threshold from the final weights is not shown: this machine cannot "
                      "load the runs' corpus as their records name it.")]
    context = got[0].model_config.context
    ids = sequences(corpus, SEQUENCES, context)
    measured: list[tuple[Any, dict[str, Any]]] = [(t, frozen_by_threshold(t.path, ids)) for t in got]
    head = ["run", "seed", "layer", *[f"max weight > {x:g}" for x in THRESHOLDS], "rows"]
    rows = []
    for t, m in measured:
        for i, (shares, n) in enumerate(zip(m["by_layer"], m["rows"])):
            rows.append([t.run_id, t.seed, i, *[f"{100 * v:.1f}%" for v in shares], f"{n:,}"])
        rows.append([t.run_id, t.seed, "all", *[f"{100 * v:.1f}%" for v in m["all_layers"]], f"{sum(m['rows']):,}"])
    if len(measured) > 1:  # the course's layer over seeds: mean ± SE
        layer = course.COURSE_LAYER
        cells = []
        for k in range(len(THRESHOLDS)):
            m, se = mean_se([got_["by_layer"][layer][k] for _, got_ in measured])
            cells.append(plus_minus(100 * m, None if se is None else 100 * se, "{:.1f}%"))
        rows.append(["mean ± SE over seeds", len(measured), layer, *cells, ""])
    text = (f"Frozen share at the end by threshold: the unscaled d=1,024 runs' final weights read again in float32 "
            f"over the first {ids.shape[0]} held-out sequences of {context} tokens (the training record measures "
            f"4 sequences, in the precision the run trained in); rows that see at least 2 keys, over all heads "
            f"of a layer. The claim above is judged at 0.99.")
    return [Para(text), Table(head, rows)]
