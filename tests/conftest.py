"""Shared by every test: no test reads or writes the user's real cache folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_folder(tmp_path_factory):
    """Corpora, fitted tokenizers and token ids go to a temp folder for the whole session
    (``ATTNSCALE_CACHE``, which subprocesses inherit), never to ~/.cache/attnscale."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNSCALE_CACHE", str(tmp_path_factory.mktemp("attnscale-cache")))
        yield
