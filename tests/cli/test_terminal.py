"""The one terminal-table helper: columns as wide as their widest cell, aligned as asked."""

import pytest

from attnscale.terminal import table


def test_columns_are_as_wide_as_their_widest_cell_and_aligned_as_asked():
    lines = table(("width", "scale", "ppl"), [(64, "1/√d", "3.25"), (1024, "none", "103.10")], "><>")
    assert lines == ["width scale    ppl",
                     "   64 1/√d    3.25",
                     " 1024 none  103.10"]


def test_a_left_aligned_last_column_leaves_no_trailing_spaces():
    lines = table(("n", "status"), [(1, "done"), (2, "diverged at step 40")], "><")
    assert lines[1] == "1 done" and lines[2] == "2 diverged at step 40"


@pytest.mark.parametrize("align", ["<", "<>x", "<<<"])
def test_an_alignment_that_does_not_fit_the_columns_is_refused(align):
    with pytest.raises(ValueError, match="align"):
        table(("a", "b"), [], align)


def test_a_row_with_the_wrong_number_of_cells_is_refused():
    with pytest.raises(ValueError, match="2 columns"):
        table(("a", "b"), [(1, 2, 3)], "<<")
