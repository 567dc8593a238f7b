"""Two (or more) processes on the CPU in one gloo process group at 127.0.0.1, for the watch's distributed tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, fn, port: int, world: int, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, *args, world: int = 2) -> None:
    """``fn(rank, *args)`` in each of ``world`` fresh processes, inside their process group; ``fn`` must be a
    module-level function (the processes are spawned, so it travels by name)."""
    mp.start_processes(_run, args=(fn, free_port(), world, args), nprocs=world, join=True, start_method="spawn")


def spawned_into(tmp_path_factory, name: str, fn, world: int = 2) -> Path:
    """A fresh folder, after ``fn(rank, folder)`` has run on every rank (see ``spawn``); skips where this torch
    has no torch.distributed."""
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    out = tmp_path_factory.mktemp(name)
    spawn(fn, str(out), world=world)
    return out
