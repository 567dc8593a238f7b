"""The run store: atomic records, and the resume rules (what counts as the same run)."""

import json

import pytest

from attnscale import files
from attnscale.runs import store
from attnscale.errors import ConfigError


def _config(**changes):
    cfg = {
        "model": {"vocab_size": 104, "context": 16, "d_model": 16, "head_dim": 8, "scale": "none"},
        "train": {"steps": 10, "batch": 4, "lr": 3e-3, "seed": 0, "threads": None},
        "corpus": {"name": "default", "tokenizer": "char", "vocab_size": 104, "train_tokens": 900,
                   "valid_tokens": 100, "sha256": "ab" * 32},
    }
    for section, values in changes.items():
        cfg[section] = {**cfg[section], **values}
    return cfg


def test_atomic_write_json_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "a" / "record.json"
    files.atomic_write_json(path, {"x": 1})
    files.atomic_write_json(path, {"x": (2, 3)})
    assert json.loads(path.read_text()) == {"x": [2, 3]}
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]


def test_write_and_find_records(tmp_path):
    store.write_record(tmp_path / "r1", "train", _config(), {"perplexity": 3.0}, status="done", extra={"group": "g"})
    rec = store.read_record(tmp_path / "r1")
    assert rec["status"] == "done" and rec["group"] == "g" and rec["results"]["perplexity"] == 3.0
    assert store.find_records(tmp_path) == [tmp_path / "r1"]


def test_run_id_names_width_scale_seed_and_lr():
    assert store.run_id(64, "inv_sqrt_d", 1) == "d64-inv_sqrt_d-s1"
    assert store.run_id(64, "none", 0, 3e-3) == "d64-none-s0-lr3e-3"
    assert store.run_id(64, "none", 0, 1e-2) == "d64-none-s0-lr1e-2"
    assert store.run_id(64, "none", 0, 2.5e-4) == "d64-none-s0-lr2.5e-4"


def test_empty_folder_restarts(tmp_path):
    assert store.run_state(tmp_path / "missing", _config()) == "restart"


@pytest.mark.parametrize("status,expected", [("done", "finished"), ("diverged", "finished"),
                                              ("running", "restart"), ("stopped", "restart")])
def test_finished_runs_are_kept_others_restart(tmp_path, status, expected):
    store.write_record(tmp_path, "train", _config(), None, status=status)
    assert store.run_state(tmp_path, _config()) == expected


def test_another_config_in_the_folder_is_refused(tmp_path):
    store.write_record(tmp_path, "train", _config(), None, status="done")
    with pytest.raises(ConfigError, match="another --out") as e:
        store.run_state(tmp_path, _config(model={"head_dim": 16}))
    assert "head_dim" in str(e.value)
    # a half-finished run of another config is refused too: the folder is someone else's
    store.write_record(tmp_path, "train", _config(), None, status="running")
    with pytest.raises(ConfigError):
        store.run_state(tmp_path, _config(train={"steps": 20}))


def test_another_experiment_in_the_folder_is_refused(tmp_path):
    store.write_record(tmp_path, "spread", {"widths": [4]}, [], status="done")
    with pytest.raises(ConfigError, match="spread"):
        store.run_state(tmp_path, _config())


def test_thread_count_and_corpus_path_do_not_make_another_run(tmp_path):
    store.write_record(tmp_path, "train", _config(), None, status="done")
    same = _config(train={"threads": 1}, corpus={"name": "/data/wikitext-2"})
    assert store.run_state(tmp_path, same) == "finished"
    with pytest.raises(ConfigError, match="sha256"):
        store.run_state(tmp_path, _config(corpus={"sha256": "cd" * 32}))


def test_unreadable_record_restarts(tmp_path):
    (tmp_path / "record.json").write_text('{"experiment": "tr')
    assert store.run_state(tmp_path, _config()) == "restart"
