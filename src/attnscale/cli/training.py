"""The commands that train the tiny model: train, dynamics, sweep, schemes, study.

Each starts from its experiment's preset, applies the shared budget options
(``options.with_budget``), and hands the runs to the experiment; the experiment
decides where they train (``--jobs``, ``--executor``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnscale.cli.options import (PARSERS, UsageError, default_of, executor_kwargs, executor_options, full_option,
                                   given_options, jobs_option, nonneg_int, overrides, positive_float, positive_int, scale_name, study_axis,
                                   study_combination, training_options, with_budget, words)
from attnscale.cli.sequence import Command, table_of

__all__ = ["COMMANDS"]


def _once(values) -> tuple:
    """``values`` in order, each once: a value given twice trains once."""
    return tuple(dict.fromkeys(values))


def _train_config(args):
    from attnscale.experiments import sweep

    base = sweep.preset(quick=args.quick, full=args.full, corpus=args.corpus, seed=args.seed, tokenizer=args.tokenizer)
    train = dataclasses.replace(base.train, optimizer=args.optimizer)
    return with_budget(sweep.SweepConfig(corpus=args.corpus, head_dims=(args.head_dim,), scales=(args.scale,),
                                         seeds=(args.seed,), model=base.model, train=train), args)


def _train(cfg, out, args) -> dict:
    from attnscale.experiments import dynamics, sweep

    rows = dynamics.rows_from_records(sweep.run_records(cfg, out, jobs=1, group="train"))
    return {"rows": rows, "run": out / rows[0]["run_id"]}


def _train_table(result) -> str:
    from attnscale.experiments.dynamics import format_table

    return f"{format_table(result['rows'])}\nrun: {result['run']}"


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train the tiny LM once, at one head width and scale")
    p.add_argument("--head-dim", "--width", type=positive_int, default=64, help="head width d (length of q and k; default: %(default)s)")
    p.add_argument("--scale", type=scale_name, default="inv_sqrt_d",
                   help="score-scale scheme (default: %(default)s, the course's 1/sqrt(d))")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the weights and batches (default: %(default)s)")
    p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                   help="adamw (the default), or muon: Muon for the blocks' weight matrices, its update's RMS matched "
                        "to AdamW's, and AdamW for the embeddings, read-out, norms, biases and the scale's gains")
    training_options(p, "attnscale-out/train")
    full_option(p)
    p.set_defaults(run=Command(_train_config, _train, _train_table, as_json=lambda result: result["rows"]))


def _dynamics_config(args):
    from attnscale.experiments import dynamics

    cfg = dynamics.preset(quick=args.quick, full=args.full, corpus=args.corpus, seed=args.seed, tokenizer=args.tokenizer)
    return with_budget(dataclasses.replace(cfg, head_dim=args.head_dim, scales=_once(args.scales)), args)


def _dynamics(cfg, out, args):
    from attnscale.experiments import dynamics

    return dynamics.run(cfg, out, jobs=args.jobs, **executor_kwargs(args))


def add_dynamics(sub) -> None:
    from attnscale.experiments.dynamics import DynamicsConfig

    scales = default_of(DynamicsConfig, "scales")
    p = sub.add_parser("dynamics", help="train at one width with and without the scale; diagnostics over training")
    p.add_argument("--head-dim", "--width", type=positive_int, default=default_of(DynamicsConfig, "head_dim"),
                   help="head width d (length of q and k; default: %(default)s)")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes, one run each (default: {words(scales)})")
    p.add_argument("--seed", type=nonneg_int, default=default_of(DynamicsConfig, "seed"),
                   help="seed of the weights and batches, the same for every scheme (default: %(default)s)")
    training_options(p, "attnscale-out/dynamics")
    full_option(p)
    jobs_option(p)
    executor_options(p)
    p.set_defaults(run=Command(_dynamics_config, _dynamics, table_of("dynamics")))


def _sweep_config(args):
    from attnscale.experiments import sweep

    cfg = sweep.preset(quick=args.quick, full=args.full, corpus=args.corpus, tokenizer=args.tokenizer)
    cfg = dataclasses.replace(cfg, head_dims=_once(args.head_dims or cfg.head_dims), scales=_once(args.scales),
                              seeds=_once(args.seeds or cfg.seeds), lrs=_once(args.lrs) if args.lrs else None)
    return with_budget(cfg, args)


def _sweep(cfg, out, args):
    from attnscale.experiments import sweep

    return sweep.run(cfg, out, jobs=args.jobs, **executor_kwargs(args))


def _sweep_json(rows) -> dict:
    from attnscale.experiments import sweep

    return {"rows": rows, "gaps": sweep.gap_table(rows)}


def add_sweep(sub) -> None:
    from attnscale.experiments.sweep import SweepConfig

    head_dims, scales, seeds = (default_of(SweepConfig, k) for k in ("head_dims", "scales", "seeds"))
    p = sub.add_parser("sweep", help="held-out perplexity across head widths and scales; where the gap starts")
    p.add_argument("--head-dims", "--widths", type=positive_int, nargs="+",
                   help=f"head widths (default: {words(head_dims)}; fewer with --quick)")
    p.add_argument("--scale", type=scale_name, nargs="+", default=list(scales), dest="scales",
                   help=f"score-scale schemes; the gap is none − inv_sqrt_d (default: {words(scales)})")
    p.add_argument("--seeds", type=nonneg_int, nargs="+",
                   help=f"seeds per width and scheme; two or more give standard errors (default: {words(seeds)}; "
                        "--full: the full budget's)")
    p.add_argument("--lrs", type=positive_float, nargs="+", help="sweep these learning rates too")
    training_options(p, "attnscale-out/sweep")
    full_option(p, seeds=True)
    jobs_option(p)
    executor_options(p)
    p.set_defaults(run=Command(_sweep_config, _sweep, table_of("sweep"), as_json=_sweep_json))


def _schemes_config(args):
    from attnscale.experiments import schemes

    cfg = with_budget(schemes.preset("quick" if args.quick else "full", corpus=args.corpus, tokenizer=args.tokenizer), args)
    lrs = args.lrs or (schemes.lr_grid(args.lr) if args.lr is not None else cfg.lrs)
    return dataclasses.replace(cfg, head_dims=_once(args.head_dims or cfg.head_dims), scales=_once(args.scales or cfg.scales),
                               seeds=_once(args.seeds if args.seeds is not None else cfg.seeds), lrs=_once(lrs))


def _schemes(cfg, out, args):
    from attnscale.experiments import schemes

    return schemes.run(cfg, out, jobs=args.jobs, **executor_kwargs(args))


def add_schemes(sub) -> None:
    p = sub.add_parser("schemes", help="which scale? every scheme × head width × learning rate × seed: "
                                       "LR sensitivity, logit growth, entropy collapse")
    p.add_argument("--head-dims", "--widths", type=positive_int, nargs="+", help="head widths (default 64 256 1024; --quick: 64 256)")
    p.add_argument("--scale", type=scale_name, nargs="+", dest="scales", help="schemes (default: every registered one)")
    p.add_argument("--lrs", type=positive_float, nargs="+",
                   help="learning rates (default: 5 from 10× below to 10× above the preset's, or --lr's)")
    p.add_argument("--seeds", type=nonneg_int, nargs="+", help="seeds (default 0 1 2; --quick: 0 1)")
    training_options(p, "attnscale-out/schemes")
    jobs_option(p)
    executor_options(p)
    p.set_defaults(run=Command(_schemes_config, _schemes, table_of("schemes")))


def _study_config(args):
    from attnscale.experiments import setup_study
    from attnscale.lm.presets import budget

    vocab = setup_study.CorpusSpec(args.corpus, args.tokenizer).load().vocab_size
    base = budget("default" if args.quick else "full", vocab)
    model, train = overrides(base.model, base.train, args)  # the axes are then taken around this base
    cfg = setup_study.preset("quick" if args.quick else "full", corpus=args.corpus, tokenizer=args.tokenizer,
                             vocab_size=vocab, model=model, train=train)
    cfg = dataclasses.replace(cfg, device=args.device, head_dim=args.head_dim or cfg.head_dim, scales=_once(args.scales or cfg.scales),
                              seeds=_once(args.seeds if args.seeds is not None else cfg.seeds),
                              axes=_axes(args, cfg.axes))
    missing = [str(d) for d in args.reuse if not d.is_dir()]
    if missing:
        raise UsageError(f"--reuse: {', '.join(missing)} is not a folder; give folders that hold finished runs")
    return cfg


def _axes(args, preset_axes):
    """--axis's axes (the preset's where neither --axis nor --combine is given), then --combine's,
    one entry per combined axis with its values in the order given."""
    combos: dict[str, tuple] = {}
    for axis, value in args.combos or ():
        if value in combos.get(axis, ()):
            raise UsageError(f"--combine {axis} with {value} is given twice; give each combination once")
        combos[axis] = combos.get(axis, ()) + (value,)
    single = tuple(args.axes) if args.axes else () if combos else preset_axes
    return single + tuple(combos.items())


def _study(cfg, out, args):
    from attnscale.experiments import setup_study

    return setup_study.run(cfg, out, jobs=args.jobs, reuse=args.reuse, **executor_kwargs(args))


def add_study(sub) -> None:
    from attnscale.lm.study_axes import AXES

    p = sub.add_parser("study", help="the setup study: how the end of training at d=1,024 (spread, frozen rows, "
                                     "perplexity) depends on lr, schedule, weight decay, init, norm and length")
    p.add_argument("--head-dim", "--width", type=positive_int, help="head width d (default: 1024)")
    p.add_argument("--scale", type=scale_name, nargs="+", dest="scales",
                   help="schemes, one run each per setup (default: none inv_sqrt_d)")
    p.add_argument("--seeds", type=nonneg_int, nargs="+", help="seeds (default 0 1)")
    p.add_argument("--axis", type=study_axis, action="append", dest="axes", metavar="AXIS=V1,V2",
                   help=f"one axis and the values tried instead of the base's (repeat for more; default: every "
                        f"axis, around the full budget, or the default one with --quick); AXIS: {', '.join(AXES)}")
    p.add_argument("--combine", type=study_combination, action="append", dest="combos", metavar="AXIS=V,AXIS=V",
                   help="settings changed together as one setup (repeat for more), e.g. "
                        "schedule=constant,weight_decay=0; without --axis only these and the base run")
    p.add_argument("--reuse", type=Path, nargs="+", default=[], metavar="DIR",
                   help="folders of finished runs (e.g. reproduce --full's OUT/dynamics): a run of the very same "
                        "config found there is copied, not trained again")
    training_options(p, "attnscale-out/study",
                     quick="around the default budget (400 steps) instead of the full one (1,200): 36 runs at "
                           "d=1,024, about an hour on a 2-core laptop CPU, less with --reuse")
    jobs_option(p)
    executor_options(p)
    p.set_defaults(run=Command(_study_config, _study, table_of("setup_study")))


def _pilot_config(args) -> list:
    from attnscale.errors import ConfigError
    from attnscale.experiments import warn_study

    if args.family != "tiny" or args.scales or args.norms or (args.warmups and len(args.warmups) > 1):
        raise ConfigError("--pilot trains the tiny LM's qk-norm-off recipe arms at one warm-up: drop --family, --scale "
                          "and --norm, and give --warmup one value")
    cfg = warn_study.pilot_preset("smoke" if args.quick else "full", corpus=args.corpus, tokenizer=args.tokenizer)
    model, train = overrides(cfg.model, cfg.train, args)
    train = dataclasses.replace(train, warmup=args.warmups[0]) if args.warmups else train
    return [dataclasses.replace(cfg, model=model, train=train, device=args.device, lrs=_once(args.lrs or cfg.lrs),
                                seeds=_once(args.seeds if args.seeds is not None else cfg.seeds))]


def _study_of_pilot(args) -> list:
    from attnscale.errors import ConfigError
    from attnscale.experiments import recipe_study

    if (args.pilot or args.family != "tiny" or args.scales or args.norms or args.warmups or args.lrs or args.seeds
            or args.lr is not None):
        raise ConfigError("--study trains the recipe's arms on the ladder and rungs its pilot chose, on seeds "
                          "fixed in advance: drop --pilot, --family, --scale, --norm, --warmup, --lr, --lrs and --seeds")
    if not args.study.is_dir():
        raise UsageError(f"--study: {str(args.study)!r} is not a folder; give the folder of a finished pilot "
                         "(attnscale warn-study --pilot --out DIR)")
    cfg = recipe_study.study_preset(args.study, "smoke" if args.quick else "full", corpus=args.corpus,
                                    tokenizer=args.tokenizer)
    model, train = overrides(cfg.model, cfg.train, args)  # as the pilot takes them: give the pilot's own
    return [dataclasses.replace(cfg, model=model, train=train, device=args.device)]


def _warn_config(args) -> list:
    from attnscale.experiments import warn_study

    if args.reread is not None or args.published is not None:
        if args.pilot or args.study is not None:
            from attnscale.errors import ConfigError

            raise ConfigError("--reread and --published read published numbers and train nothing: drop --pilot "
                              "and --study")
        for flag, path in (("--reread", args.reread), ("--published", args.published)):
            if path is not None and not path.is_file():
                raise UsageError(f"{flag}: no file {str(path)!r}; give a published file (e.g. "
                                 f"{'docs/act-study-series.json.gz' if flag == '--reread' else 'docs/warn-study.json'})")
        given = given_options(args, "warn-study", ("reread", "published", "json"))
        if given:
            raise UsageError(f"{given[0]} has no effect with --reread or --published, which train nothing; leave it out")
        args.out = None  # the re-read trains nothing and writes no folder
        return []
    if args.study is not None:
        return _study_of_pilot(args)
    if args.pilot:
        return _pilot_config(args)
    out = []
    for cfg in warn_study.configs(args.family, "smoke" if args.quick else "full", corpus=args.corpus,
                                  tokenizer=args.tokenizer):
        model, train = overrides(cfg.model, cfg.train, args)
        # --scale and --norm vary the tiny LM: with --family all the Llama keeps its own; with --family llama
        # they are refused by WarnConfig, which says why
        ours = cfg.family == "tiny" or args.family != "all"
        out.append(dataclasses.replace(
            cfg, model=model, train=train, device=args.device, lrs=_once(args.lrs or cfg.lrs),
            seeds=_once(args.seeds if args.seeds is not None else cfg.seeds),
            scales=_once((ours and args.scales) or cfg.scales), norms=_once((ours and args.norms) or cfg.norms),
            warmups=_once(args.warmups if args.warmups is not None else cfg.warmups)))
    return out


def _warn(cfgs, out, args) -> list:
    from attnscale.experiments import warn_study

    if args.reread is not None or args.published is not None:
        from attnscale.experiments import warn_reread

        return [warn_reread.reread_files(args.reread, args.published)]
    if args.study is not None:
        from attnscale.experiments import recipe_study

        return [recipe_study.run_study(cfgs[0], out, jobs=args.jobs, **executor_kwargs(args))]
    if args.pilot:
        return [warn_study.run_pilot(cfgs[0], out, jobs=args.jobs, **executor_kwargs(args))]
    # one folder for both families: the Llama's run ids begin "llama-", the tiny LM's never do
    return [warn_study.run(cfg, out, jobs=args.jobs, **executor_kwargs(args)) for cfg in cfgs]


def _warn_table(results) -> str:
    from attnscale.experiments import recipe_study, warn_reread, warn_study

    if results and results[0].get("reread"):
        return warn_reread.format_reread(results[0])
    if results and results[0].get("study"):
        return recipe_study.format_study(results[0])
    return warn_study.format_tables(results)


def _warn_json(results) -> dict:
    from attnscale.experiments import recipe_study, warn_reread, warn_study

    if results and results[0].get("reread"):
        return warn_reread.reread_json(results[0])
    if results and results[0].get("study"):
        return recipe_study.study_json(results[0])
    return warn_study.as_json_all(results)


def add_warn_study(sub) -> None:
    from attnscale.experiments.warn_study import FAMILIES, LLAMA_LRS, LRS

    p = sub.add_parser("warn-study", help="does the watch warn before a run breaks? small models trained to the edge: "
                                          "each alert's hits, false alarms and lead time over a learning-rate ladder")
    p.add_argument("--family", choices=[*FAMILIES, "all"], default="tiny",
                   help="tiny: the tiny LM (the default); llama: a Llama-shaped HF model under transformers' Trainer; "
                        "all: both, into one --out (the Llama's run ids begin 'llama-')")
    p.add_argument("--lrs", type=positive_float, nargs="+",
                   help=f"the learning-rate ladder (default: tiny {words(LRS)}; llama {words(LLAMA_LRS)})")
    p.add_argument("--seeds", type=nonneg_int, nargs="+",
                   help="seeds per cell; half choose the thresholds, half judge them (default: tiny 0 … 9, llama 0 … 11)")
    p.add_argument("--scale", type=scale_name, nargs="+", dest="scales",
                   help="schemes of the tiny LM (default: none inv_sqrt_d); with --family all, the Llama keeps its own")
    p.add_argument("--norm", choices=["post", "pre"], nargs="+", dest="norms",
                   help="norm placements of the tiny LM (default: post pre)")
    p.add_argument("--warmup", type=nonneg_int, nargs="+", dest="warmups",
                   help="warm-up steps (default: tiny 0 20, llama 0 40)")
    mode = p.add_mutually_exclusive_group()  # the usage shows that the two exclude each other
    mode.add_argument("--pilot", action="store_true",
                      help="the recipe's pilot instead (Wortsman et al. 2023: pre-LN, AdamW 0.9/0.95, independent weight "
                           "decay, constant rate after a warm-up; qk-norm off × z-loss 0/1e-4, and the uniform-attention "
                           "floor) on seeds outside the study: per rung, the runs that learnt, then broke mid-run (run "
                           "ids 'pilot-'); with --quick 6 runs of 40 steps, a smoke check")
    mode.add_argument("--study", type=Path, metavar="PILOT_DIR",
                      help="the study proper: the recipe's four arms on the pilot's ladder, seeds 0–23 on the two "
                           "rungs the finished pilot in PILOT_DIR chose and 0 on the others (run ids 'study-'); each "
                           "detector judged within each cell, thresholds cross-fitted over the seeds; with --quick, "
                           "on a --quick pilot, a smoke check; --steps, --batch, --context, --dtype and --weights as the pilot was given "
                           "them")
    reread = ("train nothing: re-derive the warning's figures from a published series file (e.g. "
              "docs/act-study-series.json.gz; arms A and E): leads from a landmark 200 steps after learning, breakers "
              "against holders there, the share of held runs that alarm, and the break-dating rules' sensitivity; "
              "with --json, every number")
    published = ("with or without --reread: the study's own numbers (docs/warn-study.json) read again: its leads "
                 "beside each run's survival after learning, its silenced detectors, its AUC count")
    for flag, metavar, text in (("--reread", "SERIES", reread), ("--published", "JSON", published)):
        p.add_argument(flag, type=Path, metavar=metavar, help=text)
    PARSERS["warn-study"] = p
    training_options(p, "attnscale-out/warn-study",
                     quick="the smoke size: 4 runs a family, a check that the study works, not a measurement")
    jobs_option(p)
    executor_options(p)
    p.set_defaults(run=Command(_warn_config, _warn, _warn_table, as_json=_warn_json))


def _act_config(args):
    from attnscale.errors import ConfigError
    from attnscale.experiments import act_study

    from attnscale.runs.writers import check_file

    if args.pilot == (args.study is not None):  # the parser's group says so too; a library caller may not have it
        raise ConfigError("act-study trains its pilot or its study: give --pilot, or --study PILOT_DIR (not both)")
    if args.study is not None and not args.study.is_dir():
        raise UsageError(f"--study: {str(args.study)!r} is not a folder; give the folder of a finished pilot "
                         "(attnscale act-study --pilot --out DIR)")
    if args.series is not None and args.series.is_dir():
        raise UsageError(f"--series: {str(args.series)!r} is a folder; give the file to write (e.g. "
                         f"{str(args.series / 'act-study-series.json.gz')!r})")
    if args.series is not None and not args.series.parent.is_dir():
        raise UsageError(f"--series: {str(args.series.parent)!r} is not a folder; give a file in a folder that exists")
    if args.series is not None and args.pilot:
        raise ConfigError("--series writes the pilot's and the study's runs together: give it with --study PILOT_DIR")
    if args.series is not None:  # before any run trains: a file of someone else's is never replaced
        check_file(args.series, "act-study", "--series", "series file")
    if args.block is not None and args.pilot:
        raise ConfigError("--block picks the study's seeds; the pilot has its own: give it with --study PILOT_DIR")
    size = "smoke" if args.quick else "full"
    if args.pilot:
        return act_study.preset(size, corpus=args.corpus, pilot=True)
    try:
        level = act_study.read_pilot(args.study, args.corpus, size)
    except ConfigError as e:
        raise ConfigError(f"--study: {e}") from None
    return act_study.preset(size, corpus=args.corpus, level=level, block=args.block or 1)


def _act(cfg, out, args):
    from attnscale.experiments import act_study

    if args.pilot:
        return act_study.run_pilot(cfg, out, jobs=args.jobs)
    result = act_study.run_study(cfg, out, jobs=args.jobs)
    if args.series is not None:
        act_study.write_series(args.series, act_study.read_rows(args.study, pilot=True) + result["rows"])
    return result


def _act_table(result) -> str:
    from attnscale.experiments import act_study

    return act_study.format_result(result)


def _act_json(result) -> dict:
    from attnscale.experiments import act_study

    return act_study.as_json(result)


def add_act_study(sub) -> None:
    p = sub.add_parser("act-study", help="does acting on the watch save a run? QK-Clip and a rate cut switched on by "
                                         "the alarm, against no action and qk-norm, on paired seeds (docs/act-study.md)")
    mode = p.add_mutually_exclusive_group(required=True)  # the usage shows one of the two as required
    mode.add_argument("--pilot", action="store_true",
                      help="the pilot: arm A on seeds 100–103 of both cells; it chooses the alarm's level")
    mode.add_argument("--study", type=Path, metavar="PILOT_DIR",
                      help="the study's block 1 (seeds 0–3, every arm of both cells, seed by seed) at the level the "
                           "finished pilot in PILOT_DIR chose")
    p.add_argument("--block", type=int, choices=[1, 2],
                   help="with --study: 1 (the default) trains seeds 0–3; 2 adds seeds 4–15 after them in the same "
                        "folder and reads both blocks together (the reading is final only with every seed of both)")
    p.add_argument("--series", type=Path, metavar="FILE",
                   help="with --study: also write every run's series, the pilot's with them, to FILE (.json.gz)")
    p.add_argument("--corpus", default="default", help="the corpus (default: %(default)s, the warning study's)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke check: a 16-wide model, 60 steps, one seed; not a measurement")
    p.add_argument("--out", type=Path, required=True, help="runs go to OUT/<run_id>")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    jobs_option(p)
    p.set_defaults(run=Command(_act_config, _act, _act_table, as_json=_act_json))


COMMANDS = [add_train, add_dynamics, add_sweep, add_schemes, add_study, add_warn_study, add_act_study]
