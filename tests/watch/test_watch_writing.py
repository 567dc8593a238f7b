"""watch.logs.writing: a sink that fails is said once and written no more, its lost records counted and said at
the close; a close that fails is said too; nothing raises."""

import logging

from attnscale.watch.logs.writing import Writing
from watch_lines import record


class Flaky:
    """A sink whose writes fail from the ``fail_at``-th on, and whose close may fail."""

    def __init__(self, fail_at=None, close_fails=False):
        self.fail_at, self.close_fails, self.written, self.closed = fail_at, close_fails, [], False

    def write(self, r):
        if self.fail_at is not None and len(self.written) + 1 >= self.fail_at:
            raise OSError(28, "No space left on device")
        self.written.append(r.step)

    def close(self):
        if self.close_fails:
            raise OSError(5, "Input/output error")

    def __repr__(self):
        return "Flaky()"


def test_a_failing_sink_is_said_once_and_its_lost_records_counted_at_the_close(caplog):
    good, full = Flaky(), Flaky(fail_at=2)
    writing = Writing([good, full])
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        for step in (0, 10, 20, 30):
            writing.write(record(step))
        said_now = [r.getMessage() for r in caplog.records]
        writing.close()
    assert good.written == [0, 10, 20, 30] and full.written == [0]
    assert writing.lost == {1: ["OSError: [Errno 28] No space left on device", 10, 3]}
    assert said_now == ["the watch's sink Flaky() failed at step 10 (OSError: [Errno 28] No space left on device); "
                        "it is written no more and training goes on; the records it loses are counted when the "
                        "watch closes"]
    assert caplog.records[-1].getMessage() == (
        "the watch's sink Flaky() lost 3 of 4 records, from step 10 on (OSError: [Errno 28] No space left on device);"
        " the run went on and its results are kept")
    assert good.closed and full.closed


def test_a_close_that_fails_is_said_with_what_was_written(caplog):
    writing = Writing([Flaky(close_fails=True)])
    writing.write(record(0))
    with caplog.at_level(logging.WARNING, logger="attnscale.watch"):
        writing.close()
    assert [r.getMessage() for r in caplog.records] == [
        "the watch's sink Flaky() wrote its 1 records; its close failed (OSError: [Errno 5] Input/output error); the "
        "run went on and its results are kept"]
