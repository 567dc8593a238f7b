"""The alarm where some runs hold (docs/alarm-study.md, its rules committed before its pilot ran).

The lr study's runs (``experiments.lr_study``: the recipe's tiny LM at width 64 under AdamW, 3,000 steps) at one
rate, the pilot's: arm A is ``none``, B ``clip`` (QK-Clip at tau 100 from step 0), C ``alarm-clip`` (from the first
probe over 1e4; trained only where A's alarm fired, elsewhere A's run), E ``qk-norm``, F ``none`` at half the rate.
``run_pilot`` trains arm A on three rates (and once the rate the rule adds) and chooses the study's rate (``alarm_judging.choose_rate``), kept in
``out/PILOT_FILE``; ``run_block`` trains block 1 (seeds 0–23, every arm) or block 2 (arm A on seeds 24–79).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnscale.errors import ConfigError
from attnscale.experiments import lr_study as ls
from attnscale.runs.runner import execute

__all__ = ["GROUP", "PILOT_GROUP", "PILOT_FILE", "PILOT_LRS", "PILOT_SEEDS", "BLOCKS", "pilot_config", "block_config",
           "run_pilot", "read_pilot", "run_block", "arm_rows"]

GROUP, PILOT_GROUP, PILOT_FILE = "alarm-study", "alarm-pilot", "alarm-pilot.json"
PILOT_LRS = (5e-2, 6e-2, 7e-2)
PILOT_SEEDS = tuple(range(100, 108))
BLOCKS = {1: tuple(range(24)), 2: tuple(range(24, 80))}  # block 1: every arm; block 2: arm A alone


def pilot_config(size: str = "full") -> ls.LrConfig:
    base = replace(ls.preset(1, size), treatments=("none",), level=ls.LEVEL)
    return replace(base, lrs=PILOT_LRS if size == "full" else base.lrs, seeds=PILOT_SEEDS if size == "full" else (100,))


def block_config(block: int, rate: float, size: str = "full") -> list[ls.LrConfig]:
    """The block's configs: block 1 every arm (A, B, E at ``rate``; F, ``none`` at half of it), block 2 arm A alone."""
    if block not in BLOCKS:
        raise ConfigError(f"the alarm study has blocks 1 and 2, got {block!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise ConfigError(f"the study's rate must be a positive number, got {rate!r}")
    base = ls.preset(1, size)
    seeds = BLOCKS[block] if size == "full" else (block - 1,)
    if block == 2:
        return [replace(base, treatments=("none",), lrs=(rate,), seeds=seeds)]
    return [replace(base, treatments=("none", "clip", "qk-norm", "alarm-clip"), lrs=(rate,), seeds=seeds),
            replace(base, treatments=("none",), lrs=(rate / 2,), seeds=seeds)]


def run_pilot(cfg: ls.LrConfig, out: Path, jobs: int = 1, progress: bool = True) -> dict[str, Any]:
    """Train the pilot, and where its rates qualify none, once, the rate the rule adds on the same seeds; per rate
    arm A's break share, and the rate the rule chooses, kept in ``out/PILOT_FILE`` once every run has finished."""
    from attnscale.analysis import alarm_judging as aj
    from attnscale.files import atomic_write_json

    corpus = cfg.corpus_spec.load()

    def train(c):
        specs = ls.block_specs(c, corpus.vocab_size, prefix="pilot", group=PILOT_GROUP)
        got = ls.rows(execute(specs, c.corpus_spec, Path(out), jobs=jobs, progress=progress, corpus=corpus,
                              keep_order=True))
        return [{**r, "arm": "A"} for r in got], len(got) == len(specs)

    got, whole = train(cfg)
    choice = aj.choose_rate(aj.pilot_shares(got))
    if whole and choice["add"] is not None:
        more, whole = train(replace(cfg, lrs=(choice["add"],)))
        got += more
    shares = aj.pilot_shares(got)
    choice = aj.choose_rate(shares)
    if whole:
        atomic_write_json(Path(out) / PILOT_FILE, {"rate": choice["rate"], "add": choice["add"], "runs": len(got),
                                                   "d_model": cfg.d_model, **({"fallback": True} if choice.get(
                                                       "fallback") else {})})
    return {"pilot": True, "shares": shares, "choice": choice, "rows": got}


def read_pilot(folder: Path, size: str | None = "full") -> float:
    """The rate the finished pilot in ``folder`` chose; a one-line ConfigError for a missing, torn or foreign file, a
    pilot that chose none, or one of the other ``size`` (None: either)."""
    path = Path(folder) / PILOT_FILE
    again = f"run `attnscale alarm-study --pilot --out {folder}` first"
    if not path.is_file():
        raise ConfigError(f"no finished alarm pilot in {folder}: {again}")
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read as the pilot's JSON ({e}): {again}") from None
    rate = kept.get("rate") if isinstance(kept, dict) else None
    if rate is None and isinstance(kept, dict) and kept.get("add") is not None:
        raise ConfigError(f"the pilot in {folder} chose no rate; the rule adds {kept['add']:g} on its seeds first")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise ConfigError(f"{path} holds no rate the pilot could choose ({rate!r}): {again}")
    want = pilot_config(size or "full")
    if size is None and kept.get("d_model") in {pilot_config(z).d_model for z in ls.SIZES}:
        return float(rate)  # publishing reads a pilot of either size: its runs say which
    if kept.get("d_model") != want.d_model:
        raise ConfigError(f"the pilot in {folder} trained d_model {kept.get('d_model')!r}, not {want.d_model}: "
                          "run the study as its pilot was run (with --quick or without)")
    return float(rate)


def arm_rows(got: list[dict[str, Any]], rate: float) -> list[dict[str, Any]]:
    """The lr study's rows as the alarm study's arms; C's row where A's alarm never fired is A's run."""
    name = {"none": "A", "clip": "B", "alarm-clip": "C", "qk-norm": "E"}
    out = []
    for r in ls.with_alarm_rows(got):
        arm = "F" if r["treatment"] == "none" and math.isclose(r["lr"], rate / 2, rel_tol=1e-9) else name[r["treatment"]]
        if arm == "C" and r.get("same_as") and not math.isclose(r["lr"], rate, rel_tol=1e-9):
            continue  # the half-rate run's own alarm-clip twin is no arm of the study
        out.append({**r, "arm": arm})
    return out


def run_block(block: int, rate: float, out: Path, size: str = "full", jobs: int = 1,
              progress: bool = True) -> list[dict[str, Any]]:
    """Train what is missing of the block in ``out``, seed by seed (every arm of a seed, then the next), then C
    where A's alarm fired; the study's rows."""
    cfgs = block_config(block, rate, size)
    corpus = cfgs[0].corpus_spec.load()
    specs = [s for cfg in cfgs for s in ls.block_specs(cfg, corpus.vocab_size, prefix="alarm", group=GROUP)]
    specs.sort(key=lambda s: ls.parse_run_id(s.run_id)["seed"])  # stable: within a seed, the arms in order

    def train(these):
        return ls.rows(execute(these, cfgs[0].corpus_spec, Path(out), jobs=jobs, progress=progress, corpus=corpus,
                               keep_order=True)) if these else []

    first = train(specs)
    return arm_rows(first + train(ls.alarm_specs(cfgs[0], corpus.vocab_size, first, prefix="alarm", group=GROUP)), rate)


SERIES_KEYS = (*ls.SERIES_KEYS, "arm", "pilot")


def block(got: list[dict[str, Any]], pilot: list[dict[str, Any]], rate: float, command: str | None = None) -> dict[str, Any]:
    """The JSON block "alarm": the pilot's shares and choice, then ``alarm_judging.judge`` of the study's rows,
    interim unless arm A has every seed of both blocks and the other arms every seed of block 1."""
    from attnscale.analysis import alarm_judging as aj

    shares = aj.pilot_shares(pilot)
    seeds = {a: sorted({r["seed"] for r in got if r["arm"] == a}) for a in "ABCEF"}
    whole = seeds["A"] == sorted(BLOCKS[1] + BLOCKS[2]) and all(seeds[a] == list(BLOCKS[1]) for a in "BCEF")
    return {"command": command, "rate": rate, "interim": not whole, "seeds": seeds,
            "pilot": {"shares": {f"{lr:g}": s for lr, s in shares.items()}, "choice": aj.choose_rate(shares)},
            **aj.judge(got)}


def _pilot_rows(folder: Path) -> list[dict[str, Any]]:
    return [{**r, "arm": "A", "pilot": True} for r in ls.read_rows([folder], PILOT_GROUP)]


def publish(folders, pilot_dir: Path, json_out: Path | None, series: Path | None,
            command: str | None = None) -> dict[str, Any]:
    """The block from the finished runs in ``folders`` and the pilot in ``pilot_dir``, into the studies' JSON (key
    "alarm") and the series (the pilot's runs with them, marked); both checked before anything is written."""
    from attnscale.experiments import publish as pub

    pub.check_targets(json_out, series, "alarm-study")
    rate = read_pilot(pilot_dir, size=None)
    got = arm_rows(ls.read_rows(folders, GROUP), rate)
    if not got:
        raise ConfigError(f"no finished alarm-study runs in {', '.join(map(str, folders))}")
    pilot = _pilot_rows(pilot_dir)
    out = block(got, pilot, rate, command)
    trained = [r for r in got if not r.get("same_as")]
    pub.publish(json_out, "alarm", out, series, "alarm", [{k: r.get(k) for k in SERIES_KEYS} for r in pilot + trained],
                {"rate": rate, "floor": ls.act_study.FLOOR, "learned_level": ls.act_study.LEARNED_LEVEL})
    return {"publish": True, **out}


def block_from_series(data: dict[str, Any], command: str | None = None) -> dict[str, Any]:
    """The "alarm" block again from a series file's contents alone (each outcome judged again from its losses)."""
    runs = [{**r, "outcome": ls.outcome_of(r)} for r in data["runs"]]
    pilot = [r for r in runs if r.get("pilot")]
    study = arm_rows([{k: v for k, v in r.items() if k != "arm"} for r in runs if not r.get("pilot")], data["rate"])
    return block(study, pilot, data["rate"], command)
