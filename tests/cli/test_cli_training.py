"""The training commands (train, dynamics, sweep) through the real entry points:
tables, JSON, resume, and bad input as one line with exit code 2."""

import json
import subprocess
import sys

import pytest

from attnscale.cli import main

# the quick preset made tinier still: a few steps on 16-token windows
TINY = ["--quick", "--steps", "3", "--batch", "2", "--context", "16"]


def test_train_json_row_and_record(tmp_path, capsys):
    out = tmp_path / "train"
    assert main(["train", "--width", "8", "--scale", "none", *TINY, "--out", str(out), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["head_dim"], row["scale"], row["status"]) == (8, "none", "done")
    assert row["valid_ppl"] > 1 and row["start"]["spread"] > 0
    record = json.loads((out / "d8-none-s0" / "record.json").read_text())
    assert record["config"]["train"]["steps"] == 3 and record["config"]["model"]["context"] == 16


def test_dynamics_table(tmp_path, capsys):
    assert main(["dynamics", "--width", "16", *TINY, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "none" in text and "1/√d" in text and "→" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d16-inv_sqrt_d-s0", "d16-none-s0"]


def test_sweep_table_then_resume_keeps_finished_runs(tmp_path, capsys):
    args = ["sweep", "--widths", "8", "16", "--scale", "none", "inv_sqrt_d", "--seeds", "0", *TINY, "--out", str(tmp_path)]
    assert main(args) == 0
    first = capsys.readouterr()
    # four runs and the sweep's uniform floor (at 8, its narrowest width: it has no 128); the counted floors beside
    assert "gap = ppl(none) − ppl(1/√d)" in first.out and "[5/5]" in first.err and "share of V" in first.out
    records = sorted(tmp_path.glob("*/record.json"))
    assert len(records) == 5 and (tmp_path / "floors.json").exists()
    before = [r.stat().st_mtime_ns for r in records]
    assert main(args + ["--json"]) == 0
    again = capsys.readouterr()
    assert "5 of 5 runs already finished" in again.err
    assert [r.stat().st_mtime_ns for r in records] == before
    result = json.loads(again.out)
    assert len(result["rows"]) == 5 and [g["head_dim"] for g in result["gaps"]["rows"]] == [8, 16]


def test_another_config_in_out_is_refused_and_nothing_is_lost(tmp_path, capsys):
    base = ["sweep", "--widths", "8", "--scale", "none", "--out", str(tmp_path), "--quick", "--batch", "2", "--context", "16"]
    assert main(base + ["--steps", "3"]) == 0
    record = tmp_path / "d8-none-s0" / "record.json"
    content = record.read_bytes()
    capsys.readouterr()
    assert main(base + ["--steps", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another --out" in err[0] and "steps" in err[0]
    assert record.read_bytes() == content


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dtype_is_the_precision_the_run_trains_and_is_known_by(tmp_path, capsys, dtype):
    out = tmp_path / "train"
    assert main(["train", "--width", "8", *TINY, "--out", str(out), "--dtype", dtype]) == 0
    record = json.loads((out / "d8-inv_sqrt_d-s0" / "record.json").read_text())
    assert record["config"]["train"]["dtype"] == dtype and record["results"]["dtype"] == dtype
    # another precision in the same folder is another run: refused there, never resumed as this one
    other = {"fp32": "bf16", "bf16": "fp32"}[dtype]
    capsys.readouterr()
    assert main(["train", "--width", "8", *TINY, "--out", str(out), "--dtype", other]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dtype" in err[0]


def test_a_precision_this_machine_cannot_train_in_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", "--width", "8", *TINY, "--out", str(out), "--dtype", "fp16", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnscale: error: dtype 'fp16' needs a GPU") and "--dtype bf16" in err[0]
    assert not out.exists()


def _bad_corpora(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    short = tmp_path / "short.txt"
    short.write_text("far too short for one window\n")
    return {"missing": str(tmp_path / "nope.txt"), "empty": str(empty), "binary": str(binary), "short": str(short)}


@pytest.mark.parametrize("kind", ["missing", "empty", "binary", "short"])
def test_bad_corpus_is_one_line_exit_2(tmp_path, capsys, kind):
    corpus = _bad_corpora(tmp_path)[kind]
    out = tmp_path / "out"
    assert main(["sweep", "--widths", "8", "--corpus", corpus, *TINY, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscale: error: ") and "Traceback" not in captured.err
    assert not list(out.glob("*/record.json"))


@pytest.mark.parametrize("args, needle", [
    (["train", "--width", "0"], "--width"),
    (["train", "--batch", "0"], "--batch"),
    (["train", "--scale", "loud"], "--scale"),
    (["sweep", "--widths", "32", "0"], "--widths"),
    (["sweep", "--scale", "none", "bogus"], "--scale"),
    (["sweep", "--seeds", "-1"], "--seeds"),
    (["sweep", "-j", "0"], "-j"),
    (["dynamics", "--steps", "ten"], "--steps"),
    (["dynamics", "--tokenizer", "sentencepiece"], "--tokenizer"),
    (["sweep", "--lrs", "0"], "--lrs"),
    (["sweep", "--dtype", "fp8"], "--dtype"),
    (["reproduce", "--dtype", "half"], "--dtype"),
])
def test_bad_options_are_one_line_exit_2(capsys, args, needle):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_unwritable_out_is_one_line_exit_2(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["train", *TINY, "--out", str(blocker / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0]


def test_entry_point_in_a_subprocess(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "attnscale.cli", "sweep", "--corpus", str(tmp_path / "none.txt"),
                              "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    ok = subprocess.run([sys.executable, "-m", "attnscale.cli", "train", "--width", "8", *TINY, "--out",
                         str(tmp_path / "t"), "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["status"] == "done"
    assert "d8-inv_sqrt_d-s0: done" in ok.stderr  # plain progress lines: stderr is not a terminal


@pytest.mark.parametrize("command, one, many", [("train", "--head-dim", None), ("dynamics", "--head-dim", None),
                                                ("study", "--head-dim", None), ("sweep", None, "--head-dims"),
                                                ("schemes", None, "--head-dims"), ("spread", None, "--head-dims"),
                                                ("fresh", None, "--head-dims")])
def test_the_head_width_is_head_dim_and_the_courses_width_is_the_same_option(command, one, many):
    from attnscale.cli import build_parser

    parser = build_parser()
    option = one or many
    alias = "--width" if one else "--widths"
    values = ["8"] if one else ["8", "16"]
    given = parser.parse_args([command, option, *values])
    assert parser.parse_args([command, alias, *values]) == given
    dest = "head_dim" if one else "head_dims"
    assert getattr(given, dest) in (8, [8, 16]) and not hasattr(given, "width") and not hasattr(given, "widths")
