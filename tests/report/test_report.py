"""report.build: from run records on disk to HTML + Markdown, with any subset of experiments.

Records are written by hand here, in the form runs/record.py documents (lm/train.py's), so these
tests need no training (test_assemble's runs the real spread and fresh experiments at tiny sizes to
hold the contract between them and the report). The record writers here serve the report room's other files."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnscale import report
from attnscale.cli import main
from attnscale.files import atomic_write_json

WIDTHS = (4, 32, 64, 128, 256, 512, 1024)
XSS = "<script>alert(1)</script>"
ENV = {"attnscale": "0.1.0", "python": "3.11", "torch": "2.13.0", "platform": "Linux", "cpu_count": 2}


def _record(path: Path, experiment: str, config, results, *, status="done", finished=1.0e9, **extra) -> None:
    atomic_write_json(path / "record.json", {
        "experiment": experiment, "status": status, "config": config, "environment": ENV,
        "started": finished - 5, "finished": finished, "duration_s": 5.0, "results": results, **extra})


def _spread_rows(pairs=20000):
    rows = []
    for d in WIDTHS:
        se = 0.5 * math.sqrt((2 + 6 / d) / pairs) * math.sqrt(d)
        raw = math.sqrt(d) + 0.5 * se  # half an SE off: inside the tolerance
        rows.append({"head_dim": d, "scale": "inv_sqrt_d", "factor": d ** -0.5, "pairs": pairs, "raw_spread": raw,
                     "scaled_spread": raw * d ** -0.5, "sqrt_d": math.sqrt(d), "raw_spread_se": se})
    return rows


def _fresh_row(init, d, scale, *, frozen=None):
    loud = scale == "none" and d >= 256
    ff = frozen if frozen is not None else (0.70 if (scale == "none" and d == 1024) else 0.4 if loud else 0.0)
    eff = (1.02, 1.0, 1.3) if loud else (38.0, 30.0, 45.0)
    return {"head_dim": d, "scale": scale, "init": init, "words": 64, "sequences": 200,
            "effective_words_median": eff[0], "effective_words_p10": eff[1], "effective_words_p90": eff[2],
            "effective_words_mean": eff[0], "max_weight_mean": 0.99 if loud else 0.1, "frozen_fraction": ff,
            "frozen_threshold": 0.99, "push_median": 0.01, "push_mean": 0.02,
            "example": f"row 12 puts 99.9% of its weight on word 3 (1.0 effective words) {XSS}",
            "example_row": [1 / 64] * 64}


def _illustration():
    scores = [math.sin(i) for i in range(64)]
    mults = [0.25, 1, 4, 16]
    weights = []
    for m in mults:
        e = [math.exp(m * s) for s in scores]
        weights.append([x / sum(e) for x in e])
    eff = [math.exp(-sum(p * math.log(p) for p in w if p > 0)) for w in weights]
    return {"scores": scores, "multipliers": mults, "weights": weights, "effective_words": eff}


def _diag(step, spread, frozen, eff, layers=2, heads=2):
    return {"step": step, "layers": [{"layer": i, "spread": [spread * (1 + 0.3 * i)] * heads, "max_score": [3 * spread] * heads,
                                      "effective_words": [eff] * heads, "frozen_fraction": [frozen] * heads,
                                      "push": [0.1] * heads, "max_weight": [0.5] * heads} for i in range(layers)]}


def _train(root: Path, group: str, d: int, scale: str, seed: int, *, ppl: float, corpus: str, start=(3.0, 0.0, 30.0),
           end=(3.4, 0.0, 20.0), steps=40) -> None:
    """A training run as train.py writes it: [layer][head] lists per metrics line, means in start/end."""
    run = root / group / f"d{d}-{scale}-s{seed}"
    lines = []
    for k, step in enumerate(range(0, steps + 1, 10)):
        t = k / (steps // 10)
        vals = [a + (b - a) * t for a, b in zip(start, end)]
        layers = _diag(step, *vals)["layers"]
        lines.append({"step": step, "loss": 5 - 2 * t, "lr": 3e-3,
                      **{key: [layer[key] for layer in layers] for key in layers[0] if key != "layer"}})
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"model": {"vocab_size": 256, "context": 64, "d_model": 64, "n_layers": 2, "n_heads": 2, "head_dim": d,
                        "scale": scale, "init": "torch", "norm": "pre"},
              "train": {"steps": steps, "batch": 8, "lr": 3e-3, "seed": seed},
              "corpus": {"name": corpus, "tokenizer": "bytes", "tokens": 12345}}
    means = {w: dict(zip(("spread", "frozen_fraction", "effective_words"), v)) for w, v in (("start", start), ("end", end))}
    results = {"status": "done", "valid_loss": math.log(ppl), "perplexity": ppl, "steps_done": steps, "diverged_at": None,
               "tokens_per_s": 1000.0, "final_train_loss": 3.0, **means}
    _record(run, "train", config, results, group=group)


def write_runs(root: Path, *, training: bool = True, corpus: str = "wikitext-2") -> Path:
    """A folder of hand-written records in the layout of ``attnscale reproduce``, where every
    claim of the chapter agrees (layer 0's spread is the course's; layer 1's is 30% above)."""
    _record(root / "spread", "spread", {"head_dims": list(WIDTHS), "pairs": 20000, "seed": 0}, _spread_rows())
    for init in ("unit", "model"):
        rows = [_fresh_row(init, d, s) for d in WIDTHS for s in ("none", "inv_sqrt_d")]
        _record(root / f"fresh-{init}", "fresh", {"init": init, "words": 64, "sequences": 200, "note": XSS},
                {"rows": rows, "illustration": _illustration()})
    if training:
        for scale, start, end in (("none", (21.0, 0.3, 3.0), (5200.0, 0.999, 1.0)), ("inv_sqrt_d", (3.0, 0.0, 30.0), (3.0, 0.0, 20.0))):
            _train(root, "dynamics", 1024, scale, 0, ppl=50.0, corpus=corpus, start=start, end=end)
        for d, gap in ((32, -0.2), (128, 2.0), (256, 17.5), (1024, 17.8)):
            for seed in (0, 1):
                _train(root, "sweep", d, "inv_sqrt_d", seed, ppl=40.0 + 0.1 * seed, corpus=corpus)
                _train(root, "sweep", d, "none", seed, ppl=40.0 + gap + 0.1 * seed, corpus=corpus)
    return root


def test_spread_and_fresh_only(tmp_path):
    paths = report.build(write_runs(tmp_path / "runs", training=False))
    assert paths["html"] == tmp_path / "runs" / "report" / "index.html"
    assert {"html", "markdown", "spread", "fresh", "illustration"} <= set(paths)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    md = paths["markdown"].read_text()
    assert "Not in the records, so not judged" in md
    assert "- dynamics:" in md and "- sweep:" in md
    assert "| not run |" in md and "| differs |" not in md
    assert "(spread.png)" in md and (paths["markdown"].parent / "spread.png").exists()


def test_all_experiments(tmp_path):
    paths = report.build(write_runs(tmp_path / "runs"), tmp_path / "out")
    assert {"dynamics-d1024", "sweep"} <= set(paths)
    md = paths["markdown"].read_text()
    assert "| not run |" not in md and "| differs |" not in md
    assert "Not in the records" not in md
    text = paths["html"].read_text()
    srcs = re.findall(r'<img src="([^"]*)"', text)
    assert len(srcs) == 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<script" not in text.lower() and "http://" not in text and "https://" not in text
    assert "<link" not in text and "@import" not in text  # nothing fetched: opens offline
    assert "seeds" in md and "wikitext-2" in md and "torch=2.13.0" in md


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_strings_from_records_are_escaped(tmp_path):
    paths = report.build(write_runs(tmp_path / "runs", corpus=XSS), tmp_path / "out")
    html_text, md = paths["html"].read_text(), paths["markdown"].read_text()
    assert XSS not in html_text and XSS not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_text
    assert "\\<script>alert(1)\\</script>" in md and not re.search(r"&[#\w]+;", md)


def test_cli_report(tmp_path, capsys):
    runs = write_runs(tmp_path / "runs", training=False)
    assert main(["report", str(runs), "--out", str(tmp_path / "r")]) == 0
    assert str(tmp_path / "r" / "index.html") in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing-here")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "no run records" in err


def test_import_does_not_load_matplotlib():
    code = "import sys, attnscale, attnscale.report, attnscale.report.course; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _as_preset(root: Path, name: str) -> None:
    """Give every training record under ``root`` the settings of the preset ``name`` (lm.presets)."""
    from dataclasses import asdict

    from attnscale.lm.presets import budget

    model, train = budget(name).model, budget(name).train
    for path in root.rglob("record.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == "train":
            rec["config"]["model"].update(model)
            rec["config"]["train"].update({k: v for k, v in asdict(train).items() if k != "seed"})
            path.write_text(json.dumps(rec))


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_numbers_are_right_aligned_with_one_precision_per_column(tmp_path):
    md = report.build(write_runs(tmp_path / "runs"), tmp_path / "out")["markdown"].read_text()
    lines = md.splitlines()
    spread_head = next(i for i, line in enumerate(lines) if line.startswith("| width d | scale | raw spread"))
    assert lines[spread_head + 1] == "|---:|---|---:|---:|---:|---:|---:|"
    factors = [row.split(" | ")[5] for row in lines[spread_head + 2:spread_head + 9]]
    assert len({len(f.split(".")[1]) for f in factors}) == 1, factors  # one number of decimals
    assert not re.search(r"&[#\w]+;", md)


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_no_absolute_path_of_this_machine_reaches_the_report(tmp_path):
    runs = write_runs(tmp_path / "runs")
    src = runs / "dynamics" / "d1024-none-s0"
    outside = tmp_path / "elsewhere" / "d1024-none-s0"  # a study copies runs from another folder
    outside.mkdir(parents=True)
    rec = json.loads((src / "record.json").read_text())
    rec.update(group="sweep", copied_from=str(outside))
    (runs / "sweep" / "d1024-none-s0" / "record.json").write_text(json.dumps(rec))
    paths = report.build(runs, tmp_path / "out")
    for text in (paths["markdown"].read_text(), paths["html"].read_text()):
        assert str(tmp_path) not in text
    assert "a copy of ../elsewhere/d1024-none-s0 (not retrained)" in paths["markdown"].read_text()
