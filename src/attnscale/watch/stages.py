"""The watch under pipeline parallelism: each stage measures its own layers, and rank 0 writes the whole model.

No stage can run a whole-model probe (stage s needs stage s - 1's activations), so a pipeline watch measures
in the training forward: on every rank, ``Watch(stage_module, in_training_forward=True, stage=s)``, and each
stage's layers are measured in the micro-batches of the probe step that pass through it (every micro-batch
counts, ``in_training.py``). At the probe step the ranks gather every rank's layer names and per-head sums in
two ``all_gather`` calls over the default process group (names and head counts as objects, then the sums as one
padded tensor), and every rank holds the union, in the model's layer order:

- ``layer_offset`` given (on every rank): the stage's i-th attention call is global layer ``layer_offset + i``,
  Megatron's ``get_transformer_layer_offset(config)`` or the index of the stage's first layer in torchtitan's
  ``layers.{i}`` names, so the record's layer l is the model's layer l whatever the split;
- not given: the stages in the order of ``stage``, each one's layers (in the order its forward calls them)
  after the previous stage's, the layout of GPipe and 1F1B schedules, torchtitan's and Megatron's default.

Ranks that give the same global layer are data-parallel replicas of one stage (PP × DP): their sums merge, as
the data-parallel watch merges its ranks (``capture/ranks.py``), so a layer's numbers are those of all the
replicas' micro-batches. An interleaved (virtual-stage) schedule, where one rank holds several chunks of
layers, is not covered: one Watch per rank, on one module.
"""

from __future__ import annotations

import math

import torch

from attnscale.capture import ranks
from attnscale.capture.options import WatchOptions
from attnscale.capture.sums import HeadSums
from attnscale.errors import ConfigError

__all__ = ["check_stage", "union_of_stages"]


def check_stage(stage, layer_offset, in_training_forward: bool) -> None:
    """A ConfigError naming the option, for pipeline options no watch can run with (``capture.options``)."""
    WatchOptions(stage=stage, layer_offset=layer_offset, in_training_forward=in_training_forward)


def _key(stage: int, offset: int | None, i: int) -> tuple[int, ...]:
    return (offset + i,) if offset is not None else (stage, i)


def union_of_stages(sums: list[HeadSums], names: list[str], stage: int, layer_offset: int | None,
                    threshold: float) -> tuple[list[HeadSums], list[str]]:
    """Every rank's layers, merged where ranks give the same global layer, in global order (see the module's
    docstring); one process: its own."""
    if not ranks.active():
        return sums, names
    dist = torch.distributed
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, (stage, layer_offset, list(names), [s.heads for s in sums]))
    if len({offset is None for _, offset, _, _ in metas}) > 1:
        raise ConfigError("layer_offset was given on some pipeline stages and not on others: give it on every "
                          "stage, or on none (the stages then follow the order of stage=)")
    layers = max(len(m[2]) for m in metas)
    heads = max((h for m in metas for h in m[3]), default=0)
    if not layers:
        return [], []
    here = sums[0].device if sums else torch.device("cpu")
    packed = torch.full((layers, len(HeadSums.FIELDS), heads), math.nan, dtype=torch.float64, device=here)
    for i, s in enumerate(sums):
        packed[i, :, :s.heads] = s.data
    gathered = ranks.all_gather(packed)
    union: dict[tuple[int, ...], tuple[HeadSums, str, int]] = {}
    for g, (s, offset, stage_names, stage_heads) in zip(gathered, metas):
        for i, (name, h) in enumerate(zip(stage_names, stage_heads)):
            part = HeadSums(h, threshold, here)
            part.data.copy_(g[i, :, :h].to(here))
            key = _key(s, offset, i)
            if key not in union:
                union[key] = (part, name, s)
                continue
            kept, kept_name, kept_stage = union[key]
            if (kept_stage, kept_name, kept.heads) != (s, name, h):
                raise ConfigError(f"two ranks give one layer {key} unlike each other (stage {kept_stage}: {kept_name!r}, "
                                  f"{kept.heads} heads; stage {s}: {name!r}, {h} heads): give each stage the "
                                  "layer_offset of its first layer, and one stage index to its replicas only")
            kept.merge(part)  # a data-parallel replica of the same stage
    order = sorted(union)
    return [union[k][0] for k in order], [union[k][1] for k in order]
