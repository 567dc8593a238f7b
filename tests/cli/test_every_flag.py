"""Every option of every command is honoured or refused, and a bad value of each typed option is one line and
exit 2, before any work.

The walk reads the parser itself (``build_parser``): every subcommand and every option found there is tried,
so a command or option added later is covered without being listed here. The library calls the commands make
are replaced by a capture (``LIBRARY``; for the training commands ``runs.runner.execute``, where every training
run passes), so nothing measures or trains: an option is honoured when the call it reaches differs from the call
made without it, refused when the command ends in exit 2 with one line naming it. What cannot be derived from an
option's type (a value for a path, a required argument, a mode that changes which options apply) is in the tables
below; an option they miss fails with a message naming it and the table to fill."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import sys
from pathlib import Path

import pytest

from attnscale.cli import build_parser, main, sequence

# the library calls the commands make (module, name); training reaches runs.runner.execute, captured as well
LIBRARY = [("attnscale.reproduce", "run"), ("attnscale.reproduce", "end_state"),
           ("attnscale.experiments.spread", "run"), ("attnscale.experiments.fresh", "run"),
           ("attnscale.headcheck.check", "run"), ("attnscale.report", "build"),
           ("attnscale.report.watch_page", "build"), ("attnscale.report.watch_page", "follow"),
           ("attnscale.experiments.recipe_study", "run_study"), ("attnscale.experiments.warn_reread", "reread_files"),
           ("attnscale.experiments.lr_study", "publish"), ("attnscale.experiments.alarm_study", "publish")]
EXECUTE = ("attnscale.runs.runner", "execute")

# options that change how the result is printed, not what runs, with the test that checks them
PRINTING = {"json": "tests/cli/test_measuring.py and tests/cli/test_cli_training.py read the JSON printed",
            "series": "tests/experiments/test_act_study.py writes the series file after the study and reads it back",
            "figure": "tests/experiments/test_lr_study.py draws the figure after publishing and refuses bad paths first"}

# the modes of a command: option lines that change which other options apply (each walked on its own too)
MODES = {"reproduce": [["--end-state"]], "warn-study": [["--pilot"], ["--study", "{pilot}"], ["--reread", "{series}"]],
         "watch-report": [["--follow", "1"]], "act-study": [["--pilot"], ["--study", "{act_pilot}"]],
         "lr-study": [["--block", "1", "--out", "{tmp}/out"], ["--muon-pilot", "--out", "{tmp}/out"],
                      ["--publish", "{runs}", "--json-out", "{tmp}/studies.json"]],
         "alarm-study": [["--pilot", "--out", "{tmp}/out"],
                         ["--block", "1", "--pilot-dir", "{alarm_pilot}", "--out", "{tmp}/out"],
                         ["--publish", "{runs}", "--pilot-dir", "{alarm_pilot}", "--json-out", "{tmp}/studies.json"]]}
# commands that run in one of their modes only: never walked bare, and tried with the first mode where a test needs one
NEEDS_MODE = {"act-study", "lr-study", "alarm-study"}

# values for what a type does not say: required arguments and positionals by dest, then options by dest
REQUIRED = {"model": "{run}", "text": "to be or not to be", "runs_dir": "{runs}", "log": "{log}", "out": "{tmp}/out"}
VALUES = {"out": "{tmp}/elsewhere", "file": "{text_file}", "reuse": "{runs}", "study": "{pilot}",
          "corpus": "{corpus}", "model": "{run2}", "text": "that is the question", "ray_address": "127.0.0.1:6379",
          "steps": "301", "seeds": "101", "reread": "{series}", "published": "{published}",
          "series": "{tmp}/series.json.gz", "grid_from": "{runs}", "json_out": "{tmp}/other-studies.json",
          "pilot_dir": "{alarm_pilot2}", "figure": "{tmp}/lr.png"}  # steps past every preset's warm-up; a seed outside the warn study's
# a bad value of each typed option: by the name of its type, then (paths) by dest
BAD_BY_TYPE = {"positive_int": "0", "nonneg_int": "-1", "at_least_two": "1", "positive_float": "nan",
               "probability": "1.5", "scale_name": "bogus", "scale_or_all": "bogus", "device_name": "tpu9",
               "dtype_name": "fp8", "tokenizer_name": "bytes", "study_axis": "nope=1", "study_combination": "lr=1",
               "seconds": "-1"}
BAD_PATHS = {"out": "{tmp}/a-file/below", "file": "{tmp}/missing.txt", "reuse": "{tmp}/missing",
             "study": "{tmp}/missing", "reread": "{tmp}/missing.json.gz", "published": "{tmp}/missing.json",
             "series": "{tmp}/a-file/below.json.gz", "grid_from": "{tmp}/missing", "json_out": "{tmp}/a-file/below.json",
             "pilot_dir": "{tmp}/missing", "publish": "{tmp}/missing", "figure": "{tmp}/a-file/below.png"}
GOOD_BY_TYPE = {"positive_int": 3, "nonneg_int": 3, "at_least_two": 3, "positive_float": "0.0123",
                "probability": "0.5", "scale_name": "inv_d", "scale_or_all": "inv_d", "device_name": "cpu",
                "dtype_name": "bf16", "tokenizer_name": "char", "study_axis": "lr=0.001,0.002",
                "study_combination": "lr=0.001,weight_decay=0", "seconds": "7"}


class Captured(Exception):
    """Raised by a captured library call: what it was given, in plain values."""

    def __init__(self, where, args, kwargs):
        super().__init__(where)
        self.call = (where, _plain(args), _plain(kwargs))


def _plain(x, depth=0):
    """A comparable form of what a library call was given: dataclasses and containers as plain values, paths as
    text, a loaded corpus (an object made from the spec that is captured beside it) by its type."""
    if depth > 12:
        return "…"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, {f.name: _plain(getattr(x, f.name), depth + 1) for f in dataclasses.fields(x)})
    if isinstance(x, dict):
        return {str(k): _plain(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, depth + 1) for v in x]
    if isinstance(x, (str, int, float, bool, type(None), enum.Enum)):
        return x
    if isinstance(x, Path):
        return str(x)
    return type(x).__name__


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The files the values above name: a training run (two), a folder of records, a watch log, a pilot folder,
    a text file and a corpus file."""
    from run_folders import _cfg, _run_dir

    from attnscale.lm.data import load_corpus
    from attnscale.runs import record
    from attnscale.watch.logs.sinks import JsonlSink
    from watch_lines import record as watch_line

    tmp = tmp_path_factory.mktemp("flags")
    corpus = load_corpus("default")
    for name in ("run", "run2"):
        _run_dir(tmp / name, _cfg(vocab_size=corpus.vocab_size), corpus=corpus)
    (tmp / "runs" / "spread").mkdir(parents=True)
    record.write(tmp / "runs" / "spread", record.new("spread", {"pairs": 2}, []))
    sink = JsonlSink(tmp / "watch.jsonl")
    sink.write(watch_line(10))
    sink.close()
    (tmp / "pilot").mkdir()
    (tmp / "act-pilot").mkdir()  # a finished act-study pilot: the level its rule chose
    (tmp / "act-pilot" / "act-pilot.json").write_text('{"level": 10000.0, "runs": 8, "size": 64, "corpus": "default"}')
    for name, rate in (("alarm-pilot", 0.06), ("alarm-pilot2", 0.07)):  # finished alarm-study pilots: their rates
        (tmp / name).mkdir()
        (tmp / name / "alarm-pilot.json").write_text(f'{{"rate": {rate}, "add": null, "runs": 24, "d_model": 64}}')
    (tmp / "series.json.gz").write_bytes(b"")  # read by the captured re-read only
    (tmp / "published.json").write_text("{}")
    (tmp / "a-file").write_text("")
    (tmp / "text.txt").write_text("a text read from a file, not given on the line", encoding="utf-8")
    words = "the score scale in attention keeps the softmax from freezing as heads grow wide".split()
    (tmp / "corpus.txt").write_text(" ".join(words[i * 7 % len(words)] for i in range(30000)), encoding="utf-8")
    return {"tmp": str(tmp), "run": str(tmp / "run"), "run2": str(tmp / "run2"), "runs": str(tmp / "runs"),
            "log": str(tmp / "watch.jsonl"), "pilot": str(tmp / "pilot"), "text_file": str(tmp / "text.txt"),
            "corpus": str(tmp / "corpus.txt"), "act_pilot": str(tmp / "act-pilot"),
            "series": str(tmp / "series.json.gz"), "published": str(tmp / "published.json"),
            "alarm_pilot": str(tmp / "alarm-pilot"), "alarm_pilot2": str(tmp / "alarm-pilot2")}


@pytest.fixture
def capture(monkeypatch, places):
    """Every library call in ``LIBRARY``, and ``execute`` wherever a module holds it, raises ``Captured``; the
    commands run in a folder of their own (their default --out is relative)."""
    def stand_in(where):
        def call(*args, **kwargs):
            raise Captured(where, args, kwargs)
        return call

    monkeypatch.chdir(places["tmp"])
    execute = getattr(importlib.import_module(EXECUTE[0]), EXECUTE[1])
    for loaded in [m for n, m in list(sys.modules.items()) if n.startswith("attnscale.")]:
        if getattr(loaded, EXECUTE[1], None) is execute:  # a module that imported it before: its own name for it
            monkeypatch.setattr(loaded, EXECUTE[1], stand_in(f"{loaded.__name__}.{EXECUTE[1]}"))
    for module, name in LIBRARY:
        monkeypatch.setattr(importlib.import_module(module), name, stand_in(f"{module}.{name}"))
    built = []  # the config each Command built: a later library call (--family all's second) shows only there
    command_call = sequence.Command.__call__

    def recording(self, args):
        def config(given):
            cfg = self.config(given)
            built.append(_plain(cfg))
            return cfg
        return command_call(dataclasses.replace(self, config=config), args)

    monkeypatch.setattr(sequence.Command, "__call__", recording)
    return built


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(parser):
    """The options a user gives (help left out), each once."""
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _fill(text: str, places) -> str:
    return text.format(**places)


def _base(command: str, parser, places) -> list[str]:
    """The command with its required arguments: positionals, then required options and groups."""
    argv = [command]
    needed = [a for a in parser._actions if (not a.option_strings or a.required) and not isinstance(a, argparse._HelpAction)]
    mode_flags = {m[0] for m in MODES.get(command, [])}
    for group in parser._mutually_exclusive_groups:
        # a required group whose members are the command's modes is given by the mode each test adds
        if group.required and not any(set(a.option_strings) & mode_flags for a in group._group_actions):
            needed.append(group._group_actions[0])
    for action in needed:
        if action.dest not in REQUIRED:
            pytest.fail(f"{command}: no value for its required {action.option_strings or action.dest}; add one to "
                        "REQUIRED in tests/cli/test_every_flag.py")
        value = _fill(REQUIRED[action.dest], places)
        argv += [action.option_strings[0], value] if action.option_strings else [value]
    return argv


def _type_name(action) -> str | None:
    kind = action.type
    return None if kind is None else "path" if kind is Path else getattr(kind, "__name__", None)


def _good(action, places) -> list[str] | None:
    """A value other than the default for ``action``, as command-line words; None where none is known."""
    if action.nargs == 0:
        return []
    if action.dest in VALUES:
        words = [_fill(VALUES[action.dest], places)]
    elif action.choices:
        default = action.default if not isinstance(action.default, list) else action.default[0]
        words = [next(str(c) for c in reversed(action.choices) if c != default)]  # the last: often the newer way
    elif _type_name(action) in GOOD_BY_TYPE:
        value = GOOD_BY_TYPE[_type_name(action)]
        if isinstance(value, int) and isinstance(action.default, int) and not isinstance(action.default, bool):
            value = action.default + 1
        words = [str(value)]
    else:
        return None
    return words


def _refused_naming(argv, action, capsys) -> str | None:
    """None where ``main(argv)`` ends in exit 2 with one line naming ``action``; else what happened."""
    code = main(argv)
    err = capsys.readouterr().err
    if code != 2:
        return f"exit {code}"
    if err.count("\n") != 1 or not err.startswith("attnscale: error: ") or "Traceback" in err:
        return f"exit 2 but not one error line: {err!r}"
    named = any(o in err for o in action.option_strings) or action.dest.replace("_", "-") in err
    return None if named else f"exit 2, but the line does not name {action.option_strings[-1]}: {err.strip()}"


def _call(argv, capsys, built):
    """The config the command built and the library call ``argv`` reaches (``Captured.call``), or (exit code,
    stderr) where it ends before one."""
    built.clear()
    try:
        code = main(argv)
    except Captured as c:
        capsys.readouterr()
        return (*c.call, list(built))
    return code, capsys.readouterr().err


def _walk():
    cases = []
    for command, parser in sorted(_subparsers().items()):
        modes = ([] if command in NEEDS_MODE else [[]]) + MODES.get(command, [])
        mode_flags = {m[0] for m in modes if m}
        for mode in modes:
            for action in _options(parser):
                if not (set(action.option_strings) & mode_flags):
                    cases.append(pytest.param(command, tuple(mode), action.dest,
                                              id=f"{command}{' ' + mode[0] if mode else ''} {action.option_strings[-1]}"))
    return cases


def _action(command, dest):
    parser = _subparsers()[command]
    return parser, next(a for a in _options(parser) if a.dest == dest)


def _without_group_siblings(argv: list[str], parser, action) -> list[str]:
    """``argv`` without the other members of a mutually exclusive group ``action`` is in (with their values)."""
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            for other in group._group_actions:
                for flag in other.option_strings:
                    if flag in argv and other is not action:
                        i = argv.index(flag)
                        del argv[i:i + 2]
    return argv


@pytest.mark.parametrize("command, mode, dest", _walk())
def test_every_option_reaches_the_call_or_is_refused(command, mode, dest, places, capture, capsys):
    parser, action = _action(command, dest)
    flag = action.option_strings[-1]
    if dest in PRINTING:
        return  # how the result prints: PRINTING names the test that reads it
    mode = [_fill(w, places) for w in mode]
    base = _base(command, parser, places) + mode
    before = _call(base, capsys, capture)
    assert isinstance(before[0], str), f"{' '.join(base)} reaches no library call ({before}): add it to LIBRARY"
    words = _good(action, places)
    if words is None:
        pytest.fail(f"{command} {flag}: no value to try it with; add one to VALUES (by dest {dest!r}) or, for an "
                    "option that changes only the printing, to PRINTING, in tests/cli/test_every_flag.py")
    argv = _without_group_siblings(list(base), parser, action) + [flag, *words]
    after = _call(argv, capsys, capture)
    if isinstance(after[0], str):
        assert after != before, (f"{' '.join(argv)}: {flag} is accepted and dropped (the call is the same as "
                                 "without it); honour it, or refuse it in one line")
        return
    code, err = after
    assert code == 2 and err.count("\n") == 1 and err.startswith("attnscale: error: "), (argv, code, err)
    assert any(o in err for o in action.option_strings), f"{' '.join(argv)} is refused without naming {flag}: {err}"


def _typed():
    return [pytest.param(command, a.dest, id=f"{command} {a.option_strings[-1]}")
            for command, parser in sorted(_subparsers().items()) for a in _options(parser)
            if a.type is not None or a.choices]


@pytest.mark.parametrize("command, dest", _typed())
def test_a_bad_value_is_one_line_and_exit_2_before_any_work(command, dest, places, capture, capsys):
    parser, action = _action(command, dest)
    kind = _type_name(action)
    if action.choices:
        bad = "bogus"
    elif kind == "path":
        if dest not in BAD_PATHS:
            pytest.fail(f"{command} {action.option_strings[-1]}: no bad path to try; add one to BAD_PATHS")
        bad = _fill(BAD_PATHS[dest], places)
    elif kind in BAD_BY_TYPE:
        bad = BAD_BY_TYPE[kind]
    else:
        pytest.fail(f"{command} {action.option_strings[-1]}: no bad value for its type {kind!r}; add one to BAD_BY_TYPE")
    is_mode = bool(set(action.option_strings) & {m[0] for m in MODES.get(command, [])})
    mode = MODES[command][0] if command in NEEDS_MODE and not is_mode else []  # a mode flag is tried alone
    base = _base(command, parser, places) + [_fill(w, places) for w in mode]
    argv = _without_group_siblings(base, parser, action) + [action.option_strings[-1], bad]
    try:
        problem = _refused_naming(argv, action, capsys)
    except Captured as c:
        problem = f"accepted: it reached {c.call[0]}"
    assert problem is None, f"{' '.join(argv)}: {problem}"


def test_the_walk_covers_every_command_and_the_dropped_flags_it_was_written_for():
    ids = {p.id for p in _walk()}
    assert {c for c in _subparsers()} == {i.split(" ")[0] for i in ids}
    for case in ("reproduce --end-state --seed", "reproduce --end-state --dtype", "reproduce --end-state --executor",
                 "warn-study --study --steps", "warn-study --study --batch", "warn-study --study --dtype"):
        assert case in ids
