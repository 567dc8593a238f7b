"""sections: what the report says from its records: the scoreboard and the preset first, each stage's budget,
runs counted once, the machines and precisions, the schemes by their readers' names."""

import json

import pytest

from attnscale import report
from test_report import ENV, _as_preset, write_runs


def _top(md: str) -> tuple[str, str, str]:
    """(title, scoreboard, banner): the page's first line, first bold line and first quoted line."""
    lines = md.splitlines()
    board = next(i for i, line in enumerate(lines) if line.startswith("**Scoreboard"))
    banner = next(i for i, line in enumerate(lines) if line.startswith("> **"))
    assert board == 2 and board < banner  # the scoreboard first, before the preset and any paragraph
    assert not [line for line in lines[board + 1:banner] if line and not line.startswith("- ")]
    return lines[0], lines[board], lines[banner]


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_the_first_lines_are_the_scoreboard_then_the_preset(tmp_path):
    runs = write_runs(tmp_path / "runs")
    title, board, banner = _top(report.build(runs, tmp_path / "custom")["markdown"].read_text())
    assert board == "**Scoreboard: 19 agree, 0 partly, 0 differ of 19 claims of the course**"
    assert banner.startswith("> **Custom settings")
    _as_preset(runs, "quick")
    title, board, banner = _top(report.build(runs, tmp_path / "quick")["markdown"].read_text())
    assert title.endswith("(quick preset)") and banner.startswith("> **Quick preset")
    assert "not the full reproduction" in banner and "60 steps per run" in banner
    _as_preset(runs, "default")
    title, board, banner = _top(report.build(runs, tmp_path / "full")["markdown"].read_text())
    assert "quick" not in title and banner.startswith("> **Default preset")
    assert "400 steps per run" in banner and title.endswith("(default preset)")
    assert "judged by the full preset (attnscale reproduce --full: 1,200 steps a run)." in banner
    _as_preset(runs, "full")
    md = report.build(runs, tmp_path / "full-preset")["markdown"].read_text()
    title, board, banner = _top(md)
    assert title.endswith("(full preset)") and banner.startswith(
        "> **Full preset (attnscale reproduce --full): 1,200 steps per run")
    _as_preset(runs, "default")
    md = report.build(runs, tmp_path / "default-again")["markdown"].read_text()  # the records as just rewritten
    assert "Claims that do not agree" not in md  # every claim agrees on these records
    # a claim that differs is named in the scoreboard, and listed with its reason before the first section
    rec_path = runs / "sweep" / "d32-none-s0" / "record.json"
    for seed in (0, 1):
        p = runs / "sweep" / f"d32-none-s{seed}" / "record.json"
        rec = json.loads(p.read_text())
        rec["results"]["perplexity"] = 40.72 + 0.1 * seed
        p.write_text(json.dumps(rec))
    md = report.build(runs, tmp_path / "differs")["markdown"].read_text()
    title, board, banner = _top(md)
    assert board == "**Scoreboard: 18 agree, 0 partly, 1 differ of 19 claims of the course**"
    assert md.splitlines()[4] == "- d=32: no difference (unscaled very slightly ahead): differs"
    head = md[:md.index("## 1.")]
    assert rec_path.exists() and "Claims that do not agree, and why:" in head
    assert "- d=32: no difference (unscaled very slightly ahead) — differs" in head
    assert "the scaled run is ahead" in head


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_each_stage_shows_its_own_budget_from_its_records(tmp_path):
    runs = write_runs(tmp_path / "runs")
    _as_preset(runs, "default")
    for path in (runs / "sweep").rglob("record.json"):  # a sweep at another budget than the dynamics runs
        rec = json.loads(path.read_text())
        rec["config"]["train"]["steps"], rec["config"]["model"]["context"] = 60, 32
        path.write_text(json.dumps(rec))
    md = report.build(runs, tmp_path / "out")["markdown"].read_text()
    table = md[md.index("| stage |"):].split("\n\n")[0].splitlines()
    assert table[0] == "| stage | runs | steps a run | context | batch | seeds | widths | learning rate |"
    assert table[2] == "| 4. training dynamics | 2 | 400 | 64 | 16 | 1 | 1,024 | 3e-3 |", table[2]
    assert table[3] == "| 5. width sweep | 16 | 60 | 32 | 16 | 2 | 32 to 1,024 | 3e-3 |", table[3]


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_runs_shared_by_two_stages_are_counted_once(tmp_path):
    runs = write_runs(tmp_path / "runs")
    n = sum(1 for _ in runs.rglob("record.json")) - 2  # two of the sweep's become copies
    for scale in ("none", "inv_sqrt_d"):  # the sweep's widest pair, copied from the dynamics stage
        src = runs / "dynamics" / f"d1024-{scale}-s0"
        dst = runs / "sweep" / f"d1024-{scale}-s0"
        rec = json.loads((src / "record.json").read_text())
        rec.update(group="sweep", copied_from=str(src))
        (dst / "metrics.jsonl").write_bytes((src / "metrics.jsonl").read_bytes())
        (dst / "record.json").write_text(json.dumps(rec))
    md = report.build(runs, tmp_path / "out")["markdown"].read_text()
    assert f"Built from {n} run records in the folder runs/" in md
    assert "2 runs are copies of runs another stage trained (the sweep's widest pairs are the dynamics runs" in md
    assert md.count("; a copy of dynamics/d1024-") == 2 and md.count("(not retrained)") == 2


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_environments_that_differ_only_in_threads_are_one_line(tmp_path):
    runs = write_runs(tmp_path / "runs")
    for i, path in enumerate(sorted(runs.rglob("record.json"))):
        rec = json.loads(path.read_text())
        rec["environment"] = {**ENV, "torch_threads": 1 + i % 2}
        path.write_text(json.dumps(rec))
    md = report.build(runs, tmp_path / "out")["markdown"].read_text()
    envs = md[md.index("Software and hardware:"):].split("\n\n")[1].splitlines()
    assert len(envs) == 1 and "torch_threads=1 or 2 (threads per process" in envs[0]


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_precision_and_native_bf16_are_said_for_the_machine_and_every_run(tmp_path):
    runs = write_runs(tmp_path / "runs")
    for path in runs.rglob("record.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == "train" and "sweep" in path.parts:  # the dynamics records are older: no field
            rec["environment"] = {**ENV, "cpu_native_bf16": True, "device": {"type": "cpu", "name": "Xeon", "dtype": "bf16"}}
            rec["results"]["dtype"] = "bf16"
        path.write_text(json.dumps(rec))
    paths = report.build(runs, tmp_path / "out")
    md = paths["markdown"].read_text()
    envs = md[md.index("Software and hardware:"):].split("\n\n")[1].splitlines()
    assert len(envs) == 2, envs
    ends = sorted(line.split("; ", 1)[1] for line in envs)
    assert ends == ["native bf16 in the CPU: not recorded",  # spread, fresh and the older training records
                    "native bf16 in the CPU: yes; trained in bf16 on cpu (Xeon)"], envs
    table = md[md.index("| run | experiment |"):].splitlines()
    assert table[0].startswith("| run | experiment | status | duration (s) | precision | native bf16 in the CPU |")
    row = next(line for line in table if line.startswith("| sweep/d32-none-s0 |"))
    assert "| bf16 | yes |" in row
    assert "| — | not recorded |" in next(line for line in table if line.startswith("| spread |"))
    # the appendix is folded until a reader opens it
    assert "<details><summary>Every run (" in md
    page = paths["html"].read_text()
    assert "<details><summary>Every run (" in page and "<details open" not in page


@pytest.mark.usefixtures("words_only")  # reads the words; figures are rendered elsewhere
def test_schemes_read_as_readers_name_them(tmp_path):
    md = report.build(write_runs(tmp_path / "runs"), tmp_path / "out")["markdown"].read_text()
    assert "| width d | ppl 1/√d | ppl none | gap |" in md
    assert "| 1024 | 1/√d | 32.080 |" in md  # the spread table
    assert "| inv_sqrt_d |" not in md
