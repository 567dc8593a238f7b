"""tools/install_torch.py: which torch build `make setup` installs, on machines faked with a
pip that records its arguments, an nvidia-smi on PATH or not, and a local index server."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "install_torch.py"


@pytest.fixture
def machine(tmp_path):
    """A fake pip (writes its arguments to pip-args.txt) and a bin folder for a fake nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pip = tmp_path / "pip.py"
    pip.write_text("import sys, pathlib\npathlib.Path(sys.argv[1]).write_text(' '.join(sys.argv[2:]))\n")
    record = tmp_path / "pip-args.txt"

    def run(*args, gpu: bool | None = None):
        if gpu is not None:
            smi = bin_dir / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\nexit {0 if gpu else 9}\n")
            smi.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"}
        out = subprocess.run([sys.executable, str(SCRIPT), "--pip", f"{sys.executable} {pip} {record}", *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout, record.read_text()
    return run


@pytest.fixture
def cpu_index():
    """A local HTTP server standing in for PyTorch's CPU index: it answers every page."""
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()


def _closed_port() -> str:
    """An address where nothing listens: the connection is refused at once."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/whl/cpu"


def test_without_a_gpu_the_cpu_build_comes_from_the_cpu_index(machine, cpu_index):
    said, pip = machine("--cpu-index", cpu_index)
    assert pip == f"install -q --index-url {cpu_index} torch==2.13.0"
    assert said.strip() == f"attnscale setup: no NVIDIA GPU: installing torch==2.13.0 from PyTorch's CPU index ({cpu_index})"


def test_a_failing_nvidia_smi_counts_as_no_gpu(machine, cpu_index):
    _, pip = machine("--cpu-index", cpu_index, gpu=False)
    assert "--index-url" in pip


def test_an_unreachable_cpu_index_falls_back_to_the_default_one_and_says_so(machine):
    index = _closed_port()
    said, pip = machine("--cpu-index", index)
    assert pip == "install -q torch==2.13.0"
    assert said.count("\n") == 1 and "could not be reached" in said and "default index instead" in said and index in said


def test_with_a_gpu_the_default_index_gives_the_cuda_build(machine, cpu_index):
    said, pip = machine("--cpu-index", cpu_index, gpu=True)
    assert pip == "install -q torch==2.13.0"
    assert "NVIDIA GPU found" in said


@pytest.mark.parametrize("gpu", [True, None])
def test_an_index_given_overrides_the_machine(machine, gpu):
    said, pip = machine("--index", "https://example.invalid/whl/cu126", "--torch", "torch==2.13.0", gpu=gpu)
    assert pip == "install -q --index-url https://example.invalid/whl/cu126 torch==2.13.0"
    assert "(TORCH_INDEX)" in said


def test_the_makefile_runs_it_before_attnscale_and_passes_the_override():
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    recipe = makefile[makefile.index("$(VENV)/.core:"):]
    assert recipe.index("tools/install_torch.py") < recipe.index("pip install -q -e")
    assert "--index '$(TORCH_INDEX)'" in recipe and "--torch '$(TORCH)'" in recipe
