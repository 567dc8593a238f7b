"""report.held_out: the held-out sequences the report measures final weights on, cut from the corpus's split."""

from attnscale.report import held_out


def test_held_out_sequences_are_the_split_cut_in_order(corpus):
    ids = held_out.sequences(corpus, 3, 32)
    assert ids.shape == (3, 32) and ids.flatten().tolist() == corpus.valid[:96].tolist()
