"""The benchmark scripts under benchmarks/, loaded as modules so that tests can call their functions."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name> as a module (the scripts are not a package: each runs on its own). Its folder
    is first on the import path while it loads, as it is for ``python benchmarks/<name>``, so a script
    imports its neighbours the way it does when run."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, BENCH / name)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def run_bench(name: str, *args: str, timeout: int = 300) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout
