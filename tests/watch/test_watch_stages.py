"""The watch under pipeline parallelism: two processes on the CPU (gloo, 127.0.0.1), each a stage holding two of
the model's four layers, trained GPipe-style on two micro-batches a step; each stage measures its own layers in
the training forward, and rank 0 writes the numbers one process measures running the whole model the same way."""

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn

from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.loop import Watch
from attnscale.watch.logs.line import read_log
from attnscale.watch.logs.sinks import JsonlSink
from gloo import spawned_into

WORLD = 2
CONFIG = ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=4, n_heads=2, head_dim=8)
STEPS, MICRO, LR = 3, 2, 0.5


def _batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 40, (4, 12), generator=gen) for _ in range(STEPS)]


def _loss(logits, ids):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()) / MICRO


class First(nn.Module):
    """Stage 0: the embeddings and layers 0 and 1 (local names blocks.0 and blocks.1, as Megatron keeps them)."""

    def __init__(self, model):
        super().__init__()
        self.tok_emb, self.pos_emb, self.blocks = model.tok_emb, model.pos_emb, nn.ModuleList(model.blocks[:2])

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return x


class Last(nn.Module):
    """Stage 1: layers 2 and 3 (local names blocks.0 and blocks.1), the final norm and the head."""

    def __init__(self, model):
        super().__init__()
        self.blocks, self.ln_f, self.head = nn.ModuleList(model.blocks[2:]), model.ln_f, model.head

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _pipeline(rank: int, out: str, **placement) -> None:
    """GPipe: every micro-batch forward through both stages, then every backward; an SGD step on each stage."""
    whole = build_model(CONFIG, seed=0)
    stage = (First if rank == 0 else Last)(whole)
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    sinks = [JsonlSink(out)] if rank == 0 else []
    with Watch(stage, every=1, alerts=(), sinks=sinks, in_training_forward=True, stage=rank, **placement) as watch:
        for step, batch in enumerate(_batches(), 1):
            pieces = batch.chunk(MICRO)
            if rank == 0:
                outs = [stage(ids) for ids in pieces]
                sent = [dist.isend(y.detach(), dst=1) for y in outs]
                for y in outs:
                    grad = torch.empty_like(y)
                    dist.recv(grad, src=1)
                    y.backward(grad)
                for s in sent:
                    s.wait()
            else:
                for ids in pieces:
                    x = torch.empty(ids.shape[0], 12, CONFIG.d_model)
                    dist.recv(x, src=0)
                    x.requires_grad_(True)
                    _loss(stage(x), ids).backward()
                    dist.send(x.grad, dst=0)
            opt.step()
            opt.zero_grad()
            watch.step(step)


def _worker(rank: int, out: str) -> None:
    _pipeline(rank, f"{out}/by_stage.jsonl")  # the stages in order of stage=
    _pipeline(rank, f"{out}/by_offset.jsonl", layer_offset=2 * rank)  # each stage's first layer


def _whole_model(out) -> None:
    """One process: the whole model, the same micro-batches accumulated, the same SGD steps."""
    model = build_model(CONFIG, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with Watch(model, every=1, alerts=(), sinks=[JsonlSink(out)], in_training_forward=True) as watch:
        for step, batch in enumerate(_batches(), 1):
            for ids in batch.chunk(MICRO):
                _loss(model(ids), ids).backward()
            opt.step()
            opt.zero_grad()
            watch.step(step)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    out = spawned_into(tmp_path_factory, "pipeline", _worker, world=WORLD)
    _whole_model(out / "whole.jsonl")
    return out


@pytest.mark.parametrize("log", ["by_stage", "by_offset"])
def test_rank_0_writes_every_stage_s_layers_as_the_whole_model_measures_them(ran, log):
    whole = read_log(ran / "whole.jsonl")
    staged = read_log(ran / f"{log}.jsonl")  # rank 0 alone wrote
    assert [r.step for r in staged] == [r.step for r in whole] == [0, 1, 2, 3]  # the baseline: step 1's forward
    for s, w in zip(staged, whole):
        assert len(s.values) == CONFIG.n_layers
        torch.testing.assert_close(torch.tensor(s.values), torch.tensor(w.values), rtol=1e-5, atol=1e-6)
        assert s.rows == w.rows  # every micro-batch counted
        assert s.summary == pytest.approx(w.summary, rel=1e-5)
        assert s.probe["forwards"] == w.probe["forwards"] == MICRO
    # the layers differ from one another: a stage's layers in the wrong place would show
    assert json.dumps(whole[0].values[0]) != json.dumps(whole[0].values[2])
