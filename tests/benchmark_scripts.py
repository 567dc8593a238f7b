"""The benchmark scripts under benchmarks/, loaded as modules so that tests can call their functions."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name> as a module (the scripts are not a package: each runs on its own)."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, BENCH / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
