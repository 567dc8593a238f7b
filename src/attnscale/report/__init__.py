"""The report: the course's claims, the analysis of run records, figures and rendering.

``build(runs_dir, out_dir)`` writes the HTML and Markdown report from the
records under ``runs_dir``; matplotlib loads only when figures are drawn."""

from attnscale.report.assemble import Runs, TrainRun, build, load_runs

__all__ = ["Runs", "TrainRun", "build", "load_runs"]
