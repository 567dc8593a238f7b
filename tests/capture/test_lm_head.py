"""The probe spares the LM head it never reads: a transformers causal LM is asked for one position's logits a
sequence (``logits_to_keep=1``), its labels dropped, and the numbers are those of the whole forward."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from attnscale import watch  # noqa: E402
from attnscale.capture.probe import Inputs, one_logit  # noqa: E402


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).eval()


def _positions(model):
    """The positions the LM head is handed at each forward, read by a hook."""
    seen = []
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    return seen


@pytest.mark.parametrize("shape", ["dict with labels", "tensor", "Inputs"])
def test_the_lm_head_reads_one_position_and_the_numbers_are_the_whole_forwards(shape):
    model = _llama()
    ids = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    batch = {"dict with labels": {"input_ids": ids, "attention_mask": mask, "labels": ids},
             "tensor": ids, "Inputs": Inputs((ids,), {"attention_mask": mask})}[shape]
    seen = _positions(model)
    stats = watch.measure_heads(model, batch)
    assert seen == [1] and stats.lm_head == "logits_to_keep=1"  # one position a sequence, not 12
    whole = {"dict with labels": {"input_ids": ids, "attention_mask": mask, "logits_to_keep": 0},
             "tensor": Inputs((ids,), {"logits_to_keep": 0}),
             "Inputs": Inputs((ids,), {"attention_mask": mask, "logits_to_keep": 0})}[shape]
    asked = watch.measure_heads(model, whole)  # the batch's own logits_to_keep is left as it is: every position
    assert seen == [1, 12] and asked.lm_head == ""
    assert torch.equal(stats.values_LMH, asked.values_LMH) and torch.equal(stats.rows_LH, asked.rows_LH)


def test_a_model_without_logits_to_keep_runs_as_it_is():
    model = torch.nn.Linear(4, 4)
    batch = {"input": torch.ones(2, 4)}
    assert one_logit(model, batch) == (batch, "")


def test_the_watch_record_says_the_lm_head_was_spared(tmp_path):
    from attnscale.watch.logs.line import read_log
    from attnscale.watch.logs.sinks import JsonlSink

    model = _llama()
    ids = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    with watch.Watch(model, every=1, probe={"input_ids": ids}, alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")]) as w:
        w.step(1)
    assert {line.probe.get("lm_head") for line in read_log(tmp_path / "w.jsonl")} == {"logits_to_keep=1"}
