"""report.frozen_section: the frozen share by threshold from final weights, as the report prints it."""

import math
import statistics
from types import SimpleNamespace

from attnscale.headcheck.thresholds import THRESHOLDS, frozen_by_threshold
from attnscale.report import frozen_section, held_out
from attnscale.analysis.estimates import plus_minus
from attnscale.runs.record import TrainRun

from run_folders import _cfg, _run_dir


def test_the_table_prints_each_runs_shares_and_the_seeds_mean(tmp_path, corpus):
    cfg = _cfg(vocab_size=corpus.vocab_size, head_dim=1024, scale="none")
    runs = []
    for seed in (1, 2):
        path = tmp_path / f"d1024-none-s{seed}"
        _run_dir(path, cfg, corpus=corpus, seed=seed)
        runs.append(TrainRun.load(path))
    runs.append(TrainRun.load(_run_dir_scaled(tmp_path, corpus)))  # scaled: not this table's
    (para, table) = frozen_section.blocks(SimpleNamespace(dynamics=runs))
    assert "first 32 held-out sequences of 32 tokens" in para.text
    head, rows = table.head, table.rows
    assert head[3:7] == [f"max weight > {x:g}" for x in THRESHOLDS]
    ids = held_out.sequences(corpus, 32, 32)
    want = [frozen_by_threshold(t.path, ids) for t in runs[:2]]
    assert [r[0] for r in rows[:3]] == ["d1024-none-s1"] * 3 and rows[2][2] == "all"
    assert rows[0][3:7] == [f"{100 * v:.1f}%" for v in want[0]["by_layer"][0]]
    assert rows[2][3:7] == [f"{100 * v:.1f}%" for v in want[0]["all_layers"]]
    # the last row: layer 0 over the two seeds, mean ± SE (sample sd / sqrt 2), by hand
    last = rows[-1]
    assert last[0] == "mean ± SE over seeds" and last[1] == 2
    for k, cell in enumerate(last[3:7]):
        a, b = (100 * w["by_layer"][0][k] for w in want)
        m, se = (a + b) / 2, statistics.stdev([a, b]) / math.sqrt(2)
        assert cell == plus_minus(m, se, "{:.1f}%")  # the numbers by hand; the format is plus_minus's (tested)


def _run_dir_scaled(tmp_path, corpus):
    path = tmp_path / "d1024-inv_sqrt_d-s1"
    _run_dir(path, _cfg(vocab_size=corpus.vocab_size, head_dim=1024, scale="inv_sqrt_d"), corpus=corpus, seed=1)
    return path


def test_no_final_weights_no_table(tmp_path):
    assert frozen_section.blocks(SimpleNamespace(dynamics=[])) == []
