"""The watch under data parallelism (DDP, FSDP2, any ``torch.distributed`` process group): one set of numbers.

Every rank runs the probe's forward on its own probe batch (so a collective in
the model's forward, FSDP's gathers, finds every rank there), and the per-head
numbers are then reduced across ranks in ONE collective per probe step: each
rank's per-head sums (``core.diagnostics.HeadPool``: entries, rows, the scores'
sum and sum of squares, each row measurement's total) and largest |score| are
gathered, then summed and maxed. That makes the spread the spread of all the
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

import torch

from attnscale.core import diagnostics as D

__all__ = ["active", "rank", "reduce_pools", "reduce_max"]


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


def reduce_pools(pools: list[D.HeadPool]) -> None:
    """Sum (and max) every pool's sums over the ranks, in place, with one ``all_gather``."""
    if not active() or not pools:
        return
    heads = max(p.rows.shape[0] for p in pools)
    names = sorted(pools[0].row_sums)
    fields = 5 + len(names)  # entries, rows, sum, sum_sq, max_abs, then each row measurement's total
    here = pools[0].rows.device
    packed = torch.zeros(len(pools), fields, heads, dtype=torch.float64, device=here)
    for i, p in enumerate(pools):
        h = p.rows.shape[0]
        packed[i, :, :h] = torch.stack([p.entries, p.rows, p.sum, p.sum_sq, p.max_abs, *(p.row_sums[k] for k in names)])
    packed = packed.to(_device(packed))
    gathered = [torch.empty_like(packed) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, packed)
    ranks = torch.stack(gathered).to(here)  # (ranks, layers, fields, heads)
    total, largest = ranks.sum(0), ranks.amax(0)
    for i, p in enumerate(pools):
        h = p.rows.shape[0]
        p.entries, p.rows, p.sum, p.sum_sq = (total[i, f, :h].clone() for f in range(4))
        p.max_abs = largest[i, 4, :h].clone()
        p.row_sums = {k: total[i, 5 + j, :h].clone() for j, k in enumerate(names)}


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
