"""The lr study's printout: each number as the block holds it, never "± 0.00"."""

from attnscale.analysis import sensitivity
from attnscale.experiments import lr_study_text as txt


def _rows():
    rows = []
    for t, shift in (("none", 0.0), ("clip", 0.01), ("alarm-clip", 0.011)):
        for s in range(3):
            for lr, loss in ((0.01, 1.60), (0.02, 1.55), (0.04, None)):
                rows.append({"optimizer": "adamw", "d_model": 64, "treatment": t, "seed": s, "lr": lr,
                             "valid_loss": None if loss is None else loss + shift + 0.01 * s,
                             "outcome": {"learned_at": 5, "break_step": 900 if loss is None else None}})
    return rows


def test_format_result_prints_the_block():
    block = sensitivity.judge(_rows(), 2.0)
    for g in block["groups"]:
        g["interim"] = False
    text = txt.format_result(block)
    c = block["groups"][0]["curves"]["none"]
    assert "adamw, d_model 64 (final: seeds 0, 1, 2)" in text
    assert txt.mean_text(c["best"]) in text and "0.01–0.02 (×2)" in text
    assert "2.000 b3 n0" in text  # every 0.04 run diverged: read as the floor, its breaks counted
    assert "alarm-clip − clip, best loss: +0.0010 nats" in text and "equivalent at ±0.02" in text


def test_mean_text_one_seed_and_alike():
    assert txt.mean_text({"mean": 1.5, "se": None, "n": 1, "interval": None}) == "1.500 (n=1, no interval)"
    assert txt.mean_text({"mean": 1.5, "se": 0.0, "n": 3, "interval": (1.5, 1.5)}) == "1.500 (every seed alike)"


def test_pilot_line():
    text = txt.format_result({"pilot": True, "rows": [1, 2], "grid": {"r1": 0.04, "why": "w", "lrs": (0.0025, 0.08)}})
    assert text == "Muon pilot: 2 runs; r1 = 0.04 (w); Muon's grid: 0.0025, 0.08"


def test_an_equivalence_alike_on_every_seed_prints_no_zero_width_interval():
    rows = _rows()
    for r in rows:
        if r["treatment"] == "alarm-clip":
            r["valid_loss"] = None if r["valid_loss"] is None else r["valid_loss"] - 0.001
    text = txt.format_result(sensitivity.judge(rows, 2.0) | {"groups": [
        {**g, "interim": True} for g in sensitivity.judge(rows, 2.0)["groups"]]})
    assert "alarm-clip − clip, best loss: +0.0000 nats, the same on every seed: equivalent" in text
    assert "[+0.0000, +0.0000]" not in text
