"""Wall time of the quick sweep through the local executor and through Ray, side by side.

    python benchmarks/ray_vs_local.py [-j 2] [--repeats 2]

Each sweep is `attnscale sweep --quick` on the embedded corpus (widths 32, 128,
1,024 × none, inv_sqrt_d: 6 runs) in a fresh process into a fresh folder, as a
user runs it; the Ray one starts its local Ray instance and shuts it down inside
that time. Local and Ray alternate, so a change in the machine's load touches
both; medians are printed with the ratio (target: ray/local <= 1.5).

Then the local Ray instance alone: the time ``ray_executor.start_local`` takes,
and the resident memory (RSS) of each process it starts, idle, before any task.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sweep_seconds(jobs: int, executor: str) -> float:
    with tempfile.TemporaryDirectory(prefix="attnscale-bench-") as out:
        cmd = [sys.executable, "-m", "attnscale.cli", "sweep", "--quick", "-j", str(jobs), "--out", out,
               "--executor", executor]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t


def instance_footprint(cpus: int) -> None:
    import ray

    from attnscale.runs.ray_executor import start_local

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
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cpus} cores, load average {os.getloadavg()[0]:.1f}; quick sweep, -j {args.jobs}")
    times: dict[str, list[float]] = {"local": [], "ray": []}
    for i in range(args.repeats):
        for executor in ("local", "ray"):
            times[executor].append(sweep_seconds(args.jobs, executor))
            print(f"  {executor:<5} run {i + 1}: {times[executor][-1]:6.1f} s", flush=True)
    local, on_ray = statistics.median(times["local"]), statistics.median(times["ray"])
    print(f"quick sweep: local {local:.1f} s, ray {on_ray:.1f} s (Ray start-up included); "
          f"ray/local {on_ray / local:.2f} (target <= 1.5)")
    instance_footprint(cpus)


if __name__ == "__main__":
    main()
