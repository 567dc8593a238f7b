"""Install the torch build this machine should have; `make setup` runs it before attnscale.

The pin (torch==2.13.0) fixes a version, not a build: on Linux the default index serves
the CUDA build, a 526 MB wheel plus several GB of CUDA libraries that a machine without an
NVIDIA GPU never uses. So:

- no working ``nvidia-smi``: the CPU build, from PyTorch's own CPU wheel index; where that
  index cannot be reached within a few seconds, the default index instead (said in one line);
- a working ``nvidia-smi``: the default index (the CUDA build);
- ``--index URL`` (TORCH_INDEX=URL in make): that index, whatever the machine has.

Standard library only: it runs in a fresh venv before anything else is installed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_SECONDS = 5  # a reachable index answers in well under a second; a firewall never does


def has_nvidia_gpu() -> bool:
    """True where ``nvidia-smi`` exists and exits 0 (a driver that sees a GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        return subprocess.run([exe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def reachable(index: str, seconds: float = PROBE_SECONDS) -> bool:
    """True if the index answers for torch's page within ``seconds``."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=seconds):
            return True
    except (OSError, ValueError):
        return False


def plan(torch: str, index: str, gpu: bool, cpu_index: str, cpu_index_reachable) -> tuple[list[str], str]:
    """The pip arguments and the one line that says what was chosen and why."""
    if index:
        return ["--index-url", index, torch], f"installing {torch} from {index} (TORCH_INDEX)"
    if gpu:
        return [torch], f"NVIDIA GPU found: installing {torch} from the default index (the CUDA build)"
    if cpu_index_reachable():
        return ["--index-url", cpu_index, torch], f"no NVIDIA GPU: installing {torch} from PyTorch's CPU index ({cpu_index})"
    return [torch], (f"no NVIDIA GPU, and PyTorch's CPU index ({cpu_index}) could not be reached within {PROBE_SECONDS} s: "
                     f"installing {torch} from the default index instead (on Linux that can be the CUDA build; "
                     f"TORCH_INDEX=URL picks another index)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch", default="torch==2.13.0", help="the requirement to install")
    p.add_argument("--index", default="", help="install from this index, whatever the machine has")
    p.add_argument("--pip", default=f"{shlex.quote(sys.executable)} -m pip", help="the pip command to run")
    p.add_argument("--cpu-index", default=CPU_INDEX, help=argparse.SUPPRESS)  # tests point it at a local server
    args = p.parse_args(argv)
    pip_args, line = plan(args.torch, args.index, has_nvidia_gpu(), args.cpu_index, lambda: reachable(args.cpu_index))
    print(f"attnscale setup: {line}", flush=True)
    return subprocess.run([*shlex.split(args.pip), "install", "-q", *pip_args]).returncode


if __name__ == "__main__":
    sys.exit(main())
