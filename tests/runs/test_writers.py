"""runs.writers: no command writes over a file it did not write. Each writer is tried on a folder another
command wrote (refused in one line, exit 2, every file there unchanged) and on its own (rewritten, as a rerun
or a resume does)."""

from dataclasses import asdict

import pytest

from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.runs import record, store, writers

from run_folders import _cfg, _run_dir


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(argv, capsys, *says) -> str:
    """``main(argv)`` ends in exit 2 and one error line holding each of ``says``, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnscale: error: ") and "Traceback" not in err, err
    assert all(s in err for s in says), err
    return err


@pytest.fixture
def run(tmp_path):
    """A finished training run's folder: record.json (experiment "train", group "dynamics") and its weights."""
    from attnscale.lm.data import load_corpus

    folder, corpus = tmp_path / "run", load_corpus("default")  # embedded: no download
    _run_dir(folder, _cfg(vocab_size=corpus.vocab_size), corpus=corpus)
    written = record.read(folder)
    record.write(folder, record.Record(**{**written.__dict__, "group": "dynamics"}))
    return folder


def test_inspect_never_replaces_a_training_runs_record(run, capsys):
    before = _snapshot(run)
    err = _refused(["inspect", "--model", str(run), "--text", "to be or not to be", "--out", str(run)], capsys,
                   f"--out {str(run)!r} holds a record.json that attnscale train wrote", "give another folder")
    assert _snapshot(run) == before  # the run can still be inspected and reported
    assert "inspect would replace" in err


def test_inspect_rewrites_its_own_folder_and_refuses_a_figure_without_its_record(run, tmp_path, capsys):
    out = tmp_path / "look"
    argv = ["inspect", "--model", str(run), "--text", "to be or not to be", "--max-tokens", "8", "--out", str(out)]
    assert main(argv) == 0 and record.read(out).experiment == "inspect"
    assert main(argv) == 0  # its own folder: written again
    (out / "record.json").unlink()  # a heatmaps.png alone is not known as inspect's
    _refused(argv, capsys, "holds heatmaps.png but no record.json of attnscale inspect's")


def test_spread_and_fresh_refuse_each_others_folder_and_rewrite_their_own(tmp_path, capsys):
    spread, fresh = tmp_path / "spread", tmp_path / "fresh"
    assert main(["spread", "--widths", "4", "--pairs", "200", "--out", str(spread)]) == 0
    assert main(["fresh", "--widths", "8", "--sequences", "2", "--out", str(fresh)]) == 0
    assert main(["spread", "--widths", "4", "--pairs", "300", "--out", str(spread)]) == 0  # its own: rewritten
    assert record.read(spread).config["pairs"] == 300
    before = _snapshot(tmp_path)
    _refused(["spread", "--widths", "4", "--pairs", "200", "--out", str(fresh)], capsys,
             "holds a record.json that attnscale fresh wrote")
    _refused(["fresh", "--widths", "8", "--sequences", "2", "--out", str(spread)], capsys,
             "holds a record.json that attnscale spread wrote")
    assert _snapshot(tmp_path) == before


def test_a_folder_of_someone_elses_figure_is_refused(tmp_path, capsys):
    (tmp_path / "spread.png").write_bytes(b"my own figure")
    _refused(["spread", "--widths", "4", "--pairs", "200", "--out", str(tmp_path)], capsys,
             "holds spread.png but no record.json of attnscale spread's")
    assert (tmp_path / "spread.png").read_bytes() == b"my own figure"


def test_report_never_writes_over_a_page_it_did_not_write(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["spread", "--widths", "4", "16", "--pairs", "200", "--out", str(runs / "spread")]) == 0
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!DOCTYPE html><title>my site</title>")
    _refused(["report", str(runs), "--out", str(site)], capsys, "holds a index.html that is not one attnscale report")
    assert (site / "index.html").read_text() == "<!DOCTYPE html><title>my site</title>"
    # nor over a measurement's figure: the report draws its own spread.png
    _refused(["report", str(runs), "--out", str(runs / "spread")], capsys, "holds spread.png but no index.html")
    capsys.readouterr()
    assert main(["report", str(runs)]) == 0 and main(["report", str(runs)]) == 0  # its own: rebuilt
    assert writers.written_by(runs / "report" / "index.html") == "report"
    assert writers.written_by(runs / "report" / "report.md") == "report"


def test_a_page_or_report_written_before_the_marks_is_known_by_its_title(tmp_path):
    old = tmp_path / "index.html"
    old.write_text('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>The score scale in attention: '
                   "the course's figures beside ours</title>")
    assert writers.written_by(old) == "report"
    old.write_text('<!DOCTYPE html>\n<html><head><title>Attention watch: w.jsonl</title>')
    assert writers.written_by(old) == "watch-report"
    old.write_text(f"<!DOCTYPE html><head>{writers.page_mark('report')}<title>Attention watch: x</title>")
    assert writers.written_by(old) == "report"  # the mark is read before any title
    assert writers.written_by(tmp_path / "absent.html") is None


def test_a_training_command_never_trains_into_one_runs_folder(run, capsys):
    before = _snapshot(run)
    _refused(["train", "--steps", "2", "--out", str(run)], capsys,
             f"--out {str(run)!r} holds the record of an attnscale train run", "give another folder")
    assert _snapshot(run) == before


def test_a_run_another_command_trained_is_neither_taken_nor_trained_over(tmp_path):
    config = {"model": asdict(_cfg()), "train": {"steps": 4}}
    for status in ("stopped", "done"):
        record.write(tmp_path, record.new("train", config, None, status=status, group="dynamics"))
        with pytest.raises(ConfigError, match="holds a run of 'dynamics', not of 'sweep': another command trained"):
            store.run_state(tmp_path, config, group="sweep")
        assert store.run_state(tmp_path, config, group="dynamics") == ("restart" if status == "stopped" else "finished")
    record.write(tmp_path, record.new("train", config, None, status="done"))  # no group: written before groups
    assert store.run_state(tmp_path, config, group="sweep") == "finished"


def test_reproduce_refuses_a_report_folder_it_did_not_write_before_any_stage(tmp_path, capsys, monkeypatch):
    from attnscale import reproduce

    monkeypatch.setattr(reproduce, "stages", lambda **kw: pytest.fail("a stage was planned before the check"))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.md").write_text("# my notes\n")
    _refused(["reproduce", "--quick", "--out", str(tmp_path)], capsys,
             f"--out {str(tmp_path / 'report')!r} holds report.md but no index.html of attnscale report's")
    assert (tmp_path / "report" / "report.md").read_text() == "# my notes\n"
