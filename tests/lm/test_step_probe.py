"""What a recording step writes beside the heads (``lm.step_measures.PROBED``): the step's gradient norm
before clipping, the mean log Z of the output logits and each layer's q and k weight RMS, each checked
against the same step recomputed in float64 on a copy of the model and the same batch; and the loss of
every step kept in the results."""

import copy
import math

import pytest
import torch

from attnscale.lm import train as tr
from attnscale.lm.data import batches
from attnscale.lm.model import ModelConfig
from attnscale.lm.train import TrainConfig
from tiny_corpus import V, corpus  # noqa: F401  (the fixture)


def mcfg() -> ModelConfig:
    return ModelConfig(vocab_size=V, context=8, d_model=16, n_layers=2, n_heads=2, head_dim=4)


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_a_recording_step_probes_grad_norm_log_z_and_qk_rms_as_recomputed_in_float64(corpus, z_loss):
    cfg = TrainConfig(steps=3, batch=3, lr=1e-2, warmup=0, record_every=1, dtype="fp32", clip=0.5,
                      z_loss=z_loss, eval_batches=1)
    run = tr.build_run(mcfg(), cfg, None)
    with torch.no_grad():
        run.model.head.weight.mul_(8)  # log Z away from log V and gradients over the clip
    twin = copy.deepcopy(run.model).double()
    gen = torch.Generator()
    gen.set_state(run.gen.get_state())
    x, y = batches(corpus.train, cfg.batch, 8, gen)
    tr.train_step(run, 0, corpus)
    row = run.history[-1]

    logits = twin(x).flatten(0, 1)
    log_z = torch.logsumexp(logits, -1)
    loss = log_z.mean() - logits.gather(1, y.flatten()[:, None]).mean()
    (loss + z_loss * log_z.pow(2).mean()).backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in twin.parameters()))
    assert norm > cfg.clip  # the norm written is the one before clipping
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert row["log_z"] == pytest.approx(log_z.mean().item(), rel=1e-5)
    for key, name in (("q_rms", "q_proj"), ("k_rms", "k_proj")):
        want = [math.sqrt(float(getattr(b.attn, name).weight.pow(2).mean())) for b in twin.blocks]
        assert row[key] == pytest.approx(want, rel=1e-6)  # the weights the forward used, before the update
    assert row["loss"] == pytest.approx(float(loss), rel=1e-5)


def test_steps_between_probes_write_no_probe_and_the_results_keep_every_loss(corpus):
    cfg = TrainConfig(steps=7, batch=2, lr=1e-2, warmup=0, record_every=3, dtype="fp32", eval_batches=1)
    got = tr.train(mcfg(), cfg, corpus)
    probed = [h["step"] for h in got["history"] if "grad_norm" in h]
    assert probed == [0, 3, 6]  # the trained model's own line (step 7) has no update, so no gradient
    assert len(got["losses"]) == 7
    by_step = {h["step"]: h["loss"] for h in got["history"]}
    assert [got["losses"][s] for s in (0, 3, 6)] == pytest.approx([by_step[s] for s in (0, 3, 6)], rel=0, abs=0)
