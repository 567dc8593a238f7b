"""The Ray executor on a real local Ray instance (2 CPUs): the same runs as local
workers, records written by the driver, a killed worker retried from its last
checkpoint, a killed driver resumed (in the slow tests), a failing run reported while
the others go on, and a command's --executor ray (tests/runs/test_ray_commands.py has
the other commands, in the slow tests: the same executor path)."""

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.runs import record as rec
from attnscale.runs.ray_executor import GPU_SHARE, resources
from attnscale.runs.runner import cores, execute
from test_promises import TINY as TINY_ARGS  # the command-line flags of a tiny run
from test_promises import tiny_corpus
from specs import CORPUS, corpus  # noqa: F401  (the module-scoped fixture)
from specs import TINY as SPEC_TINY
from specs import spec as shared_spec

TINY = replace(SPEC_TINY, threads=1)  # one torch thread per run, as each Ray task gets
TIMING = ("train_seconds", "tokens_per_s")  # the only results that may differ between two executors
RESUMED = ("resumed_from",)  # where a resumed run started: all else as if never stopped


# how long a test waits for a run to reach a state before it calls the executor stuck: generous, because
# the machines are shared (a busy 2-core machine took over 90 s where an idle one takes 10); it only
# bounds a failing test, a passing one never waits for it
LIVENESS_S = 600


def test_resources_ask_for_the_threads_and_a_gpu_share_on_cuda():
    # the README's "a quarter GPU on CUDA", pinned by its value
    assert GPU_SHARE == 0.25
    assert resources("cpu", 3, cluster_has_gpu=True) == {"num_cpus": 3}
    assert resources("cuda", 1, cluster_has_gpu=False) == {"num_cpus": 1, "num_gpus": 0.25}
    assert resources("auto", 1, cluster_has_gpu=True) == {"num_cpus": 1, "num_gpus": 0.25}
    assert resources("auto", 1, cluster_has_gpu=False) == {"num_cpus": 1}


@pytest.fixture
def one_visible_gpu(monkeypatch):
    """A Ray task's view of CUDA on a CPU machine: Ray gave it physical GPU 3 and set
    CUDA_VISIBLE_DEVICES to it, so torch sees one GPU, cuda:0. (Only torch.cuda's answers
    are patched; the GPU check, benchmarks/gpu_check.py, runs the same with nothing patched.)"""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_cuda_n_asks_for_any_gpu_and_trains_on_the_one_ray_gave(one_visible_gpu):
    import torch

    from attnscale.core.device import resolve_device
    from attnscale.runs.ray_executor import task_device

    # "cuda:1" names a GPU of the driver's machine; on the cluster it is a share of whichever GPU Ray gives
    assert resources("cuda:1", 2, cluster_has_gpu=True) == {"num_cpus": 2, "num_gpus": GPU_SHARE}
    with pytest.raises(ConfigError, match="has 1 CUDA GPU"):
        resolve_device("cuda:1")  # what the task did before: the driver's check passed, the task failed
    for asked in ("cuda:1", "cuda", "cuda:0", "auto"):
        device = task_device(asked, [3], os.environ["CUDA_VISIBLE_DEVICES"])
        assert resolve_device(device) == torch.device("cuda", 0), asked
    assert task_device("cuda:1", ["1"], "0,1") == "cuda:1"  # a task given two GPUs trains on its first
    assert task_device("cuda:1", [2], None) == "cuda:2"  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: all visible
    assert task_device("cpu", [3], "3") == "cpu"


def test_a_task_given_no_gpu_trains_auto_runs_off_cuda(one_visible_gpu):
    from attnscale.runs.ray_executor import task_device

    assert task_device("auto", [], "3") == "cpu"  # the GPU torch sees is another run's
    assert task_device("cuda", [], None) == "cuda"  # asked for, not given: resolve_device says what is missing


def test_a_record_names_its_ray_node_and_records_without_one_still_read(tmp_path):
    import json

    node = {"node_id": "6f1c", "node_ip": "127.0.0.1", "hostname": "here"}
    before = rec.new("train", {"model": {}}, {"status": "done", "steps_done": 8})
    rec.write(tmp_path, before.on_ray_node(node))
    assert rec.read(tmp_path).ray_node == node
    assert rec.read(tmp_path).environment["torch"] == before.environment["torch"]  # added to, nothing replaced
    old = json.loads((tmp_path / rec.RECORD).read_text())
    del old["environment"]["ray_node"]  # as every record written before Ray nodes were named
    (tmp_path / rec.RECORD).write_text(json.dumps(old))
    assert rec.read(tmp_path).ray_node is None


def test_an_unknown_executor_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="executor 'dask' is unknown; choose one of: local, ray"):
        execute([], CORPUS, tmp_path, progress=False, executor="dask")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance started the way ``--executor ray`` starts one; yields its address."""
    ray = pytest.importorskip("ray", reason="Ray cannot be imported here: pip install 'attnscale[ray]'")
    from attnscale.runs.ray_connect import start_local

    start_local(num_cpus=2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


spec = partial(shared_spec, base=TINY)


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / rec.METRICS).read_text().splitlines()]


def ray_processes():
    import psutil  # after ray: Ray ships its own

    return psutil.Process().children(recursive=True)


def loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 too


def comparable(run_dir: Path, leave_out=TIMING) -> dict:
    """A finished run without what only timing changes."""
    record = rec.read(run_dir)
    results = {k: v for k, v in record.results.items() if k not in leave_out}
    results["history"] = [{k: v for k, v in line.items() if k != "elapsed_s"} for line in results["history"]]
    return {"status": record.status, "config": record.config, "group": record.group, "results": results,
            "weights": (run_dir / rec.WEIGHTS).read_bytes()}


def test_local_instance_listens_on_loopback_only_without_dashboard_or_usage_stats(cluster):
    assert cluster.startswith("127.0.0.1:")
    procs = ray_processes()
    listening = [(p.name(), c.laddr) for p in procs for c in p.net_connections("inet") if c.status == "LISTEN"]
    assert listening and all(loopback(addr.ip) for _, addr in listening), listening
    assert 8265 not in {addr.port for _, addr in listening}  # the dashboard's port
    gcs = next(p for p in procs if p.name() == "gcs_server")
    assert gcs.environ().get("RAY_USAGE_STATS_ENABLED") == "0"
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") is None  # put back once the instance is up


def test_ray_sweep_gives_the_local_executors_records(cluster, tmp_path):
    import torch

    # -j 1: Ray tasks of cores() threads, one at a time; the local executor trains in this process
    args = ["sweep", "--widths", "8", "16", "--quick", "--steps", "8", "--batch", "2", "--context", "16", "-j", "1"]
    assert main(args + ["--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    threads = torch.get_num_threads()
    torch.set_num_threads(cores())  # the thread count the Ray tasks had
    try:
        assert main(args + ["--out", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    ids = sorted(p.name for p in (tmp_path / "local").iterdir() if p.is_dir())
    assert ids == sorted(p.name for p in (tmp_path / "ray").iterdir() if p.is_dir()) and len(ids) == 5  # + the uniform floor
    # the counted floors depend on the corpus alone: the same wherever the runs trained
    assert (tmp_path / "ray" / "floors.json").read_text() == (tmp_path / "local" / "floors.json").read_text()
    for run_id in ids:
        on_ray, local = comparable(tmp_path / "ray" / run_id), comparable(tmp_path / "local" / run_id)
        assert on_ray["results"]["perplexity"] == local["results"]["perplexity"]
        assert on_ray == local
        assert steps_logged(tmp_path / "ray" / run_id) == [0, 8]
        assert not (tmp_path / "ray" / run_id / rec.CHECKPOINT).exists()


def _in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_killed_worker_is_retried_from_its_last_checkpoint(cluster, tmp_path, corpus):
    specs = [spec(corpus, 8, s, steps=400, record_every=10, checkpoint_every=25) for s in ("none", "inv_sqrt_d")]
    out = tmp_path / "ray"
    thread, box = _in_thread(lambda: execute(specs, CORPUS, out, jobs=2, progress=False, corpus=corpus,
                                             executor="ray"))
    deadline = time.monotonic() + LIVENESS_S
    victim = None
    while victim is None:  # a run whose checkpoint reached the driver's disk, still training
        assert time.monotonic() < deadline and thread.is_alive(), box
        for s in specs:
            if (out / s.run_id / rec.CHECKPOINT).exists():
                victim = s
        time.sleep(0.01)
    [proc] = [p for p in ray_processes() if p.cmdline()[:1] == [f"ray::train {victim.run_id}"]]
    os.kill(proc.pid, signal.SIGKILL)
    thread.join(timeout=LIVENESS_S)
    assert not thread.is_alive() and "error" not in box, box.get("error")
    runs = {r.run_id: r for r in box["value"]}
    assert {r.status for r in runs.values()} == {"done"}
    assert runs[victim.run_id].results.resumed_from  # the retry started from the checkpoint, not step 0
    for s in specs:
        assert steps_logged(out / s.run_id) == list(range(0, 401, 10))  # no step twice
        assert not (out / s.run_id / rec.CHECKPOINT).exists()
    [alone] = execute([victim], CORPUS, tmp_path / "local", progress=False, corpus=corpus)
    resumed, never_killed = comparable(out / victim.run_id, TIMING + RESUMED), comparable(alone.path, TIMING + RESUMED)
    assert resumed == never_killed, {k: (v, never_killed["results"].get(k))
                                     for k, v in resumed["results"].items() if v != never_killed["results"].get(k)}


def _states(out: Path) -> dict[str, str]:
    states = {}
    for d in out.glob("d*"):
        try:
            states[d.name] = rec.read(d).status
        except ConfigError:
            pass
    return states


@pytest.mark.slow  # a second driver process and its Ray job: 24–35 s of the suite on a 2-core CPU
def test_killed_driver_then_rerun_keeps_finished_runs(cluster, tmp_path):
    # the driver to kill is a process of its own: a new Ray job on the fixture's instance, whose
    # workers import torch afresh, so -j 1 (one run at a time, 2 threads) needs one of them, not two;
    # the rerun, the same command, runs in this process (connected to the same instance already)
    out = tmp_path / "sweep"
    args = ["sweep", "--widths", "8", "16", "--quick", "--steps", "40", "--batch", "2", "--context", "16", "-j", "1",
            "--out", str(out), "--executor", "ray", "--ray-address", cluster]
    proc = subprocess.Popen([sys.executable, "-m", "attnscale.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + LIVENESS_S
        while not ("done" in _states(out).values() and "running" in _states(out).values()):
            assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, f"no run finished within {LIVENESS_S} s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed = _states(out)
    finished = {r for r, s in killed.items() if s == "done"}
    assert finished and "running" in killed.values()
    kept = {r: ((out / r / rec.RECORD).read_bytes(), (out / r / rec.RECORD).stat().st_mtime_ns) for r in finished}

    assert main(args) == 0
    after = _states(out)
    assert sorted(after) == ["d16-inv_sqrt_d-s0", "d16-none-s0", "d8-inv_sqrt_d-s0", "d8-none-s0"]
    assert set(after.values()) == {"done"}
    for r, (content, mtime) in kept.items():  # not lost, not redone
        assert (out / r / rec.RECORD).read_bytes() == content
        assert (out / r / rec.RECORD).stat().st_mtime_ns == mtime
    for r in after:
        assert steps_logged(out / r) == list(range(0, 41, 10))
    assert not list(out.rglob("*.tmp"))


def test_a_failing_run_is_reported_and_the_others_finish(cluster, tmp_path, corpus):
    from attnscale.core.scales import DISPLAY_NAMES, SCALES, ScoreScale, register_scale

    @register_scale("driver_only")  # known to this process, not to Ray's workers: the run fails there
    class DriverOnly(ScoreScale):
        def factor(self):
            return 1.0 / self.head_dim

    try:
        specs = [spec(corpus, 8, "driver_only"), spec(corpus, 8, "none")]
        with pytest.raises(ConfigError, match=r"1 of 2 runs failed \(d8-driver_only-s0: ConfigError: unknown scale"):
            execute(specs, CORPUS, tmp_path, jobs=2, progress=False, corpus=corpus, executor="ray")
    finally:
        SCALES.pop("driver_only"), DISPLAY_NAMES.pop("driver_only")
    assert rec.read(tmp_path / "d8-none-s0").status == "done"
    assert rec.read(tmp_path / "d8-driver_only-s0").status == "running"  # a rerun retries it


def test_a_run_leaves_the_scratch_of_another_cluster_on_this_host_alone(cluster, tmp_path, corpus):
    # every fresh cluster numbers its first job 01000000: two clusters on one host (two test workers
    # in CI) ran d8-none-s0 at once, and one deleted the folder the other was training in
    import ray

    context = ray.get_runtime_context()
    base = Path(context.get_temp_dir()) / "attnscale"
    job = context.get_job_id()
    run = spec(corpus, 8, "none")
    others = [base / job / run.run_id, base / "session_of_another_cluster" / job / run.run_id]
    for folder in others:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "training.pt").write_text("another cluster's run")
    try:
        execute([run], CORPUS, tmp_path, jobs=1, progress=False, corpus=corpus, executor="ray")
        assert rec.read(tmp_path / run.run_id).status == "done"
        for folder in others:
            assert (folder / "training.pt").read_text() == "another cluster's run"
    finally:
        for folder in others:
            shutil.rmtree(folder, ignore_errors=True)


def test_dynamics_through_ray(cluster, tmp_path, capsys):
    """A command's --executor ray on this module's instance (one Ray start for both files' default tests)."""
    out = tmp_path / "dyn"
    assert main(["dynamics", "--width", "8", "--corpus", str(tiny_corpus(tmp_path / "c")), *TINY_ARGS,
                 "--out", str(out), "--executor", "ray", "--json"]) == 0
    runs = [rec.TrainRun.load(p) for p in rec.find(out)]
    assert len(runs) == 2 and all(r.status == "done" for r in runs), [(r.run_id, r.status) for r in runs]
    assert {r.scale for r in runs} == {"none", "inv_sqrt_d"}
    assert len(json.loads(capsys.readouterr().out)) == 2
