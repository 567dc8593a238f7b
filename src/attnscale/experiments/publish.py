"""Publishing a pre-registered study: its numbers as one block of the studies' JSON (docs/warn-study.json), its
runs' series as a gzip'd JSON file, both written from run folders by the study's own command (``--publish``), so
that a test can re-derive every published number from the series.

A study's block replaces only its own key of the JSON ("act", "sensitivity", "alarm"); a file that is not the
studies' JSON (an object holding one of their keys) is refused, and so is a series file another command wrote.
A run is published once: a series that would hold a run id twice is refused.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError

__all__ = ["STUDY_KEYS", "check_json", "write_block", "write_series", "read_series", "rounded"]

STUDY_KEYS = ("recipe", "recipe_16", "families", "reread", "act", "sensitivity", "alarm")


def check_json(path: Path, option: str = "--json-out") -> dict[str, Any]:
    """The studies' JSON at ``path`` (an empty dict where there is no file yet); a ConfigError, one line, where it
    is a folder, cannot be read, or holds none of the studies' keys (someone else's file is never written over)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option}: {str(path)!r} is a folder; give the studies' JSON file (e.g. docs/warn-study.json)")
    if not path.exists():
        if not path.parent.is_dir():
            raise ConfigError(f"{option}: {str(path.parent)!r} is not a folder; give a file in a folder that exists")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{option}: {str(path)!r} cannot be read as JSON ({str(e)[:80]}); give the studies' JSON "
                          "file, or a new file") from None
    if not isinstance(data, dict) or not set(data) & set(STUDY_KEYS):
        raise ConfigError(f"{option}: {str(path)!r} is not the studies' JSON (none of {', '.join(STUDY_KEYS)}); give "
                          "another file, or move that one away first")
    return data


def write_block(path: Path, key: str, block: dict[str, Any], option: str = "--json-out") -> None:
    """Replace (or add) ``key`` of the studies' JSON at ``path`` with ``block``, the rest kept as it was."""
    from attnscale.files import atomic_write_bytes, to_jsonable

    if key not in STUDY_KEYS:
        raise ValueError(f"unknown study block {key!r}")
    data = check_json(path, option)
    data[key] = to_jsonable(block)
    text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    atomic_write_bytes(Path(path), text.encode("utf-8"))


def rounded(x: float | None, digits: int) -> float | None:
    """``x`` to ``digits`` significant digits (None and non-finite values as None)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def write_series(path: Path, study: str, runs: Sequence[dict[str, Any]], header: dict[str, Any] | None = None) -> None:
    """Every run as one gzip'd JSON file opening ``{"study":"<study>",`` (``runs.writers.written_by`` knows it by
    that), with ``header``'s numbers, then {"runs": [...]}: each run's losses to 6 significant digits and its probes'
    values to 5, the rest as given."""
    from attnscale.files import atomic_write_bytes

    ids = [r["run_id"] for r in runs]
    twice = next((x for x in ids if ids.count(x) > 1), None)
    if twice is not None:  # counted twice a run would weigh twice in every figure
        raise ValueError(f"run {twice} is given twice; a series holds each run once")
    out = []
    for row in runs:
        keep = dict(row)
        keep["losses"] = [rounded(x, 6) for x in row.get("losses") or []]
        keep["probes"] = [{k: (v if k == "step" else rounded(v, 5)) for k, v in p.items()} for p in row.get("probes") or []]
        out.append(keep)
    text = json.dumps({"study": study, **(header or {}), "runs": out}, separators=(",", ":"), allow_nan=False)
    atomic_write_bytes(Path(path), gzip.compress(text.encode("utf-8"), mtime=0))


def read_series(path: Path, study: str) -> dict[str, Any]:
    """A series file ``write_series`` wrote for ``study``; a ConfigError, one line, for anything else."""
    import zlib

    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()).decode("utf-8"))
    except (OSError, EOFError, zlib.error, ValueError) as e:
        raise ConfigError(f"{str(path)!r} cannot be read as a gzip'd series ({type(e).__name__}); give the file "
                          f"attnscale {study}-study --publish wrote") from None
    if not isinstance(data, dict) or data.get("study") != study or not isinstance(data.get("runs"), list):
        raise ConfigError(f"{str(path)!r} is not the {study} study's series; give the file attnscale {study}-study "
                          "--publish wrote")
    return data


def check_targets(json_out: Path | None, series: Path | None, command: str) -> None:
    """Both files a ``--publish`` writes, checked before anything is read or written: the studies' JSON
    (``check_json``) and a series file that is not a folder and that no one but ``attnscale command`` wrote."""
    from attnscale.runs.writers import check_file

    if json_out is not None:
        check_json(json_out)
    if series is not None:
        if Path(series).is_dir():
            raise ConfigError(f"--series: {str(series)!r} is a folder; give the file to write (e.g. "
                              f"docs/{command}-series.json.gz)")
        check_file(series, command, "--series", "series file")


def publish(json_out: Path | None, key: str, block: dict[str, Any], series: Path | None, study: str,
            runs: Sequence[dict[str, Any]], header: dict[str, Any]) -> None:
    """Write ``block`` as ``key`` of the studies' JSON and ``runs`` as ``study``'s series (each where given)."""
    if json_out is not None:
        write_block(json_out, key, block)
    if series is not None:
        write_series(series, study, runs, header)
