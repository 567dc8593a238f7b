"""lm.checkpoint: what a run is known by (comparable_config) and what an unusable checkpoint says."""

from __future__ import annotations

import pytest
import torch

from attnscale.lm.checkpoint import Checkpoint, comparable_config


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
