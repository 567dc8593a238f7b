"""Corpora and tokenizers: the text a tiny language model trains and is evaluated on.

``load_corpus(spec)`` gives a training split and a held-out split of token ids,
with the sha256 of the raw training text (recorded in every run). ``spec`` is:

- ``"default"`` (alias ``"pydoc"``), what every command trains on unless told
  otherwise: embedded in the package, no download, checked against its sha256 at
  load. It is the Python Language Reference as CPython 3.11.7 ships it for
  ``help()`` (``Lib/pydoc_data/topics.py``, PSF License; the licence travels with
  it in ``corpora/pydoc_topics.LICENSE.txt``), tokenized by ``char`` unless told
  otherwise, which needs no optional extra. Its size and how it was built: the
  README's "Corpora".
- ``"wikitext-2"`` (Merity et al. 2016, CC BY-SA 3.0; the tokenized v1 copy in
  pytorch/examples) or ``"tinyshakespeare"`` (Karpathy's char-rnn, public-domain
  text): downloaded on first use, checked against a known sha256, cached.
- a path: a UTF-8 text file, or a folder with ``train.txt`` and ``valid.txt``
  (optional ``test.txt``; ``wiki.train.tokens``-style names work too). A local
  copy whose training text matches a named corpus byte for byte gets that name.

A single file (the default corpus, Tiny Shakespeare, any local file) is split
by characters: the first 90% trains, the last 10% is held out, as nanoGPT does.

Tokenizers (``TOKENIZERS``), all fitted on the training split only, so held-out
text never shapes the vocabulary; held-out symbols unseen in training map to an
unknown id (``<unk>`` for words, U+FFFD for characters):
- ``word``: PyTorch word_language_model's rule, whitespace split plus ``<eos>``
  per line; ids in order of first appearance in the training text.
- ``char``: one id per character, sorted; the unknown id is counted in
  ``vocab_size`` (66 for Tiny Shakespeare, where nanoGPT reports 65).
- ``bpe``: byte-level BPE from Hugging Face ``tokenizers`` (extra
  ``attnscale[train]``), cached by training-text hash and vocabulary size.

Cache (``$ATTNSCALE_CACHE``, else ``$XDG_CACHE_HOME/attnscale``, else
``~/.cache/attnscale``): ``<name>/<file>`` downloads, ``bpe/*.json`` fitted BPE
models, ``tokens/*.pt`` tokenized ids, so a repeated load costs one read and
one hash. Every write goes to a temp file renamed into place.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tempfile
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

import torch

from attnscale.errors import ConfigError
from attnscale.files import atomic_write_bytes
from attnscale.lm.vocab import Bpe, Vocab

__all__ = ["Corpus", "Source", "SOURCES", "TOKENIZERS", "load_corpus", "batches", "eval_batches",
           "check_length", "cache_root", "corpus_names"]

TOKENIZERS = ("word", "char", "bpe")
TRAIN_FRACTION = 0.9  # single-file corpora: first 90% of the characters train
MIRROR_ENV = "ATTNSCALE_MIRROR"  # fetch named corpora from $ATTNSCALE_MIRROR/<name>/<file> instead
DOWNLOAD_TIMEOUT_S = 60
_FORMAT = 1  # bump when a tokenizer's rule or the token-cache layout changes
DEFAULT_FILE, DEFAULT_SHA256 = "pydoc_topics.txt.gz", "47a217db09a150d521ac1015e4bb381141807d46980da61007841e5ce32a611c"
_ALIASES = {"pydoc": "default"}
_SPLITS = {"train": ("train",), "valid": ("valid", "validation", "val"), "test": ("test",)}


@dataclass(frozen=True)
class Source:
    """A named public corpus: where its files live and their sha256 (training file first)."""

    url: str  # base URL; a file's URL is url + its name
    files: dict[str, str]  # file name -> sha256
    tokenizer: str  # default tokenizer

    def local_hint(self, name: str) -> str:
        """How to point at a local copy instead, in CLI terms."""
        if len(self.files) == 1:
            return f"--corpus /path/to/{next(iter(self.files))}"
        return f"--corpus /path/to/{name}/ (a folder with {', '.join(self.files)})"


SOURCES: dict[str, Source] = {
    "wikitext-2": Source(
        "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2/",
        {"train.txt": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
         "valid.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
         "test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"},
        "word"),
    "tinyshakespeare": Source(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
        {"input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
        "char"),
}


def corpus_names() -> list[str]:
    return ["default", *_ALIASES, *sorted(SOURCES)]


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """``cache_dir``, else ``$ATTNSCALE_CACHE``, else ``$XDG_CACHE_HOME/attnscale``, else ``~/.cache/attnscale``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("ATTNSCALE_CACHE"):
        return Path(os.environ["ATTNSCALE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "attnscale"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _decode(raw: bytes, where: str) -> str:
    """UTF-8 text of a corpus file; ConfigError for an empty or binary one."""
    if not raw or raw.isspace():
        raise ConfigError(f"corpus file {where} is empty; give a file with text in it")
    if b"\x00" in raw:
        raise ConfigError(f"corpus file {where} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"corpus file {where} is not UTF-8 text (invalid byte at offset {e.start}); "
                          f"convert it first, e.g. iconv -t UTF-8") from None


def _read(path: Path) -> tuple[str, str]:
    """(text, sha256 of the bytes) of a corpus file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read corpus file {path}: {e.strerror}") from None
    return _decode(raw, str(path)), _sha256(raw)


def _split(text: str, where: str) -> tuple[str, str]:
    cut = int(len(text) * TRAIN_FRACTION)
    if cut == 0 or cut == len(text):
        raise ConfigError(f"corpus {where} has only {len(text)} characters, too few to split 90/10 "
                          f"into training and held-out text; give a longer file")
    return text[:cut], text[cut:]


def _download(url: str, dest: Path, expected: str, name: str) -> None:
    """Stream ``url`` to a temp file beside ``dest``, hashing as it goes; rename into place only if the hash matches."""
    hint = f"point at a local copy instead: {SOURCES[name].local_hint(name)}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as e:
        raise ConfigError(f"cannot write to the cache folder {dest.parent} ({e.strerror}); "
                          f"set ATTNSCALE_CACHE to a writable folder") from None
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    while chunk := response.read(1 << 20):
                        digest.update(chunk)
                        f.write(chunk)
            except Exception as e:  # URLError, HTTPError, timeouts, resets: all mean "no file"
                reason = getattr(e, "reason", None) or e
                raise ConfigError(f"download of {name} failed ({url}: {reason}); {hint}") from None
        if digest.hexdigest() != expected:
            raise ConfigError(f"download of {name} is corrupt ({url}): sha256 expected {expected}, "
                              f"got {digest.hexdigest()}; not cached. Try again, or {hint}")
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _fetch(name: str, cache_dir) -> dict[str, str]:
    """Text of each file of a named corpus, from the cache or downloaded (a bad cached copy is fetched again)."""
    source, folder = SOURCES[name], cache_root(cache_dir) / name
    mirror = os.environ.get(MIRROR_ENV)
    base = f"{mirror.rstrip('/')}/{name}/" if mirror else source.url
    texts = {}
    for fname, expected in source.files.items():
        path = folder / fname
        if path.is_file():  # verified bytes are the published file, so they need no other check
            raw = path.read_bytes()
            if _sha256(raw) == expected:
                texts[fname] = raw.decode("utf-8")
                continue
        _download(base + fname, path, expected, name)
        texts[fname] = _read(path)[0]
    return texts


def _find(folder: Path, split: str) -> Path | None:
    for stem in _SPLITS[split]:
        for pattern in ("{}.txt", "wiki.{}.tokens", "{}.tokens", "wiki.{}.raw", "{}.raw"):
            if (folder / pattern.format(stem)).is_file():
                return folder / pattern.format(stem)
    return None


def _resolve(spec: str, cache_dir) -> tuple[str, str, dict[str, str]]:
    """(name, default tokenizer, {"train", "valid"[, "test"]: text}) for a corpus spec."""
    name = _ALIASES.get(spec, spec)
    if name == "default":
        raw = gzip.decompress((resources.files("attnscale.lm") / "corpora" / DEFAULT_FILE).read_bytes())
        if _sha256(raw) != DEFAULT_SHA256:
            raise ConfigError(f"the packaged default corpus is damaged (sha256 {_sha256(raw)}, "
                              f"expected {DEFAULT_SHA256}); reinstall attnscale")
        return "default", "char", dict(zip(("train", "valid"), _split(raw.decode("utf-8"), "default")))
    if name in SOURCES:
        files = _fetch(name, cache_dir)
        if len(files) == 1:
            return name, SOURCES[name].tokenizer, dict(zip(("train", "valid"), _split(*files.values(), name)))
        return name, SOURCES[name].tokenizer, dict(zip(("train", "valid", "test"), files.values()))
    path = Path(spec).expanduser()
    if not path.exists():
        if not any(c in spec for c in "/\\~." + os.sep):
            raise ConfigError(f"unknown corpus {spec!r}; use one of {', '.join(corpus_names())}, "
                              f"or the path to a UTF-8 text file or a folder with train.txt and valid.txt")
        raise ConfigError(f"corpus path {spec} does not exist; give a UTF-8 text file, a folder with "
                          f"train.txt and valid.txt, or a named corpus ({', '.join(corpus_names())})")
    if path.is_dir():
        found = {split: _find(path, split) for split in _SPLITS}
        if found["train"] is None or found["valid"] is None:
            raise ConfigError(f"corpus folder {spec} needs train.txt and valid.txt (or wiki.train.tokens and "
                              f"wiki.valid.tokens); give those, or the path to a single text file")
        read = {split: _read(p) for split, p in found.items() if p is not None}
        texts, shas = {split: text for split, (text, _) in read.items()}, [sha for _, sha in read.values()]
    else:
        text, sha = _read(path)
        texts, shas = dict(zip(("train", "valid"), _split(text, spec))), [sha]
    # A byte-for-byte copy of a named corpus (its training and held-out files) is that
    # corpus, with its name and tokenizer: runs then compare across machines.
    for known, source in SOURCES.items():
        published = list(source.files.values())
        if shas == published[: len(shas)] and len(shas) >= min(len(published), 2):
            return known, source.tokenizer, texts
    return spec, "char", texts


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no single truth value
class Corpus:
    """Token ids of a corpus's training and held-out splits; ``codec`` encodes and decodes text."""

    name: str
    tokenizer: str
    vocab_size: int
    train: torch.Tensor = field(repr=False)  # 1-D int64
    valid: torch.Tensor = field(repr=False)  # 1-D int64
    sha256: str  # of the raw training text (UTF-8)
    test: torch.Tensor | None = field(default=None, repr=False)  # where the corpus has a test split
    codec: Vocab | Bpe | None = field(default=None, repr=False)

    def describe(self) -> dict:
        return {"name": self.name, "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                "train_tokens": len(self.train), "valid_tokens": len(self.valid), "sha256": self.sha256}

    def encode(self, text: str) -> torch.Tensor:
        return torch.from_numpy(self.codec.encode(text))

    def decode(self, ids) -> str:
        return self.codec.decode(ids)


def load_corpus(spec: str = "default", tokenizer: str | None = None, *, bpe_vocab: int = 4096,
                cache_dir: Path | None = None) -> Corpus:
    """Load a named corpus or a local path (see the module docstring) and tokenize it.

    Tokenized ids are cached under ``cache_root(cache_dir)/tokens``, keyed by the
    hashes of every split, the tokenizer and its vocabulary size."""
    if tokenizer is not None and tokenizer not in TOKENIZERS:
        raise ConfigError(f"unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}")
    if tokenizer == "bpe" and bpe_vocab < 257:
        raise ConfigError(f"bpe_vocab must be more than 256 (the byte alphabet), got {bpe_vocab}")
    name, default_tokenizer, texts = _resolve(str(spec), cache_dir)
    tokenizer = tokenizer or default_tokenizer
    hashes = {split: _sha256(text.encode("utf-8")) for split, text in texts.items()}
    root = cache_root(cache_dir)
    key = _sha256(repr((_FORMAT, tokenizer, bpe_vocab if tokenizer == "bpe" else 0, sorted(hashes.items()))).encode())
    path = root / "tokens" / f"{key[:32]}.pt"
    saved = _load_tokens(path, tokenizer, texts)
    if saved is None:
        if tokenizer == "bpe":
            codec = _fit_bpe(texts["train"], hashes["train"], bpe_vocab, root)
        else:
            codec = Vocab.fit(tokenizer, texts["train"])
        ids = {split: torch.from_numpy(codec.encode(text)) for split, text in texts.items()}
        # int32 on disk halves the file; every vocabulary here is far below 2**31.
        buffer = io.BytesIO()
        torch.save({"codec": codec.state(), **{split: t.int() for split, t in ids.items()}}, buffer)
        try:
            atomic_write_bytes(path, buffer.getvalue())
        except OSError:
            pass  # a read-only cache only costs a re-tokenization next time
    else:
        codec, ids = saved
    return Corpus(name, tokenizer, codec.size, ids["train"], ids["valid"], hashes["train"], ids.get("test"), codec)


def _fit_bpe(text: str, text_sha256: str, vocab: int, root: Path) -> Bpe:
    """Fit BPE on the training text, or reuse the fit cached for this text and size."""
    path = root / "bpe" / f"{text_sha256[:20]}-{vocab}.json"
    if path.exists():
        return Bpe(path.read_text(encoding="utf-8"))
    bpe = Bpe.fit(text, vocab)
    try:
        atomic_write_bytes(path, bpe.json.encode("utf-8"))
    except OSError:
        pass  # a read-only cache only costs a refit next time
    return bpe


def _load_tokens(path: Path, tokenizer: str, texts: dict):
    """(codec, ids per split) from the token cache, or None when absent or unreadable."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, weights_only=True)
        codec = Bpe(saved["codec"]["json"]) if tokenizer == "bpe" else Vocab(tokenizer, saved["codec"]["itos"])
        return codec, {split: saved[split].long() for split in texts}
    except (OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError):
        return None  # a damaged cache file is rebuilt, never trusted


def check_length(ids: torch.Tensor, context: int, what: str = "corpus") -> None:
    """Raise ConfigError unless ``ids`` holds more than one context (one window plus its shifted target)."""
    if context < 1:
        raise ConfigError(f"context must be a positive integer, got {context}")
    if ids.ndim != 1 or len(ids) <= context:
        raise ConfigError(f"the {what} has {ids.numel()} tokens, not more than one context of {context}; "
                          f"use a shorter --context or a longer corpus")


def batches(ids: torch.Tensor, batch: int, context: int,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One random batch ``(x_BT, y_BT)`` of windows from ``ids``; ``y`` is ``x`` shifted by one token.

    Window starts are uniform over every position that leaves room for the
    target, drawn from ``generator`` alone, so a seeded generator repeats them."""
    check_length(ids, context)
    if batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch}")
    starts_B = torch.randint(len(ids) - context, (batch,), generator=generator, device=generator.device)
    idx_BT = (starts_B[:, None] + torch.arange(context, device=starts_B.device)).to(ids.device)
    return ids[idx_BT], ids[idx_BT + 1]


def eval_batches(ids: torch.Tensor, batch: int, context: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping windows over held-out ``ids`` in order, ``batch`` windows at a time.

    Every token after the first is a target exactly once: full windows of
    ``context`` first, then one shorter ``(1, r)`` window for the remainder
    (as PyTorch's word_language_model evaluates). So perplexity is
    exp(sum of token losses / (len(ids) - 1)), summing over all batches."""
    check_length(ids, context)
    if batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch}")
    n = (len(ids) - 1) // context
    x_NT, y_NT = ids[: n * context].view(n, context), ids[1 : n * context + 1].view(n, context)
    for i in range(0, n, batch):
        yield x_NT[i : i + batch], y_NT[i : i + batch]
    if n * context < len(ids) - 1:
        yield ids[n * context : -1][None], ids[n * context + 1 :][None]
