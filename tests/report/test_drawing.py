"""drawing: matplotlib loads only when a figure is drawn, not when the modules that draw are imported."""

import subprocess
import sys


def test_matplotlib_loads_only_when_drawing():
    code = "import sys, attnscale.drawing, attnscale.report.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
