"""watch.logs.line: a line's non-finite values in the file, and a bad or missing log as one clear error."""

import json
import math

import pytest

from attnscale.errors import ConfigError
from attnscale.watch.logs.line import read_log
from watch_lines import record


def test_non_finite_values_are_null_in_the_file(tmp_path):
    r = record(1)
    r.values[0][1][0] = math.nan
    line = json.loads(r.to_line())
    assert line["values"][0][1][0] is None


@pytest.mark.parametrize("text, says", [
    ('{"schema": "attnscale.watch", "version": 99, "step": 1}\n', "version 99"),
    ('{"schema": "something.else", "version": 1}\n', "not an attnscale watch record"),
    ("not json\n", ":1 is not JSON"),
    ("", "holds no record"),
    ('{"schema": "attnscale.watch", "version": 1, "step": 1}\n', "lacks a well-formed field"),
])
def test_a_bad_log_is_one_clear_error(tmp_path, text, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as e:
        read_log(path)
    assert "\n" not in str(e.value)


def test_a_missing_log_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="cannot read watch log"):
        read_log(tmp_path / "absent.jsonl")


def test_kinds_round_trip_and_a_foreign_kinds_field_is_refused(tmp_path):
    import dataclasses

    r = dataclasses.replace(record(0), kinds=[["sink"] + [""] * (len(record(0).values[0][0]) - 1)]
                            * len(record(0).values))
    path = tmp_path / "w.jsonl"
    path.write_text(r.to_line())
    assert read_log(path)[0].kinds == r.kinds
    good = json.loads(r.to_line())
    for bad in ("sink", [["collapsed"]], [[1]], [["sink"]] * (len(r.values) + 1), {"0": []}):
        path.write_text(json.dumps({**good, "kinds": bad}) + "\n")
        with pytest.raises(ConfigError, match="'kinds' is not a list of layers"):
            read_log(path)
