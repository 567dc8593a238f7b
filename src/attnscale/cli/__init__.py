"""Command line: parse, build a config, call the library, print or write.

Each command is its options, plus a ``sequence.Command``: how its config is
built, which library call it makes, how its result reads. The order every
command follows (device → config → out folder → run → print) is written once,
in ``sequence.py``; the option types and shared options are in ``options.py``.
Every user mistake ends in one line on stderr naming the option and what it
takes, and exit code 2; no traceback.
"""

from __future__ import annotations

import os
import sys

from attnscale.cli import measuring, studies, training
from attnscale.cli.options import ERROR, Parser, UsageError
from attnscale.errors import ConfigError

__all__ = ["main", "build_parser", "UsageError"]

COMMANDS = [measuring.add_spread, measuring.add_fresh, measuring.add_reproduce, measuring.add_report,
            *training.COMMANDS, *studies.COMMANDS, measuring.add_inspect, measuring.add_watch_report]


def build_parser() -> Parser:
    from attnscale import __version__

    parser = Parser(prog="attnscale", description="A laboratory for the score scale in dot-product attention.")
    parser.add_argument("--version", action="version", version=f"attnscale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


# the commands whose --out keeps finished runs and a checkpoint of each run cut short: run again, they go on
RESUMING = {"reproduce", "train", "dynamics", "sweep", "schemes", "study", "warn-study", "act-study", "lr-study"}


def _interrupted(argv: list[str]) -> str:
    """What Ctrl-C leaves, and the command that goes on from it (or starts again), ready to paste."""
    import shlex

    again = shlex.join(["attnscale", *argv])
    if next((a for a in argv if not a.startswith("-")), None) in RESUMING:
        return (f"attnscale: interrupted; finished runs are kept on disk, and a run cut short goes on from its last "
                f"checkpoint: to resume, run the same command again: {again}")
    return f"attnscale: interrupted before it finished; to run it again: {again}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except (UsageError, ConfigError) as e:
        print(f"{ERROR}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(_interrupted(sys.argv[1:] if argv is None else list(argv)), file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnscale spread | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
