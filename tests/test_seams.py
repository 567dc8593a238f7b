"""The training loop's seams stay public: nothing outside ``lm/`` reaches into its private names, no
benchmark or example reaches into a private name of attnscale or of another script, and none edits
``sys.path`` (a script run as ``python benchmarks/x.py`` finds its neighbours without it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LM = ROOT / "src" / "attnscale" / "lm"
SCRIPTS = ("benchmarks", "examples")
PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)\b|sys\.path\s*(\[[^\]]*\]\s*=|\+=|=[^=])")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_uses(source: str, owners: tuple[str, ...], siblings: frozenset[str] = frozenset()) -> list[str]:
    """Each private name the source takes from a module under one of ``owners`` (dotted prefixes such as
    ``attnscale.lm``) or from a script among ``siblings``: imported by name, or read off a module bound to
    a name (``import ... as T``, ``from attnscale.lm import train``) or off its full dotted path."""
    def owned(module: str) -> bool:
        return module in siblings or any(module == o or module.startswith(o + ".") for o in owners)

    tree, found, bound = ast.parse(source), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                if owned(node.module) and _private(a.name):
                    found.append(f"from {node.module} import {a.name}")
                elif owned(f"{node.module}.{a.name}"):
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and owned(a.name):
                    bound[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            path = _dotted(node.value)
            module = bound.get(path, path) if path else None
            if module and owned(module):
                found.append(f"{module}.{node.attr}")
    return found


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if ".venv" not in p.parts)


def test_no_module_outside_lm_reads_a_private_name_of_lm():
    outside = [p for top in ("src", "tests", *SCRIPTS) for p in _python_files(ROOT / top)
               if LM not in p.parents]
    assert len(outside) > 100  # the walk found the tree
    bad = {p.relative_to(ROOT).as_posix(): uses for p in outside
           if (uses := private_uses(p.read_text(encoding="utf-8"), ("attnscale.lm",)))}
    assert not bad, f"private names of attnscale.lm used outside lm/ (give them a public name there): {bad}"


def test_no_script_reads_a_private_name_of_attnscale_or_of_another_script():
    for folder in SCRIPTS:
        files = [p for p in _python_files(ROOT / folder)]
        siblings = frozenset(p.stem for p in _python_files(ROOT / folder))
        assert files
        bad = {p.name: uses for p in files
               if (uses := private_uses(p.read_text(encoding="utf-8"), ("attnscale",), siblings))}
        assert not bad, f"{folder}/ reaches into private names: {bad}"


def test_no_script_edits_sys_path():
    files = [p for folder in SCRIPTS for p in _python_files(ROOT / folder)]
    assert len(files) > 10
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in files
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if PATH_EDIT.search(line)]
    assert not bad, f"sys.path edited in {bad}: a script run from the repo root finds its neighbours unaided"


def test_the_checks_see_what_they_forbid():
    """The scanners flag each form they look for, and leave public names and other modules alone."""
    lm = ("attnscale.lm",)
    assert private_uses("from attnscale.lm.train import _clip_, lr_at", lm) == ["from attnscale.lm.train import _clip_"]
    assert private_uses("from attnscale.lm import train as T\nT._build(1)\nT.train(2)", lm) == ["attnscale.lm.train._build"]
    assert private_uses("import attnscale.lm.train as tr\ntr._step", lm) == ["attnscale.lm.train._step"]
    assert private_uses("import attnscale.lm.train\nattnscale.lm.train._Run", lm) == ["attnscale.lm.train._Run"]
    assert private_uses("from attnscale.core import device as dev\ndev._x\nfrom attnscale.lm import __all__", lm) == []
    assert private_uses("from vs_nanogpt import _load", ("attnscale",), frozenset({"vs_nanogpt"})) == \
        ["from vs_nanogpt import _load"]
    assert private_uses("import step_limit as S\nS._x", ("attnscale",), frozenset({"step_limit"})) == ["step_limit._x"]
    for edit in ("sys.path.insert(0, here)", "sys.path.append(here)", "sys.path[:0] = [here]", "sys.path += [here]"):
        assert PATH_EDIT.search(edit), edit
    assert not PATH_EDIT.search("monkeypatch.syspath_prepend(here)") and not PATH_EDIT.search("if x in sys.path:")
