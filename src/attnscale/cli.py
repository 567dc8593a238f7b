"""Command line: parse, build a config, call the library, print or write.

Every user mistake ends in one line on stderr naming the option and what it
takes, and exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from attnscale.errors import ConfigError

__all__ = ["main", "UsageError"]


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        raise UsageError(f"{self.prog}: {message}")


# ---- option types: each names what it takes --------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a positive integer, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"takes a non-negative integer, got {text!r}")
    return value


def at_least_two(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"takes an integer of at least 2, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a positive number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a positive number, got {text!r}")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number between 0 and 1, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"takes a number between 0 and 1, got {text!r}")
    return value


def scale_name(text: str) -> str:
    from attnscale.scales import SCALES

    if text not in SCALES:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(SCALES)}, got {text!r}")
    return text


def scale_or_all(text: str) -> str:
    return text if text == "all" else scale_name(text)


def writable_dir(path: Path, option: str = "--out") -> Path:
    """Create ``path`` and check that files can be written in it, before any work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".attnscale-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{option}: cannot write to {str(path)!r} ({e.strerror or e}); give a writable folder") from None
    return path


def _print_json(rows) -> None:
    from attnscale.runs import to_jsonable

    json.dump(to_jsonable(rows), sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---- commands ----------------------------------------------------------------


def _add_spread(sub) -> None:
    p = sub.add_parser("spread", help="spread of raw and scaled q·k over random pairs, per width")
    p.add_argument("--widths", type=positive_int, nargs="+", default=[4, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--pairs", type=at_least_two, default=20000)
    p.add_argument("--scale", type=scale_name, nargs="+", default=["inv_sqrt_d"], dest="scales")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--out", type=Path, help="write record.json and plots here")
    p.set_defaults(run=_run_spread)


def _run_spread(args) -> None:
    from attnscale.experiments import spread

    out = writable_dir(args.out) if args.out else None
    cfg = spread.SpreadConfig(widths=tuple(args.widths), pairs=args.pairs, scales=tuple(args.scales), seed=args.seed)
    rows = spread.run(cfg, out=out)
    _print_json(rows) if args.json else print(spread.format_table(rows))


def _add_fresh(sub) -> None:
    p = sub.add_parser("fresh", help="a freshly initialised head over a sequence of words, per width")
    p.add_argument("--widths", type=positive_int, nargs="+", default=[4, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--words", type=at_least_two, default=64)
    p.add_argument("--sequences", type=positive_int, default=200)
    p.add_argument("--init", choices=["unit", "model"], default="unit")
    p.add_argument("--scale", type=scale_or_all, nargs="+", default=["all"], dest="scales",
                   help="schemes to compare; 'all' means none and inv_sqrt_d, the course's pair")
    p.add_argument("--threshold", type=probability, default=0.99, help="max weight above which a row is frozen")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path)
    p.set_defaults(run=_run_fresh)


def _run_fresh(args) -> None:
    from attnscale.experiments import fresh

    out = writable_dir(args.out) if args.out else None
    scales = ("none", "inv_sqrt_d") if "all" in args.scales else tuple(dict.fromkeys(args.scales))
    cfg = fresh.FreshConfig(widths=tuple(args.widths), words=args.words, sequences=args.sequences,
                            init=args.init, scales=scales, threshold=args.threshold, seed=args.seed)
    result = fresh.run(cfg, out=out)
    _print_json(result["rows"]) if args.json else print(fresh.format_table(result))


def _add_reproduce(sub) -> None:
    p = sub.add_parser("reproduce", help="run every experiment of the chapter and write the report")
    p.add_argument("--out", type=Path, default=Path("attnscale-out"))
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--quick", action="store_true", help="a small preset that finishes in minutes")
    p.set_defaults(run=_run_reproduce)


def _run_reproduce(args) -> None:
    from attnscale import reproduce

    out = writable_dir(args.out)
    reproduce.run(out, seed=args.seed, quick=args.quick)


COMMANDS = [_add_spread, _add_fresh, _add_reproduce]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnscale", description="A laboratory for the score scale in dot-product attention.")
    parser.add_argument("--version", action="version", version=f"attnscale {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _version() -> str:
    from attnscale import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except (UsageError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished runs are kept on disk", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnscale spread | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
