"""The watch under data parallelism (DDP, FSDP2, any ``torch.distributed`` process group): one set of numbers.

Every rank runs the probe's forward on its own probe batch (so a collective in
the model's forward, FSDP's gathers, finds every rank there), and the per-head
numbers are then reduced across ranks in ONE collective per probe step: each
rank's per-head sums (``capture.reduce.HeadSums``) are gathered, then merged as
if every rank's blocks had been added in one place. That makes the spread the spread of all the
ranks' entries and each row measurement a mean weighted by the rows each rank
counted, and max_score the largest of any rank: exactly the numbers one process
would measure on the ranks' probe batches concatenated.

QK-Clip needs the same S_max on every rank, or the ranks' weights would part:
its per-head S_max is reduced with one all-reduce (max) per step. Under FSDP2
(``fully_shard``) each rank scales the rows of its own shards (``projections.py``).
Tested on the CPU with gloo, two ranks, DDP and FSDP2.

Ranks other than 0 write nothing (no sink, no warning); their alerts see the same
numbers, so an alert that stops the run stops every rank at the same step.
torch.distributed is read only where it is initialised; one process does none of this.
"""

from __future__ import annotations

import math

import torch

from attnscale.capture.reduce import HeadSums

__all__ = ["active", "rank", "reduce_sums", "reduce_max"]


def active() -> bool:
    """True inside an initialised process group of more than one rank."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return torch.distributed.get_rank() if active() else 0


def _device(tensor: torch.Tensor) -> torch.device:
    """Where a collective of this backend takes its tensors: gloo's on the CPU."""
    return torch.device("cpu") if torch.distributed.get_backend() == "gloo" else tensor.device


def reduce_sums(layers: list[HeadSums]) -> None:
    """Every layer's sums merged over the ranks, in place, with one ``all_gather``: each rank then holds the
    sums of all the ranks' blocks."""
    if not active() or not layers:
        return
    heads = max(s.heads for s in layers)
    here = layers[0].device
    packed = torch.full((len(layers), len(HeadSums.FIELDS), heads), math.nan, dtype=torch.float64, device=here)
    for i, s in enumerate(layers):
        packed[i, :, :s.heads] = s.data
    packed = packed.to(_device(packed))
    gathered = [torch.empty_like(packed) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, packed)
    for i, s in enumerate(layers):
        s.data.copy_(gathered[0][i, :, :s.heads].to(here))
        for other in gathered[1:]:
            part = HeadSums(s.heads, s.threshold, here)
            part.data.copy_(other[i, :, :s.heads].to(here))
            s.merge(part)


def reduce_max(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's elementwise max over the ranks, with one ``all_reduce``; a value that is not a finite
    number counts as -1 (no rank's NaN decides for the others)."""
    if not active() or not values:
        return values
    sizes = [v.numel() for v in values]
    flat = torch.cat([v.float().flatten() for v in values])
    flat = torch.where(torch.isfinite(flat), flat, -1.0)
    flat = flat.to(_device(flat))
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.MAX)
    flat = flat.to(values[0].device)
    return [part.view_as(v) for part, v in zip(flat.split(sizes), values)]
