"""A batch at any depth: every tensor found, each container rebuilt as the type it was, a key found where it
sits, and the padding mask a forward hands on to its inner model."""

import dataclasses
from collections import namedtuple

import pytest
import torch

from attnscale.capture.batch import batch_shape, find_key, handed_padding, map_tensors, tensors_in
from attnscale.capture.probe import first_sequences

Pair = namedtuple("Pair", "ids mask")


@dataclasses.dataclass(frozen=True)
class Batch:
    ids: torch.Tensor
    extra: dict
    name: str = "b"


def _nested():
    ids, mask = torch.arange(12).view(3, 4), torch.ones(3, 4, dtype=torch.long)
    return ({"input_ids": ids, "attention_mask": mask}, Pair(ids + 1, mask), Batch(ids + 2, {"labels": ids + 3}), 7)


def test_every_tensor_is_found_depth_first_and_each_container_keeps_its_type():
    batch = _nested()
    assert [int(t[0, 0]) for t in tensors_in(batch)] == [0, 1, 1, 1, 2, 3]
    doubled = map_tensors(batch, lambda t: t * 2)
    assert type(doubled) is tuple and type(doubled[1]) is Pair and type(doubled[2]) is Batch and doubled[3] == 7
    assert int(doubled[2].extra["labels"][0, 0]) == 6 and doubled[2].name == "b"
    assert batch_shape(batch) == (3, 4) and batch_shape({"n": 3}) is None


def test_a_batch_encoding_stays_one():
    transformers = pytest.importorskip("transformers")
    batch = transformers.BatchEncoding({"input_ids": torch.zeros(3, 4, dtype=torch.long)})
    cut = first_sequences(batch, 2)
    assert isinstance(cut, transformers.BatchEncoding) and cut.input_ids.shape == (2, 4)


def test_the_first_sequences_are_cut_at_any_depth_and_a_key_is_found_where_it_sits():
    cut = first_sequences((_nested(),), 2)
    assert [tuple(t.shape) for t in tensors_in(cut)] == [(2, 4)] * 6
    assert find_key(cut, "attention_mask").shape == (2, 4) and find_key(cut, "labels").shape == (2, 4)
    assert find_key(cut, "nothing") is None


def test_the_mask_a_forward_hands_its_inner_module_is_given_once_before_that_module_runs():
    class Inner(torch.nn.Module):
        def forward(self, x, attention_mask=None):
            order.append("inner")
            return x

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, batch):
            return self.inner(batch[0], batch[1])  # the mask handed on positionally

    order, found = [], []
    model, mask = Outer(), torch.tensor([[1, 1, 0]])
    with handed_padding(model, lambda m: (found.append(m), order.append("mask"))):
        model((torch.zeros(1, 3), mask))
        model((torch.zeros(1, 3), mask))
    assert order == ["mask", "inner", "inner"] and found[0].dtype == torch.bool and found[0].tolist() == [[True, True, False]]
    model((torch.zeros(1, 3), mask))  # hooks gone after the block
    assert len(found) == 1
