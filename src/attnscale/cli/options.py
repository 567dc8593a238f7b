"""The command line's vocabulary: the parser that answers a mistake in one line, the option
types (each names what it takes), and the options several commands share.

Every user mistake ends in one line on stderr naming the option and what it
takes, and exit code 2; no traceback. Imports inside functions load torch (the
scale registry, the presets, the experiments) only when a command needs it, so
``attnscale --help`` and a mistyped option answer at once."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from pathlib import Path

from attnscale.errors import ConfigError

ERROR = "attnscale: error: "  # how every error line starts, whichever layer found the mistake


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # for the "did you mean" of error()
        return super().parse_known_args(args, namespace)

    def error(self, message):  # one line, not usage + message
        command = self.prog.partition(" ")[2]  # "attnscale spread" -> "spread"; the top parser has none
        if message.startswith("argument COMMAND: invalid choice: "):  # argparse's words for a mistyped command
            given = message.split("'")[1]
            message = f"unknown command {given!r}; choose one of: {', '.join(self._commands())}"
        raise UsageError(f"{command + ': ' if command else ''}{message}{self._did_you_mean(message)}")

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        return next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})

    def _did_you_mean(self, message: str) -> str:
        """The closest command or option to a mistyped one (difflib), as "; did you mean X?"."""
        choice = re.search(r"(?:invalid choice: |unknown command )'([^']*)'", message)
        if choice:
            known = list(self._commands()) or [c for a in self._actions for c in (a.choices or [])]
            close = difflib.get_close_matches(choice.group(1), known, n=1, cutoff=0.6)
            return f"; did you mean {close[0]!r}?" if close else ""
        if "unrecognized arguments" not in message:
            return ""
        argv = getattr(self, "_argv", [])
        # the options of the command that was given (the top parser reports a subcommand's leftovers)
        parser = next((self._commands()[a] for a in argv if a in self._commands()), self)
        options = [o for a in parser._actions for o in a.option_strings]
        unknown = [a.split("=", 1)[0] for a in message.split(":", 1)[1].split() if a.startswith("--")]
        hints = [close[0] for u in unknown for close in [difflib.get_close_matches(u, options, n=1, cutoff=0.6)] if close]
        return f"; did you mean {' and '.join(hints)}?" if hints else ""


# ---- option types: each names what it takes --------------------------------


def _number(text: str, cast, ok, what: str):
    """``cast(text)`` if it parses and satisfies ``ok``; else an error naming what the option takes."""
    try:
        value = cast(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"takes {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def nonneg_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a non-negative integer")


def at_least_two(text: str) -> int:
    return _number(text, int, lambda v: v >= 2, "an integer of at least 2")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a positive number")  # NaN fails both


def probability(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < 1, "a number between 0 and 1")


def _one_of(text: str, check, choices) -> str:
    """``check(text)``, the library's own rule for the option; its refusal as argparse's one line."""
    try:
        return check(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(choices)}, got {text!r}") from None


def scale_name(text: str) -> str:
    from attnscale.core.scales import SCALES, check_scale

    return _one_of(text, check_scale, SCALES)


def scale_or_all(text: str) -> str:
    return text if text == "all" else scale_name(text)


def device_name(text: str) -> str:
    """A well-formed device spec; whether this machine has it is checked by ``usable_device`` before any work."""
    from attnscale.core.device import DEVICES, check_device_spec

    return _one_of(text, check_device_spec, DEVICES)


def tokenizer_name(text: str) -> str:
    choices = ("word", "char", "bpe")
    if text not in choices:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(choices)}, got {text!r}")
    return text


def study_axis(text: str) -> tuple[str, tuple]:
    """AXIS=V1,V2 for --axis: numbers where the axis takes numbers."""
    from attnscale.lm.study_axes import AXES

    axis, sep, values = text.partition("=")
    if not sep or axis not in AXES or not values:
        raise argparse.ArgumentTypeError(f"takes AXIS=V1,V2 with AXIS one of {', '.join(AXES)}, got {text!r}")
    return axis, tuple(_axis_value(axis, v) for v in values.split(","))


def study_combination(text: str) -> tuple[str, tuple]:
    """AXIS=V,AXIS=V for --combine: settings changed together, as (combined axis, its value)."""
    from attnscale.lm.study_axes import AXES, combine

    settings = {}
    for item in text.split(","):
        axis, sep, value = item.partition("=")
        if not sep or axis not in AXES or not value:
            raise argparse.ArgumentTypeError(f"takes AXIS=V,AXIS=V with each AXIS one of {', '.join(AXES)}, "
                                             f"got {text!r}")
        if axis in settings:
            raise argparse.ArgumentTypeError(f"{axis} is given twice in {text!r}; give each axis once")
        settings[axis] = _axis_value(axis, value)
    if len(settings) < 2:
        raise argparse.ArgumentTypeError(f"combines two or more settings, got {text!r}; for one, use --axis")
    return combine(settings)


def _axis_value(axis: str, text: str):
    parse = {"lr": float, "weight_decay": float, "steps": int}.get(axis, str)
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{axis} takes numbers, got {text!r}") from None


# ---- checks made before anything is written ------------------------------------


def usable_device(spec: str, executor: str = "local", dtype: str | None = None) -> str:
    """``spec`` when this machine has the device, and can train in ``dtype`` there where one is given; else a
    one-line error (ConfigError), before anything is written. With ``executor`` "ray" the runs train elsewhere:
    the Ray executor checks the cluster instead."""
    from attnscale.core.device import resolve_device, resolve_precision

    if executor != "ray":
        device = resolve_device(spec)
        if dtype is not None:
            resolve_precision(dtype, device)
    return spec


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


# ---- options several commands share ---------------------------------------------


def default_of(cls, name: str):
    """The default of field ``name`` of the dataclass ``cls``: the library's, never restated here."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def words(values) -> str:
    return " ".join(map(str, values))


def device_option(p) -> None:
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps")


def dtype_name(text: str) -> str:
    from attnscale.core.device import DTYPES

    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(DTYPES)}, got {text!r}")
    return text


def dtype_option(p) -> None:
    p.add_argument("--dtype", type=dtype_name,
                   help="precision the runs train in: auto (the preset's: bf16 where the CPU or GPU computes in it "
                        "natively, fp16 on Volta and Turing GPUs, else fp32), fp32, bf16 or fp16 (GPUs only); "
                        "a run trained in another precision is another run, never resumed as this one")


def weights_option(p) -> None:
    p.add_argument("--weights", choices=["fp32", "bf16"],
                   help="what a bf16 step computes on: fp32 weights cast by autocast at every use (the default), or "
                        "a bf16 copy of fp32 master weights, refreshed once a step (no effect where the runs train in fp32)")


def training_options(p, out: str, quick: str | None = None) -> None:
    """Options every training command shares: corpus, budget overrides, output, workers."""
    p.add_argument("--corpus", default="default",
                   help="'default' (embedded), 'wikitext-2', 'tinyshakespeare', a text file or a folder")
    p.add_argument("--tokenizer", type=tokenizer_name, help="word, char or bpe (default: the corpus's own)")
    p.add_argument("--quick", action="store_true",
                   help=quick or f"a small budget, seconds per run ({_quick_budget()})")
    p.add_argument("--steps", type=positive_int, help="optimizer steps per run (default: the preset's)")
    p.add_argument("--batch", type=positive_int, help="sequences per step (default: the preset's)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate (default: the preset's)")
    p.add_argument("--context", type=positive_int, help="tokens per sequence (default: the preset's)")
    p.add_argument("--out", type=Path, default=Path(out), help=f"runs go to OUT/<run_id> (default {out})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    device_option(p)
    dtype_option(p)
    weights_option(p)


def _quick_budget() -> str:
    from attnscale.lm.presets import budget

    b = budget("quick")
    return f"{b.train.steps} steps, batch {b.train.batch}, context {b.model['context']}"


def full_option(p, seeds: bool = False) -> None:
    from attnscale.lm.presets import budget

    b = budget("full")
    what = f"{b.train.steps:,} steps a run" + (f", seeds 0 to {b.seeds - 1} unless --seeds" if seeds else "")
    p.add_argument("--full", action="store_true", help=f"the full-length budget ({what}); not with --quick")


def jobs_option(p) -> None:
    p.add_argument("-j", "--jobs", type=positive_int, default=1,
                   help="runs trained at once, each in its own process with cores/JOBS threads")


def executor_options(p) -> None:
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where runs train: 'local' worker processes, or 'ray' tasks (pip install -e '.[ray]' in the clone), "
                        "on a local Ray instance unless --ray-address is given; each run gets cores/JOBS threads")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --executor ray: join the Ray cluster whose head is at ADDRESS (HOST:PORT; "
                        "ray://HOST:PORT through Ray Client; 'auto': the one `ray start` runs on this machine); "
                        "records still land in --out on this machine, and --device is resolved where runs train")


def executor_kwargs(args) -> dict:
    """Where the runs train, as the library takes it (checked by ``sequence.Command`` before anything is written)."""
    return {"executor": args.executor, "ray_address": args.ray_address}


def overrides(model: dict, train, args) -> tuple[dict, object]:
    """(model settings, TrainConfig) with the command line's --steps, --batch, --lr, --context, --dtype and --weights."""
    from attnscale.lm.presets import with_steps

    chosen = {k: v for k in ("dtype", "weights") if (v := getattr(args, k, None)) is not None}
    if chosen:
        train = dataclasses.replace(train, **chosen)  # together: each is checked against the other
    if args.steps is not None:
        train = with_steps(train, args.steps)
    if args.batch is not None:
        train = dataclasses.replace(train, batch=args.batch)
    if args.lr is not None:
        train = dataclasses.replace(train, lr=args.lr)
    return {**model, **({"context": args.context} if args.context is not None else {})}, train


def with_budget(cfg, args):
    """``cfg`` (a DynamicsConfig or SweepConfig) with the command line's overrides."""
    model, train = overrides(cfg.model, cfg.train, args)
    return dataclasses.replace(cfg, tokenizer=args.tokenizer, model=model, train=train, device=args.device)


PARSERS: dict = {}  # command -> its parser, kept as each is built: what a mode's refusal reads the defaults from


def given_options(args, command: str, allowed) -> list[str]:
    """The options of ``command`` given a value other than their default, but for ``allowed`` (by dest), by flag."""
    parser = PARSERS[command]
    return [a.option_strings[-1] for a in parser._actions
            if a.option_strings and a.dest not in allowed and a.dest != "help"
            and getattr(args, a.dest, a.default) != a.default]
