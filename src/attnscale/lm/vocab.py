"""Tokenizers fitted on training text: word, char and byte-level BPE.

Pure text <-> ids; ``data.py`` does the reading and caching. Every vocabulary is
fitted on the training split only; held-out symbols unseen in training map to
an unknown id (``<unk>`` for words, U+FFFD for characters); byte-level BPE has
no unknowns.
"""

from __future__ import annotations

import itertools
import re
from typing import Iterator

import numpy as np
import torch

from attnscale.errors import ConfigError

__all__ = ["Vocab", "Bpe", "UNK"]

UNK = {"word": "<unk>", "char": "\ufffd"}


class Vocab:
    """A word- or character-level vocabulary fitted on training text; unseen symbols map to ``unk``."""

    def __init__(self, kind: str, itos: list[str]):
        self.kind, self.itos = kind, list(itos)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.unk = self.stoi[UNK[kind]]
        self.size = len(self.itos)

    @classmethod
    def fit(cls, kind: str, text: str) -> Vocab:
        if kind == "char":  # sorted by code point, the unknown symbol included, for encode's table
            return cls(kind, sorted(set(text) | {UNK["char"]}))
        words = list(dict.fromkeys(_words(text)))
        return cls(kind, words if UNK["word"] in words else [*words, UNK["word"]])

    def encode(self, text: str) -> np.ndarray:
        if self.kind == "word":
            return np.fromiter((self.stoi.get(w, self.unk) for w in _words(text)), dtype=np.int64)
        # Code points looked up in the sorted table: a 10 MB text in well under a second.
        table = np.array([ord(s) for s in self.itos], dtype=np.uint32)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        pos = np.searchsorted(table, codes).clip(max=len(table) - 1)
        return np.where(table[pos] == codes, pos, self.unk).astype(np.int64)

    def decode(self, ids) -> str:
        pieces = [self.itos[i] for i in torch.as_tensor(ids).tolist()]
        return "".join(pieces) if self.kind == "char" else re.sub(r" ?<eos> ?", "\n", " ".join(pieces))

    def state(self) -> dict:
        return {"kind": self.kind, "itos": self.itos}


def _words(text: str) -> Iterator[str]:
    """PyTorch word_language_model's tokens: each line split on whitespace, then ``<eos>``."""
    lines = text.split("\n")
    if lines[-1] == "":  # a final newline ends the last line; it does not start another
        lines.pop()
    for line in lines:
        yield from line.split()
        yield "<eos>"


def _lines(text: str) -> list[str]:
    """The text as lines that keep their newline: pieces BPE trains and encodes in parallel, joined losslessly."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


class Bpe:
    """Byte-level BPE (GPT-2 style): every byte is in the alphabet, so nothing is unknown and decode inverts encode."""

    kind = "bpe"

    def __init__(self, json: str):
        self.json, self.tok = json, _tokenizers().Tokenizer.from_str(json)
        self.size = self.tok.get_vocab_size()

    @classmethod
    def fit(cls, text: str, vocab: int) -> Bpe:
        tk = _tokenizers()
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_lines(text), trainer)
        return cls(tok.to_str())

    def encode(self, text: str) -> np.ndarray:
        encodings = self.tok.encode_batch(_lines(text))
        return np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tok.decode(torch.as_tensor(ids).tolist())

    def state(self) -> dict:
        return {"kind": "bpe", "json": self.json}


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError("the bpe tokenizer needs Hugging Face tokenizers: pip install -e '.[train]' in the clone") from None
    return tokenizers
