"""The README keeps working: every command it shows parses, every Python block runs (on a
tiny model the test supplies), every relative link resolves, its commands table names every
subcommand, and it stays a front door (at most 200 lines, the watch's first code in its
first 100). Its headline table is pinned to docs/results.md, where each figure is read."""

from __future__ import annotations

import math
import re
import shlex
import unicodedata
from pathlib import Path

import pytest
import torch

from attnscale.cli import build_parser
from attnscale.core.hooks import hooked
from attnscale.lm.model import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
V, T = 11, 16


def _blocks(lang: str, text: str = TEXT) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _tiny_lm():
    return build_model(ModelConfig(vocab_size=V, context=T, d_model=16, n_layers=2, n_heads=2, head_dim=4), seed=0)


def _max_scores_by_hand(model, x_BT) -> dict[tuple[int, int], float]:
    """Each head's largest |q·k × scale| over the keys its mask leaves visible, read from the
    model's own score hook point and reduced in float64 here, not by the capture."""
    model.eval()
    with torch.no_grad(), hooked(model, ["*hook_scores"]) as cache:
        model(x_BT)
    out = {}
    for layer, name in enumerate(sorted(cache)):
        scores_BHTS = cache[name].double()
        visible = torch.isfinite(scores_BHTS)
        for head in range(scores_BHTS.shape[1]):
            out[layer, head] = float(scores_BHTS[:, head].abs()[visible[:, head]].max())
    return out


# ---- a front door ---------------------------------------------------------------------------


def test_the_readme_is_short_and_shows_the_watch_early():
    lines = TEXT.splitlines()
    assert len(lines) <= 200, len(lines)
    first = next(i for i, line in enumerate(lines, 1)
                 if line.startswith("```python") and "attnscale.watch" in "\n".join(lines[i:i + 6]))
    assert first <= 100, first


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not a link
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for link in _links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {link}"
        if anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S),
                                  re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: {link}"


def test_the_slug_rule_is_the_one_mkdocs_writes():
    assert _slug("The verdicts by today's rule") == "the-verdicts-by-todays-rule"
    assert _slug("Several runs on one GPU: `-j`") == "several-runs-on-one-gpu-j"
    assert _slug("The gap in points on WikiText-2 (BPE)") == "the-gap-in-points-on-wikitext-2-bpe"


def test_docs_index_links_every_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {link.partition("#")[0] for link in _links(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked


# ---- the commands ---------------------------------------------------------------------------


def _shell_lines(text: str) -> list[str]:
    lines = []
    for block in _blocks("sh", text):
        lines += [" ".join(shlex.split(line, comments=True)) for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line]


def _subcommands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def test_every_command_shown_parses():
    parser = build_parser()
    shown = [line for line in _shell_lines(TEXT) if re.match(r"(\.venv/bin/)?attnscale ", line)]
    assert shown, "the README shows no attnscale command"
    for line in shown:
        argv = shlex.split(line)[1:]
        args = parser.parse_args(argv)  # an unknown command or option exits 2 here
        assert args.command == argv[0]


def test_every_make_target_shown_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = [line.split()[1] for line in _shell_lines(TEXT) if line.startswith("make ")]
    assert {"reproduce", "test"} <= set(targets)
    for target in targets:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "commands.md"], ids=lambda p: p.name)
def test_the_commands_table_names_every_command(page):
    rows = re.findall(r"^\| `attnscale ([\w-]+)", page.read_text(encoding="utf-8"), re.M)
    assert len(rows) == len(set(rows))
    assert set(rows) == _subcommands()


def test_the_commands_table_shows_a_required_choice_as_required():
    """A command whose parser requires one of a group of options (``--pilot`` or ``--study``) shows the group in
    parentheses, not in the brackets of an option one may leave out; a group one may leave out is not shown as
    required."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    rows = dict(re.findall(r"^\| `attnscale ([\w-]+)([^`]*)`", TEXT, re.M))
    for name, synopsis in rows.items():
        for group in sub.choices[name]._mutually_exclusive_groups:
            flags = [a.option_strings[-1] for a in group._group_actions if a.option_strings]
            shown = [f for f in flags if re.search(rf"{re.escape(f)}(?![\w-])", synopsis)]
            if not shown:
                continue
            open_ = []  # the brackets still open where the group's first flag is shown
            for ch in synopsis[:synopsis.index(shown[0])]:
                if ch in "([":
                    open_.append(ch)
                elif ch in ")]" and open_:
                    open_.pop()
            optional = "[" in open_
            assert optional != group.required, (name, flags, synopsis)


# ---- the Python blocks ----------------------------------------------------------------------


def _block(marker: str) -> str:
    found = [b for b in _blocks("python") if marker in b]
    assert len(found) == 1, marker
    return found[0]


def test_every_python_block_is_run_by_a_test_here():
    markers = ["with Watch(", "callbacks.hf import", "callbacks.lightning import", "numbers = measure("]
    assert sorted(_blocks("python")) == sorted(_block(m) for m in markers)


def test_the_plain_loop_block_logs_the_heads_at_its_probe_step(tmp_path, monkeypatch):
    from attnscale.watch.logs.line import read_log

    monkeypatch.chdir(tmp_path)
    model = _tiny_lm()
    gen = torch.Generator().manual_seed(0)
    loader = [(x, x.roll(-1, 1)) for x in torch.randint(0, V, (100, 6, T), generator=gen)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    exec(compile(_block("with Watch("), "README.md", "exec"), {"model": model, "loader": loader, "optimizer": optimizer})
    records = read_log(tmp_path / "watch.jsonl")
    assert [r.step for r in records] == [0, 100]  # the baseline before training, then a probe every 100 steps
    # the probe: the first 4 sequences of the first batch, measured with the weights after step 100
    by_hand = _max_scores_by_hand(model, loader[0][0][:4])
    assert records[1].summary["attn/max_score"] == pytest.approx(max(by_hand.values()), rel=1e-5)


def test_the_measure_block_gives_each_heads_numbers(monkeypatch):
    model = _tiny_lm()
    batch = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    namespace = {"model": model, "batch": batch}
    exec(compile(_block("numbers = measure("), "README.md", "exec"), namespace)
    numbers = namespace["numbers"]
    by_hand = _max_scores_by_hand(model, batch)
    assert len(by_hand) == 4
    for (layer, head), value in by_hand.items():
        assert numbers[f"attn/layer_{layer}/head_{head}/max_score"] == pytest.approx(value, rel=1e-5)
    assert numbers["attn/max_score"] == pytest.approx(max(by_hand.values()), rel=1e-5)


def _probing_every_step(module, monkeypatch) -> list:
    """The block's WatchCallback, made to probe at step 1 (a test trains one step, not 100)."""
    made = []

    class EveryStep(module.WatchCallback):
        def __init__(self, *args, **options):
            options.setdefault("every", 1)
            super().__init__(*args, **options)
            made.append(self)

    monkeypatch.setattr(module, "WatchCallback", EveryStep)
    return made


def _one_probe(made) -> dict:
    assert len(made) == 1
    step, numbers = made[0].latest
    assert step == 1
    assert math.isfinite(numbers["attn/max_score"]) and numbers["attn/max_score"] > 0
    return numbers


def test_the_trainer_block_attaches_the_watch(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    from attnscale.watch.callbacks import hf

    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.chdir(tmp_path)
    made = _probing_every_step(hf, monkeypatch)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T))
    ids = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(2))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    exec(compile(_block("callbacks.hf import"), "README.md", "exec"), {"model": model, "args": args, "data": data})
    assert set(_one_probe(made)) >= {"attn/layer_0/head_0/max_score", "attn/layer_0/head_1/max_score"}


def test_the_lightning_block_attaches_the_watch(tmp_path, monkeypatch):
    lightning = pytest.importorskip("lightning")
    import torch.nn.functional as F

    from attnscale.watch.callbacks import lightning as callbacks

    class LanguageModel(lightning.LightningModule):  # training_step calls self(x): where the watch takes its probe
        def __init__(self):
            super().__init__()
            self.model = _tiny_lm()

        def forward(self, x_BT):
            return self.model(x_BT)

        def training_step(self, batch, batch_idx):
            x_BT, y_BT = batch
            return F.cross_entropy(self(x_BT).flatten(0, 1), y_BT.flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    monkeypatch.chdir(tmp_path)
    made = _probing_every_step(callbacks, monkeypatch)
    real = lightning.Trainer

    def one_step(**options):  # the block's Trainer, for one quiet step
        return real(**options, max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))

    monkeypatch.setattr(lightning, "Trainer", one_step)
    ids = torch.randint(0, V, (4, T + 1), generator=torch.Generator().manual_seed(3))
    loader = torch.utils.data.DataLoader(list(zip(ids[:, :-1], ids[:, 1:])), batch_size=2)
    module = LanguageModel()
    exec(compile(_block("callbacks.lightning import"), "README.md", "exec"), {"module": module, "loader": loader})
    assert set(_one_probe(made)) >= {"attn/layer_0/head_0/max_score", "attn/layer_0/head_1/max_score"}


# ---- the headline table, pinned where its figures are read in full ------------------------------


def test_the_headline_table_says_what_docs_results_says():
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    table = TEXT[TEXT.index("| the course says |"):].split("\n\n")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert len(rows) == 9
    for claim, course, default, full in rows:
        line = [line for line in results.splitlines() if line.startswith(f"| {claim} | {course} |")]
        assert len(line) == 1, claim
        cells = [c.strip() for c in line[0].strip("|").split("|")]
        # docs/results.md's columns: claim, course, attnscale or the default preset, full fp32, full bf16
        assert cells[2] == default, claim
        assert not full or cells[4] == full or cells[4].startswith(full + " / "), claim


def test_the_end_state_paragraph_says_what_docs_end_state_says():
    """Every figure of the README's end-state paragraph stands in docs/end-state.md, where the run's tables are."""
    import re

    page = " ".join((ROOT / "docs" / "end-state.md").read_text(encoding="utf-8").split())
    start = TEXT.index("The end of training at d = 1,024 and the size of the gap")
    paragraph = TEXT[start:TEXT.index("docs/end-state.md", start)]
    assert "inconsistent for this family of setups" in paragraph and "inconsistent for this family of setups" in page
    figures = set(re.findall(r"\d[\d,]*(?:\.\d+)?", paragraph)) - {"1", "0", "2"}
    assert len(figures) >= 14
    missing = sorted(f for f in figures if not re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d])", page))
    assert not missing, f"README end-state figures not in docs/end-state.md: {missing}"


def test_the_readme_says_whose_numbers_it_shows_as_docs_results_and_the_code_do():
    """The machine, the precision and the commit of each column, how far another CPU moved them, and how a reader
    tells which precision theirs trains in: each figure and commit stands in docs/results.md, each commit in the
    history, and the CPU flags named are the ones ``native_bf16`` reads."""
    import inspect
    import subprocess

    from attnscale.core.device import native_bf16

    start = TEXT.index("Whose numbers:")
    paragraph = " ".join(TEXT[start:TEXT.index("docs/results.md", start)].split())
    results = " ".join((ROOT / "docs" / "results.md").read_text(encoding="utf-8").split())
    assert "fp32" in paragraph and "bf16" in paragraph and "AMD EPYC" in paragraph
    figures = set(re.findall(r"[+]\d+\.\d+|\b\d{3}\b", paragraph))
    assert {"+2.19", "+2.84", "+6.96", "352"} <= figures
    assert all(f in results for f in figures), sorted(f for f in figures if f not in results)
    commits = re.findall(r"commit ([0-9a-f]{7,})", paragraph)
    assert len(commits) == 2 and all(f"commit {c}" in results for c in commits)
    if (ROOT / ".git").exists():  # a clone: each names a commit of its history
        for c in commits:
            assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{c}^{{commit}}"]).returncode == 0, c
    flags = re.findall(r"avx512_bf16|amx_bf16", paragraph)
    assert set(flags) == {"avx512_bf16", "amx_bf16"} and all(f'"{f}"' in inspect.getsource(native_bf16) for f in flags)
