"""The command line as a user starts it: ``python -m attnscale.cli`` in a subprocess, for the tests of the
commands and of the sequence they share."""

import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "attnscale.cli", *args], capture_output=True, text=True, timeout=120)
