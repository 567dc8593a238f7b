"""The watch under DDP: two processes on the CPU (gloo, 127.0.0.1), each probing its own half of a batch,
log once, and their numbers are a single process's on the whole batch; QK-Clip keeps the ranks' weights equal."""

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnscale.core.diagnostics import HEAD_MEASURES
from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.loop import Watch
from attnscale.watch.measure import measure_heads
from attnscale.watch.record import read_log
from attnscale.watch.sinks import JsonlSink

WORLD = 2
CONFIG = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8)


def _batch() -> torch.Tensor:
    """4 sequences: rank r probes sequences 2r and 2r + 1."""
    return torch.randint(0, 40, (4, 12), generator=torch.Generator().manual_seed(1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        batch = _batch()
        model = DDP(build_model(CONFIG, seed=0))
        with Watch(model, every=1, probe=batch[2 * rank:2 * rank + 2], alerts=(),
                   sinks=[JsonlSink(f"{out}/watch.jsonl")]) as watch:
            numbers = watch.step(1)

        # QK-Clip on different batches per rank: without the ranks agreeing on S_max, their weights would part
        clipped = DDP(build_model(ModelConfig(**{**CONFIG.__dict__, "scale": "none", "init": "unit"}), seed=0))
        opt = torch.optim.SGD(clipped.parameters(), lr=1e-3)
        with Watch(clipped, every=100, probe=batch[:1], alerts=(), qk_clip=5.0) as watch:
            clipped(batch[2 * rank:2 * rank + 2]).sum().backward()
            opt.step()
            local = {n: s.clone() for n, s in watch.clip._s_max.items()}
            watch.step(1)
        weights = torch.cat([p.detach().flatten() for n, p in clipped.module.named_parameters() if "q_proj" in n])
        gathered = [torch.empty_like(weights) for _ in range(WORLD)]
        dist.all_gather(gathered, weights)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"max_score": numbers["attn/max_score"], "weights_equal": torch.equal(gathered[0], gathered[1]),
                       "local_s_max": {n: s.tolist() for n, s in local.items()}}, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True, start_method="spawn")
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_two_ranks_log_once_the_numbers_of_the_whole_batch(ran):
    out, ranks = ran
    records = read_log(out / "watch.jsonl")
    assert len(records) == 1 and records[0].step == 1  # rank 0 alone wrote
    whole = measure_heads(build_model(CONFIG, seed=0), _batch())
    torch.testing.assert_close(torch.tensor(records[0].values), whole.values_LMH, rtol=1e-6, atol=0)
    assert records[0].rows == whole.rows_LH.tolist()  # every rank's rows counted
    halves = [measure_heads(build_model(CONFIG, seed=0), _batch()[2 * r:2 * r + 2]) for r in range(WORLD)]
    spread = HEAD_MEASURES.index("spread")
    assert not torch.allclose(halves[0].values_LMH[:, spread], whole.values_LMH[:, spread])  # a rank alone differs
    assert ranks[0]["max_score"] == ranks[1]["max_score"] == pytest.approx(whole.summary()["attn/max_score"])


def test_qk_clip_keeps_the_ranks_weights_equal(ran):
    _, ranks = ran
    assert ranks[0]["local_s_max"] != ranks[1]["local_s_max"]  # the ranks saw different scores
    assert all(max(s) > 5.0 for r in ranks for s in r["local_s_max"].values())  # and clipped
    assert ranks[0]["weights_equal"] and ranks[1]["weights_equal"]
