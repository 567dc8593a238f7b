"""The command-line options the watch's examples share, so each example shows only what is its own."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

# What the extra attnscale[watch] adds to these examples; `make reproduce`'s set-up installs the rest
WATCH_EXTRA = "pip install -e '.[watch]'"


def run_options(p: argparse.ArgumentParser, out: str) -> None:
    """How long, how often the watch probes, the batch, where it writes, whether an alert stops the run and
    whether QK-Clip acts."""
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=20, help="probe every this many steps")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--stop", action="store_true", help="stop training at the first max-score or collapse alert")
    p.add_argument("--qk-clip", type=float, default=None, metavar="TAU",
                   help="QK-Clip: after each step, scale down W_q and W_k of every head whose max score passed TAU")
    p.add_argument("--out", type=Path, default=Path(out))


def tiny_lm_options(p: argparse.ArgumentParser) -> None:
    """attnscale's tiny LM: its head width, score scale, initialisation and learning rate."""
    p.add_argument("--width", type=int, default=64, help="head width d (length of q and k)")
    p.add_argument("--scale", default="inv_sqrt_d", help="inv_sqrt_d (the course's), none, ...")
    p.add_argument("--init", default="torch", help="torch, gpt2 or unit (q and k entries of variance 1)")
    p.add_argument("--lr", type=float, default=3e-3)


def tensorboard_here(logdir: Path) -> bool:
    """Whether TensorBoard is installed; where it is not (`make reproduce`'s set-up leaves it out), say in one
    line that the heads go to the watch log alone and what installing it adds, and carry on."""
    if importlib.util.find_spec("tensorboard") is not None:
        return True
    print(f"TensorBoard is not installed: every head goes to watch.jsonl alone; {WATCH_EXTRA} adds "
          f"TensorBoard event files in {logdir}")
    return False


def alert_tau(qk_clip: float | None, tau: float = 100.0) -> float:
    """The max-score alert's threshold beside QK-Clip: ``tau``, or twice the clip's where the clip's is as high, so
    that the alert fires only where the clip has lost hold of a head (at the clip's own tau the two would fight)."""
    return tau if qk_clip is None or qk_clip < tau else 2.0 * qk_clip
