"""A study's published block and its series, as a test that re-derives one reads them: docs/warn-study.json's
``key`` and the series file beside it, or a skip where the study has not published yet."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def published_block(key: str, series: str, kind: str):
    """(the block under ``key``, the series' contents read as ``kind``, the docs folder)."""
    from attnscale.experiments import publish

    docs = ROOT / "docs"
    block = json.loads((docs / "warn-study.json").read_text(encoding="utf-8")).get(key)
    path = docs / series
    if block is None or not path.exists():
        pytest.skip(f"no {key} block published yet")
    return block, publish.read_series(path, kind), docs


def doc_text(docs: Path, name: str) -> str:
    """A doc's text with its line breaks and runs of spaces as one space, as a quoted number is searched for."""
    return " ".join((docs / name).read_text(encoding="utf-8").split())
