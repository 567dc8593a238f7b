"""attnscale watch-report --follow: the page of a log that is still being written, rebuilt as it grows."""

import pytest

from attnscale.cli import main
from attnscale.report import watch_page
from attnscale.watch.logs.sinks import JsonlSink

from test_watch_page import _record  # the watch log's records of the page's own tests


def test_follow_waits_builds_rebuilds_and_keeps_the_page_through_a_half_written_line(tmp_path):
    log, said = tmp_path / "watch.jsonl", []
    steps = iter([
        lambda: None,  # no log yet: waited for
        lambda: JsonlSink(log).write(_record(10)),
        lambda: None,  # nothing new: no rebuild
        lambda: log.write_text(log.read_text() + _record(20).to_line()[:25]),  # a line caught half-written
        lambda: log.write_text(log.read_text()[: log.read_text().rindex("\n") + 1] + _record(20).to_line()),
    ])

    def stop():
        try:
            next(steps)()
        except StopIteration:
            return True
        return False

    out = watch_page.follow(log, every=0.01, say=said.append, stop=stop)
    assert said[0] == f"waiting for {log} to appear"
    assert said[1:] == [f"page: {out} (1 probe steps, the last at step 10)", f"page: {out} (2 probe steps, the last at step 20)"]
    html = out.read_text()
    assert '<meta http-equiv="refresh" content="0.01">' in html and "2 probe steps, 10 to 20" in html


def test_a_page_built_once_does_not_reload_itself(tmp_path):
    log = tmp_path / "watch.jsonl"
    JsonlSink(log).write(_record(10))
    assert 'http-equiv="refresh"' not in watch_page.build(log).read_text()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_follow_takes_a_positive_number_of_seconds(tmp_path, value, capsys):
    log = tmp_path / "watch.jsonl"
    JsonlSink(log).write(_record(10))
    assert main(["watch-report", str(log), "--follow", value]) == 2
    err = capsys.readouterr().err
    assert f"--follow takes a positive number of seconds, got {value}" in err and "Traceback" not in err
