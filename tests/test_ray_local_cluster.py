"""tools/ray_local_cluster.py: several Ray nodes on 127.0.0.1, their process ids written for
killing one by hand, everything stopped on SIGTERM."""

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "ray_local_cluster.py"


def main(argv):
    """The script's ``main``, loaded from its file (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("ray_local_cluster", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def test_a_node_count_below_one_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--nodes", "0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--nodes and --cpus take positive integers")


@pytest.mark.slow  # two Ray nodes start and stop: about 30 s on a loaded 2-core machine
def test_two_nodes_start_write_their_process_ids_and_stop_on_sigterm(tmp_path):
    import psutil

    pytest.importorskip("ray", reason="Ray cannot be imported here: pip install 'attnscale[ray]'")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--nodes", "2", "--client-port", "0", "--pids", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        while not lines or "Ctrl-C" not in lines[-1]:
            line = proc.stdout.readline()
            assert line, f"the cluster did not come up: {lines}"
            lines.append(line)
        assert lines[0].startswith("Ray cluster of 2 nodes on 127.0.0.1: --ray-address 127.0.0.1:")
        pids = {i: [int(p) for p in (tmp_path / f"node-{i}.pids").read_text().split()] for i in (0, 1)}
        assert all(psutil.pid_exists(p) for ps in pids.values() for p in ps)
        assert psutil.Process(pids[1][0]).name() == "raylet"  # first: the one whose children are the task workers
        listening = [c.laddr.ip for ps in pids.values() for p in ps
                     for c in psutil.Process(p).net_connections("inet") if c.status == "LISTEN"]
        assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening), listening
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        gone = psutil.wait_procs([psutil.Process(p) for ps in pids.values() for p in ps if psutil.pid_exists(p)],
                                 timeout=60)[1]
        assert not gone, gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
