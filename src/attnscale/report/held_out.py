"""The corpus a group of runs trained on, loaded again where this machine has it, and held-out
sequences from it: for figures read from held-out text after training (a unigram model's loss,
the frozen share by threshold from final weights). Nothing here trains or writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["corpus_of", "sequences"]


def corpus_of(runs: Sequence[Any]):
    """The ``lm.data.Corpus`` every run of ``runs`` (``runs.record.TrainRun``) trained on, or None where
    they used several, or it cannot be loaded here (a named corpus not in this machine's cache, a local
    file moved), or it is not the one the records name (another sha256)."""
    from attnscale.runs.runner import CorpusSpec

    named = {(t.corpus.get("name"), t.corpus.get("tokenizer"), t.corpus.get("sha256")) for t in runs}
    if len(named) != 1:
        return None
    name, tokenizer, sha = next(iter(named))
    try:
        corpus = CorpusSpec(name, tokenizer).load()
    except Exception:  # offline or moved: the figure is skipped, and the report says nothing of it
        return None
    return corpus if corpus.sha256 == sha else None


def sequences(corpus, n: int, length: int) -> torch.Tensor:
    """The first ``n`` consecutive, non-overlapping sequences of ``length`` tokens of the held-out
    split (fewer where it is shorter), as an n × length LongTensor."""
    ids = corpus.valid.long()
    n = min(n, len(ids) // length)
    return ids[: n * length].reshape(n, length)
