"""The watch under DDP and FSDP2: two processes on the CPU (gloo, 127.0.0.1), each probing its own half of a
batch, log once, and their numbers are a single process's on the whole batch; QK-Clip keeps the ranks' weights
equal, and scales FSDP's shards as DDP's whole weights."""

import json

import pytest
import torch
import torch.distributed as dist

from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.loop import Watch
from attnscale.capture.probe import measure_heads
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink
from gloo import spawned_into

WORLD = 2
CONFIG = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8)


def _batch() -> torch.Tensor:
    """4 sequences: rank r probes sequences 2r and 2r + 1."""
    return torch.randint(0, 40, (4, 12), generator=torch.Generator().manual_seed(1))


def _clipped(wrap, batch, rank):
    """One SGD step of an unscaled model on this rank's half of the batch, then QK-Clip at 5: (the S_max this
    rank saw, the full q_proj weights after the clip)."""
    model = build_model(ModelConfig(**{**CONFIG.__dict__, "scale": "none", "init": "unit"}), seed=0)
    wrapped = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Watch(wrapped, every=100, probe=batch[:1], alerts=(), qk_clip=5.0) as watch:
        wrapped(batch[2 * rank:2 * rank + 2]).sum().backward()
        opt.step()
        local = {n: s.tolist() for n, s in watch.clip._s_max.items()}
        watch.step(1)
    full = [getattr(p, "full_tensor", lambda p=p: p)().detach().flatten() for n, p in model.named_parameters() if "q_proj" in n]
    return local, torch.cat(full)


def _fsdp(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _worker(rank: int, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    batch = _batch()
    numbers = {}
    for name, wrap in (("ddp", DDP), ("fsdp", _fsdp)):
        with Watch(wrap(build_model(CONFIG, seed=0)), every=1, probe=batch[2 * rank:2 * rank + 2], alerts=(),
                   sinks=[JsonlSink(f"{out}/{name}.jsonl")]) as watch:
            numbers[name] = watch.step(1)["attn/max_score"]

    # QK-Clip on different batches per rank: without the ranks agreeing on S_max, their weights would part
    local, weights = _clipped(DDP, batch, rank)
    gathered = [torch.empty_like(weights) for _ in range(WORLD)]
    dist.all_gather(gathered, weights)
    _, sharded = _clipped(_fsdp, batch, rank)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"max_score": numbers, "weights_equal": torch.equal(gathered[0], gathered[1]),
                   "fsdp_gap": (sharded - weights).abs().max().item(), "local_s_max": local}, f)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    out = spawned_into(tmp_path_factory, "ddp", _worker, world=WORLD)
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_two_ranks_log_once_the_numbers_of_the_whole_batch(ran, wrap):
    out, ranks = ran
    records = read_log(out / f"{wrap}.jsonl")
    assert [r.step for r in records] == [0, 1]  # the baseline, then step 1: rank 0 alone wrote
    records = records[1:]
    whole = measure_heads(build_model(CONFIG, seed=0), _batch())
    torch.testing.assert_close(torch.tensor(records[0].values), whole.values_LMH, rtol=1e-6, atol=0)
    assert records[0].rows == whole.rows_LH.tolist()  # every rank's rows counted
    halves = [measure_heads(build_model(CONFIG, seed=0), _batch()[2 * r:2 * r + 2]) for r in range(WORLD)]
    spread = HEAD_MEASURES.index("spread")
    assert not torch.allclose(halves[0].values_LMH[:, spread], whole.values_LMH[:, spread])  # a rank alone differs
    assert ranks[0]["max_score"][wrap] == ranks[1]["max_score"][wrap] == pytest.approx(whole.summary()["attn/max_score"])


def test_qk_clip_keeps_the_ranks_weights_equal(ran):
    _, ranks = ran
    assert ranks[0]["local_s_max"] != ranks[1]["local_s_max"]  # the ranks saw different scores
    assert all(max(s) > 5.0 for r in ranks for s in r["local_s_max"].values())  # and clipped
    assert ranks[0]["weights_equal"] and ranks[1]["weights_equal"]


def test_qk_clip_scales_fsdp_shards_as_ddp_scales_whole_weights(ran):
    _, ranks = ran
    assert ranks[0]["fsdp_gap"] < 1e-5 and ranks[1]["fsdp_gap"] < 1e-5
