"""The commands that measure without training (spread, fresh), through the real entry points: output, JSON,
records, the same digits from the same seed."""

import json

from attnscale.cli import main
from command_line import run_cli


def test_spread_json_rows(capsys):
    assert main(["spread", "--widths", "4", "64", "--pairs", "2000", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["head_dim"] for r in rows] == [4, 64]
    assert {"head_dim", "scale", "raw_spread", "scaled_spread", "sqrt_d"} <= set(rows[0])


def test_fresh_table_and_record(tmp_path, capsys):
    out = tmp_path / "fresh"
    assert main(["fresh", "--widths", "256", "--sequences", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1/√d" in text and "of its weight on word" in text
    record = json.loads((out / "record.json").read_text())
    assert record["config"]["seed"] == 0 and record["environment"]["torch"]
    assert {r["scale"] for r in record["results"]["rows"]} == {"none", "inv_sqrt_d"}
    assert (out / "fresh.png").exists()


def test_fresh_json_keys(capsys):
    assert main(["fresh", "--widths", "32", "--sequences", "5", "--scale", "inv_d", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["scale"] == "inv_d"
    assert {"effective_words_median", "frozen_fraction", "max_weight_mean", "push_median"} <= set(rows[0])


def test_same_seed_same_output_to_the_last_digit():
    a = run_cli("spread", "--widths", "16", "--pairs", "300", "--seed", "7", "--json")
    b = run_cli("spread", "--widths", "16", "--pairs", "300", "--seed", "7", "--json")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_learned_scheme_prints_nothing_on_stderr():
    r = run_cli("spread", "--widths", "4", "16", "--pairs", "200", "--scale", "learned_temp", "qk_norm")
    assert r.returncode == 0 and r.stderr == ""
    r = run_cli("fresh", "--widths", "8", "--sequences", "2", "--scale", "learned_temp", "--init", "model")
    assert r.returncode == 0 and r.stderr == ""
