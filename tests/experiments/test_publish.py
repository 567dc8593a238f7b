"""experiments.publish: the studies' JSON and series files, written only where attnscale may write."""

import gzip
import json

import pytest

from attnscale.errors import ConfigError
from attnscale.experiments import publish
from attnscale.runs.writers import written_by


def test_write_block_keeps_the_other_blocks(tmp_path):
    path = tmp_path / "studies.json"
    path.write_text(json.dumps({"recipe": {"a": 1}, "act": {"b": 2}}))
    publish.write_block(path, "sensitivity", {"groups": [], "seeds": (0, 1)})
    data = json.loads(path.read_text())
    assert data == {"recipe": {"a": 1}, "act": {"b": 2}, "sensitivity": {"groups": [], "seeds": [0, 1]}}
    publish.write_block(tmp_path / "new.json", "alarm", {"x": 1})  # a new file is fine
    assert json.loads((tmp_path / "new.json").read_text()) == {"alarm": {"x": 1}}


@pytest.mark.parametrize("content, match", [("{", "cannot be read"), ("[1, 2]", "not the studies"),
                                            ('{"notes": 1}', "not the studies"), ("", "cannot be read")])
def test_check_json_refuses_someone_elses_file(tmp_path, content, match):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        publish.write_block(path, "alarm", {"x": 1})
    assert path.read_text() == content


def test_check_json_refuses_a_folder_and_a_missing_parent(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        publish.check_json(tmp_path)
    with pytest.raises(ConfigError, match="not a folder"):
        publish.check_json(tmp_path / "nope" / "x.json")


def test_write_block_refuses_nan_and_an_unknown_key(tmp_path):
    with pytest.raises(ValueError):
        publish.write_block(tmp_path / "s.json", "mine", {})
    with pytest.raises(ValueError):
        publish.write_block(tmp_path / "s.json", "alarm", {"x": float("nan")})
    assert not (tmp_path / "s.json").exists()


def test_series_round_trip_rounding_and_mark(tmp_path):
    path = tmp_path / "s.json.gz"
    runs = [{"run_id": "a", "losses": [1.23456789, None, float("nan")], "probes": [{"step": 10, "max_score": 123.456789}]}]
    publish.write_series(path, "lr", runs, {"floor": 2.0})
    data = publish.read_series(path, "lr")
    assert data["floor"] == 2.0 and data["runs"][0]["losses"] == [1.23457, None, None]
    assert data["runs"][0]["probes"] == [{"step": 10, "max_score": 123.46}]
    assert gzip.decompress(path.read_bytes()).startswith(b'{"study":"lr",')
    assert written_by(path) == "lr-study"
    with pytest.raises(ValueError, match="twice"):
        publish.write_series(path, "lr", runs + runs)


@pytest.mark.parametrize("content, zipped, study", [(b"not gzip", False, "lr"), (b"{", True, "lr"),
                                                    (b'{"study":"act","runs":[]}', True, "lr"),
                                                    (b'{"study":"lr","runs":3}', True, "lr")],
                         ids=["not-gzip", "torn-json", "another-study", "runs-not-a-list"])
def test_read_series_refuses_others(tmp_path, content, zipped, study):
    path = tmp_path / "s.json.gz"
    path.write_bytes(gzip.compress(content, mtime=0) if zipped else content)
    with pytest.raises(ConfigError):
        publish.read_series(path, study)


def test_check_targets_refuses_a_series_of_another_study(tmp_path):
    path = tmp_path / "s.json.gz"
    publish.write_series(path, "alarm", [])
    with pytest.raises(ConfigError, match="alarm-study"):
        publish.check_targets(None, path, "lr-study")
    publish.check_targets(None, path, "alarm-study")
