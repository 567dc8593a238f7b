"""Run a sweep's training runs as Ray tasks: one machine's worth of runs or a cluster's.

Each run is one Ray task that calls ``runs.trainer.train_run``, the function every
executor calls; this module only decides where it runs. A task asks Ray for what
its run needs (as many CPUs as it has torch threads; a share of a GPU when it
trains on CUDA), so Ray places the runs on the cluster's nodes and packs them.
The device is resolved in the task, on the node that trains (``task_device``);
the corpus is loaded once by the driver and reaches every task through Ray's
object store; each record names the node that trained it (``Record.ray_node``).

How records reach ``--out``. Workers need not share the driver's disk. A task
trains into a scratch folder on its own node (under Ray's temp folder, removed
when the task ends) and returns the run's files
(record.json, metrics.jsonl, model.safetensors); the driver writes them under
``out/<run_id>`` atomically, the record last, so the run store on the driver's
disk stays the one source of truth and resumes exactly as with local workers.
While a run trains, each checkpoint.pt it saves (``checkpoint_every``) travels
the same way: the task sends it to a small actor on the driver's node (the hub,
which also carries the steps the progress display shows) and the driver writes it
to ``out/<run_id>/checkpoint.pt``. This needs nothing of a cluster but Ray (no
shared file system, no object storage), and a run cut short resumes from its
last checkpoint wherever it runs next. The price: every checkpoint crosses the
network once, and metrics.jsonl lands on the driver when the run ends, not line
by line.

Faults:
- a worker process dies (killed, out of memory, its node lost): Ray runs the task
  again (``MAX_RETRIES``), on a node still alive; the new attempt asks the hub for the run's last
  checkpoint and resumes from it; metrics.jsonl is rewritten from the
  checkpoint's history, so it never holds a step twice;
- the driver dies: its tasks end with it (a local instance too); finished runs
  are on disk, and rerunning the same command keeps them and resumes the others
  from the checkpoints on disk, which the driver hands to the hub first;
- a run raises: its error is reported, the other runs go on, and the sweep ends
  with an error naming every failed run (left "running" on disk: a rerun retries it).

How this process joins Ray (a local instance, HOST:PORT, ray://, auto) is
``runs.ray_connect``'s; Ray is imported only there and here, when a sweep asks for
it (the extra ``attnscale[ray]``).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from attnscale.errors import ConfigError
from attnscale.files import atomic_write_bytes
from attnscale.runs import record as rec
from attnscale.runs.ray_connect import session, start_local

__all__ = ["run", "session", "start_local", "resources", "task_device", "node_of", "MAX_RETRIES", "GPU_SHARE"]

MAX_RETRIES = 3  # attempts after a worker dies; a run that raises is not retried
GPU_SHARE = 0.25  # the tiny model trains far below one GPU: four runs share one
_POLL_S = 0.25  # the driver collects steps, checkpoints and results this often
_STEP_EVERY_S = 0.2  # a task reports its step at most this often


def resources(device: str, threads: int, cluster_has_gpu: bool) -> dict[str, float]:
    """What one run asks Ray for: ``threads`` CPUs, plus ``GPU_SHARE`` of a GPU when it
    trains on CUDA ("auto" trains on CUDA only where the cluster has a GPU to give).
    "cuda:N" asks for a share of some GPU like "cuda" does: Ray, not the index, picks
    which (``task_device``)."""
    need: dict[str, float] = {"num_cpus": threads}
    if device.startswith("cuda") or (device == "auto" and cluster_has_gpu):
        need["num_gpus"] = GPU_SHARE
    return need


def task_device(spec: str, gpu_ids: Sequence[Any], visible: str | None) -> str:
    """The device spec a run trains on inside its Ray task: the device is resolved where
    the run trains, never on the driver (a CPU-only laptop can send CUDA runs to a cluster).

    Ray gives a task the GPUs ``gpu_ids`` and sets CUDA_VISIBLE_DEVICES (``visible``) to
    them, so in the task's process the first GPU it may use is "cuda:0" whatever index
    the command asked for: "cuda:1" on the driver names a GPU of the driver's machine,
    not of the node the run lands on. Where CUDA_VISIBLE_DEVICES is left unset (Ray's
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), the GPU's own index is used. A task
    given no GPU trains "auto" runs off CUDA: a GPU Ray did not give is another run's."""
    if gpu_ids and (spec == "auto" or spec.startswith("cuda")):
        first = str(gpu_ids[0])
        if visible is None:
            return f"cuda:{first}" if first.isdigit() else "cuda"
        order = [v.strip() for v in visible.split(",")]
        return f"cuda:{order.index(first) if first in order else 0}"
    if spec == "auto":  # no torch.cuda call here: it would open a CUDA context on a GPU Ray did not give
        import torch

        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    return spec  # "cpu", "mps", or CUDA without a GPU given: resolve_device says what is missing


def node_of(context) -> dict[str, Any]:
    """The Ray node a task runs on, as its record keeps it (``Record.ray_node``): the node id
    Ray knows it by (two nodes on one host differ only there), its address and host name."""
    import ray

    return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname()}


# ---- the task and the hub ----------------------------------------------------------


def _hub_class():
    """The hub's class, made here so that Ray ships the class itself rather than a
    reference to this module: the hub's worker then never imports attnscale (nor
    torch), and is up in a fraction of a second."""

    class Hub:
        """An actor beside the driver: the steps tasks report, and each run's last checkpoint."""

        def __init__(self):
            self.events: list[tuple[str, str, Any]] = []
            self.checkpoints: dict[str, tuple[int, bytes]] = {}
            self.fresh: set[str] = set()  # checkpoints the driver has not written yet

        def seed(self, checkpoints: dict[str, bytes]) -> None:
            self.checkpoints.update({k: (0, v) for k, v in checkpoints.items()})

        def event(self, kind: str, run_id: str, payload: Any) -> None:
            self.events.append((kind, run_id, payload))

        def put_checkpoint(self, run_id: str, step: int, blob: bytes) -> None:
            if step >= self.checkpoints.get(run_id, (-1, b""))[0]:
                self.checkpoints[run_id] = (step, blob)
                self.fresh.add(run_id)

        def checkpoint(self, run_id: str) -> bytes | None:
            got = self.checkpoints.get(run_id)
            return got[1] if got else None

        def forget(self, run_id: str) -> None:
            self.checkpoints.pop(run_id, None)
            self.fresh.discard(run_id)

        def drain(self) -> tuple[list[tuple[str, str, Any]], dict[str, bytes]]:
            events, self.events = self.events, []
            fresh = {k: self.checkpoints[k][1] for k in self.fresh}
            self.fresh = set()
            return events, fresh

    return Hub


def scratch_dir(context, run_id: str) -> Path:
    """Where one run trains on a Ray node: beside Ray's own files, one place to clean.

    Named by the cluster's session as well as the job: every fresh cluster numbers its first
    job 01000000, so two clusters on one host (two test workers, two users, a cluster and a
    leftover folder) would otherwise share, and delete, one another's scratch."""
    return (Path(context.get_temp_dir()) / "attnscale" / context.get_session_name()
            / context.get_job_id() / run_id)


def _train_task(spec, corpus, threads: int, hub) -> dict[str, bytes]:
    """One run on a Ray worker: train it in scratch space through ``train_run``; return its files.

    ``corpus`` arrives through Ray's object store, put there once by the driver: a node
    needs neither the corpus's file nor a network to fetch it, and a fresh worker loads nothing."""
    import ray
    import torch

    from attnscale.runs.trainer import record_config
    from attnscale.runs.trainer import train_run

    torch.set_num_threads(threads)
    context = ray.get_runtime_context()
    device = task_device(spec.train.device, ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    train_cfg = replace(spec.train, device=device)  # the device does not make another config (runs.store)
    scratch = scratch_dir(context, spec.run_id)
    shutil.rmtree(scratch, ignore_errors=True)  # what a killed attempt on this node left
    scratch.mkdir(parents=True)
    checkpoint = scratch / rec.CHECKPOINT
    try:
        blob = ray.get(hub.checkpoint.remote(spec.run_id))
        if blob is not None:
            checkpoint.write_bytes(blob)
        seen = [_stamp(checkpoint)]
        last = [0.0]
        hub.event.remote("start", spec.run_id, None)

        def on_step(step: int, steps: int, info: dict) -> None:
            now = time.monotonic()
            if now - last[0] >= _STEP_EVERY_S or step == steps:
                last[0] = now
                hub.event.remote("step", spec.run_id, (step, info.get("loss")))
            stamp = _stamp(checkpoint)  # a stat per step: microseconds
            if stamp is not None and stamp != seen[0]:
                seen[0] = stamp
                hub.put_checkpoint.remote(spec.run_id, step, checkpoint.read_bytes())

        run = train_run(spec.model, train_cfg, corpus, scratch, group=spec.group, on_step=on_step, watch=spec.watch)
        asked = record_config(spec.model, spec.train, corpus, spec.watch)  # the device the command asked for
        rec.write(scratch, replace(run.record, config=asked).on_ray_node(node_of(context)))
        return {p.name: p.read_bytes() for p in scratch.iterdir()
                if p.is_file() and p.name != rec.CHECKPOINT and not p.name.startswith(".")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


# ---- the driver -----------------------------------------------------------------------


def _commit(run_dir: Path, files: dict[str, bytes]) -> rec.TrainRun:
    """Write a finished run's files into ``run_dir``, the record last: the record commits the run."""
    if rec.RECORD not in files or any(Path(n).name != n for n in files):
        raise RuntimeError(f"{run_dir.name}: the task returned {sorted(files)}, not a run's files")
    for name, data in files.items():
        if name != rec.RECORD:
            atomic_write_bytes(run_dir / name, data)
    atomic_write_bytes(run_dir / rec.RECORD, files[rec.RECORD])
    (run_dir / rec.CHECKPOINT).unlink(missing_ok=True)  # the run is done with it
    return rec.TrainRun.load(run_dir)


def _fits(ray, needs: dict[str, dict[str, float]], devices: dict[str, str]) -> None:
    """A run no node can hold would wait for ever: say so before submitting anything.
    (The nodes alive now are asked: scale an autoscaling cluster up before a sweep needs it.)"""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for run_id, need in needs.items():
        if any(n.get("CPU", 0) >= need["num_cpus"] and n.get("GPU", 0) >= need.get("num_gpus", 0) for n in nodes):
            continue
        if "num_gpus" in need and not any(n.get("GPU", 0) for n in nodes):
            raise ConfigError(f"--device {devices[run_id]}: no node of the Ray cluster has a GPU "
                              f"({len(nodes)} node{'s' if len(nodes) != 1 else ''}, CPUs only); "
                              "train with --device cpu or auto, or add a GPU node")
        most = max((n.get("CPU", 0) for n in nodes if n.get("GPU", 0) >= need.get("num_gpus", 0)), default=0)
        raise ConfigError(f"each run asks Ray for {need['num_cpus']:g} CPUs (its torch threads, cores/JOBS)"
                          f"{' and a GPU share' if 'num_gpus' in need else ''} but the largest node that could "
                          f"hold it has {most:g}; give a larger -j")


def _remote_train(ray, fn, gpu: bool):
    """``fn`` as a Ray remote function. A run on CPUs keeps its worker for the next run (torch
    imported once). A run on a GPU gets a fresh worker (``max_calls=1``, as Ray's own default for
    GPU tasks, which ``.options(num_gpus=...)`` alone bypasses): Ray sets CUDA_VISIBLE_DEVICES
    per task, but a process binds its GPUs when CUDA starts, so a reused worker would train on the
    GPU of its first run whatever GPU Ray gave this one, and would keep that GPU's memory."""
    return ray.remote(max_calls=1)(fn) if gpu else ray.remote(fn)


def _reason(err) -> tuple[str, BaseException | None]:
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0], cause
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}", None


def run(pending: Sequence[Any], corpus, out: Path, configs: dict[str, dict], bar, *, threads: int,
        summary: Callable[[rec.TrainRun], dict], address: str | None = None, local_cpus: int | None = None) -> None:
    """Train ``pending`` (``runner.RunSpec``s) on ``corpus`` (a loaded ``lm.data.Corpus``) as
    Ray tasks of ``threads`` CPUs each; each finished run is written to ``out/<run_id>``
    as it arrives. ``configs``: each run's record config (for the "running" record);
    ``bar``: a ``runs.progress`` display; ``summary``: a finished run as the display
    shows it; ``local_cpus``: the size of a local instance, when one is started (no
    ``address``, none connected). The device of each run is resolved in its task."""
    from attnscale.runs.trainer import mark_running

    with session(address, local_cpus) as ray:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        has_gpu = any(n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive"))
        needs = {s.run_id: resources(s.train.device, threads, has_gpu) for s in pending}
        _fits(ray, needs, {s.run_id: s.train.device for s in pending})
        # the hub lives and dies with the driver's node, never on a node that may be lost mid-sweep: with a
        # soft affinity, which lets Ray place it elsewhere when this node is busy, it once died with a killed node
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        hub = ray.remote(_hub_class()).options(num_cpus=0, scheduling_strategy=here).remote()
        on_disk = {s.run_id: (out / s.run_id / rec.CHECKPOINT).read_bytes()
                   for s in pending if (out / s.run_id / rec.CHECKPOINT).exists()}
        if on_disk:  # before any task asks for them
            ray.get(hub.seed.remote(on_disk))
        corpus_ref = ray.put(corpus)  # once for the sweep; each node fetches it once
        tasks = {gpu: _remote_train(ray, _train_task, gpu) for gpu in (False, True)}
        refs = {}
        for spec in pending:
            need = needs[spec.run_id]
            mark_running(out / spec.run_id, configs[spec.run_id], spec.group)
            refs[tasks["num_gpus" in need].options(name=f"train {spec.run_id}", max_retries=MAX_RETRIES, **need)
                 .remote(spec, corpus_ref, threads, hub)] = spec
        _drive(ray, refs, hub, out, bar, summary)


def _drive(ray, refs: dict, hub, out: Path, bar, summary) -> None:
    started: set[str] = set()
    ended: set[str] = set()
    failed: dict[str, tuple[str, BaseException | None, str]] = {}

    def start(spec) -> None:
        if spec.run_id not in started:
            started.add(spec.run_id)
            bar.start(spec.run_id, spec.train.steps)

    by_id = {s.run_id: s for s in refs.values()}
    while refs:
        ready, rest = ray.wait(list(refs), num_returns=1, timeout=_POLL_S)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        events, checkpoints = ray.get(hub.drain.remote())
        for ref in ready:  # results first: a run that ended needs none of its checkpoints or steps
            spec = refs.pop(ref)
            start(spec)
            ended.add(spec.run_id)
            hub.forget.remote(spec.run_id)
            try:
                files = ray.get(ref)
            except ray.exceptions.RayError as e:
                short, cause = _reason(e)
                failed[spec.run_id] = (short, cause, str(e))
                bar.finish(spec.run_id, {"status": f"failed ({short})"})
                continue
            bar.finish(spec.run_id, summary(_commit(out / spec.run_id, files)))
        for run_id, blob in checkpoints.items():
            if run_id not in ended:
                atomic_write_bytes(out / run_id / rec.CHECKPOINT, blob)
        for kind, run_id, payload in events:
            if run_id not in ended:
                start(by_id[run_id])
                if kind == "step":
                    bar.step(run_id, *payload)
    if failed:
        lines = "; ".join(f"{r}: {short}" for r, (short, _, _) in failed.items())
        head = f"{len(failed)} of {len(by_id)} runs failed ({lines}); the others are on disk, a rerun retries these"
        if all(isinstance(c, ConfigError) for _, c, _ in failed.values()):
            raise ConfigError(head)
        raise RuntimeError(head + "\n\n" + "\n\n".join(full for _, _, full in failed.values()))
