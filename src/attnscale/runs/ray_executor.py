"""Run a sweep's training runs as Ray tasks: one machine's worth of runs or a cluster's.

Each run is one Ray task that calls ``runs.trainer.train_run``, the function every
executor calls; this module only decides where it runs. A task asks Ray for what
its run needs (as many CPUs as it has torch threads; a share of a GPU when it
trains on CUDA), so Ray places the runs on the cluster's nodes and packs them.

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
  again (``MAX_RETRIES``); the new attempt asks the hub for the run's last
  checkpoint and resumes from it; metrics.jsonl is rewritten from the
  checkpoint's history, so it never holds a step twice;
- the driver dies: its tasks end with it (a local instance too); finished runs
  are on disk, and rerunning the same command keeps them and resumes the others
  from the checkpoints on disk, which the driver hands to the hub first;
- a run raises: its error is reported, the other runs go on, and the sweep ends
  with an error naming every failed run (left "running" on disk: a rerun retries it).

Without an address a local Ray instance is started for the sweep and shut down
after it: bound to 127.0.0.1 only, dashboard off, usage statistics off. Ray is
imported here only, when a sweep asks for it (the extra ``attnscale[ray]``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from attnscale.errors import ConfigError
from attnscale.files import atomic_write_bytes
from attnscale.runs import record as rec

__all__ = ["run", "session", "start_local", "resources", "MAX_RETRIES", "GPU_SHARE"]

MAX_RETRIES = 3  # attempts after a worker dies; a run that raises is not retried
GPU_SHARE = 0.25  # the tiny model trains far below one GPU: four runs share one
_POLL_S = 0.25  # the driver collects steps, checkpoints and results this often
_STEP_EVERY_S = 0.2  # a task reports its step at most this often
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install -e '.[ray]' in the clone") from None
    return ray


def resources(device: str, threads: int, cluster_has_gpu: bool) -> dict[str, float]:
    """What one run asks Ray for: ``threads`` CPUs, plus ``GPU_SHARE`` of a GPU when it
    trains on CUDA ("auto" trains on CUDA only where the cluster has a GPU to give)."""
    need: dict[str, float] = {"num_cpus": threads}
    if device.startswith("cuda") or (device == "auto" and cluster_has_gpu):
        need["num_gpus"] = GPU_SHARE
    return need


# ---- connecting -----------------------------------------------------------------------


@contextlib.contextmanager
def _this_host_only():
    """Let a Ray node be 127.0.0.1. Ray turns that address into the host's outward
    one, and then listens on every interface, unless it runs in single-host mode,
    which it keys on RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read at import into
    ``ray_constants``: both are set while the node starts (its processes inherit
    the variable) or joins, then put back, so a later join of a real cluster is
    untouched. Usage statistics are switched off the same way (RAY_USAGE_STATS_ENABLED=0)."""
    from ray._private import ray_constants

    names = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")
    saved_env = {k: os.environ.get(k) for k in names}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_local(num_cpus: int | None = None) -> None:
    """Start a Ray instance on this machine for this process: 127.0.0.1 only, no
    dashboard, no usage statistics; ``num_cpus`` None lets Ray count them."""
    ray = _import_ray()
    # Ray's token authentication stays on; its notice that it is on is not a warning to a user of
    # attnscale, whose stderr carries only progress and errors
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    before = notice.level
    notice.setLevel(logging.ERROR)
    try:
        with _this_host_only():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    finally:
        notice.setLevel(before)


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _check_reachable(address: str) -> None:
    """Ray itself waits minutes on an address where nothing listens: look first."""
    where = _host_port(address)
    if where is None:  # "auto": Ray finds the cluster this node belongs to
        return
    try:
        socket.create_connection(where, timeout=5).close()
    except OSError as e:
        raise ConfigError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}); "
                          "start its head with `ray start --head` or fix the address") from None


def _join(address: str) -> None:
    ray = _import_ray()
    where = _host_port(address)
    loopback = where is not None and where[0] in _LOOPBACK
    with _this_host_only() if loopback else contextlib.nullcontext():
        ray.init(address=address, logging_level=logging.WARNING)


@contextlib.contextmanager
def session(address: str | None = None, num_cpus: int | None = None):
    """Yield the ``ray`` module connected to a cluster: the one this process is
    already connected to (left connected), else the one at ``address``, else a local
    instance of ``num_cpus`` CPUs started now (also for ``address`` "local"); the
    last two are let go on exit."""
    ray = _import_ray()
    address = None if address == "local" else address
    if address:
        _check_reachable(address)
    if ray.is_initialized():
        yield ray
        return
    if address:
        _join(address)
    else:
        start_local(num_cpus)
    try:
        yield ray
    finally:
        ray.shutdown()


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


_corpora: dict[Any, Any] = {}  # per worker process: Ray reuses a worker for many tasks


def _train_task(spec, corpus_spec, threads: int, hub) -> dict[str, bytes]:
    """One run on a Ray worker: train it in scratch space through ``train_run``; return its files."""
    import ray
    import torch

    from attnscale.runs.trainer import train_run

    torch.set_num_threads(threads)
    if corpus_spec not in _corpora:
        _corpora.clear()
        _corpora[corpus_spec] = corpus_spec.load()
    context = ray.get_runtime_context()  # scratch beside Ray's own files on this node: one place to clean
    scratch = Path(context.get_temp_dir()) / "attnscale" / context.get_job_id() / spec.run_id
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

        train_run(spec.model, spec.train, _corpora[corpus_spec], scratch, group=spec.group, on_step=on_step)
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


def _fits(ray, needs: Sequence[dict[str, float]]) -> None:
    """A run no node can hold would wait for ever: say so before submitting anything."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    most_cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    cpus = max(n["num_cpus"] for n in needs)
    if cpus > most_cpus:
        raise ConfigError(f"each run asks Ray for {cpus:g} CPUs (its torch threads, cores/JOBS) but the largest "
                          f"node has {most_cpus:g}; give a larger -j")
    if any("num_gpus" in n for n in needs) and not any(n.get("GPU", 0) for n in nodes):
        raise ConfigError("runs ask for CUDA but no node of the Ray cluster has a GPU; train on cpu or add a GPU node")


def _reason(err) -> tuple[str, BaseException | None]:
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0], cause
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}", None


def run(pending: Sequence[Any], corpus_spec, out: Path, configs: dict[str, dict], bar, *, threads: int,
        summary: Callable[[rec.TrainRun], dict], address: str | None = None, local_cpus: int | None = None) -> None:
    """Train ``pending`` (``runner.RunSpec``s) as Ray tasks of ``threads`` CPUs each; each
    finished run is written to ``out/<run_id>`` as it arrives. ``configs``: each run's
    record config (for the "running" record); ``bar``: a ``runs.progress`` display;
    ``summary``: a finished run as the display shows it; ``local_cpus``: the size
    of a local instance, when one is started (no ``address``, none connected)."""
    from attnscale.runs.trainer import mark_running

    with session(address, local_cpus) as ray:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        has_gpu = any(n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive"))
        needs = {s.run_id: resources(s.train.device, threads, has_gpu) for s in pending}
        _fits(ray, list(needs.values()))
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        hub = ray.remote(_hub_class()).options(num_cpus=0, scheduling_strategy=here).remote()
        on_disk = {s.run_id: (out / s.run_id / rec.CHECKPOINT).read_bytes()
                   for s in pending if (out / s.run_id / rec.CHECKPOINT).exists()}
        if on_disk:  # before any task asks for them
            ray.get(hub.seed.remote(on_disk))
        task = ray.remote(_train_task)
        refs = {}
        for spec in pending:
            mark_running(out / spec.run_id, configs[spec.run_id], spec.group)
            refs[task.options(name=f"train {spec.run_id}", max_retries=MAX_RETRIES, **needs[spec.run_id])
                 .remote(spec, corpus_spec, threads, hub)] = spec
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
