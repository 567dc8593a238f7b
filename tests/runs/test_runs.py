"""The run store: atomic records, and the resume rules (what counts as the same run)."""

import json

import pytest

from attnscale import files
from attnscale.runs import record, store
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


def _write(run_dir, experiment, config, results, status="done", group=None):
    record.write(run_dir, record.new(experiment, config, results, status=status, group=group))


def test_run_id_names_head_dim_scale_seed_and_lr():
    assert store.run_id(64, "inv_sqrt_d", 1) == "d64-inv_sqrt_d-s1"
    assert store.run_id(64, "none", 0, 3e-3) == "d64-none-s0-lr3e-3"
    assert store.run_id(64, "none", 0, 1e-2) == "d64-none-s0-lr1e-2"
    assert store.run_id(64, "none", 0, 2.5e-4) == "d64-none-s0-lr2.5e-4"


def test_empty_folder_restarts(tmp_path):
    assert store.run_state(tmp_path / "missing", _config()) == "restart"


@pytest.mark.parametrize("status,expected", [("done", "finished"), ("diverged", "finished"),
                                              ("running", "restart"), ("stopped", "restart")])
def test_finished_runs_are_kept_others_restart(tmp_path, status, expected):
    _write(tmp_path, "train", _config(), None, status=status)
    assert store.run_state(tmp_path, _config()) == expected


def test_another_config_in_the_folder_is_refused(tmp_path):
    _write(tmp_path, "train", _config(), None, status="done")
    with pytest.raises(ConfigError, match="another --out") as e:
        store.run_state(tmp_path, _config(model={"head_dim": 16}))
    assert "head_dim" in str(e.value)
    # a half-finished run of another config is refused too: the folder is someone else's
    _write(tmp_path, "train", _config(), None, status="running")
    with pytest.raises(ConfigError, match="holds a run with another config"):
        store.run_state(tmp_path, _config(train={"steps": 20}))


def test_another_experiment_in_the_folder_is_refused(tmp_path):
    _write(tmp_path, "spread", {"head_dims": [4]}, [], status="done")
    with pytest.raises(ConfigError, match="spread"):
        store.run_state(tmp_path, _config())


def test_thread_count_and_corpus_path_do_not_make_another_run(tmp_path):
    _write(tmp_path, "train", _config(), None, status="done")
    same = _config(train={"threads": 1}, corpus={"name": "/data/wikitext-2"})
    assert store.run_state(tmp_path, same) == "finished"
    with pytest.raises(ConfigError, match="sha256"):
        store.run_state(tmp_path, _config(corpus={"sha256": "cd" * 32}))


def test_unreadable_record_is_damaged_and_run_state_changes_nothing(tmp_path):
    (tmp_path / "record.json").write_text('{"experiment": "tr')
    assert store.run_state(tmp_path, _config()) == "damaged"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # run_state may read another folder's runs


def test_a_damaged_record_is_set_aside_with_what_the_run_made(tmp_path, capsys):
    made = {"record.json": b'{"experiment": "tr', "metrics.jsonl": b'{"step": 0}\n', "model.safetensors": b"weights"}
    for name, data in made.items():
        (tmp_path / name).write_bytes(data)
    moved = store.set_aside(tmp_path, _config())
    assert sorted(p.name for p in moved) == sorted(f"{name}.damaged-1" for name in made)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {f"{n}.damaged-1": d for n, d in made.items()}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "record.json is not valid JSON" in err and "record.json.damaged-1" in err
    # the line in full: the reason (the record error's first clause, without its advice), each file moved in
    # the order moved (the record last), the folder, what happens next
    (tmp_path / "record.json").write_bytes(made["record.json"])
    (tmp_path / "metrics.jsonl").write_bytes(made["metrics.jsonl"])
    with pytest.raises(record.RecordError) as e:
        record.read(tmp_path)
    assert "; " in str(e.value)
    store.set_aside(tmp_path, _config())
    assert capsys.readouterr().err == (
        f"attnscale: {str(e.value)[:str(e.value).index('; ')]}; set aside as metrics.jsonl.damaged-2, "
        f"record.json.damaged-2 in {tmp_path}; this run is trained again\n")
    for name in ("record.json", "metrics.jsonl"):
        (tmp_path / f"{name}.damaged-2").unlink()
    # damaged again on a later resume: the first set stays, the second is numbered after it
    (tmp_path / "record.json").write_bytes(b"[1, 2]")
    assert [p.name for p in store.set_aside(tmp_path, _config())] == ["record.json.damaged-2"]
    assert (tmp_path / "record.json.damaged-1").read_bytes() == made["record.json"]
    # a record that reads is never moved
    _write(tmp_path, "train", _config(), None, status="running")
    assert store.set_aside(tmp_path, _config()) == [] and (tmp_path / "record.json").exists()


def test_set_aside_keeps_this_runs_checkpoint_and_moves_another_configs(tmp_path):
    import torch

    for folder, config in (("mine", _config()), ("other", _config(model={"head_dim": 16}))):
        run = tmp_path / folder
        run.mkdir()
        (run / "record.json").write_text("{oops")
        torch.save({"config": config, "step": 4}, run / "checkpoint.pt")
    store.set_aside(tmp_path / "mine", _config())
    store.set_aside(tmp_path / "other", _config())
    assert (tmp_path / "mine" / "checkpoint.pt").exists()  # training resumes from it
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["checkpoint.pt.damaged-1", "record.json.damaged-1"]


# ---- the record schema ---------------------------------------------------------------


def test_a_record_round_trips_through_its_schema(tmp_path):
    written = record.new("train", _config(), {"status": "done", "steps_done": 3, "perplexity": 4.5},
                         status="done", group="sweep", notes=["checkpoint.pt belongs to another configuration"])
    record.write(tmp_path, written)
    back = record.read(tmp_path)
    assert back == written and back.schema == record.SCHEMA_VERSION
    on_disk = json.loads((tmp_path / "record.json").read_text())
    assert on_disk["schema"] == 2 and on_disk["duration_s"] == pytest.approx(written.duration_s)
    assert on_disk["environment"]["torch"] and on_disk["notes"] == list(written.notes)
    assert record.find(tmp_path) == [tmp_path]


def test_a_record_and_its_metrics_saved_with_a_byte_order_mark_read_as_they_are(tmp_path):
    """A record re-saved by an editor that writes a UTF-8 byte-order mark is the same record, not a damaged one
    (which a resume would set aside and train again); its metrics lines likewise."""
    written = record.new("train", _config(), {"status": "done", "steps_done": 3}, status="done")
    record.write(tmp_path, written)
    bom = b"\xef\xbb\xbf"
    (tmp_path / "record.json").write_bytes(bom + (tmp_path / "record.json").read_bytes())
    (tmp_path / "metrics.jsonl").write_bytes(bom + b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n')
    assert record.read(tmp_path) == written
    assert store.run_state(tmp_path, _config()) == "finished"
    assert record.read_metrics(tmp_path) == ([{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}], 0)


def test_every_record_says_whether_the_cpu_has_native_bf16(monkeypatch):
    from attnscale.core import device

    for native in (True, False):  # what "auto" would train in here, and why the numbers may differ elsewhere
        monkeypatch.setattr(device, "native_bf16", lambda: native)
        assert record.new("spread", {}, []).environment["cpu_native_bf16"] is native


def test_a_record_without_a_version_reads_as_the_old_form(tmp_path):
    files.atomic_write_json(tmp_path / "record.json", {
        "experiment": "train", "status": "done", "config": _config(), "environment": {}, "started": 1.0,
        "finished": 3.0, "duration_s": 2.0, "group": "dynamics",
        "results": {"status": "done", "steps_done": 5, "perplexity": 9.0, "history": [], "dtype": "fp32"}})
    run = record.TrainRun.load(tmp_path)
    assert run.record.duration_s == 2.0 and run.group == "dynamics" and run.perplexity == 9.0
    assert run.record.notes == () and run.results.notes == ()


def test_a_version_1_record_calls_the_head_width_head_dim_as_version_2_does(tmp_path):
    # version 1 named the head width three ways: head_dim (None when coupled), d_k, width/widths
    coupled = {**_config(), "model": {"vocab_size": 5, "d_model": 32, "n_heads": 4, "head_dim": None, "scale": "none"}}
    files.atomic_write_json(tmp_path / "train" / "record.json", {
        "schema": 1, "experiment": "train", "status": "done", "config": coupled,
        "results": {"status": "done", "steps_done": 5, "perplexity": 9.0, "d_k": 8, "history": []}})
    run = record.TrainRun.load(tmp_path / "train")
    assert run.results.head_dim == 8 and run.head_dim == 8 and run.model["head_dim"] == 8  # 32 // 4
    assert run.record.schema == record.SCHEMA_VERSION == 2
    files.atomic_write_json(tmp_path / "spread" / "record.json", {
        "schema": 1, "experiment": "spread", "status": "done", "config": {"widths": [4, 64], "pairs": 10},
        "results": [{"width": 4, "scale": "none", "raw_spread": 2.1}, {"width": 64, "scale": "none", "raw_spread": 8.0}]})
    spread = record.read(tmp_path / "spread")
    assert spread.config == {"head_dims": [4, 64], "pairs": 10}
    assert [(r["head_dim"], r["raw_spread"]) for r in spread.results] == [(4, 2.1), (64, 8.0)]
    assert all("width" not in r for r in spread.results)
    files.atomic_write_json(tmp_path / "fresh" / "record.json", {
        "schema": 1, "experiment": "fresh", "status": "done", "config": {"widths": [1024], "init": "unit"},
        "results": {"rows": [{"width": 1024, "scale": "none", "frozen_fraction": 0.7}], "illustration": {}}})
    fresh = record.read(tmp_path / "fresh")
    assert fresh.config["head_dims"] == [1024] and fresh.results["rows"] == [
        {"head_dim": 1024, "scale": "none", "frozen_fraction": 0.7}]
    assert fresh.results["illustration"] == {}
    # a record of version 2 is read as written: a key called width there is left alone
    files.atomic_write_json(tmp_path / "v2" / "record.json", {
        "schema": 2, "experiment": "spread", "status": "done", "config": {"widths": [4]}, "results": [{"width": 4}]})
    assert record.read(tmp_path / "v2").results == [{"width": 4}]


def test_a_newer_record_is_refused_with_both_versions(tmp_path):
    files.atomic_write_json(tmp_path / "record.json", {"schema": 7, "experiment": "train", "status": "done",
                                                        "config": _config(), "results": None})
    with pytest.raises(record.RecordError, match="schema version 7.*0 to 2: upgrade attnscale"):
        record.read(tmp_path)
    with pytest.raises(record.RecordError, match="schema version 7"):
        store.run_state(tmp_path, _config())  # never overwritten by an older attnscale


@pytest.mark.parametrize("text,words", [("[1, 2]", "not a JSON object"), ('{"status": "done"}', "lacks experiment, config"),
                                        ("{oops", "not valid JSON")])
def test_what_is_not_a_record_is_said_in_one_line(tmp_path, text, words):
    (tmp_path / "record.json").write_text(text)
    with pytest.raises(record.RecordError, match=words) as e:
        record.read(tmp_path)
    assert "\n" not in str(e.value)


def test_only_a_finished_run_has_a_perplexity(tmp_path):
    for status in ("diverged", "stopped", "running"):
        record.write(tmp_path, record.new("train", _config(), {"status": status, "steps_done": 2, "perplexity": 5.0,
                                                                 "valid_loss": 1.6}, status=status))
        run = record.TrainRun.load(tmp_path)
        assert run.perplexity is None and run.results.valid_loss is None


def test_a_folder_of_unreadable_records_is_an_error_not_an_empty_report(tmp_path):
    from attnscale.errors import ConfigError
    from attnscale.report import load_runs

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text("{torn")
    with pytest.raises(ConfigError, match="none of the records.*2 skipped"):
        load_runs(tmp_path)


def test_a_refused_config_names_each_difference_by_its_path():
    diff = store._differences
    assert diff({"train": {"steps": 10, "lr": 1}}, {"train": {"steps": 20, "lr": 1}}) == ["train.steps 10 on disk, 20 asked"]
    assert diff({"train": {}}, {"train": {"warmup": 3}}) == ["train.warmup None on disk, 3 asked"]  # a key on one side only
    assert diff({"model": {"a": 1}}, {"model": 5}) == ["model {'a': 1} on disk, 5 asked"]
    assert diff(1, 2) == ["config 1 on disk, 2 asked"] and diff({"x": 1}, {"x": 1}) == []


def test_the_refusal_names_the_first_three_differences_and_the_way_out(tmp_path):
    _write(tmp_path, "train", _config(), None, status="done")
    asked = _config(train={"steps": 20, "batch": 8, "lr": 1e-3, "seed": 1})
    with pytest.raises(ConfigError) as info:
        store.run_state(tmp_path, asked)
    assert str(info.value) == (f"{tmp_path} holds a run with another config (train.batch 4 on disk, 8 asked; "
                               "train.lr 0.003 on disk, 0.001 asked; train.seed 0 on disk, 1 asked); "
                               "use another --out, or delete that folder to retrain it")


def _written(tmp_path, config):
    files.atomic_write_json(tmp_path / "record.json", {
        "schema": 2, "experiment": "train", "status": "done", "config": config,
        "results": {"status": "done", "steps_done": 10, "history": []}})
    return record.TrainRun.load(tmp_path)


def test_a_record_reads_back_as_the_typed_configs_that_made_it(tmp_path):
    from attnscale.lm.hf_family import LlamaModelConfig
    from attnscale.lm.model import ModelConfig
    from attnscale.lm.train import TrainConfig

    run = _written(tmp_path, _config(train={"removed_long_ago": 1}))  # a setting since removed is dropped
    m, t = run.model_config, run.train_config
    assert isinstance(m, ModelConfig) and isinstance(t, TrainConfig)
    assert (m.vocab_size, m.context, m.d_model, m.head_dim, m.scale) == (104, 16, 16, 8, "none")
    assert (t.steps, t.batch, t.lr, t.seed) == (10, 4, 3e-3, 0)
    assert t.z_loss == 0.0 and t.schedule == "cosine"  # settings added after the record: their defaults
    llama = _written(tmp_path / "l", _config(model={"family": "llama", "kv_heads": 2, "n_heads": 4, "d_model": 32,
                                                    "head_dim": None, "scale": "inv_sqrt_d"}))
    assert isinstance(llama.model_config, LlamaModelConfig) and llama.model_config.kv_heads == 2


def test_a_record_whose_config_no_longer_builds_is_one_line_naming_it(tmp_path):
    run = _written(tmp_path, {"model": {"context": 16}, "train": {"lr": -1}, "corpus": {}})
    with pytest.raises(record.RecordError, match=r"record.json: its model config cannot be read \(.*vocab_size"):
        run.model_config
    with pytest.raises(record.RecordError, match=r"its train config cannot be read \(train lr must be a positive"):
        run.train_config
