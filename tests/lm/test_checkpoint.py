"""lm.checkpoint: what a run is known by (comparable_config) and what an unusable checkpoint says."""

from __future__ import annotations
import json

import pytest
import torch

from attnscale.lm.checkpoint import Checkpoint, comparable_config, run_config, save_weights


def test_execution_settings_are_dropped_wherever_they_are_present():
    assert comparable_config({"model": {"head_dim": 8}}) == {"model": {"head_dim": 8}}  # no train section at all
    assert comparable_config({"train": {"threads": 2, "steps": 5}}) == {"train": {"steps": 5}}  # only some present
    every = {"threads": 1, "checkpoint_every": 10, "device": "cuda", "attention": "fused", "lr": 0.1}
    assert comparable_config({"train": every}) == {"train": {"lr": 0.1}}


def test_a_corpus_keeps_whichever_identity_fields_it_has():
    assert comparable_config({"corpus": {"name": "a", "path": "/x", "sha256": "f" * 64}}) == {"corpus": {"sha256": "f" * 64}}
    assert comparable_config({"corpus": {"name": "a"}}) == {"corpus": {"name": "a"}}  # nothing to identify it by
    assert comparable_config({"corpus": None}) == {"corpus": None}
    assert comparable_config({"corpus": "default"}) == {"corpus": "default"}


@pytest.mark.parametrize("error, detail", [
    (RuntimeError("x" * 200 + "\nsecond line"), "RuntimeError: " + "x" * 120),  # the first line, cut at 120
    (EOFError(), "EOFError: no detail"),
])
def test_an_unreadable_checkpoint_says_why_in_one_line(tmp_path, monkeypatch, error, detail):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"torn")

    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "load", load)
    state, note = Checkpoint(path, {"train": {}}).load()
    assert state is None and note == f"checkpoint.pt could not be read ({detail}); trained from step 0"


def test_a_checkpoint_of_another_config_is_not_used(tmp_path):
    saved = Checkpoint(tmp_path / "checkpoint.pt", {"train": {"steps": 5, "threads": 1}})
    saved.save(step=3)
    # another thread count is the same run; another number of steps is not
    state, note = Checkpoint(saved.path, {"train": {"steps": 5, "threads": 2}}).load()
    assert note is None and state["step"] == 3
    state, note = Checkpoint(saved.path, {"train": {"steps": 6}}).load()
    assert state is None and note == "checkpoint.pt belongs to another configuration; trained from step 0"
    assert Checkpoint(tmp_path / "absent.pt", {}).load() == (None, None)
    saved.remove()
    assert not saved.path.exists()
    saved.remove()  # removing what is gone is fine


def test_a_coupled_config_written_with_head_dim_none_matches_its_number():
    # before a built ModelConfig always held the number, a coupled one recorded head_dim None:
    # its checkpoint still resumes a run of the same model
    old = {"model": {"d_model": 32, "n_heads": 4, "head_dim": None}, "train": {"steps": 3}}
    new = {"model": {"d_model": 32, "n_heads": 4, "head_dim": 8}, "train": {"steps": 3}}
    assert comparable_config(old) == comparable_config(new)
    assert comparable_config(old) != comparable_config({**new, "model": {**new["model"], "head_dim": 16}})


def test_a_model_config_without_a_head_dim_key_gets_none_filled_in():
    # only an explicit head_dim None is an old coupled config; a missing key is left missing
    cfg = {"model": {"d_model": 32, "n_heads": 4}, "train": {"steps": 3}}
    assert "head_dim" not in comparable_config(cfg)["model"]


def test_a_filled_head_dim_is_the_integer_quotient():
    old = {"model": {"d_model": 32, "n_heads": 4, "head_dim": None}}
    filled = comparable_config(old)["model"]["head_dim"]
    assert filled == 8 and type(filled) is int
    assert json.dumps(comparable_config(old)) == json.dumps({"model": {"d_model": 32, "n_heads": 4, "head_dim": 8}})


def test_run_config_holds_model_train_and_the_corpus_description():
    from attnscale.lm.data import Corpus
    from attnscale.lm.model import ModelConfig
    from attnscale.lm.train import TrainConfig

    corpus = Corpus(name="tiny", tokenizer="char", vocab_size=5, train=torch.arange(20) % 5,
                    valid=torch.arange(10) % 5, sha256="a" * 64)
    cfg = run_config(ModelConfig(vocab_size=5, context=4, d_model=8, n_layers=1, n_heads=2, head_dim=4),
                     TrainConfig(steps=3), corpus)
    assert set(cfg) == {"model", "train", "corpus"}
    assert cfg["corpus"] == {"name": "tiny", "tokenizer": "char", "vocab_size": 5, "train_tokens": 20,
                             "valid_tokens": 10, "sha256": "a" * 64}
    assert cfg["model"]["d_model"] == 8 and cfg["train"]["steps"] == 3


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(tmp_path, monkeypatch):
    # torch.save tags each storage with its device; tag them "cuda:0" as a GPU run's file would be
    import torch.serialization as ser

    saved = Checkpoint(tmp_path / "ckpt.pt", {"model": {"d_model": 8}})
    with monkeypatch.context() as m:
        m.setattr(ser, "location_tag", lambda storage: "cuda:0")
        saved.save(step=2, w=torch.tensor([1.0, 2.0]))
    state, why = Checkpoint(tmp_path / "ckpt.pt", {"model": {"d_model": 8}}).load()
    assert why is None
    assert state["w"].device.type == "cpu" and state["w"].tolist() == [1.0, 2.0]


def test_saved_weights_say_they_are_pytorch_tensors(tmp_path):
    from safetensors import safe_open

    model = torch.nn.Linear(3, 2)
    save_weights(model, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_tensor("weight"), model.weight.detach())
