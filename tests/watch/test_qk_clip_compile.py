"""QK-Clip on a compiled Hugging Face model: it reads the AttentionInterface and, as a probe, the functions the
modules call themselves; on a compiled graph it keeps both for the whole run, so no step after the first
recompiles (taking the functions' hooks off once the interface is known to carry the calls would)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


def _compile(model, how: str):
    """The model compiled as ``how`` says (eager backend): "model.compile()" in place, the module itself with no
    wrapper around it, else ``torch.compile(model)``'s wrapper."""
    if how == "model.compile()":
        model.compile(backend="eager")
        return model
    return torch.compile(model, backend="eager")


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
    compiled = _compile(model, how)
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


@pytest.mark.hf
@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_a_compiled_models_evaluation_between_steps_counts_for_no_clip_and_recompiles_no_training_step(how):
    """An evaluation (eval mode, no gradients) between two steps is no training forward: the clip's S_max is the
    training forwards' alone, as a probe measures them on the model, and the training steps after it run the
    graphs they compiled (the check reads the module's mode in the eager pre-hook, never inside a graph)."""
    pytest.importorskip("transformers")
    import torch._dynamo

    from attnscale.capture.probe import measure_heads
    from attnscale.watch.clip.qk_clip import QKClip
    from tiny_llama import tiny_llama

    torch._dynamo.reset()
    model = tiny_llama(40, layers=2, hidden=16, heads=2, kv_heads=1, context=12, unscaled=True, init_std=0.5)
    gen = torch.Generator().manual_seed(0)
    candidates = [torch.randint(0, 40, (2, 12), generator=gen) for _ in range(8)]
    s_max = [measure_heads(model, {"input_ids": x}).get("max_score") for x in candidates]
    x = candidates[min(range(8), key=lambda i: s_max[i].max())]
    loud = candidates[max(range(8), key=lambda i: s_max[i].min())]
    training = measure_heads(model, {"input_ids": x}).get("max_score")
    assert (measure_heads(model, {"input_ids": loud}).get("max_score") > training).any()
    compiled = _compile(model, how)
    clip = QKClip(compiled, 1e9)  # nothing clipped: the weights stay, and every step's S_max is the same
    try:
        for step in range(1, 4):
            with torch._dynamo.config.patch(error_on_recompile=step > 1):
                compiled(input_ids=x).logits.float().pow(2).mean().backward()
            clip.step()
            model.eval()
            with torch.no_grad():
                compiled(input_ids=loud)  # compiles its own graph the first time: eval mode, no gradients
            model.train()
        got = clip.take()
    finally:
        clip.close()
    assert torch.tensor(got["s_max"]) == pytest.approx(training, rel=1e-5)
