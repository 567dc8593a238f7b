"""A watch log line with known values, for the tests of the line and of the sinks that write it."""

from attnscale.watch.logs.line import WatchLine

MEASURES = ("spread", "max_score", "effective_words", "frozen_fraction", "push", "max_weight")


def record(step: int, bump: float = 0.0) -> WatchLine:
    """2 layers × 2 heads; value of (layer l, measure m, head h) = 100 l + 10 m + h + bump."""
    values = [[[100 * l + 10 * m + h + bump for h in range(2)] for m in range(len(MEASURES))] for l in range(2)]
    return WatchLine(step=step, time=1_700_000_000.0 + step, measures=MEASURES, values=values,
                       rows=[[60, 60], [60, 59]], summary={"attn/max_score": 111.0 + bump},
                       alerts=[{"alert": "max_score", "layer": 1, "head": 1, "step": step, "value": 111.0 + bump,
                                "action": "warn", "message": "m"}],
                       watch={"seconds": 0.01, "total_seconds": 0.02, "share": 0.001},
                       probe={"sequences": 4, "tokens": 16}, threshold=0.99)
