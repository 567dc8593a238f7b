"""The run store: one self-describing directory per run.

A run directory holds
    record.json     experiment, config, seed, environment, status, results (written atomically)
    metrics.jsonl   optional: one JSON object per recorded step (appended, flushed)
    *.png           optional plots

Reports are built only from these files, never from memory.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "environment", "write_record", "read_record", "find_records", "to_jsonable"]

RECORD = "record.json"


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, paths, tuples and numpy/torch scalars to plain JSON values."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON to a temp file beside ``path`` and rename it into place:
    a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(to_jsonable(obj), f, indent=2, allow_nan=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _git_hash() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Versions, git hash and hardware, for the record."""
    import numpy
    import torch

    import attnscale

    return {
        "attnscale": attnscale.__version__,
        "git": _git_hash(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_record(
    run_dir: Path,
    experiment: str,
    config: Any,
    results: Any,
    *,
    status: str = "done",
    started: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/record.json`` atomically and return its path."""
    now = time.time()
    record = {
        "experiment": experiment,
        "status": status,
        "config": to_jsonable(config),
        "environment": environment(),
        "started": started if started is not None else now,
        "finished": now,
        "duration_s": (now - started) if started is not None else 0.0,
        "results": to_jsonable(results),
    }
    if extra:
        record.update(to_jsonable(extra))
    path = Path(run_dir) / RECORD
    atomic_write_json(path, record)
    return path


def read_record(run_dir: Path) -> dict[str, Any]:
    with open(Path(run_dir) / RECORD) as f:
        return json.load(f)


def find_records(root: Path) -> list[Path]:
    """Every run directory below ``root`` (``root`` itself included) that holds a record."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob(RECORD))
