"""A Llama-shaped Hugging Face model small enough for a CPU, and the embedded corpus as its dataset.

Shared by ``hf_trainer.py``, ``benchmarks/watch_overhead.py`` and their tests. The model is
``LlamaForCausalLM`` from a ``LlamaConfig`` (no download): RoPE, RMSNorm, SwiGLU and grouped-query
attention (``kv_heads`` < ``heads``), as the models people train are shaped. The text is attnscale's
embedded corpus (the Python Language Reference that ships with CPython), one token per character.
"""

from __future__ import annotations

import torch

from attnscale.lm.data import load_corpus


class Windows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``context`` tokens: the dict a causal LM takes (labels = input ids;
    the model shifts them itself)."""

    def __init__(self, ids: torch.Tensor, context: int):
        self.ids, self.context = ids, context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.ids[i * self.context:(i + 1) * self.context]
        return {"input_ids": x, "labels": x}


def corpus_windows(context: int) -> tuple[Windows, int]:
    """(training windows of the embedded corpus, vocabulary size)."""
    corpus = load_corpus("default")
    return Windows(corpus.train, context), corpus.vocab_size


def tiny_llama(vocab: int, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               head_dim: int | None = None, context: int = 64, seed: int = 0, unscaled: bool = False,
               init_std: float = 0.02):
    """A fresh ``LlamaForCausalLM``. ``unscaled=True`` sets every attention's ``scaling`` (the model's
    1/sqrt(head_dim)) to 1: the model the course warns about, for alerts to catch. ``init_std``: the
    weights' initial SD (Llama's 0.02 keeps q and k, hence every score, near 0 at first; about
    1/sqrt(hidden) gives q and k entries of unit variance, as Vaswani et al.'s footnote assumes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads,
                         max_position_embeddings=context, initializer_range=init_std,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    if unscaled:
        for layer in model.model.layers:
            layer.self_attn.scaling = 1.0
    return model
