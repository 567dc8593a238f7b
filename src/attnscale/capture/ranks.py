"""The watch under data parallelism (DDP, FSDP2, any ``torch.distributed`` process group): one set of numbers.

Every rank runs the probe's forward on its own probe batch (so a collective in
the model's forward, FSDP's gathers, finds every rank there), and the per-head
numbers are then reduced across ranks in ONE collective per probe step: each
rank's per-head sums (``capture.sums.HeadSums``) are gathered, then merged as
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

from dataclasses import dataclass
from typing import Any

import torch

from attnscale.capture.sums import HeadSums
from attnscale.errors import ConfigError

__all__ = ["TensorParallel", "active", "all_gather", "merge_gathered", "rank", "reduce_sums", "reduce_max"]


def active() -> bool:
    """True inside an initialised process group of more than one rank."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return torch.distributed.get_rank() if active() else 0


def _device(tensor: torch.Tensor) -> torch.device:
    """Where a collective of this backend takes its tensors: gloo's on the CPU, the others' (NCCL) on the
    tensor's GPU, or on this rank's GPU for a tensor on the CPU (a pipeline stage that measured nothing)."""
    if torch.distributed.get_backend() == "gloo":
        return torch.device("cpu")
    return tensor.device if tensor.device.type != "cpu" else torch.device("cuda", torch.cuda.current_device())


def all_gather(packed: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``packed`` (the same shape on every rank) in rank order, through the backend's device
    and back on ``packed``'s."""
    wire = packed.to(_device(packed))
    gathered = [torch.empty_like(wire) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, wire)
    return [g.to(packed.device) for g in gathered]


@dataclass(frozen=True)
class TensorParallel:
    """Attention heads split over the ranks of ``group`` (Megatron, torchtitan, DTensor's tensor parallel): the
    rank of the group at position t holds query heads t·H_local … (t + 1)·H_local - 1 of every layer, H_local
    its own head count. ``heads``: instead, {layer name: the global index of each of this rank's heads}, for
    a layout that differs. ``group``: a ``torch.distributed`` process group; None: every rank of the world (pure
    tensor parallelism). Ranks outside ``group`` that hold the same global heads (data-parallel replicas)
    are merged with them, as data parallelism's ranks are."""

    group: Any = None
    heads: dict[str, list[int]] | None = None

    def __post_init__(self):
        _check_group(self.group)
        if self.heads is None:
            return
        if not isinstance(self.heads, dict) or not all(
                isinstance(name, str) and isinstance(ix, (list, tuple)) and all(
                    isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ix)
                for name, ix in self.heads.items()):
            raise ConfigError("TensorParallel's heads takes {layer name: [the global index of each local head]}, "
                              f"non-negative integers, got {self.heads!r}")

    def global_heads(self, name: str, local: int) -> list[int]:
        """The global index of each of this rank's ``local`` heads in layer ``name``."""
        if self.heads is not None and name in self.heads:
            given = list(self.heads[name])
            if len(given) != local:
                raise ConfigError(f"TensorParallel.heads gives {len(given)} heads for {name!r}, where this rank "
                                  f"holds {local}; give one global index per local head")
            return given
        t = torch.distributed.get_rank(self.group) if active() else 0
        return [t * local + h for h in range(local)]


def _check_group(group: Any) -> None:
    """A ConfigError unless ``group`` is None or a process group: a DeviceMesh (torchtitan's and DTensor's way of
    naming the ranks) is not one, and would fail only at the first probe's collective."""
    dist = torch.distributed
    if group is None or (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        return
    if type(group).__name__ == "DeviceMesh":
        raise ConfigError("TensorParallel's group takes a process group, got a DeviceMesh: give the group of the "
                          "mesh dimension the heads are split over, e.g. TensorParallel(group=mesh.get_group('tp'))")
    raise ConfigError(f"TensorParallel's group takes a torch.distributed process group (None: every rank of the "
                      f"world), got {type(group).__name__}")


def _index(layers: list[HeadSums], names: list[str], tp: TensorParallel | None) -> list[list[int]]:
    return [tp.global_heads(n, s.heads) if tp is not None else list(range(s.heads)) for s, n in zip(layers, names)]


def reduce_sums(layers: list[HeadSums], names: list[str] | None = None, tp: TensorParallel | None = None) -> None:
    """Every layer's sums merged over the ranks, in place, with one ``all_gather``: each rank then holds, per
    global head, the sums of every rank's blocks of that head. Without ``tp`` a head's index is the same on
    every rank (data parallelism); with it, each rank's heads go to their global index, so a layer ends with
    all the heads of every rank of the tensor-parallel group."""
    if not active() or not layers:
        return
    names = [str(i) for i in range(len(layers))] if names is None else names
    index = _index(layers, names, tp)
    heads = max(s.heads for s in layers)
    here = layers[0].device
    fields = len(HeadSums.FIELDS)
    packed = torch.full((len(layers), fields + 1, heads), -1.0, dtype=torch.float64, device=here)
    for i, s in enumerate(layers):  # the sums, then a row of each head's global index (-1: no head there)
        packed[i, :fields, :s.heads] = s.data
        packed[i, fields, :s.heads] = torch.tensor(index[i], dtype=torch.float64)
    merge_gathered(layers, all_gather(packed))


def merge_gathered(layers: list[HeadSums], gathered: list[torch.Tensor]) -> None:
    """``reduce_sums``' merge, from every rank's packed sums (layers, fields + 1, heads): each rank's head goes to
    the global index its last row names, and the sums of one global head are merged over the ranks."""
    fields = len(HeadSums.FIELDS)
    for i, s in enumerate(layers):
        index = [g[i, fields].long() for g in gathered]
        width = int(max(int(ix.max()) for ix in index)) + 1
        total = HeadSums(width, s.threshold, s.device)
        for g, ix in zip(gathered, index):
            real = ix >= 0
            part = HeadSums(width, s.threshold, s.device)
            part.data[:, ix[real]] = g[i, :fields][:, real]
            total.merge(part)
        s.data = total.data


def reduce_max(values: list[torch.Tensor], names: list[str] | None = None,
               tp: TensorParallel | None = None) -> list[torch.Tensor]:
    """Each tensor's elementwise max over the ranks that hold the same heads (every rank without ``tp``; with it,
    the ranks whose heads of that layer have the same global index), in one collective; a value that is not a
    finite number counts as -1 (no rank's NaN decides for the others)."""
    if not active() or not values:
        return values
    sizes = [v.numel() for v in values]
    flat = torch.cat([v.float().flatten() for v in values])
    flat = torch.where(torch.isfinite(flat), flat, -1.0)
    flat = flat.to(_device(flat))
    if tp is None:
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.MAX)
        flat = flat.to(values[0].device)
        return [part.view_as(v) for part, v in zip(flat.split(sizes), values)]
    names = [str(i) for i in range(len(values))] if names is None else names
    index = torch.tensor([g for v, n in zip(values, names) for g in tp.global_heads(n, v.numel())], dtype=torch.float32)
    gathered = all_gather(torch.stack([flat, index.to(flat.device)]))  # ranks hold the same layers in order
    layer = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(flat.device)
    out = flat.clone()
    for g in gathered:
        same = g[1][None, :] == index.to(flat.device)[:, None]  # (mine, theirs): the same global head …
        same &= layer[:, None] == layer[None, :]  # … of the same layer
        out = torch.maximum(out, torch.where(same, g[0][None, :], -1.0).amax(1))
    out = out.to(values[0].device)
    return [part.view_as(v) for part, v in zip(out.split(sizes), values)]
