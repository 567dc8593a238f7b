"""What the corpus tests share: a private cache per test with every download pointed at a closed port (an autouse
fixture: import it into a test module), and corpus folders written from strings."""

import socket
from pathlib import Path

import pytest

from attnscale.lm import data


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every test gets its own cache, and no test can reach the real sources."""
    monkeypatch.setenv("ATTNSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(data.MIRROR_ENV, f"http://127.0.0.1:{_closed_port()}")
    for var in ("no_proxy", "NO_PROXY"):  # a CI proxy must not swallow requests to the local server
        monkeypatch.setenv(var, "127.0.0.1,localhost")


def _write(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text, encoding="utf-8")
    return folder
