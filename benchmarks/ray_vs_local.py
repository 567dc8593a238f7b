"""Wall time of the quick sweep through the local executor and through Ray, side by side.

    python benchmarks/ray_vs_local.py [-j 2] [--repeats 2] [--kept] [--seeds 1]

Each sweep is `attnscale sweep --quick` on the embedded corpus (widths 32, 128,
1,024 × none, inv_sqrt_d: 6 runs a seed, ``--seeds`` seeds) in a fresh process into a fresh folder, as a
user runs it; the Ray one starts its local Ray instance and shuts it down inside
that time. With ``--kept`` a third column joins one Ray cluster kept across the
sweeps (``python tools/ray_local_cluster.py --nodes 1``, started once:
what ``ray start --head`` then ``--ray-address auto`` gives), so Ray's start-up is
paid once, outside the sweeps; its start-up and the cost of joining it are printed.
The columns alternate, so a change in the machine's load touches each; medians are
printed with the ratios.

Then the local Ray instance alone: the time ``ray_connect.start_local`` takes,
and the resident memory (RSS) of each process it starts, idle, before any task.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def sweep_seconds(jobs: int, executor: str, address: str | None = None, seeds: int = 1) -> float:
    with tempfile.TemporaryDirectory(prefix="attnscale-bench-") as out:
        cmd = [sys.executable, "-m", "attnscale.cli", "sweep", "--quick", "-j", str(jobs), "--out", out,
               "--seeds", *map(str, range(seeds)), "--executor", executor]
        cmd += ["--ray-address", address] if address else []
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t


@contextlib.contextmanager
def kept_cluster(cpus: int):
    """One local Ray cluster for every sweep of the ``kept`` column; yields its address."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(TOOLS / "ray_local_cluster.py"), "--nodes", "1", "--cpus", str(cpus),
                             "--client-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        first = proc.stdout.readline()
        address = first.split("--ray-address ")[1].split()[0]
        while "Ctrl-C" not in proc.stdout.readline():
            pass
        print(f"kept cluster ({cpus} CPUs): up in {time.perf_counter() - t:.1f} s, "
              f"joined in {join_seconds(address):.1f} s by a fresh process", flush=True)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def join_seconds(address: str) -> float:
    """What a command pays to join a running cluster: connect and let go, in a fresh process."""
    code = ("import time,sys; from attnscale.runs.ray_connect import session; t=time.perf_counter()\n"
            "with session(sys.argv[1]): pass\nprint(time.perf_counter()-t)")
    done = subprocess.run([sys.executable, "-c", code, address], check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def instance_footprint(cpus: int) -> None:
    import ray

    from attnscale.runs.ray_connect import start_local

    t = time.perf_counter()
    start_local(cpus)
    started = time.perf_counter() - t
    import psutil  # after ray: Ray ships its own

    time.sleep(2)  # let the workers Ray starts ahead of tasks come up
    procs = psutil.Process().children(recursive=True)
    rows = sorted(((p.memory_full_info(), _name(p)) for p in procs), key=lambda r: -r[0].rss)
    driver = psutil.Process().memory_info().rss
    t = time.perf_counter()
    ray.shutdown()
    stopped = time.perf_counter() - t
    print(f"local Ray instance ({cpus} CPUs): start-up {started:.1f} s, shutdown {stopped:.1f} s")
    print(f"  its {len(rows)} processes: RSS {sum(m.rss for m, _ in rows) / 2**20:.0f} MiB in all, "
          f"USS (memory no other process shares) {sum(m.uss for m, _ in rows) / 2**20:.0f} MiB; "
          f"this driver process: RSS {driver / 2**20:.0f} MiB")
    for mem, name in rows:
        print(f"    RSS {mem.rss / 2**20:4.0f} MiB  USS {mem.uss / 2**20:4.0f} MiB  {name}")


def _name(proc) -> str:
    """gcs_server, raylet, dashboard.py, ray::IDLE...: what a Ray process is, in a word."""
    cmd = proc.cmdline()
    script = next((Path(a).name for a in cmd[1:] if a.endswith(".py")), None)
    return script or (Path(cmd[0]).name if cmd else proc.name())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kept", action="store_true", help="also sweep on one Ray cluster kept across sweeps")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per width and scale: 6 runs each (default: 1)")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cpus} cores, load average {os.getloadavg()[0]:.1f}; quick sweep, {6 * args.seeds} runs, -j {args.jobs}",
          flush=True)
    columns = ["local", "ray"] + (["ray, kept cluster"] if args.kept else [])
    times: dict[str, list[float]] = {c: [] for c in columns}
    with kept_cluster(cpus) if args.kept else contextlib.nullcontext() as address:
        for i in range(args.repeats):
            for column in columns:
                executor = "local" if column == "local" else "ray"
                kept = address if "kept" in column else None
                times[column].append(sweep_seconds(args.jobs, executor, kept, args.seeds))
                print(f"  {column:<17} run {i + 1}: {times[column][-1]:6.1f} s "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    local = statistics.median(times["local"])
    print("quick sweep, median wall time: " + "; ".join(
        f"{c} {statistics.median(t):.1f} s ({statistics.median(t) / local:.2f}x local)" for c, t in times.items()))
    instance_footprint(cpus)


if __name__ == "__main__":
    main()
