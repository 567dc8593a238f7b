"""What a group of training runs was given (steps, context, batch, seeds, widths, learning rates), in words.

Read from the runs' own records, per stage, so a study with its own budget
never borrows a preset's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["budget", "span_text", "budget_text"]


def budget(runs: Sequence[Any]) -> dict[str, Any]:
    """What a group of training runs (``runs.record.TrainRun``) was given, as their records say:
    {"runs", and the distinct "steps", "context", "batch", "seeds", "widths", "lrs", sorted}.
    Read per stage, so a study with its own budget never borrows a preset's."""
    def values(get) -> list:
        return sorted({v for v in (get(t) for t in runs) if v is not None})

    return {"runs": len(runs), "steps": values(lambda t: t.train_config.steps),
            "context": values(lambda t: t.model_config.context), "batch": values(lambda t: t.train_config.batch),
            "seeds": values(lambda t: t.seed), "head_dims": values(lambda t: t.head_dim), "lrs": values(lambda t: t.lr)}


def span_text(values: Sequence[Any], fmt: str = "{:,}") -> str:
    """Sorted values in words: "64", "64 and 256", "32 to 1,024" ("?" for none)."""
    if not values:
        return "?"
    if len(values) <= 2:
        return " and ".join(fmt.format(v) for v in values)
    return f"{fmt.format(values[0])} to {fmt.format(values[-1])}"


def budget_text(b: dict[str, Any]) -> str:
    """A ``budget`` in words: "60 steps a run, context 32, 2 seeds, widths 64 and 256, 5 learning rates
    from 3e-4 to 3e-2"; a setting that differs between runs shows both ends."""
    from attnscale.lm.study_axes import lr_text

    seeds = len(b["seeds"])
    text = (f"{span_text(b['steps'])} steps a run, context {span_text(b['context'])}, "
            f"{seeds} seed{'s' if seeds != 1 else ''}, width{'s' if len(b['head_dims']) != 1 else ''} "
            f"{span_text(b['head_dims'])}")
    if len(b["lrs"]) > 2:
        text += f", {len(b['lrs'])} learning rates from {lr_text(b['lrs'][0])} to {lr_text(b['lrs'][-1])}"
    elif len(b["lrs"]) == 2:
        text += ", learning rates " + " and ".join(lr_text(x) for x in b["lrs"])
    elif b["lrs"]:
        text += f", learning rate {lr_text(b['lrs'][0])}"
    return text
