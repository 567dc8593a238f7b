"""lm.vocab: the word, character and BPE vocabularies a corpus is read with, fitted on the training split only."""

import pytest
import torch

from attnscale.lm.data import load_corpus
from corpus_files import _private_cache, _write  # noqa: F401  (_private_cache: the autouse fixture)


def test_bpe_round_trips_and_is_cached(tmp_path):
    corpus = load_corpus("default", "bpe", bpe_vocab=300, cache_dir=tmp_path)
    assert corpus.tokenizer == "bpe" and corpus.vocab_size == 300
    assert len(corpus.train) < 0.9 * 418_002  # merges do compress the text
    text = "Held-out text, «unicode» too: 𝔘 ✓\n  indented\n"
    assert corpus.decode(corpus.encode(text)) == text
    assert list((tmp_path / "bpe").glob("*-300.json"))


@pytest.mark.parametrize("tokenizer", ["word", "char", "bpe"])
def test_held_out_text_never_shapes_the_vocabulary(tmp_path, tokenizer):
    train = "the cat sat on the mat\nthe dog sat on the log\n" * 40
    # Separate caches, so the second vocabulary is fitted afresh rather than read back.
    a = load_corpus(str(_write(tmp_path / "a", train_txt=train, valid_txt="the cat sat\n")), tokenizer,
                    bpe_vocab=280, cache_dir=tmp_path / "cache_a")
    b = load_corpus(str(_write(tmp_path / "b", train_txt=train, valid_txt="zebra quokka xylophone\n" * 50)),
                    tokenizer, bpe_vocab=280, cache_dir=tmp_path / "cache_b")
    assert a.vocab_size == b.vocab_size and torch.equal(a.train, b.train)
    assert a.encode("zebra").tolist() == b.encode("zebra").tolist()
    if tokenizer != "bpe":  # unseen words and characters become the unknown id
        unk = a.codec.unk
        assert (b.valid == unk).any() and not (b.train == unk).any()


def test_word_tokens_follow_pytorch_word_language_model(tmp_path):
    folder = _write(tmp_path / "w", train_txt=" a b \n\n c a \n", valid_txt="a z\n")
    corpus = load_corpus(str(folder), "word")
    # Lines: " a b ", "", " c a " -> a b <eos> <eos> c a <eos>; ids by first appearance, <unk> appended.
    assert corpus.codec.itos == ["a", "b", "<eos>", "c", "<unk>"]
    assert corpus.train.tolist() == [0, 1, 2, 2, 3, 0, 2]
    assert corpus.valid.tolist() == [0, 4, 2]
