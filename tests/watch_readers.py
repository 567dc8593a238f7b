"""Read back what the watch's sinks wrote, with each library's own reader (for the watch tests).

TensorBoard: tensorboard's EventAccumulator. W&B: this wandb (0.2x+) keeps no Python reader of its
``run-*.wandb`` transaction log, so ``wandb_history`` reads its framing (a 7-byte ``:W&B`` header,
then LevelDB log chunks in 32 KiB blocks: crc32 u32, length u16, type u8; full=1, first=2,
middle=3, last=4) and parses each record with wandb's own protobuf ``Record``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768


def tensorboard_scalars(log_dir) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in every event file under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    folders = {p.parent for p in Path(log_dir).rglob("events.out.tfevents.*")}
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def _records(data: bytes):
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, part = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield part
            part = b""


def wandb_history(wandb_dir, rows: int = 1, timeout: float = 60.0) -> list[dict]:
    """Every history row (``run.log`` call) of every offline run under ``wandb_dir``, values decoded.
    wandb's service writes the file after ``finish()`` returns, so this waits up to ``timeout`` seconds
    for at least ``rows`` rows."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        found = _history(wandb_dir)
        if len(found) >= rows or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _history(wandb_dir) -> list[dict]:
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(p for p in Path(wandb_dir).rglob("run-*.wandb") if "latest-run" not in p.parts):
        for raw in _records(path.read_bytes()):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows
