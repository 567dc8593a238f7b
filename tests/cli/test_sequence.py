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
