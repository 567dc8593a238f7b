"""The pre-registered paired studies' commands that are not the warn and act studies': lr-study (learning-rate
sensitivity, docs/lr-study.md). Each trains a declared block, a pilot, or publishes from run folders."""

from __future__ import annotations

from pathlib import Path

from attnscale.cli.options import UsageError, jobs_option, positive_float
from attnscale.cli.sequence import Command

__all__ = ["COMMANDS"]


def _lr_config(args):
    from attnscale.errors import ConfigError
    from attnscale.experiments import lr_study as ls

    size = "smoke" if args.quick else "full"
    if args.publish:
        if args.json_out is None and args.series is None:
            raise UsageError("--publish writes --json-out FILE, --series FILE or both: give at least one")
        return {"publish": args.publish}
    if args.json_out is not None or args.series is not None:
        raise UsageError("--json-out and --series go with --publish RUNS_DIR")
    if args.out is None:
        raise UsageError("--out DIR is where the runs train: give it (e.g. --out runs/lr-study)")
    if args.muon_pilot:
        if args.lrs or args.grid_from is not None:
            raise UsageError("the Muon pilot has its own rates: drop --lrs and --from")
        return ls.muon_pilot_config(size)
    lrs = tuple(args.lrs) if args.lrs else None
    if args.grid_from is not None:
        if lrs is not None:
            raise UsageError("give --lrs or --from, not both")
        if args.block == 1:
            raise UsageError("block 1's grid is fixed (docs/lr-study.md): drop --from")
        if not args.grid_from.is_dir():
            raise UsageError(f"--from: {str(args.grid_from)!r} is not a folder")
        if args.block == 2:
            got = ls.read_rows([args.grid_from], ls.PILOT_GROUP)
            if not got:
                raise ConfigError(f"--from: no finished Muon pilot runs in {args.grid_from}")
            lrs = ls.muon_grid(got)["lrs"]
        else:
            lrs = ls.narrowed(ls.read_rows([args.grid_from]), ls.BLOCKS[args.block][0])
    elif lrs is not None and args.block == 1 and not args.quick:
        raise UsageError("block 1's grid is fixed (docs/lr-study.md): drop --lrs")
    return ls.preset(args.block, size, lrs=lrs)


def _lr(cfg, out, args):
    from attnscale.experiments import lr_study as ls

    if isinstance(cfg, dict):
        command = "attnscale lr-study --publish " + " ".join(map(str, args.publish))
        return ls.publish(args.publish, args.json_out, args.series, command)
    if args.muon_pilot:
        return ls.run_muon_pilot(cfg, out, jobs=args.jobs)
    return {"rows": ls.run_block(cfg, out, jobs=args.jobs)}


def _lr_table(result) -> str:
    from attnscale.experiments.lr_study_text import format_result

    return format_result(result)


def _lr_json(result) -> dict:
    from attnscale.experiments.lr_study import block

    if "groups" in result or result.get("pilot"):
        return {k: v for k, v in result.items() if k != "rows"} | ({"rows": len(result["rows"])} if "rows" in result else {})
    return block(result["rows"])


def add_lr_study(sub) -> None:
    p = sub.add_parser("lr-study", help="learning-rate sensitivity of qk-norm, QK-Clip and the alarm under AdamW and "
                                        "Muon (docs/lr-study.md)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--block", type=int, choices=[1, 2, 3, 4],
                      help="train a declared block: 1 AdamW width 64; 2 Muon width 64 (--from the Muon pilot); "
                           "3 and 4 AdamW and Muon at d_model 256 (--from the folder of block 1 or 2)")
    mode.add_argument("--muon-pilot", action="store_true", help="the Muon pilot: it fixes Muon's grid")
    mode.add_argument("--publish", type=Path, nargs="+", metavar="RUNS_DIR",
                      help="train nothing: judge the finished runs in RUNS_DIR and write --json-out and --series")
    p.add_argument("--from", type=Path, dest="grid_from", metavar="DIR",
                   help="blocks 2-4: the folder whose runs set the grid (the Muon pilot's; block 1's or 2's)")
    p.add_argument("--lrs", type=positive_float, nargs="+", help="blocks 2-4 (or --quick): the grid, given by hand")
    p.add_argument("--out", type=Path, help="runs go to OUT/<run_id>")
    p.add_argument("--json-out", type=Path, metavar="FILE",
                   help="with --publish: the studies' JSON (e.g. docs/warn-study.json), whose \"sensitivity\" is replaced")
    p.add_argument("--series", type=Path, metavar="FILE", help="with --publish: every run's series (.json.gz)")
    p.add_argument("--quick", action="store_true", help="a smoke check: a 16-wide model, 60 steps, one seed, two rates")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    jobs_option(p)
    p.set_defaults(run=Command(_lr_config, _lr, _lr_table, as_json=_lr_json))


COMMANDS = [add_lr_study]
