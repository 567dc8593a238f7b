"""The package's floors (docs/architecture.md draws them; README, "Where things live"): no module imports from
a floor above its own, and no import of any kind (at the top, inside a function, or for types only) closes a circle.

Modules of one floor may import each other, one way only."""

import ast
from pathlib import Path

import attnscale

SRC = Path(attnscale.__file__).parent
DRAWING = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# lowest first; a module may import from its own floor or any lower one, lazily or not
RANK = {"__init__": 1, "errors": 0, "files": 0, "limits": 0, "terminal": 0, "drawing": 0, "core": 1, "capture": 2,
        "watch": 3, "lm": 4, "runs": 5, "analysis": 6, "headcheck": 7, "experiments": 8, "report": 9, "reproduce": 10,
        "cli": 11}


def _layer(parts: list[str]) -> str:
    return parts[0] if parts else "__init__"


def _absolute(node: ast.ImportFrom, path: Path) -> str | None:
    """The module a (possibly relative) ``from … import`` names, as ``attnscale.x.y``."""
    if not node.level:
        return node.module
    package = list(path.relative_to(SRC.parent).with_suffix("").parts)[:-1]  # the importing module's package
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            node = ast.ImportFrom(module=_absolute(node, path), names=node.names, level=0, lineno=node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "attnscale":  # from attnscale import files, report
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnscale."):
            yield node.module.split(".")[1], node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnscale."):
                    yield alias.name.split(".")[1], node.lineno


def test_every_module_has_a_layer():
    top = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
           if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert top - {"__init__"} <= set(RANK), top - set(RANK)
    assert set(RANK) - {"__init__"} <= top, set(RANK) - top - {"__init__"}  # no floor keeps a room that is gone


def test_no_import_runs_up_a_layer():
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("").parts
        here = _layer(list(rel))
        for target, line in _imports(path):
            if target in RANK and RANK[target] > RANK[here]:
                upward.append(f"{'/'.join(rel)}.py:{line} imports attnscale.{target}")
    assert not upward, upward


def test_relative_imports_are_read_as_the_modules_they_name(tmp_path):
    node = ast.parse("from ..report import course").body[0]
    assert _absolute(node, SRC / "runs" / "runner.py") == "attnscale.report"
    node = ast.parse("from . import record").body[0]
    assert _absolute(node, SRC / "runs" / "runner.py") == "attnscale.runs"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the attnscale modules it imports (``from attnscale.lm import train`` names attnscale.lm.train)."""
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, path) or ""
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that reach one another through imports (Tarjan's strongly connected components)."""
    index, low, stack, circles = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_closes_a_circle():
    assert not _circles(_graph())


def test_a_circle_is_found_whatever_its_length():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_experiments_return_data_and_only_the_report_draws():
    """An experiment may use the analysis (its numbers), never the report: no claim, section, plot or renderer."""
    drawing = [f"{name} imports {t}" for name, targets in _graph().items() if name.startswith("attnscale.experiments")
               for t in targets if t.startswith("attnscale.report")]
    assert not drawing, drawing


def _drawn_floors(text: str) -> dict[str, int]:
    """Room -> floor, as the drawing shows them: each table row ``│ floor │ rooms │ what it holds │ imports │``."""
    floors = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[1].isdigit():
            floors.update(dict.fromkeys(cells[2].split(), int(cells[1])))
    return floors


def test_the_drawing_of_the_house_shows_the_floors_the_test_holds():
    assert _drawn_floors(DRAWING.read_text(encoding="utf-8")) == RANK


def test_a_drawn_row_names_its_rooms_and_their_floor():
    row = "│     0 │ errors files        │ a user's mistake, atomic files │ 0       │"
    assert _drawn_floors("╱ attnscale ╲\n│ floor │ rooms │ what it holds │ imports │\n" + row) == {"errors": 0, "files": 0}
