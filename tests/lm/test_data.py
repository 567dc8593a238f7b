"""Corpora, tokenizers and batching: offline default, download path, bad input, batch shapes."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import torch

from attnscale.lm import data
from attnscale.lm.data import batches, check_length, eval_batches, load_corpus
from attnscale.errors import ConfigError
from corpus_files import _closed_port, _private_cache, _write  # noqa: F401  (_private_cache: the autouse fixture)

WIKITEXT2_TRAIN_SHA = "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"


# small files in the corpora's formats, written for the tests (tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over a temp folder; ``requests`` lists the paths asked for."""
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", root, requests
    httpd.shutdown()
    httpd.server_close()


def _toy_source(monkeypatch, train: bytes, valid: bytes) -> None:
    files = {"train.txt": hashlib.sha256(train).hexdigest(), "valid.txt": hashlib.sha256(valid).hexdigest()}
    monkeypatch.setitem(data.SOURCES, "toy", data.Source("https://example.invalid/toy/", files, "word"))


# --- the embedded default corpus ---------------------------------------------------------


def test_default_corpus_loads_offline_and_is_real_text():
    raw = gzip.decompress((Path(data.__file__).parent / "corpora" / data.DEFAULT_FILE).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == data.DEFAULT_SHA256
    text = raw.decode("utf-8")
    assert len(text) > 100_000 and len(text.split()) > 50_000
    corpus = load_corpus("default")
    assert corpus.name == "default" and corpus.tokenizer == "char"
    assert len(corpus.train) + len(corpus.valid) == len(text)
    assert len(corpus.train) == int(0.9 * len(text))  # the documented 90/10 split by characters
    assert corpus.sha256 == hashlib.sha256(text[: len(corpus.train)].encode()).hexdigest()
    assert corpus.train.dtype == torch.int64 and corpus.train.ndim == 1
    assert int(corpus.train.max()) < corpus.vocab_size
    assert corpus.decode(corpus.valid) == text[len(corpus.train) :]  # char ids round-trip exactly
    assert load_corpus("pydoc").sha256 == corpus.sha256
    described = corpus.describe()
    assert set(described) == {"name", "tokenizer", "vocab_size", "train_tokens", "valid_tokens", "sha256"}
    assert described["train_tokens"] == len(corpus.train)


def test_repeated_load_comes_from_the_token_cache(tmp_path):
    first = load_corpus("default", "word", cache_dir=tmp_path / "c")
    assert list((tmp_path / "c" / "tokens").glob("*.pt"))
    again = load_corpus("default", "word", cache_dir=tmp_path / "c")
    assert torch.equal(first.train, again.train) and torch.equal(first.valid, again.valid)
    assert again.vocab_size == first.vocab_size and again.decode(again.valid[:50]) == first.decode(first.valid[:50])


# --- downloads: checksum, cache, offline ---------------------------------------------------


def test_download_is_verified_cached_and_reused(server, monkeypatch, tmp_path):
    url, root, requests = server
    train, valid = b"one two three four five\n" * 20, b"two three\n"
    _write(root / "toy", train_txt=train.decode(), valid_txt=valid.decode())
    _toy_source(monkeypatch, train, valid)
    monkeypatch.setenv(data.MIRROR_ENV, url)
    corpus = load_corpus("toy")
    assert corpus.name == "toy" and corpus.sha256 == hashlib.sha256(train).hexdigest()
    assert sorted(requests) == ["/toy/train.txt", "/toy/valid.txt"]
    assert (tmp_path / "cache" / "toy" / "train.txt").read_bytes() == train
    (root / "toy" / "train.txt").unlink()  # the second load must not need the server
    again = load_corpus("toy", "char")
    assert len(requests) == 2 and again.sha256 == corpus.sha256
    # A damaged cached copy is not trusted: it is fetched again.
    (tmp_path / "cache" / "toy" / "valid.txt").write_bytes(b"tampered\n")
    assert torch.equal(load_corpus("toy").valid, corpus.valid) and requests[-1] == "/toy/valid.txt"


def test_corrupted_download_is_rejected_and_not_cached(server, monkeypatch, tmp_path):
    url, root, requests = server
    train, valid = b"the real training text\n" * 10, b"valid\n"
    _write(root / "toy", train_txt="the real training text, altered in transit\n", valid_txt="valid\n")
    _toy_source(monkeypatch, train, valid)
    monkeypatch.setenv(data.MIRROR_ENV, url)
    with pytest.raises(ConfigError, match="sha256") as err:
        load_corpus("toy")
    message = str(err.value)
    assert "\n" not in message and hashlib.sha256(train).hexdigest() in message
    assert hashlib.sha256(b"the real training text, altered in transit\n").hexdigest() in message
    assert requests == ["/toy/train.txt"]
    cached = tmp_path / "cache" / "toy"
    assert not cached.exists() or not any(cached.iterdir())  # neither the file nor a temp file stays


def test_offline_download_says_how_to_use_a_local_copy():
    with pytest.raises(ConfigError, match=r"download of wikitext-2 failed.*--corpus /path/to/wikitext-2/") as err:
        load_corpus("wikitext-2")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"--corpus /path/to/input\.txt"):
        load_corpus("tinyshakespeare")


def test_http_error_is_a_config_error(server, monkeypatch):
    url, _, _ = server
    monkeypatch.setenv(data.MIRROR_ENV, url)  # the server has no such file: 404
    with pytest.raises(ConfigError, match="download of tinyshakespeare failed"):
        load_corpus("tinyshakespeare")
    monkeypatch.setenv(data.MIRROR_ENV, f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ConfigError, match="download of tinyshakespeare failed"):
        load_corpus("tinyshakespeare")


def _as_published(monkeypatch, name: str, folder: Path) -> None:
    """Make the fixture files in ``folder`` the published files of corpus ``name`` (their sha256)."""
    source = data.SOURCES[name]
    shas = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in source.files}
    monkeypatch.setitem(data.SOURCES, name, data.Source(source.url, shas, source.tokenizer))


def test_tinyshakespeare_through_the_download_path(server, monkeypatch):
    url, root, requests = server
    text = (FIXTURES / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (root / "tinyshakespeare").mkdir()
    (root / "tinyshakespeare" / "input.txt").write_text(text, encoding="utf-8")
    _as_published(monkeypatch, "tinyshakespeare", FIXTURES / "tinyshakespeare")
    monkeypatch.setenv(data.MIRROR_ENV, url)
    corpus = load_corpus("tinyshakespeare")
    assert requests == ["/tinyshakespeare/input.txt"]
    # char level; 42 characters in the text and one id for a character never seen
    assert (corpus.name, corpus.tokenizer, corpus.vocab_size) == ("tinyshakespeare", "char", 43)
    assert (len(corpus.train), len(corpus.valid)) == (618, 69)  # 90/10 of 687 characters
    assert corpus.decode(corpus.train[:16]) == "First Gardener:\n"


def test_local_wikitext2_is_recognised_by_its_hash_and_read_as_words(monkeypatch):
    _as_published(monkeypatch, "wikitext-2", FIXTURES / "wikitext-2")
    corpus = load_corpus(str(FIXTURES / "wikitext-2"))
    assert (corpus.name, corpus.tokenizer) == ("wikitext-2", "word")  # recognised by its hash
    # 68 words and 9 line ends in the training file: 49 distinct tokens, <unk> among them
    assert corpus.vocab_size == 49 and "<unk>" in corpus.codec.itos
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (77, 28, 20)
    assert [corpus.codec.itos[i] for i in corpus.train[:6].tolist()] == ["<eos>", "=", "Harbour", "Lamp", "=", "<eos>"]


def test_the_published_wikitext2_checksum_is_the_one_the_counts_were_taken_on():
    assert data.SOURCES["wikitext-2"].files["train.txt"] == WIKITEXT2_TRAIN_SHA


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, match",
    [(b"", "is empty"), (b"  \n\n", "is empty"), (b"text\x00\x01\x02", "looks binary"),
     (b"caf\xe9 au lait " * 5, "not UTF-8"), (b"x", "too few to split")],
)
def test_bad_files_are_config_errors(tmp_path, content, match):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as err:
        load_corpus(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_bad_names_and_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown corpus 'wikitext2'.*wikitext-2"):
        load_corpus("wikitext2")
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(str(tmp_path / "nowhere.txt"))
    with pytest.raises(ConfigError, match="needs train.txt and valid.txt"):
        load_corpus(str(_write(tmp_path / "half", train_txt="only training text\n")))
    with pytest.raises(ConfigError, match=r"unknown tokenizer 'sentencepiece'.*word, char, bpe"):
        load_corpus("default", "sentencepiece")
    with pytest.raises(ConfigError, match="bpe_vocab"):
        load_corpus("default", "bpe", bpe_vocab=100)


def test_wikitext_style_names_are_found(tmp_path):
    folder = _write(tmp_path / "wt", **{"wiki_train_tokens": "a b c\n" * 5, "wiki_valid_tokens": "a b\n",
                                        "wiki_test_tokens": "c\n"})
    corpus = load_corpus(str(folder))
    assert corpus.name == str(folder) and corpus.tokenizer == "char"
    assert len(corpus.train) == 30 and corpus.test is not None and len(corpus.test) == 2


def test_too_short_for_one_context_is_a_config_error():
    ids = torch.arange(8)
    with pytest.raises(ConfigError, match="8 tokens.*context of 8"):
        check_length(ids, 8, "valid split")
    with pytest.raises(ConfigError, match="shorter --context"):
        batches(ids, 2, 8, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="8 tokens.*context of 8"):
        next(eval_batches(ids, 2, 8))
    check_length(ids, 7)  # 7 inputs and their 7 shifted targets fit


# --- batching ------------------------------------------------------------------------------


def test_batches_shapes_shift_and_determinism():
    ids = torch.arange(1000) * 3
    x_BT, y_BT = batches(ids, 4, 16, torch.Generator().manual_seed(0))
    assert x_BT.shape == y_BT.shape == (4, 16) and x_BT.dtype == torch.int64
    assert torch.equal(x_BT[:, 1:], y_BT[:, :-1]) and torch.equal(y_BT, x_BT + 3)  # y is x one token on
    again = batches(ids, 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x_BT, again[0]) and torch.equal(y_BT, again[1])
    other = batches(ids, 4, 16, torch.Generator().manual_seed(1))
    assert not torch.equal(x_BT, other[0])
    # The smallest legal corpus has exactly one window, and every draw returns it.
    x, y = batches(torch.arange(17), 3, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.arange(16).expand(3, 16)) and torch.equal(y, x + 1)


def test_eval_batches_cover_every_target_once():
    ids = torch.arange(103)
    out = list(eval_batches(ids, 4, 10))
    assert [tuple(x.shape) for x, _ in out] == [(4, 10), (4, 10), (2, 10), (1, 2)]
    xs = torch.cat([x.reshape(-1) for x, _ in out])
    ys = torch.cat([y.reshape(-1) for _, y in out])
    assert torch.equal(ys, torch.arange(1, 103)) and torch.equal(xs, torch.arange(102))
    again = list(eval_batches(ids, 4, 10))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out, again))
    assert [tuple(x.shape) for x, _ in eval_batches(torch.arange(21), 8, 10)] == [(2, 10)]  # no empty tail
