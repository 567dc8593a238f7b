"""The watch's records to its sinks, where one sink's failure never ends the run: a sink that fails to write (a full
disk) is said once, at once, and written no more, each record it loses from then on counted; at the close each sink
is closed, and one that lost records or failed to close is said once with its count."""

from __future__ import annotations

from typing import Sequence

from attnscale.watch.alerts import LOGGER
from attnscale.watch.arguments import one_line
from attnscale.watch.logs.line import WatchLine
from attnscale.watch.logs.sinks import Sink

__all__ = ["Writing"]


class Writing:
    """``sinks``, written record by record (``write``) and closed once (``close``); ``lost``: per index of a sink
    that failed, [reason, the first lost step, records lost]."""

    def __init__(self, sinks: Sequence[Sink]):
        self.sinks = list(sinks)
        self.lost: dict[int, list] = {}
        self.records = 0  # records written (or tried)

    def write(self, record: WatchLine) -> None:
        self.records += 1
        for i, sink in enumerate(self.sinks):
            if i in self.lost:
                self.lost[i][2] += 1
                continue
            try:
                sink.write(record)
            except Exception as e:
                self.lost[i] = [one_line(e), record.step, 1]
                LOGGER.warning(f"the watch's sink {sink!r} failed at step {record.step} ({one_line(e)}); it is "
                               "written no more and training goes on; the records it loses are counted when the "
                               "watch closes")

    def close(self) -> None:
        """Close every sink; nothing raises out of here, so a finished run keeps its results."""
        for i, sink in enumerate(self.sinks):
            try:
                sink.close()
                failed = None
            except Exception as e:
                failed = one_line(e)
            sink.closed = True
            if i in self.lost or failed is not None:
                self._said_lost(sink, self.lost.get(i), failed)

    def _said_lost(self, sink: Sink, lost: list | None, failed: str | None) -> None:
        what = (f"lost {lost[2]} of {self.records} records, from step {lost[1]} on ({lost[0]})" if lost else
                f"wrote its {self.records} records")
        closing = "" if failed is None else f"; its close failed{' too' if lost else ''} ({failed})"
        LOGGER.warning(f"the watch's sink {sink!r} {what}{closing}; the run went on and its results are kept")
