"""Packed documents that see each other: the one warning a probe gives about a batch the model itself misreads.

transformers' ``DataCollatorWithFlattening`` packs several documents into one row and marks each document's
start by ``position_ids`` that restart from 0. transformers builds the block-diagonal mask that keeps them apart
only where the forward has no cache and no ``attention_mask`` (``masking_utils``: packed sequences are looked
for only then); the flash implementations cut the documents at the ``position_ids`` themselves. A model left with
``use_cache=True`` (the default of most configs, in training too) on sdpa, eager or flex attends across
documents: the probe measures that faithfully, and this says so (``crossing``), once per place that warns, not
once per layer or step (Python's warning filter keeps a text it has shown from showing again).
"""

from __future__ import annotations

import torch

from attnscale.capture.call import AttentionCall

__all__ = ["PackedDocumentsWarning", "Packing", "crossing", "documents", "message"]

# query rows read at a time: the check holds B×R×S booleans, never B×T×S
_ROWS = 256


class PackedDocumentsWarning(UserWarning):
    """Position ids restart inside a row, but the model's attention mask lets the documents see each other."""


def documents(position_ids) -> torch.Tensor | None:
    """B×T: the document of each token (0, 1, …) where ``position_ids`` (B×T, or T) restart inside a row, as
    transformers reads them (a step other than +1 starts a document); None where no row holds two documents."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.ndim not in (1, 2) or position_ids.shape[-1] < 2:
        return None
    p = position_ids.reshape(-1, position_ids.shape[-1])
    starts = torch.diff(p, dim=-1) != 1
    if not bool(starts.any()):
        return None
    return torch.nn.functional.pad(starts.long().cumsum(-1), (1, 0))


def crossing(call: AttentionCall, documents_BT: torch.Tensor) -> bool:
    """Whether some query of ``call`` sees a key of another document (``documents_BT`` of the call's own
    length; a call of another length, or batch, is not this batch's: False)."""
    B, T, S = call.q.shape[0], call.q.shape[-2], call.k.shape[-2]
    if documents_BT.shape[-1] != T or T != S or documents_BT.shape[0] not in (1, B):
        return False
    docs = documents_BT.to(call.q.device)
    for r0 in range(0, T, _ROWS):
        rows = slice(r0, min(T, r0 + _ROWS))
        other = docs[:, None, rows, None] != docs[:, None, None, :]  # b×1×R×S
        visible = call.visible(rows, heads=slice(0, 1))
        if bool((other if visible is None else visible & other).any()):
            return True
    return False


class Packing:
    """What one forward's calls say about packing: their ``position_ids`` read once (every layer is handed the
    same tensor, and reading it costs a device sync), and the first layer whose documents see each other."""

    def __init__(self) -> None:
        self.crossed: str | None = None
        self._ids: torch.Tensor | None = None
        self._documents: torch.Tensor | None = None

    # kept out of a compiled graph: the tensor it remembers is a new one every forward, and a guard on it would
    # recompile the model at every step
    @torch.compiler.disable
    def check(self, call: AttentionCall, position_ids) -> None:
        if self.crossed is not None or not isinstance(position_ids, torch.Tensor):
            return
        if position_ids is not self._ids:
            self._ids, self._documents = position_ids, documents(position_ids)
        if self._documents is not None and crossing(call, self._documents):
            self.crossed = call.name


def message(model: str, layer: str) -> str:
    return (f"position_ids restart inside a row (documents packed into one, as DataCollatorWithFlattening makes "
            f"them) but the attention mask of {model}'s {layer!r} lets one document's queries see another "
            "document's keys, and the probe measures that cross-document attention; transformers keeps packed "
            "documents apart only when the forward has no cache and no attention_mask: pass use_cache=False (or set "
            "model.config.use_cache = False) and no attention_mask, or load the model with "
            "attn_implementation='flash_attention_2', which cuts the documents at the position_ids")
