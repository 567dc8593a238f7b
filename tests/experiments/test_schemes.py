"""experiments/schemes and `attnscale schemes`: the grid, the presets, a tiny study end to end, resume,
bad input, and the report section with its figures."""

import collections
import contextlib
import io
import json
import math
import re

import pytest

from attnscale import report
from attnscale.cli import main
from attnscale.core.scales import scale_names
from attnscale.errors import ConfigError
from attnscale.experiments import schemes
from attnscale.report.schemes_section import TITLE
from attnscale.runs.runner import CorpusSpec

TINY = ["--quick", "--steps", "3", "--batch", "2", "--context", "16"]


def test_lr_grid_spans_ten_times_either_side():
    assert schemes.lr_grid(3e-3) == (3e-4, 9.5e-4, 3e-3, 9.5e-3, 3e-2)
    with pytest.raises(ConfigError, match="an LR grid needs at least 2 points, got 1"):
        schemes.lr_grid(3e-3, 1)


def test_defaults_are_the_study():
    cfg = schemes.SchemesConfig()
    assert cfg.scales == tuple(scale_names()) and cfg.head_dims == (64, 256, 1024) and cfg.seeds == (0, 1, 2)
    assert len(cfg.lrs) >= 5 and cfg.lrs[0] == pytest.approx(cfg.train.lr / 10) and cfg.lrs[-1] == pytest.approx(cfg.train.lr * 10)
    quick = schemes.preset("quick")
    assert quick.scales == cfg.scales and quick.head_dims == (64, 256) and quick.seeds == (0, 1) and quick.train.steps == 60
    with pytest.raises(ConfigError, match="unknown schemes preset"):
        schemes.preset("huge")
    for bad, words in (({"lrs": ()}, r"lrs must be a non-empty list without repeats, got \(\)"),
                       ({"lrs": (1e-3, -1.0)}, "train lr must be a positive number, got -1.0"),
                       ({"scales": ("nope",)}, "model scale 'nope' is unknown"),
                       ({"head_dims": (0,)}, r"head_dims must be positive integers, got \(0,\)"),
                       ({"seeds": (1, 1)}, r"seeds must be a non-empty list without repeats, got \(1, 1\)")):
        with pytest.raises(ConfigError, match=words):
            schemes.SchemesConfig(**bad)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The tiny study, run once here (each test that reads it may run alone), with what it printed."""
    out = tmp_path_factory.mktemp("schemes")
    args = ["schemes", "--widths", "8", "16", "--scale", "none", "qk_norm", "--lrs", "1e-3", "3e-2",
            "--seeds", "0", "1", *TINY, "--out", str(out)]
    printed, told = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(told):
        assert main(args) == 0
    return out, args, printed.getvalue(), told.getvalue()


def test_tiny_study_end_to_end_then_resume(study, capsys):
    out, args, printed, told = study
    assert "LR sensitivity" in printed and "[16/16]" in told
    records = sorted(out.glob("*/record.json"))
    assert len(records) == 16
    rec = json.loads(records[0].read_text())
    assert rec["group"] == "schemes" and rec["status"] in ("done", "diverged")
    before = [r.stat().st_mtime_ns for r in records]
    assert main(args + ["--json"]) == 0
    again = capsys.readouterr()
    assert "16 of 16 runs already finished" in again.err
    assert [r.stat().st_mtime_ns for r in records] == before
    result = json.loads(again.out)
    assert len(result["runs"]) == 16
    rows = {(r["head_dim"], r["scale"]): r for r in result["summary"]}
    assert set(rows) == {(w, s) for w in (8, 16) for s in ("none", "qk_norm")}
    for r in rows.values():
        assert r["seeds"] == 2 and r["sensitivity"] >= 0 and r["sensitivity_se"] is not None
        assert r["best_loss"] > 0 and r["max_logit_high_lr"][0] > 0 and r["heads"] == 4 * 4 * 2


def test_the_printed_reading_flags_the_unigram_plateau_as_the_report_does(study, capsys):
    # a unigram model on the embedded corpus by hand: add-one counts over the training split, mean -log p on held-out
    out, args, *_ = study
    corpus = CorpusSpec("default").load()
    counts, n = collections.Counter(corpus.train.tolist()), len(corpus.train)
    floor = math.fsum(-math.log((counts[t] + 1) / (n + corpus.vocab_size)) for t in corpus.valid.tolist()) / len(corpus.valid)
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["unigram"] == pytest.approx(floor, rel=1e-12)
    # 3 steps from a uniform start (ln 104 ≈ 4.64 nats) end above the unigram model's loss: every end of every grid
    assert sorted((s, w, end) for s, w, end, loss in result["plateau"]) == sorted(
        (s, w, end) for s in ("none", "qk_norm") for w in (8, 16) for end in ("lowest", "highest"))
    assert all(loss >= floor - 0.1 for *_, loss in result["plateau"])
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"A unigram model (token frequencies alone) scores {floor:.3f} nats on the held-out split" in printed
    assert "so the sensitivities below are not read as a ranking" in printed
    assert "paired comparisons" not in printed


def test_report_has_the_section_and_its_images(study, tmp_path):
    out, *_ = study
    paths = report.build(out, tmp_path / "report")
    assert {"schemes-loss-lr", "schemes-sensitivity", "schemes-max-logit", "schemes-theory"} <= set(paths)
    html = paths["html"].read_text()
    assert f"<h2>{TITLE}</h2>" in html
    section = html.split(f"<h2>{TITLE}</h2>", 1)[1].split("<h2>", 1)[0]
    assert len(re.findall(r'<img src="data:image/png;base64,', section)) == 4
    assert "LR sensitivity ± SE" in section and "What the records show" in section
    md = paths["markdown"].read_text()
    assert f"## {TITLE}" in md and "(schemes-loss-lr.png)" in md


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for bad in (["--lrs", "0"], ["--scale", "bogus"], ["--widths", "0"], ["--seeds", "-1"]):
        assert main(["schemes", *bad, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("attnscale: error: ")
