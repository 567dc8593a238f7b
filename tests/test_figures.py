"""Every rule that turns training into a reported figure, checked against an
independent calculation: cross-entropy summed by hand, gaps and shares worked out
on paper, boundaries hit exactly. A rule changed by one operator or constant
(exp -> 2**, ÷ the baseline, > -> >=, 2 SE -> 3 SE) fails here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnscale.core import diagnostics as D
from attnscale.core.hooks import hooked
from attnscale.core.scales import get_scale
from attnscale.lm.checkpoint import comparable_config
from attnscale.lm.data import Corpus
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.step_measures import read_back, recording
from reference import head_summary
from attnscale.lm.train import TrainConfig, evaluate, train
from attnscale.analysis import gaps as gap_tables
from attnscale.analysis import schemes as sa

README = Path(__file__).resolve().parents[1] / "README.md"
V = 7


def _model(context=8, seed=0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(ModelConfig(vocab_size=V, context=context, d_model=16, n_layers=2, n_heads=2, head_dim=4))


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def _nll_by_hand(model: TinyLM, x_T: torch.Tensor, y_T: torch.Tensor) -> float:
    """Σ −log softmax(logits)[target] for one window, with log-softmax written out."""
    with torch.no_grad():
        logits_TV = model(x_T[None])[0].double()
    m = logits_TV.max(-1, keepdim=True).values
    log_z = (m + (logits_TV - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)
    return float((log_z - logits_TV[torch.arange(len(y_T)), y_T]).sum())


# ---- perplexity and held-out loss --------------------------------------------------


def test_held_out_loss_is_the_token_weighted_mean_and_perplexity_its_exp():
    # 8 tokens of context, 43 ids: 5 full windows (40 targets) + a window of 2: 42 targets.
    # batch 3: batches of 3, 2 and 1 windows (24, 16, 2 targets): the batches' means weighted
    # equally would put the 2-target batch on a par with the 24-target one.
    model, ids, c = _model(), _ids(43), 8
    total = sum(_nll_by_hand(model, ids[i * c:(i + 1) * c], ids[i * c + 1:(i + 1) * c + 1]) for i in range(5))
    total += _nll_by_hand(model, ids[40:42], ids[41:43])
    loss = total / 42
    got = evaluate(model, ids, batch=3, max_batches=None)
    assert got["eval_tokens"] == 42
    assert got["valid_loss"] == pytest.approx(loss, rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
    # the batches' means, unweighted, are another number (the rule this pins is the weighting)
    per_batch = [sum(_nll_by_hand(model, ids[i * c:(i + 1) * c], ids[i * c + 1:(i + 1) * c + 1]) for i in range(3)) / 24,
                 sum(_nll_by_hand(model, ids[i * c:(i + 1) * c], ids[i * c + 1:(i + 1) * c + 1]) for i in (3, 4)) / 16,
                 _nll_by_hand(model, ids[40:42], ids[41:43]) / 2]
    assert abs(sum(per_batch) / 3 - loss) > 1e-3


def test_evaluation_stops_after_max_batches():
    model, ids = _model(), _ids(43)
    first = sum(_nll_by_hand(model, ids[i * 8:(i + 1) * 8], ids[i * 8 + 1:(i + 1) * 8 + 1]) for i in range(3)) / 24
    got = evaluate(model, ids, batch=3, max_batches=1)
    assert got["eval_tokens"] == 24
    assert got["valid_loss"] == pytest.approx(first, rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(first), rel=1e-6)


def test_a_trained_runs_perplexity_is_its_held_out_loss_through_exp():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (700,), generator=g)
    corpus = Corpus(name="tiny", tokenizer="char", vocab_size=V, train=ids[:600], valid=ids[600:], sha256="0" * 64)
    mcfg = ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=1, n_heads=2, head_dim=4)
    res = train(mcfg, TrainConfig(steps=2, batch=4, warmup=1, record_every=1, eval_batches=None, threads=1), corpus)
    assert res["eval_tokens"] == 99  # the whole held-out split: every id after the first is a target once
    assert res["perplexity"] == pytest.approx(math.exp(res["valid_loss"]), rel=1e-12)
    assert 1 < res["perplexity"] < 3 * V  # near-uniform after 2 steps: about V, and never 2**loss's value
    assert res["perplexity"] != pytest.approx(2 ** res["valid_loss"], rel=1e-3)


# ---- the gap, its SE, its share, where it starts ----------------------------------


def _row(head_dim, scale, seed, ppl, lr=None, status="done"):
    return {"head_dim": head_dim, "scale": scale, "seed": seed, "lr": lr, "valid_ppl": ppl, "status": status}


def test_gap_share_is_over_the_scaled_models_perplexity():
    rows = [_row(64, "inv_sqrt_d", 0, 12.0), _row(64, "none", 0, 15.0)]
    table = gap_tables.gap_table(rows)
    (r,) = table["rows"]
    assert (r["gap"], r["gap_se"], r["reference_ppl"], r["baseline_ppl"]) == (3.0, None, 12.0, 15.0)
    assert r["share"] == pytest.approx(0.25)  # 3 / 12 (÷ the baseline's 15 would be 0.20)
    assert gap_tables.share_by_head_dim(table) == {64: pytest.approx(0.25)}


def test_gap_counts_where_its_t_interval_clears_zero():
    # per-seed differences 2 and 4: gap 3, sample std sqrt(2), SE 1. With 2 seeds (1 df) the 95% interval
    # is 3 ± 12.706: it reaches 0, so the gap is undecided (it was "> 2 SE", a 30% false-positive rule)
    rows = [_row(128, "inv_sqrt_d", 0, 10.0), _row(128, "none", 0, 12.0),
            _row(128, "inv_sqrt_d", 1, 20.0), _row(128, "none", 1, 24.0)]
    (r,) = gap_tables.gap_table(rows)["rows"]
    assert (r["gap"], r["seeds"]) == (3.0, 2) and r["gap_se"] == pytest.approx(1.0)
    assert r["counts"] is None
    # three seeds, differences 2, 3, 4: gap 3, SE 1/sqrt(3) = 0.577; 4.303 · 0.577 = 2.484 < 3: a gap
    rows += [_row(128, "inv_sqrt_d", 2, 30.0), _row(128, "none", 2, 33.0)]
    (r,) = gap_tables.gap_table(rows)["rows"]
    assert r["gap_se"] == pytest.approx(1 / math.sqrt(3)) and r["counts"] is True


def test_a_gap_under_one_point_or_not_beyond_its_noise_does_not_count():
    # differences 1 and 3: gap 2 > 1 point, SE 1, interval 2 ± 12.7: undecided, not a gap
    at_2se = [_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, 11.0),
              _row(64, "inv_sqrt_d", 1, 10.0), _row(64, "none", 1, 13.0)]
    (r,) = gap_tables.gap_table(at_2se)["rows"]
    assert (r["gap"], r["gap_se"], r["counts"]) == (2.0, 1.0, None)
    # one seed, a gap of exactly 1 point: not above the threshold
    (r,) = gap_tables.gap_table([_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, 11.0)])["rows"]
    assert (r["gap"], r["counts"]) == (1.0, False)
    (r,) = gap_tables.gap_table([_row(64, "inv_sqrt_d", 0, 10.0), _row(64, "none", 0, 11.25)])["rows"]
    assert (r["gap"], r["counts"]) == (1.25, True)


def test_where_large_starts_by_hand():
    # gaps by width, one seed: 32: 0.5, 64: 1.5, 128: 4, 256: 17 -> counts F T T T: starts at 64
    gaps = {32: 0.5, 64: 1.5, 128: 4.0, 256: 17.0}
    rows = [x for d, g in gaps.items() for x in (_row(d, "inv_sqrt_d", 0, 8.0), _row(d, "none", 0, 8.0 + g))]
    table = gap_tables.gap_table(rows)
    assert [r["counts"] for r in table["rows"]] == [False, True, True, True]
    assert table["gap_starts_at"] == gap_tables.first_start(table) == 64
    assert table["threshold_ppl"] == 1.0
    assert gap_tables.gap_by_head_dim(table) == {d: (pytest.approx(g), None, 1) for d, g in gaps.items()}
    assert gap_tables.share_by_head_dim(table) == {d: pytest.approx(g / 8.0) for d, g in gaps.items()}
    # the widest width not counting: nothing starts, whatever the narrower ones say
    rows[-1] = _row(256, "none", 0, 8.5)
    assert gap_tables.gap_table(rows)["gap_starts_at"] is None


def test_gap_table_rule_names_the_numbers_it_applies():
    assert gap_tables.GAP_THRESHOLD_PPL == 1.0
    assert "1 ppl" in gap_tables.GAP_RULE and "95% t interval above 0" in gap_tables.GAP_RULE


# ---- learning-rate sensitivity on a hand-built grid -------------------------------


def test_lr_sensitivity_on_a_hand_built_grid():
    cells = {  # (lr, seed): (final loss or None if diverged, loss at init)
        (1e-3, 0): (3.0, 4.0), (1e-2, 0): (2.0, 4.0), (1e-1, 0): (5.0, 4.0),   # capped 3, 2, 4: best 2; mean(1, 0, 2) = 1
        (1e-3, 1): (3.5, 4.2), (1e-2, 1): (2.5, 4.2), (1e-1, 1): (None, 4.2),  # capped 3.5, 2.5, 4.2: mean(1, 0, 1.7) = 0.9
    }
    s = sa.sensitivity(cells)
    assert s["sensitivity"] == pytest.approx(0.95)
    assert s["sensitivity_se"] == pytest.approx(0.05)  # std of (1, 0.9) = 0.1/sqrt 2, over sqrt 2
    assert s["best_loss"] == pytest.approx(2.25) and s["best_loss_se"] == pytest.approx(0.25)
    assert s["best_lr"] == 1e-2  # mean finals: 3.25, 2.25, 5.0 (seed 0 only)
    assert (s["seeds"], s["runs"], s["diverged"], s["lrs"]) == (2, 6, 1, [1e-3, 1e-2, 1e-1])
    assert [p["sensitivity"] for p in s["per_seed"]] == [pytest.approx(1.0), pytest.approx(0.9)]
    curve = sa.loss_curve(cells)
    assert [(c["lr"], c["runs"], c["diverged"]) for c in curve] == [(1e-3, 2, 0), (1e-2, 2, 0), (1e-1, 2, 1)]
    assert [c["mean"] for c in curve] == [pytest.approx(3.25), pytest.approx(2.25), pytest.approx(5.0)]
    assert curve[0]["se"] == pytest.approx(0.25) and curve[2]["se"] is None


def test_a_seed_missing_a_learning_rate_is_left_out_of_the_sensitivity():
    cells = {(1e-3, 0): (3.0, 4.0), (1e-2, 0): (2.0, 4.0), (1e-3, 1): (9.0, 9.0)}
    s = sa.sensitivity(cells)
    assert s["seeds"] == 1 and s["sensitivity"] == pytest.approx(0.5) and s["sensitivity_se"] is None


# ---- scheme factors, with scores below the caps ------------------------------------


@pytest.mark.parametrize("name, factor", [("none", 1.0), ("inv_sqrt_d", 0.25), ("inv_d", 1 / 16),
                                          ("qk_norm", 0.25), ("softcap", 0.25), ("learned_temp", 0.25)])
def test_each_scheme_multiplies_by_its_factor_at_d16(name, factor):
    scheme = get_scale(name, 16)
    assert float(torch.as_tensor(scheme.factor()).detach()) == pytest.approx(factor, rel=1e-6)


def test_softcap_divides_by_sqrt_d_before_the_cap():
    # q·k = 16 at d = 16: 1/sqrt(d) gives 4, and 50·tanh(4/50) = 3.9915; a factor of 1
    # would give 50·tanh(16/50) = 15.48
    q = torch.ones(1, 16)
    k = torch.ones(1, 16)
    s = get_scale("softcap", 16)
    assert float(s.pair_scores(q, k)[0]) == pytest.approx(50 * math.tanh(4 / 50), rel=1e-6)
    assert float(s.scores(q[None, None], k[None, None])[0, 0, 0, 0]) == pytest.approx(50 * math.tanh(4 / 50), rel=1e-6)
    # far above the cap the scores stay under 50
    assert float(s.pair_scores(q * 100, k * 100)[0]) == pytest.approx(50.0, rel=1e-6)


def test_qk_norm_bounds_the_score_by_sqrt_d():
    # q and k parallel: RMS-normalised to length sqrt(d) = 4; q'·k' = 16, times 1/4 = 4, whatever their size
    q = torch.full((1, 16), 7.0)
    k = torch.full((1, 16), 0.5)  # far above eps (1e-6), which would shrink a tiny k
    with torch.no_grad():  # the learned gains need no graph here
        assert float(get_scale("qk_norm", 16).pair_scores(q, k)[0]) == pytest.approx(4.0, rel=1e-4)


# ---- rows at the frozen threshold, in the float type compared ----------------------


def _rows_at_threshold(dtype=torch.float32):
    """Three rows over 2 keys: max exactly 0.99 in ``dtype``, the next float above it, 0.5."""
    at = torch.tensor(0.99, dtype=dtype)
    above = torch.nextafter(at, torch.tensor(1.0, dtype=dtype))
    return torch.stack([torch.stack([at, 1 - at]), torch.stack([above, 1 - above]),
                        torch.tensor([0.5, 0.5], dtype=dtype)])


def test_a_row_whose_max_is_exactly_the_threshold_is_not_frozen():
    p = _rows_at_threshold()
    assert D.FROZEN_THRESHOLD == 0.99
    assert D.frozen_fraction(p[:1]) == 0.0
    assert D.frozen_fraction(p[1:2]) == 1.0
    assert D.frozen_fraction(p) == pytest.approx(1 / 3)
    assert D.row_summary(p)["frozen_fraction"] == pytest.approx(1 / 3)


def test_the_reduction_applies_the_same_strict_threshold():
    """A row's max weight exactly at the threshold is not frozen in the per-head reduction either: scores (0, 0)
    give weights of exactly 1/2, (ln 3, 0) give 3/4; at threshold 1/2, one row of the two is frozen."""
    from attnscale.capture.reduce import reduce_scores

    scores_BHTT = torch.tensor([[[[0.0, 0.0], [math.log(3.0), 0.0]]]])
    assert reduce_scores(scores_BHTT, threshold=0.5).measures()[3].tolist() == [0.5]


def test_min_keys_and_frozen_head_share_by_value():
    assert (D.MIN_KEYS, D.FROZEN_HEAD_SHARE) == (2, 0.5)
    # a row that sees one key is left out; a row that sees two counts
    keep = torch.tensor([[True, False], [True, True]])
    assert D.counted_rows(keep).tolist() == [False, True]


# ---- the recording: a batch larger than the sequences it records ------------------


def test_recording_measures_the_first_four_sequences_of_a_larger_batch():
    model = _model()
    x_BT = _ids(6 * 8, seed=3).view(6, 8)
    with hooked(model, ["*hook_scores", "*hook_pattern"]) as cache:
        model(x_BT)
    with recording(model, True, 0.99, TrainConfig().record_sequences) as rec:
        model(x_BT)
    (_,), row = read_back(rec, torch.zeros(()))
    assert TrainConfig().record_sequences == 4
    for layer in range(2):
        s, p = cache[f"blocks.{layer}.attn.hook_scores"], cache[f"blocks.{layer}.attn.hook_pattern"]
        four = head_summary(s[:4], p[:4])
        six = head_summary(s, p)
        assert row["spread"][layer] == pytest.approx(four["spread"], rel=1e-5)
        assert row["effective_words"][layer] == pytest.approx(four["effective_words"], rel=1e-5)
        assert row["spread"][layer] != pytest.approx(six["spread"], rel=1e-5)


# ---- the resume identity of a corpus -----------------------------------------------


def test_a_corpus_is_known_by_its_hash_tokenizer_vocabulary_and_both_split_sizes():
    corpus = {"name": "wikitext-2", "path": "/a", "tokenizer": "word", "vocab_size": 100,
              "train_tokens": 1000, "valid_tokens": 100, "sha256": "ab" * 32}
    cfg = {"model": {"head_dim": 4}, "train": {"steps": 3, "threads": 1}, "corpus": corpus}
    same = {**cfg, "corpus": {**corpus, "name": "folder", "path": "/b"}, "train": {"steps": 3, "threads": 2}}
    assert comparable_config(cfg) == comparable_config(same)
    assert comparable_config(cfg)["corpus"] == {"sha256": "ab" * 32, "tokenizer": "word", "vocab_size": 100,
                                                "train_tokens": 1000, "valid_tokens": 100}
    for key, other in (("valid_tokens", 101), ("train_tokens", 999), ("sha256", "cd" * 32),
                       ("tokenizer", "bpe"), ("vocab_size", 99)):
        assert comparable_config(cfg) != comparable_config({**cfg, "corpus": {**corpus, key: other}}), key


# ---- preset budgets, pinned against the words of the README and the docs pages that hold them -------


def _words(name: str) -> str:
    return " ".join((README.parent / name).read_text(encoding="utf-8").split())


def test_presets_match_what_the_readme_says():
    from attnscale.lm.presets import LARGE_VOCAB, budget

    # each figure where a reader meets it: the README, the install page, the results page, the measurements page
    readme, started, results, measures = (_words(n) for n in ("README.md", "docs/getting-started.md",
                                                                "docs/results.md", "docs/measurements.md"))
    default, quick, full = budget("default"), budget("quick"), budget("full")
    # "perplexity ... on the held-out split: all of it in `reproduce`, its first 8 batches in `reproduce --quick`"
    assert "all of it in `reproduce`, its first 8 batches in `reproduce --quick`" in measures
    assert default.train.eval_batches is None and full.train.eval_batches is None
    assert quick.train.eval_batches == 8
    # "the default (`attnscale reproduce`: 400 steps a run, seed 0 ..." and "--full: ... 1,200 steps a run, seeds 0, 1 and 2"
    assert "400 steps a run, seed 0" in results and "1,200 steps a run, seeds 0, 1 and 2" in results
    assert "1,200 steps a run, 3 seeds" in started and "(`--full`, 1,200 steps, 3 seeds)" in readme
    assert (default.train.steps, default.seeds, default.train.seed) == (400, 1, 0)
    assert (full.train.steps, full.seeds) == (1200, 3)
    # "(post-LN, 2 layers, 4 heads, d_model 64": and "400 steps of 16 × 64 tokens"
    assert "post-LN, 2 layers, 4 heads, d_model 64" in results and "400 steps of 16 × 64 tokens" in results
    assert "(post-LN, 2 layers, 4 heads, d_model 64, head width d set apart)" in readme
    assert {k: default.model[k] for k in ("norm", "n_layers", "n_heads", "d_model", "context")} == \
        {"norm": "post", "n_layers": 2, "n_heads": 4, "d_model": 64, "context": 64}
    assert default.train.batch == 16 and full.train.batch == 16
    # every preset records every 10 steps; a word-level vocabulary (> 8,192) halves the default batch
    assert {b.train.record_every for b in (default, quick, full)} == {10}
    assert LARGE_VOCAB == 8192
    assert budget("default", 8193).train.batch == 8 and budget("default", 8192).train.batch == 16
