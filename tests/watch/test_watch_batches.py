"""Every batch shape a framework hands the model is read by the watch's probe: a real LightningModule whose
``training_step`` calls ``self(batch)`` with the loader's dict, tuple, ``BatchEncoding`` or dataclass whole, and
the Hugging Face Trainer's ``model(**inputs)`` in training and in ``prediction_step``. Each probe record equals
``measure_heads`` on the same sequences given as keyword arguments, padding mask included."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from tiny_llama import tiny_llama  # noqa: E402

from attnscale.capture.probe import measure_heads  # noqa: E402
from attnscale.watch.logs.line import read_log  # noqa: E402
from attnscale.watch.logs.sinks import JsonlSink  # noqa: E402

VOCAB, T, PROBE = 40, 12, 2


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Eight sequences of token ids and their padding mask: each ends in one to three pad tokens, so whichever
    sequences a loader puts first are padded."""
    ids = torch.randint(0, VOCAB, (8, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(8, T, dtype=torch.long)
    for i in range(8):
        mask[i, T - 1 - i % 3:] = 0
    return ids, mask


@dataclasses.dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def _collate(shape: str):
    def collate(rows):
        ids, mask = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
        if shape == "dict":
            return {"input_ids": ids, "attention_mask": mask, "labels": ids}
        if shape == "tuple":
            return ids, mask
        if shape == "BatchEncoding":
            from transformers import BatchEncoding

            return BatchEncoding({"input_ids": ids, "attention_mask": mask, "labels": ids})
        return Batch(ids, mask)

    return collate


def _want(model, record, first=None) -> None:
    """The record's numbers are the probe's own on the first batch's first sequences (``first``: the ids and
    mask of the first forward, where the loader shuffles), with their padding."""
    ids, mask = first or _rows()
    padded = measure_heads(model, {"input_ids": ids[:PROBE], "attention_mask": mask[:PROBE]})
    unpadded = measure_heads(model, {"input_ids": ids[:PROBE]})
    assert record.probe["sequences"] == PROBE and record.probe["tokens"] == T
    assert torch.tensor(record.values) == pytest.approx(padded.values_LMH, rel=1e-5, abs=1e-6)
    assert torch.tensor(record.values) != pytest.approx(unpadded.values_LMH, rel=1e-5, abs=1e-6)


def _llama():
    return tiny_llama(VOCAB, layers=1, hidden=16, heads=2, kv_heads=1, context=T)


def _module():
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _llama()

        def forward(self, batch):
            if isinstance(batch, tuple):
                return self.model(input_ids=batch[0], attention_mask=batch[1], labels=batch[0])
            if isinstance(batch, Batch):
                return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                  labels=batch.input_ids)
            return self.model(**batch)

        def training_step(self, batch, batch_idx):
            return self(batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _fit(tmp_path, module, shape: str, steps: int, **options) -> None:
    import lightning.pytorch as pl

    from attnscale.watch.callbacks.lightning import WatchCallback

    ids, mask = _rows()
    loader = torch.utils.data.DataLoader(list(zip(ids, mask)), batch_size=4, collate_fn=_collate(shape))
    callback = WatchCallback(alerts=(), sinks=[JsonlSink(tmp_path / "w.jsonl")], **options)
    pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path)).fit(module, loader)


@pytest.mark.parametrize("shape", ["dict", "tuple", "BatchEncoding", "dataclass"])
def test_a_lightning_module_that_calls_self_on_its_whole_batch_is_probed_on_it(tmp_path, shape):
    pytest.importorskip("lightning")
    module = _module()
    _fit(tmp_path, module, shape, steps=2, every=2, probe_sequences=PROBE)
    record = read_log(tmp_path / "w.jsonl")[-1]
    assert record.step == 2
    _want(module.model, record)


def test_in_the_training_forward_a_tuple_batch_is_read_with_the_mask_the_forward_hands_on(tmp_path):
    """The tuple names no mask: the one the LightningModule hands its Llama keeps the pad tokens out."""
    pytest.importorskip("lightning")
    import copy

    module = _module()
    before = copy.deepcopy(module.model)  # step 1's forward runs on the weights before its update
    _fit(tmp_path, module, "tuple", steps=1, every=1, in_training_forward=True)
    ids, mask = _rows()
    record = read_log(tmp_path / "w.jsonl")[-1]
    assert record.step == 1 and record.probe["sequences"] == 4
    want = measure_heads(before, {"input_ids": ids[:4], "attention_mask": mask[:4]}).values_LMH
    assert torch.tensor(record.values) == pytest.approx(want, rel=1e-4, abs=1e-5)


def _trainer(tmp_path, callback, model, collate, trainer_class=None, **options):
    from transformers import Trainer, TrainingArguments

    ids, mask = _rows()
    rows = list(zip(ids, mask))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, learning_rate=0.1, report_to="none", save_strategy="no",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
                             remove_unused_columns=False, **options)
    return (trainer_class or Trainer)(model=model, args=args, train_dataset=rows, eval_dataset=rows,
                                      data_collator=collate, callbacks=[callback])


@pytest.mark.parametrize("first", ["training", "prediction_step"])
def test_the_hf_trainers_batches_are_probed_in_training_and_in_prediction_step(tmp_path, first):
    """A ``BatchEncoding`` from the collator, given as ``model(**inputs)`` by ``compute_loss`` and by
    ``prediction_step`` (``eval_on_start``: the first forward the watch sees is an evaluation's)."""
    from attnscale.watch.callbacks.hf import WatchCallback

    model = _llama()
    callback = WatchCallback(every=2, alerts=(), probe_sequences=PROBE, sinks=[JsonlSink(tmp_path / "w.jsonl")])
    seen = []
    model.register_forward_pre_hook(lambda m, a, k: seen.append((m.training, k["input_ids"], k.get("attention_mask"))),
                                    with_kwargs=True)
    _trainer(tmp_path, callback, model, _collate("BatchEncoding"), eval_on_start=first == "prediction_step",
             eval_strategy="steps" if first == "prediction_step" else "no", eval_steps=100).train()
    assert seen[0][0] is (first == "training")
    _want(model, read_log(tmp_path / "w.jsonl")[-1], seen[0][1:])


def test_a_trainer_whose_compute_loss_hands_the_model_its_dict_whole_is_probed_on_it(tmp_path):
    from transformers import Trainer

    from attnscale.watch.callbacks.hf import WatchCallback

    class Whole(torch.nn.Module):  # a model whose forward takes the batch dict as one argument
        def __init__(self):
            super().__init__()
            self.model = _llama()

        def forward(self, batch):
            return self.model(**batch)

    class Positional(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            out = model(inputs)
            return (out.loss, out) if return_outputs else out.loss

    model = Whole()
    seen = []
    model.register_forward_pre_hook(lambda m, a, k: seen.append((a[0]["input_ids"], a[0]["attention_mask"])),
                                    with_kwargs=True)
    callback = WatchCallback(every=2, alerts=(), probe_sequences=PROBE, sinks=[JsonlSink(tmp_path / "w.jsonl")])
    _trainer(tmp_path, callback, model, _collate("dict"), trainer_class=Positional).train()
    _want(model.model, read_log(tmp_path / "w.jsonl")[-1], seen[0])
