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
    _refused(argv, capsys, "holds heatmaps.png, none of them attnscale's")


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
             "holds spread.png, none of them attnscale's")
    record.write(tmp_path / "fresh", record.new("fresh", {"head_dims": [8]}, []))  # beside a folder of attnscale's
    _refused(["spread", "--widths", "4", "--pairs", "200", "--out", str(tmp_path)], capsys,
             "holds spread.png but no record.json of attnscale spread's")
    assert (tmp_path / "spread.png").read_bytes() == b"my own figure"


THESIS = {"thesis.txt": b"my thesis", "photos/one.jpg": b"a photo"}


def _thesis(folder):
    """A user's folder: a text and a folder of photos, nothing of attnscale's."""
    for name, data in THESIS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


# every command that writes into a folder, at its smallest: each is refused before it makes or writes anything
WRITING = {
    "spread": ["spread"], "fresh": ["fresh"], "train": ["train", "--steps", "2"], "dynamics": ["dynamics", "--quick"],
    "sweep": ["sweep", "--quick"], "schemes": ["schemes", "--quick"], "study": ["study", "--quick"],
    "warn-study": ["warn-study", "--pilot", "--quick"], "act-study": ["act-study", "--pilot", "--quick"],
    "lr-study": ["lr-study", "--block", "1", "--quick"],
    "reproduce": ["reproduce", "--quick"], "inspect": ["inspect", "--model", "{run}", "--text", "to be or not"],
    "report": ["report", "{runs}"],
}


@pytest.mark.parametrize("command", WRITING)
def test_every_writing_command_refuses_a_folder_of_the_users_naming_a_new_or_empty_one(command, run, tmp_path, capsys):
    """The one folder rule: a folder that holds files and none of attnscale's is refused (reproduce --quick wrote
    about 100 files beside a thesis.txt), in one line naming what it holds and the fix; nothing is written there."""
    runs = tmp_path / "runs"
    record.write(runs / "spread", record.new("spread", {"head_dims": [4]}, []))
    thesis = _thesis(tmp_path / "thesis")
    argv = [a.replace("{run}", str(run)).replace("{runs}", str(runs)) for a in WRITING[command]]
    _refused([*argv, "--out", str(thesis)], capsys, f"--out {str(thesis)!r} holds photos/ and thesis.txt, none of them "
             f"attnscale's, and {command} would write", f"give a new or empty folder, e.g. --out {thesis / 'attnscale-out'}")
    assert _snapshot(thesis) == THESIS and sorted(p.name for p in thesis.iterdir()) == ["photos", "thesis.txt"]


def test_the_report_refuses_its_default_folder_where_it_holds_only_the_users_files(tmp_path, capsys):
    runs = tmp_path / "runs"
    record.write(runs / "spread", record.new("spread", {"head_dims": [4]}, []))
    _thesis(runs / "report")
    _refused(["report", str(runs)], capsys, f"{str(runs / 'report')!r} holds photos/ and thesis.txt, none of them")
    assert _snapshot(runs / "report") == THESIS


def test_an_empty_folder_or_one_of_hidden_files_or_empty_folders_is_written_into(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".DS_Store").write_bytes(b"")
    (tmp_path / "folders" / "dynamics").mkdir(parents=True)  # what a command stopped before its first record leaves
    for name in ("empty", "hidden", "folders"):
        assert main(["spread", "--widths", "4", "--pairs", "200", "--out", str(tmp_path / name)]) == 0
        assert writers.written_by(tmp_path / name / "record.json") == "spread"


def test_a_folder_holding_attnscale_files_deep_down_beside_the_users_is_attnscales(tmp_path):
    _thesis(tmp_path)
    record.write(tmp_path / "dynamics" / "d8-none-s0", record.new("train", {"head_dims": [8]}, None))
    writers.check_folder(tmp_path, "reproduce")  # reproduce's OUT/<stage>/<run>: its own, resumed
    assert writers.holds_ours(tmp_path) and not writers.holds_ours(tmp_path, depth=2)


def test_report_never_writes_over_a_page_it_did_not_write(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["spread", "--widths", "4", "16", "--pairs", "200", "--out", str(runs / "spread")]) == 0
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!DOCTYPE html><title>my site</title>")
    _refused(["report", str(runs), "--out", str(site)], capsys, "holds index.html, none of them attnscale's")
    record.write(site / "spread", record.new("spread", {"head_dims": [4]}, []))  # a folder with attnscale's files
    _refused(["report", str(runs), "--out", str(site)], capsys, "holds an index.html that is not one attnscale report")
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
    record.write(tmp_path / "spread", record.new("spread", {"head_dims": [4]}, []))  # reproduce's folder, resumed
    _refused(["reproduce", "--quick", "--out", str(tmp_path)], capsys,
             f"--out {str(tmp_path / 'report')!r} holds report.md, none of them attnscale's")
    assert (tmp_path / "report" / "report.md").read_text() == "# my notes\n"
