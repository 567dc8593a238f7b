"""A torch.compile'd model trains with the watch attached and never recompiles after its first step: the
probes run the original module eagerly (their hooks come and go outside the graph), and QK-Clip's capture,
left in place for the whole run, reads no state that changes between steps (attnscale's hook points are traced
into the one graph; the SDPA interception and transformers' AttentionInterface wrapper read a ContextVar, which
breaks the graph at each attention call, the same way every step)."""

import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

from attnscale.lm.model import ModelConfig, build_model
from attnscale.watch.loop import Watch
from attnscale.capture.probe import measure_heads

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from test_watch_qk_clip import Fused  # noqa: E402  nanoGPT's attention: c_attn and SDPA


class SdpaNet(nn.Module):
    """A hand-written model that calls SDPA, as nanoGPT does: the watch reads it by interception."""

    def __init__(self, vocab=40, C=16):
        super().__init__()
        self.emb, self.attn, self.out = nn.Embedding(vocab, C), Fused(C, heads=2), nn.Linear(C, vocab)

    def forward(self, ids):
        return self.out(self.attn(self.emb(ids)))


def _models():
    yield "attnscale", build_model(ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8), seed=0)
    yield "sdpa", SdpaNet()


def _train(model, backend, steps=7, **watch):
    """Train the compiled model ``steps`` steps with a Watch probing every 3; from step 2 on any recompile raises.
    Returns the steps that probed, the graphs dynamo had made after step 1 and at the end."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))

    def loss():
        out = compiled(input_ids=x) if hasattr(model, "config") else compiled(x)
        return getattr(out, "logits", out).float().pow(2).mean()

    probed, first = [], None
    with Watch(compiled, every=3, alerts=(), **watch) as w:
        for step in range(1, steps + 1):
            with torch._dynamo.config.patch(error_on_recompile=step > 1):
                loss().backward()
            opt.step()
            opt.zero_grad()
            if w.step(step) is not None:
                probed.append(step)
            first = first or torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return probed, first, torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name,model", list(_models()), ids=[n for n, _ in _models()])
def test_no_recompile_after_the_first_step(name, model):
    probed, first, graphs = _train(model, "eager")
    assert probed == [3, 6] and first == graphs == 1


@pytest.mark.parametrize("name,model", list(_models()), ids=[n for n, _ in _models()])
def test_no_recompile_with_qk_clip_and_its_scores_are_the_eager_ones(name, model):
    probed, first, graphs = _train(model, "eager", qk_clip=0.5)
    assert probed == [3, 6] and first == graphs  # nothing made after the first step
    # attnscale's hook points are traced into the one graph; the SDPA interception's context lookup breaks it
    assert graphs == 1 if name == "attnscale" else graphs > 1
    compiled = torch.compile(model, backend="eager")
    x = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    with Watch(compiled, every=100, alerts=(), qk_clip=1e9) as w:
        compiled(x)
        from_graph = {k: v.clone() for k, v in w.clip._s_max.items()}
        w.clip._s_max.clear()
        model(x)
        assert from_graph.keys() == w.clip._s_max.keys() and len(from_graph) >= 1
        for key, s_max in from_graph.items():
            torch.testing.assert_close(s_max, w.clip._s_max[key])
    numbers = measure_heads(model, x).get("max_score")  # and they are the probe's own measure
    torch.testing.assert_close(torch.stack(list(from_graph.values())).flatten(), numbers[~numbers.isnan()].flatten())


@pytest.mark.hf
def test_a_compiled_llama_does_not_recompile():
    pytest.importorskip("transformers")
    from tiny_llama import tiny_llama

    probed, first, graphs = _train(tiny_llama(40, layers=2, hidden=16, heads=2, kv_heads=1, context=12), "eager")
    assert probed == [3, 6] and first == graphs == 1


@pytest.mark.slow
def test_inductor_compiles_once_with_the_watch_and_qk_clip():
    """The same with inductor (C++ code generation: minutes on a small CPU)."""
    model = build_model(ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=2, n_heads=2, head_dim=8), seed=0)
    probed, first, graphs = _train(model, "inductor", qk_clip=0.5)
    assert probed == [3, 6] and first == graphs == 1


def test_in_training_forward_refuses_a_compiled_model():
    """Its graph was compiled without the capture, which would see no call: a clear error, not empty numbers."""
    from attnscale.errors import ConfigError

    model = build_model(ModelConfig(vocab_size=40, context=12, d_model=16, n_layers=1, n_heads=2, head_dim=8), seed=0)
    with pytest.raises(ConfigError, match="in_training_forward cannot measure inside a torch.compile'd graph"):
        Watch(torch.compile(model, backend="eager"), in_training_forward=True)
