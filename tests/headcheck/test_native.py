"""headcheck.native, through attnscale inspect --model RUN_DIR: a finished run's final weights (model.safetensors
beside record.json) or an interrupted run's checkpoint.pt."""

import json
from dataclasses import asdict

import pytest
import safetensors.torch as safetensors_torch  # a core dependency: never skipped
import torch

from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.headcheck.check import inspect_model
from attnscale.lm.model import ModelConfig, build_model
from attnscale.runs import record

from run_folders import _cfg, _run_dir

TEXT = "To be, or not to be, that is the question."


def _ids(B=2, T=32):
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))


def test_run_folder_reads_the_final_weights(tmp_path):
    cfg = _cfg()
    trained = _run_dir(tmp_path / "run", cfg)
    from_folder = inspect_model(str(tmp_path / "run"), _ids(), max_tokens=32)
    in_memory = inspect_model(trained, _ids(), max_tokens=32)
    assert from_folder.rows == in_memory.rows
    # the weights are the file's, not a fresh model's: another seed gives other numbers
    fresh = inspect_model(build_model(cfg, seed=0), _ids(), max_tokens=32)
    assert fresh.rows != from_folder.rows
    assert from_folder.model == str(tmp_path / "run")


def test_tied_read_out_is_read_from_one_name(tmp_path):
    cfg = _cfg(tie_embeddings=True)
    trained = _run_dir(tmp_path / "run", cfg, tie=True)
    assert inspect_model(tmp_path / "run", _ids(), max_tokens=32).rows == inspect_model(trained, _ids(), max_tokens=32).rows


def test_model_config_comes_from_the_record(tmp_path):
    from attnscale.headcheck.native import _model_config_from_run

    cfg = _cfg(head_dim=8, scale="inv_d")
    _run_dir(tmp_path / "run", cfg)
    assert _model_config_from_run(tmp_path / "run") == cfg
    result = inspect_model(str(tmp_path / "run"), _ids(), max_tokens=32)
    assert (result.head_dim, result.scale) == (8, pytest.approx(1 / 8))


def test_run_folder_text_uses_the_run_corpus(tmp_path):
    from attnscale.lm.data import load_corpus

    corpus = load_corpus("default")  # embedded: no download
    trained = _run_dir(tmp_path / "run", _cfg(vocab_size=corpus.vocab_size), corpus=corpus)
    from_folder = inspect_model(str(tmp_path / "run"), TEXT, max_tokens=32)
    assert from_folder.rows == inspect_model(trained, TEXT, tokenizer=corpus.encode, max_tokens=32).rows
    assert from_folder.tokens == len(TEXT)


def test_run_folder_without_corpus_refuses_text_but_takes_ids(tmp_path):
    _run_dir(tmp_path / "run", _cfg())
    with pytest.raises(ConfigError, match="names no corpus"):
        inspect_model(str(tmp_path / "run"), TEXT, max_tokens=32)


def test_interrupted_run_folder_reads_its_checkpoint(tmp_path):
    from attnscale.lm.data import load_corpus

    corpus = load_corpus("default")
    cfg = _cfg(vocab_size=corpus.vocab_size)
    model = build_model(cfg, seed=3)
    run = tmp_path / "run"
    run.mkdir()
    # the layout of a training run's checkpoint
    state = {"config": {"model": asdict(cfg), "train": {}, "corpus": corpus.describe()}, "step": 1, "model": model.state_dict()}
    torch.save(state, run / "checkpoint.pt")
    want = inspect_model(model, TEXT, tokenizer=corpus.encode, max_tokens=32).rows
    assert inspect_model(str(run), TEXT, max_tokens=32).rows == want
    assert inspect_model(str(run / "checkpoint.pt"), TEXT, max_tokens=32).rows == want


def _damage(run, how):
    weights = run / "model.safetensors"
    if how == "missing":
        weights.unlink()
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    elif how == "garbage":
        weights.write_bytes(b"not safetensors at all")
    elif how == "other model":  # weights of a wider model: the shapes do not fit the record
        safetensors_torch.save_file(build_model(_cfg(head_dim=32)).state_dict(), weights)
    elif how == "missing tensor":
        state = safetensors_torch.load_file(weights)
        state.pop("blocks.1.attn.q_proj.weight")
        safetensors_torch.save_file(state, weights)
    elif how == "extra tensor":
        state = safetensors_torch.load_file(weights)
        state["blocks.9.attn.q_proj.weight"] = torch.zeros(2, 2)
        safetensors_torch.save_file(state, weights)
    elif how == "bad record":
        (run / "record.json").write_text("{not json")
    elif how == "record without model":
        record.write(run, record.new("spread", {"head_dims": [32]}, []))
    elif how == "record with a bad model":
        record.write(run, record.new("train", {"model": {"vocab_size": 50, "n_heads": 0}}, None))
    elif how == "no record":
        (run / "record.json").unlink()


@pytest.mark.parametrize("how, words", [
    ("missing", "model.safetensors' does not exist"),
    ("truncated", "model.safetensors' is damaged"),
    ("garbage", "model.safetensors' is damaged"),
    ("other model", "model.safetensors' does not fit the model in its record.json (size mismatch for "),
    ("missing tensor", "lacks 'blocks.1.attn.q_proj.weight'"),
    ("extra tensor", "holds 'blocks.9.attn.q_proj.weight'"),
    ("bad record", "record.json is not valid JSON"),
    ("record without model", "names no model"),
    ("record with a bad model", "does not build a TinyLM"),
    ("no record", "neither record.json (an attnscale run's) nor config.json (a Hugging Face model's)"),
])
def test_damaged_run_is_one_line_and_exit_2(how, words, tmp_path, capsys):
    run = tmp_path / "run"
    _run_dir(run, _cfg())
    _damage(run, how)
    rc = main(["inspect", "--model", str(run), "--text", "hi there"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("attnscale: error: --model: ") and words in err, err
    if "model.safetensors" in words:  # the file is named, and the fix
        assert str(run / "model.safetensors") in err and "train" in err


def test_cli_reads_a_run_folder_and_prints_its_layers(tmp_path, capsys):
    from attnscale.lm.data import load_corpus

    corpus = load_corpus("default")
    _run_dir(tmp_path / "run", _cfg(vocab_size=corpus.vocab_size), corpus=corpus)
    assert main(["inspect", "--model", str(tmp_path / "run"), "--text", TEXT, "--max-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "TinyLM (Attention), 2 layers x 4 heads" in out and "per layer: the mean over its 4 heads" in out
    assert main(["inspect", "--model", str(tmp_path / "run"), "--text", TEXT, "--max-tokens", "32", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed["rows"]) == 8 and len(printed["per_layer"]) == 2


def test_a_run_trained_by_attnscale_is_inspected_from_its_folder(tmp_path, capsys):
    """End to end: runs.trainer writes the folder a finished run keeps; inspect reads it back."""
    from attnscale.lm.data import load_corpus
    from attnscale.lm.train import TrainConfig
    from attnscale.runs.trainer import train_run

    corpus = load_corpus("default")
    cfg = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=16, n_layers=2, n_heads=2, head_dim=8)
    run = train_run(cfg, TrainConfig(steps=3, batch=2, warmup=1, record_every=1, eval_batches=1, threads=1),
                    corpus, tmp_path / "run")
    assert run.status == "done" and (tmp_path / "run" / "model.safetensors").is_file()
    rc = main(["inspect", "--model", str(tmp_path / "run"), "--text", "The for statement iterates over a list.",
               "--max-tokens", "16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["rows"]) == 2 * 2  # layers x heads of the trained model


@pytest.fixture(scope="module")
def trained_folders(tmp_path_factory):
    """The layouts inspect is pointed at: a reproduce-like OUT/<stage>/<run>, trained by the runner,
    and a second folder whose run is a copy (what --reuse and reproduce's sweep leave)."""
    from dataclasses import replace

    from attnscale.lm.data import load_corpus
    from attnscale.lm.train import TrainConfig
    from attnscale.runs import store
    from attnscale.runs.runner import CorpusSpec, RunSpec, execute

    corpus = load_corpus("default")
    out = tmp_path_factory.mktemp("reproduce-out")
    model = ModelConfig(vocab_size=corpus.vocab_size, context=16, d_model=16, n_layers=1, n_heads=2, head_dim=8)
    train = TrainConfig(steps=2, batch=2, warmup=1, record_every=1, eval_batches=1, threads=1)
    specs = [RunSpec(store.run_id(8, s, 0), replace(model, scale=s), train, "dynamics") for s in ("none", "inv_sqrt_d")]
    execute(specs, CorpusSpec("default"), out / "dynamics", progress=False, corpus=corpus)
    execute(specs[:1], CorpusSpec("default"), out / "sweep", progress=False, corpus=corpus, reuse=[out / "dynamics"])
    return out


def test_max_tokens_defaults_to_the_run_context(trained_folders, tmp_path, capsys):
    run = trained_folders / "dynamics" / "d8-none-s0"
    assert main(["inspect", "--model", str(run), "--text", TEXT * 3, "--out", str(tmp_path / "i")]) == 0
    assert "sequences of at most 16 tokens" in capsys.readouterr().out  # the run's context, not 128
    assert record.read(tmp_path / "i").config["max_tokens"] == 16
    assert main(["inspect", "--model", str(run), "--text", TEXT, "--max-tokens", "17"]) == 2
    assert "more than the model's context of 16" in capsys.readouterr().err


def test_default_max_tokens_by_kind_of_model():
    from types import SimpleNamespace

    from attnscale.headcheck.check import DEFAULT_TOKENS, default_max_tokens

    assert default_max_tokens(build_model(_cfg(context=24), seed=0)) == 24
    assert default_max_tokens(SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))) == DEFAULT_TOKENS == 128
    assert default_max_tokens(SimpleNamespace(config=SimpleNamespace(max_position_embeddings=40))) == 40
    assert default_max_tokens(torch.nn.Linear(2, 2)) == DEFAULT_TOKENS


@pytest.mark.parametrize("folder", ["", "dynamics"])
def test_a_folder_of_runs_lists_them_and_suggests_one(trained_folders, folder, capsys):
    given = trained_folders / folder if folder else trained_folders
    assert main(["inspect", "--model", str(given), "--text", TEXT]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    runs = ["d8-inv_sqrt_d-s0", "d8-none-s0"] if folder else ["dynamics/d8-inv_sqrt_d-s0", "dynamics/d8-none-s0", "sweep/d8-none-s0"]
    assert f"holds {len(runs)} training runs, not one ({', '.join(runs)})" in err
    suggested = err.rsplit("--model ", 1)[1]
    assert main(["inspect", "--model", suggested, "--text", TEXT]) == 0  # the suggestion works as given


def test_a_copied_run_is_read_like_the_one_it_copies(trained_folders):
    original = inspect_model(trained_folders / "dynamics" / "d8-none-s0", TEXT)
    copy = inspect_model(trained_folders / "sweep" / "d8-none-s0", TEXT)
    assert record.read(trained_folders / "sweep" / "d8-none-s0").copied_from == str(trained_folders / "dynamics" / "d8-none-s0")
    assert copy.rows == original.rows


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_run_still_training_is_said_so_with_its_latest_checkpoint(checkpoint, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = _cfg()
    # what a run in training leaves: a "running" record, no final weights, perhaps a checkpoint
    record.write(run, record.new("train", {"model": asdict(cfg)}, None, status="running"))
    if checkpoint:
        torch.save({"config": {"model": asdict(cfg)}, "step": 4, "model": build_model(cfg).state_dict()},
                   run / "checkpoint.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    rc = main(["inspect", "--model", str(run), "--text", "hi there"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"attnscale: error: --model: {str(run)!r} is still training (its record.json says running")
    if checkpoint:
        assert f"its latest checkpoint is {str(run / 'checkpoint.pt')!r}: give that to --model" in err
    else:
        assert "it has saved no checkpoint yet" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@pytest.mark.parametrize("status", ["diverged", "done"])
def test_a_run_without_final_weights_says_why(status, tmp_path, capsys):
    # a diverged run keeps no weights (train saves them only when a run ends "done"): training it again
    # "with this version" would not keep them either, so the message says the run diverged
    run = tmp_path / "run"
    results = {"status": status, "steps_done": 37, "diverged_at": 37 if status == "diverged" else None}
    record.write(run, record.new("train", {"model": asdict(_cfg())}, results, status=status))
    rc = main(["inspect", "--model", str(run), "--text", "hi there"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    if status == "diverged":
        assert f"--model: {str(run)!r} diverged at step 37" in err and "has no final weights" in err
        assert "this version" not in err
    else:
        assert "kept no final weights; train it again with this version of attnscale" in err


def test_a_text_file_with_a_byte_order_mark_reads_as_the_same_text(tmp_path, capsys):
    """The mark is not text: with it the file reads as the same tokens, hence the same numbers, as without."""
    from attnscale.lm.data import load_corpus

    corpus = load_corpus("default")
    _run_dir(tmp_path / "run", _cfg(vocab_size=corpus.vocab_size), corpus=corpus)
    (tmp_path / "plain.txt").write_text(TEXT * 3, encoding="utf-8")
    (tmp_path / "marked.txt").write_bytes(b"\xef\xbb\xbf" + (TEXT * 3).encode("utf-8"))
    args = ["inspect", "--model", str(tmp_path / "run"), "--max-tokens", "16", "--json", "--file"]
    assert main([*args, str(tmp_path / "plain.txt")]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, str(tmp_path / "marked.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == plain["rows"]


def test_a_head_with_nan_q_weights_reads_non_finite_and_its_neighbours_keep_their_numbers():
    """inspect reads attnscale's own scores as the watch does: a broken head's NaN scores hide no key, so it
    counts its rows and reads non-finite, and the heads beside it read as the healthy model's do."""
    import math

    from attnscale.headcheck.engine import MODEL

    model = build_model(_cfg(), seed=0)
    healthy = inspect_model(model, _ids(), max_tokens=32).stats[MODEL]
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight[:model.cfg.head_dim].fill_(math.nan)  # head 0's q rows
    stats = inspect_model(model, _ids(), max_tokens=32).stats[MODEL]
    assert stats.rows_LH[0].tolist() == healthy.rows_LH[0].tolist()
    assert stats.nonfinite_LH()[0].tolist() == [True] + [False] * (stats.heads - 1)
    assert torch.equal(stats.values_LMH[0, :, 1:], healthy.values_LMH[0, :, 1:])
    assert stats.summary()["attn/nonfinite_heads"] >= 1.0 and math.isnan(stats.summary()["attn/max_score"])
