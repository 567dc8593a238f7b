"""The command line, through the real entry points: output, JSON, records, bad input."""

import json
import os
import subprocess
import sys

import pytest

from attnscale.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "attnscale.cli", *args], capture_output=True, text=True, timeout=120)


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


@pytest.mark.parametrize(
    "args, needle",
    [
        (["spread", "--widths", "0"], "--widths"),
        (["spread", "--widths", "-3"], "--widths"),
        (["spread", "--widths", "2.5"], "--widths"),
        (["spread", "--pairs", "1"], "--pairs"),
        (["fresh", "--words", "0"], "--words"),
        (["fresh", "--scale", "bogus"], "--scale"),
        (["spread", "--frobnicate"], "--frobnicate"),
        (["fresh", "--init", "xavier"], "--init"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    """In process, through the entry point's own main (the subprocess path is test_cli_training's): exit 2 and
    one line, which also says nothing raised past main."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; tested with a path under a file instead")
def test_unwritable_out_nonroot(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    r = run_cli("spread", "--widths", "4", "--out", str(ro / "x"))
    assert r.returncode == 2 and "--out" in r.stderr


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_cli("spread", "--widths", "4", "--out", str(blocker / "sub"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("attnscale: error: --out: cannot write to")
    assert len(r.stderr.strip().splitlines()) == 1


def _commands():
    from attnscale.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_option_has_help(command, capsys):
    with pytest.raises(SystemExit, match="^0$") as done:  # SystemExit's message is its code
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for action in _commands()[command]._actions:
        if action.option_strings:
            assert action.help and action.help.strip(), f"{command} {action.option_strings} has no help"
            assert action.option_strings[-1] in text
        assert ".py" not in (action.help or ""), f"{command} {action.option_strings} names a file: {action.help}"


def test_defaults_are_the_librarys():
    from attnscale.core.diagnostics import FROZEN_THRESHOLD
    from attnscale.experiments.fresh import FreshConfig
    from attnscale.experiments.spread import SpreadConfig

    cmds = _commands()
    defaults = {c: {a.dest: a.default for a in cmds[c]._actions} for c in ("spread", "fresh", "inspect")}
    assert tuple(defaults["spread"]["head_dims"]) == SpreadConfig().head_dims
    assert defaults["spread"]["pairs"] == SpreadConfig().pairs
    assert tuple(defaults["fresh"]["head_dims"]) == FreshConfig().head_dims
    assert defaults["fresh"]["threshold"] == defaults["inspect"]["threshold"] == FROZEN_THRESHOLD == 0.99
    assert defaults["spread"]["pairs"] == 20_000  # the README's default


def test_learned_scheme_prints_nothing_on_stderr():
    r = run_cli("spread", "--widths", "4", "16", "--pairs", "200", "--scale", "learned_temp", "qk_norm")
    assert r.returncode == 0 and r.stderr == ""
    r = run_cli("fresh", "--widths", "8", "--sequences", "2", "--scale", "learned_temp", "--init", "model")
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize("argv, expected", [
    (["reproduc"], "unknown command 'reproduc'"),
    (["spread", "--widht", "4"], "unrecognized arguments: --widht 4"),
    (["fresh", "--init", "unt"], "fresh: argument --init: invalid choice: 'unt'"),
])
def test_every_error_line_starts_the_same_way(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"attnscale: error: {expected}"), err


@pytest.mark.parametrize("argv, hint", [
    (["reproduc"], "did you mean 'reproduce'?"),
    (["inspec", "--model", "m"], "did you mean 'inspect'?"),
    (["spread", "--widht", "4"], "did you mean --widths?"),  # the command's own options, not the top parser's
    (["sweep", "--quik", "--jobz", "2"], "did you mean --quick and --jobs?"),
    (["fresh", "--init", "unt"], "did you mean 'unit'?"),
])
def test_a_mistyped_command_or_option_gets_a_did_you_mean(argv, hint, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.rstrip().endswith(hint)


def test_nothing_close_gets_no_guess(capsys):
    assert main(["zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err
