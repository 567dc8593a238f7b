"""A first fine-tune, as an engineer adding the watch to an existing run would make it: a small Llama saved as a
Hugging Face folder (made here, no download), fine-tuned by the Hugging Face Trainer and by Lightning (the loader's
dict handed to ``forward(self, batch)`` whole), each under the default watch and an acting alert
(``MaxScore(tau=TAU, action=ClipQK(TAU))``) with ``qk_clip_check``. Checked: ``attnscale inspect`` reads the
folder; the baseline record is at step 0 and no alert fires on the untrained but healthy model; the watch's own
time, its first probe included, is counted in the record and in the framework's logs; and the clip's two promises
(the scores it read come back to tau; after the update they may pass it)."""

import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("lightning")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inspect_models import save_tiny_llama  # noqa: E402

from attnscale.cli import main  # noqa: E402
from attnscale.watch.actions import ClipQK  # noqa: E402
from attnscale.watch.alerts import MaxScore, default_alerts  # noqa: E402
from attnscale.watch.logs.line import read_log  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402

# the saved Llama's scores start near 0.05 (its weights of SD 0.02) and pass 0.3 within two steps at lr 3e-2
TAU, STEPS, EVERY = 0.3, 6, 1  # a record a step: its S_max and factor are one step's


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama")


def _rows(vocab: int) -> list[dict]:
    """32 windows of 16 tokens, every other one ending in 3 pad tokens (masked, and no label there)."""
    gen, rows = torch.Generator().manual_seed(0), []
    for i in range(32):
        ids, mask = torch.randint(2, vocab, (16,), generator=gen), torch.ones(16, dtype=torch.long)
        if i % 2:
            ids[-3:], mask[-3:] = 1, 0
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return rows


def _callback(cls, log: Path):
    return cls(every=EVERY, alerts=[*default_alerts(), MaxScore(tau=TAU, action=ClipQK(TAU))], qk_clip_check=True,
               sinks=[JsonlSink(log)])


def _hf(folder: Path, tmp_path: Path):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from attnscale.watch.callbacks.hf import WatchCallback

    model = AutoModelForCausalLM.from_pretrained(folder)
    callback = _callback(WatchCallback, tmp_path / "hf.jsonl")
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=STEPS, per_device_train_batch_size=4,
                             learning_rate=3e-2, report_to="none", save_strategy="no", use_cpu=True,
                             disable_tqdm=True, seed=0, logging_steps=100)
    Trainer(model=model, args=args, train_dataset=_rows(model.config.vocab_size), callbacks=[callback]).train()
    return callback, read_log(tmp_path / "hf.jsonl"), None


def _lightning(folder: Path, tmp_path: Path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger
    from transformers import AutoModelForCausalLM

    from attnscale.watch.callbacks.lightning import WatchCallback

    class FineTune(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = AutoModelForCausalLM.from_pretrained(folder)

        def forward(self, batch):  # the loader's dict, whole
            return self.model(**batch)

        def training_step(self, batch, batch_idx):
            return self(batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-2)

    module = FineTune()
    loader = torch.utils.data.DataLoader(_rows(module.model.config.vocab_size), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    callback = _callback(WatchCallback, tmp_path / "lightning.jsonl")
    logger = CSVLogger(tmp_path, name="csv", version="")
    pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, callbacks=[callback], logger=logger,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path)).fit(module, loader)
    import csv

    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        logged = {int(r["step"]): r for r in csv.DictReader(f) if r.get("watch/seconds")}
    return callback, read_log(tmp_path / "lightning.jsonl"), logged


def test_inspect_reads_the_saved_folder(folder, capsys):
    assert main(["inspect", "--model", str(folder), "--text", "The scale keeps the scores small"]) == 0
    out = capsys.readouterr().out
    assert "LlamaModel (LlamaAttention), 2 layers x 4 heads" in out and "per layer" in out


@pytest.mark.slow
@pytest.mark.parametrize("fine_tune", [_hf, _lightning], ids=["hf_trainer", "lightning_dict_batch"])
def test_a_fine_tune_under_the_default_watch_and_an_acting_alert(folder, tmp_path, fine_tune):
    callback, records, logged = fine_tune(folder, tmp_path)
    baseline, *probes = records

    # the baseline: at step 0, before training, every head of the healthy model, and no alert
    assert baseline.step == 0 and [r.step for r in probes] == list(range(EVERY, STEPS + 1, EVERY))
    assert baseline.layers == 2 and baseline.heads == 4 and baseline.probe["sequences"] == 4
    assert baseline.alerts == [] and baseline.actions == [] and baseline.summary["attn/max_score"] < TAU / 5

    # the watch's cost, its first probe included: in the baseline's own seconds, in every total, in the loggers
    totals = [r.watch["total_seconds"] for r in records]
    assert baseline.watch["seconds"] > 0 and totals == sorted(totals) and totals[0] >= baseline.watch["seconds"]
    assert callback.watch.seconds >= totals[-1] > sum(r.watch["seconds"] for r in probes)
    if logged is not None:  # Lightning's CSV logger got the baseline at step 0, with its seconds
        assert float(logged[0]["watch/seconds"]) == pytest.approx(baseline.watch["seconds"]), (logged, records)

    # the alert fired at a probe of training, and its ClipQK clipped from the next step
    fired = next(i for i, r in enumerate(probes) if r.alerts)
    assert probes[fired].summary["attn/max_score"] > TAU and [a["action"] for a in probes[fired].actions] == ["clip_qk"]
    clipped = [r.qk_clip for r in probes[fired + 1:]]
    assert clipped and all(c["tau"] == TAU for c in clipped)
    for clip in clipped:
        # the first promise: the scores the clip read come back to tau: none stays over it, and in each group of
        # query heads sharing a key head (4 over 2) that had a head over tau, the largest is at tau
        for s_H, g_H in zip(clip["s_max"], clip["gamma"]):
            scaled = [s * g for s, g in zip(s_H, g_H)]
            assert max(scaled) <= TAU * (1 + 1e-5)
            for group in ((0, 1), (2, 3)):
                if max(s_H[h] for h in group) > TAU:
                    assert max(scaled[h] for h in group) == pytest.approx(TAU, rel=1e-5)
        assert any(g < 1 for g_H in clip["gamma"] for g in g_H)
        # the second: the step's batch read again after the update and the clip (qk_clip_check) may pass tau
        assert all(math.isfinite(s) for s_H in clip["s_max_after"] for s in s_H)
    assert any(s > TAU for clip in clipped for s_H in clip["s_max_after"] for s in s_H)
