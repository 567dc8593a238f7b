"""Nothing read from disk runs code: every ``torch.load`` in src/ says ``weights_only=True``, and nothing in src/
unpickles (``pickle.load``/``loads``/``Unpickler``, ``marshal.loads``) or evaluates text (``eval``, ``exec``).

The walk reads each module's syntax tree, so a load added later is checked without being listed here; a
``model.eval()`` is a method, not the builtin, and is left alone."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
UNPICKLING = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("marshal", "loads"),
              ("marshal", "load")}


def _dotted(node: ast.AST) -> tuple[str, ...]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return tuple(reversed(parts))


def unsafe_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every call in ``tree`` that could run code read from a file."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in (("eval",), ("exec",)):
            found.append((node.lineno, f"{name[0]}()"))
        elif name[-2:] in UNPICKLING:
            found.append((node.lineno, ".".join(name)))
        elif name[-2:] == ("torch", "load"):
            safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in node.keywords)
            if not safe:
                found.append((node.lineno, "torch.load without weights_only=True"))
    return found


def test_no_module_of_src_loads_anything_that_could_run_code():
    bad = [f"{path.relative_to(SRC)}:{line}: {what}" for path in sorted(SRC.rglob("*.py"))
           for line, what in unsafe_calls(ast.parse(path.read_text(encoding="utf-8"), str(path)))]
    assert not bad, "loads that could run code read from a file:\n" + "\n".join(bad)


def test_the_walk_finds_each_kind_of_unsafe_load():
    code = """
import pickle, torch
torch.load(p)
torch.load(p, weights_only=False)
pickle.loads(b)
eval(text)
exec(text)
torch.load(p, weights_only=True)
model.eval()
"""
    assert [line for line, _ in unsafe_calls(ast.parse(code))] == [3, 4, 5, 6, 7]
