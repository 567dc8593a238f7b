"""QK-Clip on a compiled Hugging Face model: it reads the AttentionInterface and, as a probe, the functions the
modules call themselves; on a compiled graph it keeps both for the whole run, so no step after the first
recompiles (taking the functions' hooks off once the interface is known to carry the calls would)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.hf
@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_a_compiled_llama_with_qk_clip_never_recompiles_after_its_first_step(how):
    pytest.importorskip("transformers")
    import torch._dynamo

    from attnscale.watch.clip.qk_clip import QKClip
    from tiny_llama import tiny_llama

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_llama(40, layers=2, hidden=16, heads=2, kv_heads=1, context=12, unscaled=True, init_std=0.5)
    if how == "model.compile()":  # compiled in place: the module itself, no wrapper around it
        model.compile(backend="eager")
        compiled = model
    else:
        compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    clip = QKClip(compiled, 1.0)
    clipped = []
    try:
        for step in range(1, 4):
            with torch._dynamo.config.patch(error_on_recompile=step > 1):
                compiled(input_ids=x).logits.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            factors = clip.step()
            assert sorted(factors) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
            clipped.append(min(f.min().item() for f in factors.values()))
    finally:
        clip.close()
    assert clipped[0] < 1  # it acted, read through the graph
