"""A sweep's floors: the uniform run beside its pairs, the counted floors on disk, the shares it prints."""

import pytest

from attnscale.experiments import sweep
from attnscale.runs import record as rec
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def test_the_course_sweep_trains_one_uniform_floor_at_128_and_a_plain_sweep_none():
    cfg = sweep.preset(quick=True, vocab_size=V)
    assert cfg.floor
    ids = [s.run_id for s in sweep.specs(cfg, V)]
    assert ids[-1] == "d128-uniform-s0" and ids.count("d128-uniform-s0") == 1
    floor = sweep.specs(cfg, V)[-1]
    assert floor.model.scale == "uniform" and floor.train == sweep.specs(cfg, V)[0].train
    plain = sweep.SweepConfig(head_dims=(32, 64), model=cfg.model, train=cfg.train)
    assert all(s.model.scale != "uniform" for s in sweep.specs(plain, V))
    assert sweep.floor_head_dim((32, 64)) == 32 and sweep.floor_head_dim((32, 128, 1024)) == 128


def test_the_counted_floors_lie_beside_the_runs_and_no_reader_of_runs_meets_them(corpus, tmp_path):
    assert sweep.floors(tmp_path) is None  # a sweep written before: none, and nothing fails
    written = sweep.write_floors(corpus, tmp_path)
    got = sweep.floors(tmp_path)
    assert got == written and got.bigram_ppl < got.unigram_ppl and got.corpus == corpus.describe()
    assert (tmp_path / "floors.json").exists() and rec.find(tmp_path) == []  # not a run record
    with pytest.raises(rec.RecordError, match="unigram_ppl, bigram_ppl and smoothing"):
        rec.Floors.from_json({"unigram_ppl": 3.0})
    (tmp_path / "floors.json").write_text("{")
    with pytest.raises(rec.RecordError, match="floors.json cannot be read"):
        sweep.floors(tmp_path)
    assert sweep.write_floors(corpus, tmp_path) == written  # a damaged file is counted again


def test_the_table_gives_each_gap_as_a_share_of_what_attention_is_worth():
    def r(w, s, p):
        return {"run_id": f"d{w}-{s}-s0", "head_dim": w, "scale": s, "seed": 0, "lr": None, "valid_ppl": p,
                "status": "done", "diverged_at": None, "train_seconds": 1.0}

    rows = [r(128, "none", 7.0), r(128, "inv_sqrt_d", 6.0), r(1024, "none", 11.0), r(1024, "inv_sqrt_d", 6.0),
            r(128, "uniform", 11.0)]
    text = sweep.format_table(rows)
    # V = 11 − 6 = 5 at both widths: gap 1 is a share of 0.20, gap 5 one of 1.00; the course's 2/17.5 and 1
    line128 = next(l for l in text.splitlines() if l.strip().startswith("128"))
    line1024 = next(l for l in text.splitlines() if l.strip().startswith("1024") or l.strip().startswith("1,024"))
    assert line128.split()[-2:] == ["0.20", f"{2 / 17.5:.2f}"] and line1024.split()[-2:] == ["1.00", "1.00"]
    assert "F = 11.00" in text
