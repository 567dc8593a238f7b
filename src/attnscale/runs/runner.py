"""Run many training runs: resumable, in parallel worker processes, with progress.

Every run trains into ``out/<run_id>`` through ``runs.trainer.train_run`` (``runs.record``
describes the files).
Resume, decided per run by ``store.run_state`` before any training starts:
- a record with status done or diverged and the same config is kept, never redone;
- a run cut short (no record, or one left "running" by a killed or interrupted
  process) is trained again, from train's ``checkpoint.pt`` where one was saved,
  else from step 0; its ``metrics.jsonl`` is rewritten from the checkpoint's
  history, so a restarted run never logs a step twice;
- a folder holding a run of another config stops everything with a ConfigError
  that asks for another --out: two experiments never mix in one folder;
- a record that cannot be read is set aside with what the run made
  (``store.set_aside``: renamed, said on stderr, never deleted) and the run trained again.
A run is marked "running" (a record with its config) before training starts,
so an interrupted folder still says what it was for.

Order: pending runs start dearest first (``longest_first``), so the last runs
to finish are short ones and no worker sits idle while another finishes a
wide run it began last; records still come back in the order given.

Parallelism: ``jobs`` worker processes, started with "spawn" (a fork of a
process that has run torch's thread pool can deadlock), each loading the corpus
itself (data.py caches tokenized ids) and limited to ``cores // jobs`` torch
threads, so workers share the cores instead of fighting over them. With
``jobs=1`` runs train in this process, which saves a torch import per run.
Ctrl-C stops the workers; every finished run is already on disk.

``executor="ray"`` hands the same runs, with the same thread count, to Ray tasks
instead (``runs.ray_executor``: a local Ray instance, or a cluster at ``ray_address``);
each run's device is then resolved on the node that trains it, not here.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue as queue_mod
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from attnscale import files, limits
from attnscale.files import to_jsonable
from attnscale.runs import record as rec
from attnscale.runs import pace as pace_mod
from attnscale.runs import store, writers
from attnscale.errors import ConfigError
from attnscale.lm.model import ModelConfig
from attnscale.runs.progress import make_progress
from attnscale.runs.trainer import mark_running, train_run
from attnscale.lm.train import TrainConfig

__all__ = ["CorpusSpec", "RunSpec", "execute", "estimate", "cores", "longest_first", "EXECUTORS"]

_STEP_MESSAGE_EVERY_S = 0.2  # a worker reports its step at most this often
EXECUTORS = ("local", "ray")  # where runs train: worker processes of this machine, or Ray tasks


@dataclass(frozen=True)
class CorpusSpec:
    """How to load a corpus (``attnscale.lm.data.load_corpus`` arguments), so each worker can load it."""

    spec: str = "default"
    tokenizer: str | None = None
    bpe_vocab: int = 4096
    cache_dir: str | None = None

    def load(self):
        from attnscale.lm.data import load_corpus

        return load_corpus(self.spec, self.tokenizer, bpe_vocab=self.bpe_vocab, cache_dir=self.cache_dir)


@dataclass(frozen=True)
class RunSpec:
    """One training run of a sweep: its folder name, configs and the experiment it belongs to."""

    run_id: str
    model: ModelConfig
    train: TrainConfig
    group: str | None = None
    # the run's watch as plain data (``trainer.build_watch`` makes the ``Attached`` where the run trains);
    # None: no watch, and the run's config is what it was before runs had watches
    watch: dict[str, Any] | None = None


def estimate(specs: Sequence[RunSpec]) -> limits.Estimate:
    """What training every run of ``specs`` costs (``pace.run_cost`` of each, summed); the
    seconds it takes here come from ``pace.Pace``, the rate measured on this machine."""
    ops, largest = 0.0, 0.0
    for s in specs:
        e = pace_mod.run_cost(s)
        ops, largest = ops + e.ops, max(largest, e.bytes)
    return limits.Estimate(f"training {len(specs)} run{'s' if len(specs) != 1 else ''}", largest, ops)


def cores() -> int:
    """CPU cores this process may use (the affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _config(spec: RunSpec, corpus) -> dict[str, Any]:
    from attnscale.runs.trainer import record_config  # the shape the record holds, so run_state compares like with like

    return record_config(spec.model, spec.train, corpus, spec.watch)


def _check(specs: Sequence[RunSpec], corpus, executor: str) -> None:
    """The runs' ids, lengths and vocabularies; their device too where they train here (Ray
    resolves it where each run trains, and refuses one no node has before any run starts)."""
    ids = [s.run_id for s in specs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"run ids must be unique; repeated: {', '.join(dupes)}")
    from attnscale.lm.data import check_length

    from attnscale.core.device import resolve_device

    for device in sorted({s.train.device for s in specs}) if executor == "local" else ():
        resolve_device(device)  # a device this machine lacks stops the sweep before any folder is written
    from attnscale.lm.train import check_watch
    from attnscale.runs.trainer import build_watch

    for s in specs:
        if s.watch is not None:  # a watch its worker could not build or follow stops the sweep before any folder
            check_watch(build_watch(s.watch), s.train)
        check_length(corpus.train, s.model.context, "corpus's training split")
        check_length(corpus.valid, s.model.context, "corpus's held-out split")
        if s.model.vocab_size < corpus.vocab_size:
            raise ConfigError(f"run {s.run_id}: model vocab_size {s.model.vocab_size} < corpus vocab {corpus.vocab_size}")


def _finished_by_config(folder: Path) -> dict[str, Path]:
    """A reuse folder's finished training runs, by their comparable config (read once per folder)."""
    out: dict[str, Path] = {}
    for d in sorted(folder.iterdir()):
        try:
            record = rec.read(d) if (d / rec.RECORD).is_file() else None
        except rec.RecordError:
            continue
        if record is not None and record.experiment == "train" and record.finished_ok:
            out.setdefault(_config_key(record.config), d)
    return out


def _config_key(config: Any) -> str:
    return json.dumps(to_jsonable(store.comparable_config(config)), sort_keys=True)


def _copy_finished(spec: RunSpec, config: dict, out: Path, reuse: Sequence[Path],
                   index: dict[Path, dict[str, Path]]) -> Path | None:
    """Copy a finished run of ``config`` from a ``reuse`` folder into ``out``; return that
    folder, or None if none has one.

    The run of the same name is looked at first, then every other run in the folder: a run of
    the very same config is the same run whatever its name (the setup study's 1,200-step rows
    are the full preset's dynamics runs). ``index`` caches each folder's runs by config."""
    for folder in reuse:
        folder = Path(folder)
        if not folder.is_dir() or folder.resolve() == out.resolve():
            continue
        source = folder / spec.run_id
        try:
            named = store.run_state(source, config) == "finished"
        except ConfigError:
            named = False  # another config under that name: not this run
        if not named:
            if folder not in index:
                index[folder] = _finished_by_config(folder)
            source = index[folder].get(_config_key(config))
            if source is None:
                continue
        target = out / spec.run_id
        target.mkdir(parents=True, exist_ok=True)
        for name in (rec.METRICS, rec.WEIGHTS):  # the files first, the record last: the record commits the copy
            if (source / name).exists():
                files.atomic_write_bytes(target / name, (source / name).read_bytes())
        rec.write(target, rec.TrainRun.load(source).copied(spec.group, str(source)))
        return folder
    return None


def longest_first(specs: Sequence[RunSpec], step_weights: dict[str, float]) -> list[RunSpec]:
    """``specs``, dearest run first (``step_weights[run_id]`` × its steps; ties keep their order).

    Workers take the next run as they free up; were the widest runs last (a sweep lists
    widths narrow first), one worker would train the last of them while the others,
    with nothing left, wait. Started dearest first, the runs left at the end are the
    short ones, and the workers finish within about one short run of each other."""
    return sorted(specs, key=lambda s: -step_weights[s.run_id] * s.train.steps)


def _summary(run: rec.TrainRun) -> dict[str, Any]:
    return {"status": run.status, "valid_ppl": run.perplexity, "duration_s": run.record.duration_s}


def execute(
    specs: Sequence[RunSpec],
    corpus_spec: CorpusSpec,
    out: Path,
    *,
    jobs: int = 1,
    progress: bool = True,
    corpus=None,
    reuse: Sequence[Path] = (),
    executor: str = "local",
    ray_address: str | None = None,
    pace: pace_mod.Pace | None = None,
    keep_order: bool = False,
) -> list[rec.TrainRun]:
    """Train every run of ``specs`` not already finished under ``out``; return all
    their records, read back from disk, in the order given.

    ``corpus``, when given, must be ``corpus_spec.load()`` (saves loading it twice).
    ``reuse``: other output folders whose finished runs of the very same config
    are copied instead of trained again (``reproduce``'s sweep takes its widest
    pair from the dynamics experiment: same seed, same budget, same numbers).
    ``executor``: "local" (worker processes) or "ray" (Ray tasks of cores/jobs CPUs
    each, on a local instance or the cluster at ``ray_address``). ``pace``: this machine's
    ``runs.pace.Pace``, so that the runs' time left weighs their steps as the stage's does. ``keep_order``:
    start the pending runs in the order given, not dearest first (a study cut short keeps whole groups)."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs must be a positive integer, got {jobs!r}")
    if executor not in EXECUTORS:
        raise ConfigError(f"executor {executor!r} is unknown; choose one of: {', '.join(EXECUTORS)}")
    out = Path(out)
    writers.check_runs_folder(out)
    corpus = corpus if corpus is not None else corpus_spec.load()
    _check(specs, corpus, executor)
    configs = {s.run_id: _config(s, corpus) for s in specs}
    # every folder is checked before anything is trained: a clash (another config, another command's run) stops
    # the sweep at once
    states = {s.run_id: store.run_state(out / s.run_id, configs[s.run_id], group=s.group) for s in specs}
    for s in specs:  # before a copy or a new run writes into the folder
        if states[s.run_id] == "damaged":
            store.set_aside(out / s.run_id, configs[s.run_id])
            states[s.run_id] = "restart"
    index: dict[Path, dict[str, Path]] = {}
    copied: dict[str, Path] = {}
    for s in specs:
        if states[s.run_id] != "finished" and (source := _copy_finished(s, configs[s.run_id], out, reuse, index)):
            states[s.run_id], copied[s.run_id] = "finished", source
    done = [s for s in specs if states[s.run_id] == "finished"]
    weights = {s.run_id: pace.step_seconds(s) if pace is not None else pace_mod.step_ops(s) for s in specs}
    pending = [s for s in specs if states[s.run_id] != "finished"]
    pending = pending if keep_order else longest_first(pending, weights)
    bar = make_progress(
        progress,
        total_runs=len(specs),
        total_steps=sum(s.train.steps for s in specs),
        done_runs=len(done),
        done_steps=sum(s.train.steps for s in done),
        out=out,
        weights=weights,  # the time left counts work, not steps: a d=1,024 step is not a d=32 one
        total_work=sum(weights[s.run_id] * s.train.steps for s in specs),
        done_work=sum(weights[s.run_id] * s.train.steps for s in done),
        copied=copied,
        pace=pace,  # each run that ends corrects the estimates made after it
    )
    try:
        if pending:
            workers = min(jobs, len(pending))
            if executor == "ray":
                from attnscale.runs import ray_executor

                ray_executor.run(pending, corpus, out, configs, bar, threads=max(1, cores() // workers),
                                 summary=_summary, address=ray_address, local_cpus=cores())
            elif workers == 1:
                _run_here(pending, corpus, out, configs, bar)
            else:
                _run_in_workers(pending, corpus_spec, out, configs, bar, workers)
    finally:
        bar.close()
    return [rec.TrainRun.load(out / s.run_id) for s in specs]


# ---- in this process ----------------------------------------------------------------


def _run_here(pending, corpus, out, configs, bar) -> None:
    for spec in pending:
        run_dir = out / spec.run_id
        mark_running(run_dir, configs[spec.run_id], spec.group)
        bar.start(spec.run_id, spec.train.steps)

        def on_step(step, steps, info, _id=spec.run_id):
            bar.step(_id, step, info.get("loss"))

        bar.finish(spec.run_id, _summary(train_run(spec.model, spec.train, corpus, run_dir, group=spec.group,
                                                   on_step=on_step, watch=spec.watch)))


# ---- in worker processes --------------------------------------------------------------


class _Orphaned(Exception):
    """The parent process is gone: nobody will read this run's outcome."""


def _die_with_parent() -> None:
    """A worker must not outlive its parent (killed with SIGKILL, say): a rerun would
    train the same run beside it. Linux: ask the kernel to kill us; elsewhere the
    step callback and the inbox wait check ``parent_process().is_alive()``."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _next_job(inbox, parent):
    while True:
        try:
            return inbox.get(timeout=1.0)
        except queue_mod.Empty:
            if parent is not None and not parent.is_alive():
                return None


def _worker(index: int, corpus_spec: CorpusSpec, threads: int, inbox, messages) -> None:
    """Entry point of one worker process: train the runs sent to ``inbox`` until None arrives.

    A worker lives for the whole sweep, so torch's import and first-optimizer
    setup (seconds) are paid once per worker, not once per run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    parent = multiprocessing.parent_process()
    try:
        import torch

        torch.set_num_threads(threads)
        corpus = corpus_spec.load()
    except BaseException:
        messages.put(("error", index, None, traceback.format_exc()))
        return
    while (job := _next_job(inbox, parent)) is not None:
        spec, run_dir = job
        last = [0.0]

        def on_step(step, steps, info, _id=spec.run_id):
            now = time.monotonic()
            if now - last[0] >= _STEP_MESSAGE_EVERY_S or step == steps:
                last[0] = now
                if parent is not None and not parent.is_alive():
                    raise _Orphaned(_id)
                messages.put(("step", index, _id, (step, info.get("loss"))))

        try:
            train_run(spec.model, spec.train, corpus, Path(run_dir), group=spec.group, on_step=on_step, watch=spec.watch)
            messages.put(("done", index, spec.run_id, None))
        except _Orphaned:
            return
        except ConfigError as e:
            messages.put(("config_error", index, spec.run_id, str(e)))
        except BaseException:
            messages.put(("error", index, spec.run_id, traceback.format_exc()))


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


def _run_in_workers(pending, corpus_spec, out, configs, bar, workers) -> None:
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    threads = max(1, cores() // workers)
    inboxes = [ctx.Queue() for _ in range(workers)]
    procs = [
        ctx.Process(target=_worker, args=(i, corpus_spec, threads, inboxes[i], messages),
                    name=f"attnscale-worker-{i}", daemon=True)
        for i in range(workers)
    ]
    todo = list(pending)
    holding: dict[int, str | None] = {i: None for i in range(workers)}  # worker -> run it trains

    def dispatch(i: int) -> None:
        if not todo:
            inboxes[i].put(None)
            holding[i] = None
            return
        spec = todo.pop(0)
        run_dir = out / spec.run_id
        mark_running(run_dir, configs[spec.run_id], spec.group)
        holding[i] = spec.run_id
        inboxes[i].put((spec, str(run_dir)))
        bar.start(spec.run_id, spec.train.steps)

    try:
        for i, proc in enumerate(procs):
            proc.start()
            dispatch(i)
        while any(r is not None for r in holding.values()):
            try:
                kind, i, rid, payload = messages.get(timeout=0.5)
            except queue_mod.Empty:
                for i, proc in enumerate(procs):  # one that died without a word fails the sweep, not hangs it
                    if holding[i] is not None and not proc.is_alive():
                        raise RuntimeError(f"run {holding[i]}: its worker process died (exit code {proc.exitcode}); "
                                           "rerun to resume") from None
                continue
            if kind == "step":
                bar.step(rid, *payload)
            elif kind == "done":
                bar.finish(rid, _summary(rec.TrainRun.load(out / rid)))
                dispatch(i)
            elif kind == "config_error":
                raise ConfigError(payload)
            else:
                raise RuntimeError(f"run {rid or holding[i]} failed in worker {i}:\n{payload}")
        for proc in procs:
            proc.join(timeout=10)
    finally:
        _stop(procs)
        for q in (messages, *inboxes):
            q.close()
            q.cancel_join_thread()  # never block exit on a queue a killed worker left unread
