"""The pre-registered paired studies' commands that are not the warn and act studies': lr-study (learning-rate
sensitivity, docs/lr-study.md) and alarm-study (the alarm where some runs hold, docs/alarm-study.md). Each trains a
declared block, a pilot, or publishes from run folders."""

from __future__ import annotations

from pathlib import Path

from attnscale.cli.options import PARSERS, UsageError, given_options, jobs_option, positive_float
from attnscale.cli.sequence import Command

__all__ = ["COMMANDS"]


def _train_nothing(args, command: str) -> None:
    """--publish trains nothing: an option that only a training mode reads is refused, naming it."""
    given = given_options(args, command, ("publish", "json_out", "series", "json", "pilot_dir", "figure"))
    if given:
        raise UsageError(f"{', '.join(given)}: --publish trains nothing; drop {'it' if len(given) == 1 else 'them'}")


_PNG = b"\x89PNG\r\n\x1a\n"


def _check_figure(path: Path) -> None:
    """--figure: a .png file name, not a folder, under no file, and where it exists, a PNG (redrawn, never another
    kind of file overwritten)."""
    from attnscale import drawing

    drawing.pyplot()  # a one-line error naming the report extra where matplotlib is missing, before anything runs
    if path.suffix.lower() != ".png":
        raise UsageError(f"--figure: {str(path)!r} is not a .png file name; give one, e.g. docs/lr-study.png")
    if path.is_dir():
        raise UsageError(f"--figure: {str(path)!r} is a folder; give the file to draw, e.g. docs/lr-study.png")
    if any(p.exists() and not p.is_dir() for p in path.parents):
        raise UsageError(f"--figure: {str(path)!r} lies under a file, not a folder; give a path in a folder")
    if path.exists():
        with open(path, "rb") as f:
            if f.read(len(_PNG)) != _PNG:
                raise UsageError(f"--figure: {str(path)!r} exists and is not a PNG; give another file, or move that "
                                 "one away")


def _lr_config(args):
    from attnscale.errors import ConfigError
    from attnscale.experiments import lr_study as ls

    size = "smoke" if args.quick else "full"
    if args.publish:
        if args.json_out is None and args.series is None and args.figure is None:
            raise UsageError("--publish writes --json-out FILE, --series FILE, --figure FILE or some of them: give at "
                             "least one")
        _train_nothing(args, "lr-study")
        if args.figure is not None:
            _check_figure(args.figure)
        return {"publish": args.publish}
    if args.json_out is not None or args.series is not None or args.figure is not None:
        raise UsageError("--json-out, --series and --figure go with --publish RUNS_DIR")
    if args.out is None:
        raise UsageError("--out DIR is where the runs train: give it (e.g. --out runs/lr-study)")
    if args.muon_pilot:
        if args.lrs or args.grid_from is not None:
            raise UsageError("the Muon pilot has its own rates: drop --lrs and --from")
        return ls.muon_pilot_config(size)
    lrs = tuple(args.lrs) if args.lrs else None
    if args.block == 5:  # z-loss under each optimizer, on the grids of blocks 1 and 2
        if lrs is not None or args.grid_from is None:
            raise UsageError("block 5 trains on the grids of blocks 1 and 2: give --from their folder, not --lrs")
        if not args.grid_from.is_dir():
            raise UsageError(f"--from: {str(args.grid_from)!r} is not a folder")
        return ls.z_loss_configs(ls.read_rows([args.grid_from]), size)
    if args.grid_from is not None:
        if lrs is not None:
            raise UsageError("give --lrs or --from, not both")
        if args.block == 1:
            raise UsageError("block 1's grid is fixed (docs/lr-study.md): drop --from")
        if not args.grid_from.is_dir():
            raise UsageError(f"--from: {str(args.grid_from)!r} is not a folder")
        if args.block == 2:
            got = ls.read_rows([args.grid_from], ls.PILOT_GROUP)
            ladder = ls.muon_pilot_config(size).lrs
            finished, wanted = ls.pilot_finished(got, ladder)
            if finished < wanted:  # a grid read off part of the pilot could miss its r1
                raise ConfigError(f"--from: the Muon pilot in {args.grid_from} has {finished} of its {wanted} "
                                  f"runs finished; finish it first: attnscale lr-study --muon-pilot --out "
                                  f"{args.grid_from}")
            lrs = ls.muon_grid(got, ladder)["lrs"]
        else:
            lrs = ls.narrowed(ls.read_rows([args.grid_from]), ls.BLOCKS[args.block][0], size)
    elif lrs is not None and args.block == 1 and not args.quick:
        raise UsageError("block 1's grid is fixed (docs/lr-study.md): drop --lrs")
    return ls.preset(args.block, size, lrs=lrs)


def _lr(cfg, out, args):
    from attnscale.experiments import lr_study as ls

    if isinstance(cfg, dict):
        command = "attnscale lr-study --publish " + " ".join(map(str, args.publish))
        out = ls.publish(args.publish, args.json_out, args.series, command)
        if args.figure is not None:  # the report draws; the experiment only returns data
            from attnscale.report.lr_plots import loss_against_rate

            loss_against_rate(out["groups"], args.figure)
        return out
    if args.muon_pilot:
        return ls.run_muon_pilot(cfg, out, jobs=args.jobs)
    configs = cfg if isinstance(cfg, list) else [cfg]  # block 5: one config per optimizer
    return {"rows": [r for c in configs for r in ls.run_block(c, out, jobs=args.jobs)]}


def _lr_table(result) -> str:
    from attnscale.experiments.lr_study_text import format_result

    return format_result(result)


def _lr_json(result) -> dict:
    from attnscale.experiments.lr_study import block

    if "groups" in result or result.get("pilot"):
        return {k: v for k, v in result.items() if k != "rows"} | ({"rows": len(result["rows"])} if "rows" in result else {})
    return block(result["rows"])


def _shared(p, command: str, key: str, smoke: str, run: Command) -> None:
    """The options every study command has beside its modes: where runs go, what --publish writes, the smoke size,
    JSON, jobs; and the command itself."""
    p.add_argument("--out", type=Path, help="runs go to OUT/<run_id>")
    p.add_argument("--json-out", type=Path, metavar="FILE",
                   help=f"with --publish: the studies' JSON (e.g. docs/warn-study.json), whose \"{key}\" is replaced")
    p.add_argument("--series", type=Path, metavar="FILE", help="with --publish: every run's series (.json.gz)")
    p.add_argument("--quick", action="store_true", help=f"a smoke check: a 16-wide model, 60 steps, {smoke}; not a measurement")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    jobs_option(p)
    PARSERS[command] = p
    p.set_defaults(run=run)


def add_lr_study(sub) -> None:
    p = sub.add_parser("lr-study", help="learning-rate sensitivity of qk-norm, QK-Clip and the alarm under AdamW and "
                                        "Muon (docs/lr-study.md)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--block", type=int, choices=[1, 2, 3, 4, 5],
                      help="train a declared block: 1 AdamW width 64; 2 Muon width 64 (--from the Muon pilot); "
                           "3 and 4 AdamW and Muon at d_model 256 (--from the folder of block 1 or 2); 5 z-loss "
                           "at width 64 under both (--from the folder of blocks 1 and 2)")
    mode.add_argument("--muon-pilot", action="store_true", help="the Muon pilot: it fixes Muon's grid")
    mode.add_argument("--publish", type=Path, nargs="+", metavar="RUNS_DIR",
                      help="train nothing: judge the finished runs in RUNS_DIR and write --json-out and --series")
    p.add_argument("--from", type=Path, dest="grid_from", metavar="DIR",
                   help="blocks 2-5: the folder whose runs set the grid (the Muon pilot's; block 1's or 2's)")
    p.add_argument("--lrs", type=positive_float, nargs="+", help="blocks 2-4 (or --quick): the grid, given by hand")
    p.add_argument("--figure", type=Path, metavar="FILE",
                   help="with --publish: draw final loss against learning rate to FILE (.png; needs the report extra)")
    _shared(p, "lr-study", "sensitivity", "one seed, two rates (blocks 3 and 4: 32 wide)",
            Command(_lr_config, _lr, _lr_table, as_json=_lr_json))


def _alarm_config(args):
    from attnscale.experiments import alarm_study as al

    size = "smoke" if args.quick else "full"
    publishing = (args.json_out is not None) or (args.series is not None)
    if publishing and not args.publish:
        raise UsageError("--json-out and --series go with --publish RUNS_DIR")
    if args.publish and not publishing:
        raise UsageError("--publish writes --json-out FILE, --series FILE or both: give at least one")
    if (args.block or args.publish) and args.pilot_dir is None:
        raise UsageError("--block and --publish read the study's rate from the pilot: give --pilot-dir DIR")
    if args.pilot and args.pilot_dir is not None:
        raise UsageError("--pilot trains the pilot into --out: drop --pilot-dir")
    if args.pilot_dir is not None and not args.pilot_dir.is_dir():
        raise UsageError(f"--pilot-dir: {str(args.pilot_dir)!r} is not a folder")
    if args.publish:
        _train_nothing(args, "alarm-study")
    elif args.out is None:
        raise UsageError("--out DIR is where the runs train: give it (e.g. --out runs/alarm-study)")
    if args.pilot:
        return al.pilot_config(size)
    # a block trains at the rate of a pilot of its own size; publishing reads a pilot of either size
    return {"rate": al.read_pilot(args.pilot_dir, None if args.publish else size), "size": size}


def _alarm(cfg, out, args):
    from attnscale.experiments import alarm_study as al

    if args.pilot:
        return al.run_pilot(cfg, out, jobs=args.jobs)
    if args.publish:
        command = "attnscale alarm-study --publish " + " ".join(map(str, args.publish)) + f" --pilot-dir {args.pilot_dir}"
        return al.publish(args.publish, args.pilot_dir, args.json_out, args.series, command)
    rows = al.run_block(args.block, cfg["rate"], out, cfg["size"], jobs=args.jobs)
    pilot = [{**r, "arm": "A"} for r in al.ls.read_rows([args.pilot_dir], al.PILOT_GROUP)]
    return al.block(rows, pilot, cfg["rate"])


def _alarm_table(result) -> str:
    from attnscale.experiments.alarm_study_text import format_result

    return format_result(result)


def _alarm_json(result) -> dict:
    return {k: v for k, v in result.items() if k != "rows"}


def add_alarm_study(sub) -> None:
    p = sub.add_parser("alarm-study", help="the alarm where some runs hold: its sensitivity, false alarms and what "
                                           "acting on it costs, against clipping always, a lower rate and qk-norm "
                                           "(docs/alarm-study.md)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--pilot", action="store_true", help="the pilot: arm A at 5e-2, 6e-2, 7e-2 on seeds 100-107; "
                                                           "it chooses the study's rate")
    mode.add_argument("--block", type=int, choices=[1, 2],
                      help="1: every arm on seeds 0-23 (C where A's alarm fired); 2: arm A on seeds 24-79")
    mode.add_argument("--publish", type=Path, nargs="+", metavar="RUNS_DIR",
                      help="train nothing: judge the finished runs in RUNS_DIR and write --json-out and --series")
    p.add_argument("--pilot-dir", type=Path, metavar="DIR", help="with --block or --publish: the finished pilot's folder")
    _shared(p, "alarm-study", "alarm", "one seed a block",
            Command(_alarm_config, _alarm, _alarm_table, as_json=_alarm_json))


COMMANDS = [add_lr_study, add_alarm_study]
