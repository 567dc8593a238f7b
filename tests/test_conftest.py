"""tests/conftest.py: a run whose browser tests skipped for want of chromium ends with how to get it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("reason, told", [("chromium not found on PATH", True), ("Ray cannot be imported", False)])
def test_a_missing_chromium_is_told_how_to_get(tmp_path, reason, told):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_it.py").write_text(f"import pytest\ndef test_it():\n    pytest.skip({reason!r})\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    assert "1 skipped" in out
    assert ("sudo apt-get install -y chromium" in out) is told


def test_the_longest_files_come_first_and_every_one_named_exists():
    import importlib.util

    here = Path(__file__).parent  # the top conftest, by its path: a room's own conftest may hold the name
    spec = importlib.util.spec_from_file_location("top_conftest", here / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert [name for name in conftest.LONGEST_FIRST if not (here / name).is_file()] == []

    class Item:
        def __init__(self, rel):
            self.fspath = here / rel

    items = [Item("core/test_hooks.py"), Item("report/test_browser.py"), Item("core/test_scales.py"),
             Item("runs/test_ray_executor.py"), Item("report/test_browser.py")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [Path(i.fspath).relative_to(here).as_posix() for i in items] == [
        "runs/test_ray_executor.py", "report/test_browser.py", "report/test_browser.py", "core/test_hooks.py",
        "core/test_scales.py"]
