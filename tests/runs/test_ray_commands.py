"""`--executor ray` on the other commands that take it (schemes, study, reproduce; dynamics is
tests/runs/test_ray_executor.py's, in the default tests), on a local Ray instance started as
that file starts one (127.0.0.1, no dashboard, no usage statistics), each on a tiny corpus and
a few steps: the records land in --out as with local workers. All three are slow tests."""

from __future__ import annotations

import json

import pytest

from attnscale.cli import main
from attnscale.runs import record as rec
from test_promises import TINY, _only_dynamics, tiny_corpus
from test_ray_executor import cluster  # noqa: F401  (the module's local Ray instance)


def _done(out, n):
    runs = [rec.TrainRun.load(p) for p in rec.find(out)]
    assert len(runs) == n and all(r.status == "done" for r in runs), [(r.run_id, r.status) for r in runs]
    return runs


@pytest.mark.slow  # another command, the same executor path: in `make test-all`
def test_schemes_through_ray(cluster, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "schemes"
    assert main(["schemes", "--widths", "8", "--scale", "none", "qk_norm", "--lrs", "3e-3", "--seeds", "0",
                 "--corpus", str(tiny_corpus(tmp_path / "c")), *TINY, "--out", str(out), "--executor", "ray",
                 "--json"]) == 0
    assert {r.scale for r in _done(out, 2)} == {"none", "qk_norm"}


@pytest.mark.slow
def test_study_through_ray(cluster, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "study"
    assert main(["study", "--quick", "--width", "8", "--seeds", "0", "--axis", "lr=9e-3",
                 "--corpus", str(tiny_corpus(tmp_path / "c")), *TINY, "--out", str(out), "--executor", "ray",
                 "--json"]) == 0
    assert sorted({r.lr for r in _done(out, 4)}) == [3e-3, 9e-3]


@pytest.mark.slow
def test_reproduce_through_ray(cluster, tmp_path, monkeypatch):  # noqa: F811
    from attnscale import reproduce

    _only_dynamics(reproduce, monkeypatch)
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--corpus", str(tiny_corpus(tmp_path / "c")), "--out", str(out),
                 "--executor", "ray"]) == 0
    _done(out / "dynamics", 2)
    assert (out / "report" / "report.md").exists()
