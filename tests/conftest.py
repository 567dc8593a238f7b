"""Shared by every test: no test reads or writes the user's real cache folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Tests are laid out as the package (tests/core/, tests/lm/, ...). A few share tiny fixtures and run
# folders across rooms (the tiny configs of lm/test_train.py, the written runs of report/test_report.py):
# every room is importable by its module name, as the one flat folder was.
_HERE = Path(__file__).resolve().parent
for _room in sorted(p for p in _HERE.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))


# Ray starts its workers at nice 15, so a test's Ray tasks yield to anything else on the machine; in
# `make test` that is the other pytest worker, on a 2-core machine. The killed-driver test took 163 s
# beside one busy core and 35 s at niceness 0 (32 s alone). Every Ray instance the tests start
# (in-process, ray.cluster_utils.Cluster, the attnscale-ray-cluster subprocess) inherits this.
os.environ.setdefault("RAY_worker_niceness", "0")

# `make test` runs two workers on a 2-core machine; torch's default, a thread per core in each, puts four
# threads on two cores. A worker's share of the cores instead (OMP_NUM_THREADS, read when torch loads,
# after this file; subprocesses and Ray workers inherit it) took the suite from 6 min 7 s to 5 min 33 s
# on a 2-core EPYC with avx2 only, every test passing. A test that sets its own thread count still does.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _CORES // _WORKERS)))


@pytest.fixture(scope="session", autouse=True)
def _private_cache_folder(tmp_path_factory):
    """Corpora, fitted tokenizers and token ids go to a temp folder for the whole session
    (``ATTNSCALE_CACHE``, which subprocesses inherit), never to ~/.cache/attnscale."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNSCALE_CACHE", str(tmp_path_factory.mktemp("attnscale-cache")))
        yield


def pytest_terminal_summary(terminalreporter):
    """Where the browser tests skipped for want of chromium, one line on how to get it
    (``make test`` installs everything else; a browser is the system's to install)."""
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = [r.longrepr[-1] for r in skipped if isinstance(getattr(r, "longrepr", None), tuple)]  # (path, line, reason)
    if any("chromium" in str(reason) for reason in reasons):
        terminalreporter.write_line("chromium is missing, so the browser tests skipped: on Debian or Ubuntu, "
                                    "sudo apt-get install -y chromium, then make test again")


# The longest files first (seconds of one run of the suite on two workers, an idle 2-core EPYC with avx2 only,
# December 2026), so that the two `--dist loadfile` workers finish together: xdist hands out whole files in this
# order (make test passes --no-loadscope-reorder, which would otherwise put the files of most tests first,
# whatever they cost).
LONGEST_FIRST = (
    "experiments/test_reproduce.py",  # 57 s, 54 of them its quick reproduce
    "test_benchmarks_scripts.py",  # 42 s
    "test_benchmarks.py",  # 40 s: the nanoGPT comparisons
    "runs/test_sweep_runner.py",  # 37 s
    "runs/test_ray_executor.py",  # 36 s
    "report/test_report.py",  # 26 s
    "report/test_browser.py",  # 20 s
    "report/test_plots.py",  # 20 s
    "cli/test_limits.py",  # 17 s
    "runs/test_ray_cluster.py",  # 16 s
)


def pytest_collection_modifyitems(config, items):
    """Put the files of ``LONGEST_FIRST`` first, in that order; every other file after them, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        rel = Path(str(item.fspath)).resolve().relative_to(_HERE).as_posix()
        return rank.get(rel, len(rank))

    items[:] = sorted(items, key=key)  # stable: within a file, and among the rest, the collected order
