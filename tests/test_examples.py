"""The examples run at smoke size and write what they say they write."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnscale.watch.logs.line import read_log
from watch_readers import tensorboard_scalars

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """Run an example's main(argv) in this process (a subprocess would spend most of a smoke run
    importing torch again), in tmp_path, offline; return what it printed."""
    monkeypatch.chdir(tmp_path)
    for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(EXAMPLES))

    def _run(script: str, *args: str) -> str:
        spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), EXAMPLES / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main(list(args)) == 0
        return capsys.readouterr().out

    return _run


# `python examples/X.py` as a newcomer runs it after `make reproduce`, whose set-up leaves out the extra
# attnscale[watch]: its modules are made unimportable first (an entry of None in sys.modules), then the script runs
# as a script (its folder first on the path, __name__ "__main__")
AS_A_SCRIPT = ("import os, runpy, sys\n"
               "for name in sys.argv[1].split(','): sys.modules[name] = None\n"
               "sys.argv = sys.argv[2:]; sys.path[0] = os.path.dirname(sys.argv[0])\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')")
CORE_LACKS = "tensorboard,wandb"  # the extra attnscale[watch], less what the core set-up also installs


def newcomer(cwd, script, *args, lacking=CORE_LACKS):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", AS_A_SCRIPT, lacking, str(EXAMPLES / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


TINY = ("--steps", "4", "--every", "2", "--batch", "4", "--context", "16")


@pytest.mark.parametrize("script, extra", [("plain_loop.py", ()),
                                           pytest.param("hf_trainer.py", ("--hidden", "32"), marks=pytest.mark.hf),
                                           ("lightning_trainer.py", ())])
def test_each_readme_example_runs_after_the_core_set_up_and_writes_its_log_without_tensorboard(tmp_path, script, extra):
    """Without the watch extra an example said ``ConfigError: TensorBoardSink needs tensorboard`` and left an empty
    log; now it says in one line what the extra adds and writes its JSONL, in watch-out/ by default."""
    if script != "plain_loop.py":
        pytest.importorskip("transformers" if script == "hf_trainer.py" else "lightning")
    done = newcomer(tmp_path, script, *TINY, *extra)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    folder = tmp_path / "watch-out" / script.split("_")[0]  # plain, hf, lightning
    assert [r.step for r in read_log(folder / "watch.jsonl")] == [0, 2, 4]
    said = [line for line in done.stdout.splitlines() if "TensorBoard is not installed" in line]
    assert len(said) == 1 and "pip install -e '.[watch]' adds TensorBoard event files" in said[0]
    assert not any(p.name.startswith("events.out.tfevents") for p in folder.rglob("*"))


def test_the_lightning_example_without_lightning_says_so_in_one_line(tmp_path):
    done = newcomer(tmp_path, "lightning_trainer.py", *TINY, lacking=f"{CORE_LACKS},lightning")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "needs Lightning, which is not installed: pip install -e '.[watch]'" in done.stderr


def test_the_core_set_up_installs_lightning_and_the_examples_output_is_ignored_by_git():
    root = EXAMPLES.parent
    core = next(line for line in (root / "Makefile").read_text().splitlines() if "pip install -q -e '.[report" in line)
    assert "lightning" in core.split("'")[1]
    assert "/watch-out/" in (root / ".gitignore").read_text().splitlines()


def test_plain_loop_example_logs_every_probe_to_jsonl_and_tensorboard(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    out = run("plain_loop.py", "--steps", "6", "--every", "3", "--batch", "4", "--context", "16", "--out", "o")
    records = read_log(tmp_path / "o" / "watch.jsonl")
    assert [r.step for r in records] == [0, 3, 6] and "step 6: loss" in out
    tb = tensorboard_scalars(tmp_path / "o" / "tb")
    assert set(tb["attn/layer_1/head_3/effective_words"]) == {0, 3, 6}


def test_plain_loop_example_stops_an_unscaled_model_at_its_first_probe(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    out = run("plain_loop.py", "--steps", "20", "--every", "2", "--batch", "4", "--context", "16",
              "--scale", "none", "--width", "1024", "--init", "unit", "--stop", "--out", "o")
    assert "stopped at step 2 by an alert" in out
    assert read_log(tmp_path / "o" / "watch.jsonl")[-1].alerts


@pytest.mark.hf
def test_hf_trainer_example_runs_and_stops_when_unscaled(tmp_path, run):
    pytest.importorskip("transformers")
    out = run("hf_trainer.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--hidden", "32",
              "--out", "o")
    assert "trained 4 steps" in out and [r.step for r in read_log(tmp_path / "o" / "watch.jsonl")] == [0, 2, 4]
    tb = tensorboard_scalars(tmp_path / "o" / "runs")
    assert set(tb["train/attn/layer_0/head_0/max_score"]) == {0, 2, 4} and set(tb["train/loss"]) == {2, 4}
    out = run("hf_trainer.py", "--steps", "8", "--every", "2", "--batch", "4", "--context", "16", "--hidden", "32",
              "--unscaled", "--init-std", "0.5", "--stop", "--out", "u")
    assert "trained 2 steps" in out


def test_lightning_example_logs_to_its_loggers_and_stops_when_unscaled(tmp_path, run):
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    out = run("lightning_trainer.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--out", "o")
    assert "trained 4 steps" in out and [r.step for r in read_log(tmp_path / "o" / "watch.jsonl")] == [0, 2, 4]
    assert set(tensorboard_scalars(tmp_path / "o" / "tb")["attn/layer_1/head_3/max_score"]) == {0, 2, 4}
    assert "attn/layer_0/head_0/effective_words" in (tmp_path / "o" / "csv" / "metrics.csv").read_text().splitlines()[0]
    out = run("lightning_trainer.py", "--steps", "8", "--every", "2", "--batch", "4", "--context", "16",
              "--scale", "none", "--width", "1024", "--init", "unit", "--stop", "--out", "u")
    assert "trained 2 steps" in out


def test_plain_loop_example_clips_an_unscaled_model(tmp_path, run):
    pytest.importorskip("tensorboard")  # the extra attnscale[watch]
    run("plain_loop.py", "--steps", "4", "--every", "2", "--batch", "4", "--context", "16", "--scale", "none",
        "--width", "1024", "--init", "unit", "--qk-clip", "100", "--out", "o")
    records = read_log(tmp_path / "o" / "watch.jsonl")
    assert records[-1].qk_clip["tau"] == 100 and min(min(layer) for layer in records[-1].qk_clip["gamma"]) < 1
    assert records[-1].summary["attn/max_score"] < records[1].qk_clip["s_max"][0][0] * 2  # held near tau, not free


def _study():
    """The study loaded as running it loads it: its folder first on the path, for ``tiny_llama`` beside it."""
    spec = importlib.util.spec_from_file_location("qk_clip_study", EXAMPLES / "qk_clip_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


def test_qk_clip_study_summary_is_mean_se_and_a_t_interval():
    pytest.importorskip("transformers")
    import statistics

    study = _study()
    runs = [{"way": "scaled", "seed": s, "perplexity": p, "first_alert_step": None, "max_score": [1.0, m]}
            for s, (p, m) in enumerate([(10.0, 3.0), (12.0, 4.0), (11.0, 5.0)])]
    s = study.summarize(runs)["scaled"]
    se = statistics.stdev([10.0, 12.0, 11.0]) / 3 ** 0.5
    assert s["perplexity"] == pytest.approx(11.0) and s["se"] == pytest.approx(se)
    assert s["ci95"] == pytest.approx(4.302653 * se)  # t(0.975, 2 degrees of freedom), from the printed tables
    assert s["final_max_score"] == [3.0, 4.0, 5.0]
    assert f"| scaled | 3 | 11.000 | {se:.3f} | ± {4.302653 * se:.3f} | none, none, none | 3.0, 4.0, 5.0 |" in study.table(
        {"scaled": s}, "title")


def test_qk_clip_study_compares_each_way_with_the_scaled_one_paired_by_seed_with_holm():
    pytest.importorskip("transformers")
    import math
    import statistics

    study = _study()
    ppl = {"scaled": [10.0, 11.0, 12.0], "a": [9.0, 9.9, 10.95], "b": [10.1, 11.2, 11.9], "c": [12.0, 11.0, 14.0]}
    runs = [{"way": w, "seed": s, "perplexity": p} for w, values in ppl.items() for s, p in enumerate(values)]
    got = study.versus(runs)
    assert list(got) == ["a", "b", "c"]
    # by hand: a − scaled = −1, −1.1, −1.05 (mean −1.05, SD 0.05); t with 2 degrees of freedom, two-sided p from its
    # closed form at df 2, F(t) = 1/2 + t / (2 sqrt(2 + t²)); 4.302653 is t(0.975, 2) from the printed tables
    def by_hand(d):
        mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(3)
        t = mean / se
        return mean, se, 2 * (1 - (0.5 + abs(t) / (2 * math.sqrt(2 + t * t))))
    hand = {w: by_hand([x - y for x, y in zip(ppl[w], ppl["scaled"])]) for w in ("a", "b", "c")}
    for w, (mean, se, p) in hand.items():
        assert got[w]["diff"] == pytest.approx(mean) and got[w]["se"] == pytest.approx(se)
        assert got[w]["p"] == pytest.approx(p, rel=1e-6)
        assert got[w]["interval"] == pytest.approx((mean - 4.302653 * se, mean + 4.302653 * se), rel=1e-5)
    order = sorted(hand, key=lambda w: hand[w][2])  # Holm: the k-th smallest p times (3 − k), running max
    running = 0.0
    for k, w in enumerate(order):
        running = max(running, min(1.0, (3 - k) * hand[w][2]))
        assert got[w]["p_holm"] == pytest.approx(running, rel=1e-6)
    assert hand["a"][2] * 3 < 0.05 and got["a"]["reading"] == "lower"  # −1.05 ± 0.03: lower even after Holm
    assert got["b"]["reading"] == got["c"]["reading"] == "inconclusive"
    text = study.versus_table(got)
    assert f"| a | 3 | -1.050 | [{-1.05 - 4.302653 * hand['a'][1]:+.3f}, {-1.05 + 4.302653 * hand['a'][1]:+.3f}] |" in text


@pytest.mark.hf
def test_qk_clip_study_writes_its_run_folder(tmp_path, run):
    pytest.importorskip("transformers")
    out = run("qk_clip_study.py", "--seeds", "1", "--steps", "4", "--every", "2", "--batch", "2", "--context", "16",
              "--hidden", "32", "--layers", "2", "--eval-windows", "2", "--taus", "10", "100", "--out", "runs/q")
    folder = tmp_path / "runs" / "q"
    results = json.loads((folder / "results.json").read_text())
    assert [r["way"] for r in results["runs"]] == ["scaled", "unscaled", "unscaled+qk-clip τ=10", "unscaled+qk-clip τ=100"]
    assert all(r["perplexity"] > 1 and r["steps"] == [0, 2, 4] for r in results["runs"])
    for r in results["runs"]:  # every layer's numbers at every probe, read back from the run's own watch log
        log = folder / _study().folder_of(r["way"]) / "seed-0" / "watch.jsonl"
        records = read_log(log)
        assert r["by_layer"]["max_score"] == [[max(heads) for heads in rec.grid("max_score")] for rec in records]
        words = [[sum(heads) / len(heads) for heads in rec.grid("effective_words")] for rec in records]
        assert [w for probe in r["by_layer"]["effective_words"] for w in probe] == pytest.approx(
            [w for probe in words for w in probe])
        assert len(r["by_layer"]["max_score"][0]) == 2  # two layers
        assert max(r["by_layer"]["max_score"][-1]) == pytest.approx(records[-1].summary["attn/max_score"])
    clipped = read_log(folder / "unscaled+qk-clip-tau-10" / "seed-0" / "watch.jsonl")
    assert clipped[-1].qk_clip["tau"] == 10 and not read_log(folder / "unscaled" / "seed-0" / "watch.jsonl")[-1].qk_clip
    assert (folder / "by-layer.png").stat().st_size > 10_000
    assert "| unscaled+qk-clip τ=100 | 1 |" in out and (folder / "summary.md").read_text() in out
    assert set(results["versus_scaled"]) == {"unscaled", "unscaled+qk-clip τ=10", "unscaled+qk-clip τ=100"}


def test_precision_effect_pairs_two_sweeps_by_seed_and_refuses_other_runs(tmp_path, run, capsys):
    import statistics

    from attnscale.cli import main as attnscale
    from attnscale.runs.record import TrainRun, find

    tiny = ["sweep", "--widths", "8", "--scale", "none", "inv_sqrt_d", "--seeds", "0", "1", "--quick", "--steps", "3",
            "--batch", "2", "--context", "16"]
    for dtype in ("bf16", "fp32"):
        assert attnscale([*tiny, "--dtype", dtype, "--out", str(tmp_path / dtype)]) == 0
    capsys.readouterr()
    out = run("precision_effect.py", str(tmp_path / "bf16"), str(tmp_path / "fp32"))
    assert "(trained in bf16)" in out and "(trained in fp32)" in out
    ppl = {(d, r.scale, r.seed): r.perplexity for d in ("bf16", "fp32") for r in map(TrainRun.load, find(tmp_path / d))}
    for scale in ("inv_sqrt_d", "none"):
        diffs = [ppl[("bf16", scale, s)] - ppl[("fp32", scale, s)] for s in (0, 1)]
        mean = statistics.fmean(diffs)
        # two seeds: t(0.975, 1) = 12.706205 from the printed tables, times the SE of the paired mean
        half = 12.706205 * statistics.stdev(diffs) / 2 ** 0.5
        line = next(x for x in out.splitlines() if x.startswith(f"| 8 | {scale} |"))
        assert f"| {mean:+.3f} (2 seeds) | [{mean - half:+.3f}, {mean + half:+.3f}] |" in line
    # a third sweep of other runs (more steps) is not the same runs in another precision: refused by name
    assert attnscale([*tiny[:-6], "--steps", "4", "--batch", "2", "--context", "16", "--out", str(tmp_path / "other")]) == 0
    with pytest.raises(SystemExit):
        run("precision_effect.py", str(tmp_path / "bf16"), str(tmp_path / "other"))
    assert "differs in train.steps, not only in its precision" in capsys.readouterr().err
    # bf16 on a bf16 copy of the weights against bf16 under autocast: the same runs, paired
    assert attnscale([*tiny, "--dtype", "bf16", "--weights", "bf16", "--out", str(tmp_path / "bf16-weights")]) == 0
    capsys.readouterr()
    out = run("precision_effect.py", str(tmp_path / "bf16-weights"), str(tmp_path / "bf16"))
    assert "(trained in bf16 on bf16 weights)" in out and "(trained in bf16)" in out
    assert sum(line.startswith("| 8 | ") and "(2 seeds)" in line for line in out.splitlines()) == 2
