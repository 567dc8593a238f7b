"""The tests mirror the package: the tests of ``src/attnscale/<room>/<module>.py`` are in
``tests/<room>/test_<module>.py``, or ``tests/<room>/test_<room>_<module>.py`` where the plain name would be taken
(every test folder is on sys.path, so a test file's name is unique across tests/). A module at the package's top
(errors, files, ...) may have its file in any folder. The modules tested only through their callers' files are
``THROUGH_CALLERS``, each with the file that reaches it and why it has none of its own; an entry goes as soon as
the module gets its file or is gone."""

from pathlib import Path

import attnscale

SRC = Path(attnscale.__file__).parent
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# module -> "the test file that reaches it: why it has no file of its own"
THROUGH_CALLERS = {
    "analysis/course_figures": "tests/report/test_course_judges.py: the figures the course's claims are judged by",
    "capture/adapter": "tests/capture/test_capture_calls.py: one capture among the routes tested side by side",
    "capture/call": "tests/capture/test_capture_calls.py: the call every capture hands over",
    "capture/hf": "tests/capture/test_capture_calls.py: one capture among the routes tested side by side",
    "capture/intercept": "tests/capture/test_capture_calls.py: what the intercepting captures share",
    "capture/own": "tests/capture/test_capture_calls.py: one capture among the routes tested side by side",
    "capture/route": "tests/capture/test_capture_calls.py: the choice among the captures",
    "capture/sdpa": "tests/capture/test_capture_calls.py: one capture among the routes tested side by side",
    "cli/studies": "tests/experiments/test_lr_study.py: lr-study's refusals and --publish (alarm-study's in test_alarm_study.py)",
    "cli/__main__": "tests/cli/test_cli_training.py: the entry point run in a subprocess",
    "errors": "tests/cli/test_cli_options.py: raised by every room, one line at the command line",
    "experiments/training_config": "tests/experiments/test_sweep.py: the fields every training config shares",
    "files": "tests/runs/test_runs.py: the writer under every record",
    "lm/precision": "tests/lm/test_train.py: the training step's mixed precision",
    "lm/step_measures": "tests/lm/test_train.py: measured on the training step's own forward",
    "report/blocks": "tests/report/test_render.py: plain types, read through the renderers",
    "report/setup_section": "tests/experiments/test_setup_study.py: built from the setup study's runs",
    "report/warn_plots": "tests/report/test_recipe_section.py: drawn beside the warning section's tables",
    "report/warn_section": "tests/experiments/test_warn_study.py: built from the divergence study's runs",
    "runs/record": "tests/runs/test_runs.py: the schema and the store, read and written together",
    "runs/runner": "tests/runs/test_sweep_runner.py: a sweep, resumed, killed and run in workers",
    "runs/store": "tests/runs/test_runs.py: the schema and the store, read and written together",
    "watch/clip/projections": "tests/watch/test_watch_qk_clip.py: the rows QK-Clip scales, checked by clipping",
}


def modules(src: Path = SRC) -> list[str]:
    """Every module of the package as ``room/module`` (``drawing`` at the top), ``__init__.py`` left out."""
    return sorted(p.relative_to(src).with_suffix("").as_posix() for p in src.rglob("*.py") if p.name != "__init__.py")


def own_file(module: str, tests: Path = TESTS) -> Path | None:
    """The test file named after ``module`` under ``tests``, by either rule, or None."""
    *folders, name = module.split("/")
    if not folders:
        return next(iter(sorted(tests.rglob(f"test_{name}.py"))), None)
    room = tests / folders[0]
    found = [p for p in (room / f"test_{name}.py", room / f"test_{folders[0]}_{name}.py") if p.is_file()]
    return found[0] if found else None


def test_the_rule_finds_either_name_in_the_rooms_folder_only(tmp_path):
    (tmp_path / "watch").mkdir()
    (tmp_path / "cli").mkdir()
    (tmp_path / "watch" / "test_watch_line.py").write_text("")
    (tmp_path / "cli" / "test_options.py").write_text("")
    (tmp_path / "cli" / "test_errors.py").write_text("")
    assert own_file("watch/logs/line", tmp_path) == tmp_path / "watch" / "test_watch_line.py"
    assert own_file("cli/options", tmp_path) == tmp_path / "cli" / "test_options.py"
    assert own_file("capture/options", tmp_path) is None  # another room's file of the same name is not its
    assert own_file("errors", tmp_path) == tmp_path / "cli" / "test_errors.py"  # a top module's, in any folder
    assert own_file("watch/logs/sinks", tmp_path) is None


def test_every_module_has_its_own_test_file_or_says_why_not():
    missing = [m for m in modules() if own_file(m) is None and m not in THROUGH_CALLERS]
    assert not missing, (f"no tests/<room>/test_<module>.py for {missing}: move its tests there, or add it to "
                         "THROUGH_CALLERS with the file that tests it and why")


def test_every_exception_is_a_module_without_a_file_and_names_an_existing_test_file():
    known = set(modules())
    for module, why in THROUGH_CALLERS.items():
        assert module in known, f"THROUGH_CALLERS names {module}, which src/attnscale no longer has: drop the entry"
        assert own_file(module) is None, f"{module} now has {own_file(module)}: drop its THROUGH_CALLERS entry"
        path, _, reason = why.partition(": ")
        assert path.startswith("tests/") and (ROOT / path).is_file(), f"{module}: {path} is not a test file"
        assert reason.strip(), f"{module}: say why it has no file of its own, after '{path}: '"


def test_test_file_names_are_unique_across_tests():
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
