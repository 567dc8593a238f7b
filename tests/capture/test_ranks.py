"""capture.ranks under tensor parallelism: two processes on the CPU (gloo, 127.0.0.1), each holding half of
every layer's heads, Megatron-style, log the numbers one process logs for the whole model; and the merge of
data-parallel replicas of tensor-parallel ranks, by hand."""

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from attnscale.capture.call import AttentionCall
from attnscale.capture.probe import measure_heads
from attnscale.capture.ranks import TensorParallel, merge_gathered, reduce_max
from attnscale.capture.reduce import reduce_call
from attnscale.capture.sums import HeadSums
from gloo import spawn

WORLD, HEADS, D, C = 2, 4, 8, 32


class Attention(nn.Module):
    """Causal attention over ``HEADS`` heads; with ``rank`` set, only that rank's half of them (column-parallel
    q, k, v; row-parallel output, summed over the ranks), as Megatron splits a layer."""

    def __init__(self, rank=None):
        super().__init__()
        self.qkv, self.out, self.rank = nn.Linear(C, 3 * C), nn.Linear(C, C, bias=False), rank

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, HEADS, D).permute(2, 0, 3, 1, 4)
        heads = slice(None) if self.rank is None else slice(self.rank * HEADS // WORLD, (self.rank + 1) * HEADS // WORLD)
        y = F.scaled_dot_product_attention(q[:, heads], k[:, heads], v[:, heads], is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        cols = slice(None) if self.rank is None else slice(heads.start * D, heads.stop * D)
        out = y @ self.out.weight[:, cols].T
        if self.rank is not None:
            dist.all_reduce(out)
        return out


class Model(nn.Module):
    def __init__(self, rank=None):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, C)
        self.layers = nn.ModuleList([Attention(rank) for _ in range(2)])

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x)
        return x


IDS = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))


def _worker(rank: int, out: str) -> None:
    stats = measure_heads(Model(rank), IDS, across_ranks=True, tensor_parallel=TensorParallel())
    naive = measure_heads(Model(rank), IDS, across_ranks=True)  # heads merged by local index: wrong
    s_max = [torch.tensor([10.0 * rank + h for h in range(HEADS // WORLD)])]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"values": stats.values_LMH.tolist(), "heads": list(stats.layer_heads),
                   "naive_heads": list(naive.layer_heads),
                   "s_max_tp": reduce_max(s_max, ["layers.0"], TensorParallel())[0].tolist(),
                   "s_max_dp": reduce_max(s_max)[0].tolist()}, f)


def test_two_tensor_parallel_ranks_log_every_head_as_one_process_does(tmp_path):
    spawn(_worker, str(tmp_path), world=WORLD)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    want = measure_heads(Model(), IDS).values_LMH
    for g in got:
        assert g["heads"] == [HEADS, HEADS] and g["naive_heads"] == [HEADS // WORLD] * 2
        torch.testing.assert_close(torch.tensor(g["values"]), want, rtol=1e-5, atol=1e-6)
    # QK-Clip's S_max: under tensor parallelism each rank keeps its own heads' (no other rank holds them);
    # without it, head h takes the max over the ranks' head h
    assert got[0]["s_max_tp"] == [0.0, 1.0] and got[1]["s_max_tp"] == [10.0, 11.0]
    assert got[0]["s_max_dp"] == got[1]["s_max_dp"] == [10.0, 11.0]


def _packed(sums: HeadSums, index: list[int], width: int) -> torch.Tensor:
    fields = len(HeadSums.FIELDS)
    out = torch.full((1, fields + 1, width), -1.0, dtype=torch.float64)
    out[0, :fields, :sums.heads] = sums.data
    out[0, fields, :sums.heads] = torch.tensor(index, dtype=torch.float64)
    return out


def test_replicas_of_each_tensor_parallel_rank_merge_with_like():
    """Four ranks, two-way tensor parallel times two-way data parallel: (tp 0, dp 0) holds heads 0-1 on batch
    half 0, (tp 1, dp 0) heads 2-3 on it, and the dp 1 pair the same heads on half 1. Merged, every head has
    both halves: the sums of one process over the whole batch and all four heads."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(4, 4, 10, 8, generator=g), torch.randn(4, 4, 10, 8, generator=g)
    whole = reduce_call(AttentionCall(q, k, is_causal=True)).measures()
    gathered = []
    for half in (slice(0, 2), slice(2, 4)):
        for heads in (slice(0, 2), slice(2, 4)):
            sums = reduce_call(AttentionCall(q[half, heads], k[half, heads], is_causal=True))
            gathered.append(_packed(sums, list(range(heads.start, heads.stop)), 2))
    mine = HeadSums(2)
    merge_gathered([mine], gathered)
    assert mine.heads == 4
    torch.testing.assert_close(mine.measures(), whole, rtol=1e-6, atol=1e-9)
    assert not math.isnan(float(mine.measures().sum()))


def test_a_head_map_of_the_wrong_length_is_refused_by_name():
    from attnscale.errors import ConfigError

    with pytest.raises(ConfigError, match="TensorParallel.heads gives 3 heads for 'layers.0', where this rank holds 2"):
        TensorParallel(heads={"layers.0": [0, 1, 2]}).global_heads("layers.0", 2)
    assert TensorParallel(heads={"layers.0": [5, 7]}).global_heads("layers.0", 2) == [5, 7]
    assert TensorParallel().global_heads("layers.1", 3) == [0, 1, 2]  # one process: position 0 of the group


def _watch_worker(rank: int, out: str) -> None:
    """A Watch per rank over its half of the heads: rank 0's log is the whole model's."""
    from attnscale.watch import TensorParallel as TP
    from attnscale.watch.logs.sinks import JsonlSink
    from attnscale.watch.loop import Watch

    with Watch(Model(rank), every=1, probe=IDS, alerts=(), tensor_parallel=TP(),
               sinks=[JsonlSink(f"{out}/watch.jsonl")] if rank == 0 else []) as watch:
        numbers = watch.step(1)
    with open(f"{out}/watch{rank}.json", "w") as f:
        json.dump({"max_score": numbers["attn/max_score"], "keys": sorted(numbers)}, f)


def test_a_watch_on_each_tensor_parallel_rank_logs_the_whole_models_heads(tmp_path):
    from attnscale.watch.logs.line import read_log

    spawn(_watch_worker, str(tmp_path), world=WORLD)
    baseline, line = read_log(tmp_path / "watch.jsonl")  # step 0's baseline record, then step 1's
    assert (baseline.step, line.step) == (0, 1)
    want = measure_heads(Model(), IDS)
    torch.testing.assert_close(torch.tensor(line.values, dtype=torch.float32), want.values_LMH, rtol=1e-5, atol=1e-6)
    got = [json.loads((tmp_path / f"watch{r}.json").read_text()) for r in range(WORLD)]
    assert got[0]["max_score"] == got[1]["max_score"] == pytest.approx(float(want.get("max_score").max()))
    assert "attn/layer_1/head_3/max_score" in got[1]["keys"]  # every rank has every head's number


def test_a_watch_refuses_a_tensor_parallel_that_is_not_one():
    from attnscale.watch.loop import Watch

    with pytest.raises(ValueError, match="tensor_parallel takes an attnscale.watch.TensorParallel, got int"):
        Watch(Model(), tensor_parallel=2)


def test_a_device_mesh_or_anything_else_given_as_the_group_is_refused_naming_the_fix():
    """torchtitan and DTensor name their ranks by a DeviceMesh; given where a process group is meant it was taken,
    to fail only in the first probe's collective. (A mesh made without its process group, as its type is all that
    is read.)"""
    from torch.distributed.device_mesh import DeviceMesh

    from attnscale.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^TensorParallel's group takes a process group, got a DeviceMesh: give the "
                                          r"group of the mesh dimension the heads are split over, e\.g\. "
                                          r"TensorParallel\(group=mesh\.get_group\('tp'\)\)$"):
        TensorParallel(group=object.__new__(DeviceMesh))
    with pytest.raises(ConfigError, match="^TensorParallel's group takes a torch.distributed process group .*, got str$"):
        TensorParallel(group="tp")
