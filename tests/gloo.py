"""Two (or more) processes on the CPU in one gloo process group, for the watch's and the capture's distributed tests.

The processes meet through a file, not a TCP port: a port found free and let go is anyone's until the group
binds it, and a server of another test on the other worker (W&B's service, a Ray node) may take it first.
Every rank waits at a barrier before the group is taken down: twice in clean-clone suite runs a rank of the
DDP/FSDP test died of SIGABRT ("terminate called without an active exception") while the group was in use,
with either rendezvous; with the barrier it has not recurred."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _run(rank: int, fn, rendezvous: str, world: int, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
        dist.barrier()  # no rank takes the group down while another still reads from it
    finally:
        dist.destroy_process_group()


def spawn(fn, *args, world: int = 2) -> None:
    """``fn(rank, *args)`` in each of ``world`` fresh processes, inside their process group; ``fn`` must be a
    module-level function (the processes are spawned, so it travels by name)."""
    room = tempfile.mkdtemp(prefix="gloo-")
    try:  # the file must not exist before the group starts, so each group gets its own
        mp.start_processes(_run, args=(fn, f"{room}/rendezvous", world, args), nprocs=world, join=True,
                           start_method="spawn")
    finally:
        shutil.rmtree(room, ignore_errors=True)


def spawned_into(tmp_path_factory, name: str, fn, world: int = 2) -> Path:
    """A fresh folder, after ``fn(rank, folder)`` has run on every rank (see ``spawn``); skips where this torch
    has no torch.distributed."""
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    out = tmp_path_factory.mktemp(name)
    spawn(fn, str(out), world=world)
    return out
