"""The end-state run's design: its runs, its budget, and the command that starts it."""

import pytest

from attnscale.cli import main
from attnscale.errors import ConfigError
from attnscale.experiments import end_state
from attnscale.lm.train import lr_at


def test_the_runs_are_the_course_pair_on_two_seeds_at_both_widths_and_the_floor():
    specs = end_state.specs(end_state.EndStateConfig(), 104)
    assert [s.run_id for s in specs] == ["d1024-none-s0", "d1024-inv_sqrt_d-s0", "d1024-none-s1", "d1024-inv_sqrt_d-s1",
                                         "d128-none-s0", "d128-inv_sqrt_d-s0", "d128-none-s1", "d128-inv_sqrt_d-s1",
                                         "d128-uniform-s0"]
    assert {s.group for s in specs} == {"end-state"} and [s.train.seed for s in specs][:4] == [0, 0, 1, 1]
    m, t = specs[0].model, specs[0].train
    assert (m.norm, m.init, m.d_model, m.n_layers, m.context, m.n_heads) == ("post", "torch", 64, 2, 64, 1)
    assert (t.batch, t.lr, t.beta2, t.weight_decay, t.clip, t.warmup, t.steps) == (16, 3e-3, 0.99, 0.1, 1.0, 40, 7200)
    assert (t.record_every, t.eval_every, t.dtype, t.schedule) == (200, 1200, "fp32", "wsd")
    # held at 3e-3 to step 5,760 (80%), then a straight line to 3e-4
    assert lr_at(5759, t) == 3e-3 and lr_at(7200, t) == pytest.approx(3e-4)


def test_a_width_or_seed_given_twice_is_refused():
    with pytest.raises(ConfigError, match="narrow_seeds must be a non-empty list without repeats"):
        end_state.EndStateConfig(narrow_seeds=(0, 0))
    with pytest.raises(ConfigError, match="the wide and narrow widths must differ"):
        end_state.EndStateConfig(wide=128)


def test_the_command_refuses_to_mix_it_with_a_preset(tmp_path, capsys):
    assert main(["reproduce", "--end-state", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--end-state is its own run; drop --quick and --full" in err


def test_the_command_trains_in_the_dtype_and_where_it_is_told_and_refuses_a_seed(tmp_path, capsys, monkeypatch):
    """--dtype and --executor reach every run; --seed is refused, the seeds being the rule's (nothing trains)."""
    seen = {}

    def execute(specs, corpus_spec, out, **kwargs):
        seen.update(specs=specs, **kwargs)
        raise KeyboardInterrupt  # stop before anything trains: main's one line for an interrupted run

    monkeypatch.setattr(end_state, "execute", execute)
    args = ["reproduce", "--end-state", "--out", str(tmp_path)]
    assert main([*args, "--dtype", "fp32", "--executor", "ray", "--ray-address", "h:1", "-j", "3"]) == 130
    assert {s.train.dtype for s in seen["specs"]} == {"fp32"} and len(seen["specs"]) == 9
    assert (seen["executor"], seen["ray_address"], seen["jobs"]) == ("ray", "h:1", 3)
    capsys.readouterr()
    assert main([*args, "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert err == ("attnscale: error: --seed has no effect with --end-state, whose seeds are fixed by its rule "
                   "(docs/end-state.md); leave it out\n")
