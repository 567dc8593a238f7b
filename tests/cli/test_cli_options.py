"""The command line's vocabulary: a mistake is one line with exit 2 and, where something is close, a guess;
every option has its help; the defaults are the library's."""

import pytest

from attnscale.cli import main


@pytest.mark.parametrize(
    "args, needle",
    [
        (["spread", "--widths", "0"], "--widths"),
        (["spread", "--widths", "-3"], "--widths"),
        (["spread", "--widths", "2.5"], "--widths"),
        (["spread", "--pairs", "1"], "--pairs"),
        (["fresh", "--words", "0"], "--words"),
        (["fresh", "--scale", "bogus"], "--scale"),
        (["spread", "--frobnicate"], "--frobnicate"),
        (["fresh", "--init", "xavier"], "--init"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    """In process, through the entry point's own main (the subprocess path is test_cli_training's): exit 2 and
    one line, which also says nothing raised past main."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


def _commands():
    from attnscale.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_option_has_help(command, capsys):
    with pytest.raises(SystemExit, match="^0$") as done:  # SystemExit's message is its code
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for action in _commands()[command]._actions:
        if action.option_strings:
            assert action.help and action.help.strip(), f"{command} {action.option_strings} has no help"
            assert action.option_strings[-1] in text
        assert ".py" not in (action.help or ""), f"{command} {action.option_strings} names a file: {action.help}"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_required_options_look_required_in_every_synopsis(command):
    """What a command cannot run without stands outside the synopsis's [ ]: a required option bare, a required
    choice of several in ( | ) (act-study showed [--pilot | --study PILOT_DIR], one of which it needs)."""
    import re

    parser = _commands()[command]
    bare = " ".join(parser.format_usage().split())
    while re.search(r"\[[^\[\]]*\]", bare):  # the optional parts, innermost first
        bare = re.sub(r"\[[^\[\]]*\]", "", bare)
    needed = [a for a in parser._actions if a.option_strings and a.required]
    needed += [a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions]
    for action in needed:
        assert re.search(re.escape(action.option_strings[0]) + r"(?![\w-])", bare), (command, action.option_strings, bare)


def test_defaults_are_the_librarys():
    from attnscale.core.diagnostics import FROZEN_THRESHOLD
    from attnscale.experiments.fresh import FreshConfig
    from attnscale.experiments.spread import SpreadConfig

    cmds = _commands()
    defaults = {c: {a.dest: a.default for a in cmds[c]._actions} for c in ("spread", "fresh", "inspect")}
    assert tuple(defaults["spread"]["head_dims"]) == SpreadConfig().head_dims
    assert defaults["spread"]["pairs"] == SpreadConfig().pairs
    assert tuple(defaults["fresh"]["head_dims"]) == FreshConfig().head_dims
    assert defaults["fresh"]["threshold"] == defaults["inspect"]["threshold"] == FROZEN_THRESHOLD == 0.99
    assert defaults["spread"]["pairs"] == 20_000  # the README's default


@pytest.mark.parametrize("argv, expected", [
    (["reproduc"], "unknown command 'reproduc'"),
    (["spread", "--widht", "4"], "unrecognized arguments: --widht 4"),
    (["fresh", "--init", "unt"], "fresh: argument --init: invalid choice: 'unt'"),
])
def test_every_error_line_starts_the_same_way(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"attnscale: error: {expected}"), err


@pytest.mark.parametrize("argv, hint", [
    (["reproduc"], "did you mean 'reproduce'?"),
    (["inspec", "--model", "m"], "did you mean 'inspect'?"),
    (["spread", "--widht", "4"], "did you mean --widths?"),  # the command's own options, not the top parser's
    (["sweep", "--quik", "--jobz", "2"], "did you mean --quick and --jobs?"),
    (["fresh", "--init", "unt"], "did you mean 'unit'?"),
])
def test_a_mistyped_command_or_option_gets_a_did_you_mean(argv, hint, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.rstrip().endswith(hint)


def test_nothing_close_gets_no_guess(capsys):
    assert main(["zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err
