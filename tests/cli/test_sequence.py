"""The one sequence every command follows: an --out that cannot be written is refused in one line."""

import os

import pytest

from command_line import run_cli


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


@pytest.mark.parametrize("argv, says", [
    (["train", "--steps", "2", "--out", "my runs"], "finished runs are kept on disk, and a run cut short goes on from "
     "its last checkpoint: to resume, run the same command again: attnscale train --steps 2 --out 'my runs'"),
    (["spread", "--widths", "4", "--out", "s"], "interrupted before it finished; to run it again: "
     "attnscale spread --widths 4 --out s"),
])
def test_ctrl_c_says_the_command_that_resumes_or_runs_it_again(argv, says, tmp_path, monkeypatch, capsys):
    """After Ctrl-C a run said only "interrupted; finished runs are kept on disk", not how to go on."""
    from attnscale.cli import main, sequence

    def interrupt(*_):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sequence, "writable_dir", interrupt)  # Ctrl-C as the command starts its work
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == f"attnscale: {'interrupted; ' if argv[0] == 'train' else ''}{says}\n" and "Traceback" not in err
