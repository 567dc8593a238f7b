"""Files that are whole or absent: the one atomic writer, and plain JSON values.

Below every layer that writes (run records, checkpoints, token caches), so none
of them imports another's module for it."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_json", "to_jsonable"]


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, paths, tuples and numpy/torch scalars to plain JSON values. A dataclass field whose
    metadata says ``json=False`` (tensors kept for the library, read in JSON through other fields) is left out."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj) if f.metadata.get("json", True)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path`` and rename it into place:
    a reader sees the old file or the new one, never half of one. The one
    writer of records, logs copied between runs, checkpoints and caches."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a record is as readable as any file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON, written atomically (``atomic_write_bytes``)."""
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=True) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def _read_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it back at once
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once, at import, not while worker threads may be creating files
