"""The report's end-state section and floors, read from hand-made records (nothing trains)."""

import json

from attnscale.report import end_state_section
from attnscale.report.assemble import load_runs, verdicts
from attnscale.report.render import to_markdown
from attnscale.runs import record


def _run(root, w, scale, seed, ppl, spreads, frozen, group="end-state"):
    """A finished run of 7,200 steps whose layer 0 has ``spreads`` and ``frozen`` at steps 5,200 and 7,200."""
    d = root / f"d{w}-{scale}-s{seed}"
    d.mkdir(parents=True)
    model = {"vocab_size": 104, "context": 64, "d_model": 64, "n_layers": 2, "n_heads": 1, "head_dim": w, "scale": scale}
    results = {"status": "done", "steps_done": 7200, "perplexity": ppl, "valid_loss": 1.0, "head_dim": w, "scale": scale,
               "evals": [{"step": 7200, "valid_loss": 1.0, "perplexity": ppl}]}
    record.write(d, record.new("train", {"model": model, "train": {"seed": seed, "steps": 7200}}, results, group=group))
    lines = [{"step": s, "loss": 1.0, "spread": [[sp], [1.0]], "frozen_fraction": [[fr], [0.0]]}
             for s, sp, fr in zip((5200, 7200), spreads, frozen)]
    (d / record.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_section_reads_the_verdict_and_the_spreads_at_each_record(tmp_path):
    for seed in (0, 1):  # ratio 300/4 = 75 → 310/4: under 1,000 and +3%: the rule says inconsistent
        _run(tmp_path, 1024, "none", seed, 11.0, (300.0, 310.0), (0.9, 0.95))
        _run(tmp_path, 1024, "inv_sqrt_d", seed, 6.0, (4.0, 4.0), (0.0, 0.0))
    _run(tmp_path, 128, "none", 0, 7.0, (50.0, 60.0), (0.1, 0.1))
    _run(tmp_path, 128, "inv_sqrt_d", 0, 6.0, (3.0, 3.0), (0.0, 0.0))
    _run(tmp_path, 128, "uniform", 0, 11.0, (0.0, 0.0), (0.0, 0.0))
    record.write_floors(tmp_path, record.Floors(unigram_ppl=25.0, bigram_ppl=10.0, smoothing="add-one"))
    runs = load_runs(tmp_path)
    assert runs.floors.bigram_ppl == 10.0 and len(runs.end_state) == 7
    md = to_markdown(end_state_section.blocks(runs))
    # V = 11 − 6 = 5: the gap 5 at 1,024 is a share of 1.00, the gap 1 at 128 one of 0.20; against the bigram
    # floor 10: V = 4, shares 1.25 and 0.25
    assert "gap share at d = 128: course about 0.11 (≤ 0.25), here 0.20: met" in md
    assert "gap share at d = 1,024: course about 1 (0.8–1.2), here 1.00: met" in md
    assert "d = 128: 0.25, d = 1,024: 1.25" in md
    assert "verdict: inconsistent" in md and "| 7200 | 310.0 / 95.0% | 310.0 / 95.0% | 4.0 / 0.0% | 4.0 / 0.0% |" in md
    assert "| run | held-out ppl at step 7,200 |" in md and "| d128-uniform-s0 | 11.00 |" in md
    notes = {v.key: v.note for v in verdicts(runs) if v.key}
    assert "unscaled spread at d = 1,024 310.00, 310.00, not met; its pre-stated rule says inconsistent" in notes["end_spread"]


def test_records_without_an_end_state_or_floors_give_no_section(tmp_path):
    _run(tmp_path, 128, "none", 0, 7.0, (50.0, 60.0), (0.1, 0.1), group="sweep")
    runs = load_runs(tmp_path)
    assert runs.floors is None and end_state_section.blocks(runs) == [] and end_state_section.floor_blocks(runs) == []
    assert end_state_section.notes(runs) == {}
