"""headcheck.engine: the config it refuses, the per-layer means and frozen heads, and that it sits below the
adapters that feed it."""

import subprocess
import sys

import pytest

from attnscale.errors import ConfigError
from attnscale.headcheck.check import inspect_model
from attnscale.headcheck.engine import InspectConfig
from attnscale.headcheck.show import format_table
from inspect_models import ids, tiny_lm


def test_bad_config_raises():
    with pytest.raises(ConfigError, match="max-tokens"):
        InspectConfig("m", max_tokens=1)
    with pytest.raises(ConfigError, match="parameters"):
        InspectConfig("m", what_ifs=("qk_norm",))
    with pytest.raises(ConfigError, match="empty"):
        inspect_model(tiny_lm(), ["  "])


@pytest.mark.parametrize("scale", ["inv_sqrt_d", "none"])
def test_per_layer_means_and_frozen_heads(scale):
    """Per layer, the mean over heads of every number; a head is frozen when more than half its rows are."""
    # unit init at d = 256: unscaled, some heads have more than half their rows frozen and some fewer
    result = inspect_model(tiny_lm(head_dim=256, scale=scale), ids(), max_tokens=32)
    assert [m["layer"] for m in result.per_layer] == [0, 1]
    for layer in result.per_layer:
        mine = [r for r in result.rows if r["layer"] == layer["layer"]]
        for scheme in ("model", "none", "inv_d"):
            for key in ("spread", "max_score", "effective_words", "frozen_fraction", "push"):
                assert layer[scheme][key] == pytest.approx(sum(r[scheme][key] for r in mine) / 4)
    for scheme in ("model", "none", "inv_d"):
        want = [(r["layer"], r["head"]) for r in result.rows if r[scheme]["frozen_fraction"] > 0.5]
        assert [(h["layer"], h["head"]) for h in result.frozen_heads[scheme]] == want
    assert 0 < len(result.frozen_heads["none"]) < 8 and not result.frozen_heads["inv_d"]
    table = format_table(result)
    lines = table.splitlines()
    frozen_lines = lines[lines.index("frozen heads (more than 50% of their rows frozen)") + 1 : -1]
    if scale == "none":  # the model's own scale is the unscaled what-if
        assert result.frozen_heads["model"] == result.frozen_heads["none"]
        h = result.frozen_heads["model"][0]
        assert len(frozen_lines) == len(result.frozen_heads["model"])
        assert frozen_lines[0] == f"  layer {h['layer']}, head {h['head']}: {h['frozen_fraction']:.1%} of rows, max |score| {h['max_score']:.1f}"
    else:
        assert frozen_lines == ["  none under the model's scale"]
    assert lines[-1] == f"  what-ifs: unscaled {len(result.frozen_heads['none'])} of 8, 1/d 0 of 8"


def test_engine_imports_no_adapter_and_adapters_no_private_names():
    """The engine is below its adapters: it imports none of them, and they use only its public names."""
    import ast
    from pathlib import Path

    import attnscale.headcheck as pkg

    code = ("import sys, attnscale.headcheck.engine; "
            "assert not {'attnscale.headcheck.hf', 'attnscale.headcheck.native', 'attnscale.headcheck.check'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnscale"):
                assert not [a.name for a in node.names if a.name.startswith("_")], (path.name, node.module)
            if path.name == "engine.py" and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
                assert not any(n.startswith("attnscale.headcheck") for n in names), names
