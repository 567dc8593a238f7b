"""benchmarks/qk_norm_cost.py at smoke size: every variant runs under both flush settings and every ratio is
printed with its interval; the F.rms_norm and hand-backward variants compute QKNorm's numbers (values and
gradients), so the ratios compare the same arithmetic, and QKNorm is itself again after each."""

import re

import pytest
import torch

from attnscale.core.scales import QKNorm, get_scale
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("qk_norm_cost.py")


def _prepared(scheme, q, k):
    qn, kn = scheme.prepare(q, k)
    up = torch.randn(qn.shape, generator=torch.Generator().manual_seed(2))
    return [qn, kn, *torch.autograd.grad((qn * up).sum() + (kn * up).sum(), (q, k, scheme.q_gain))]


@pytest.mark.parametrize("variant", ["F.rms_norm", "hand"])
def test_each_variant_is_qk_norms_arithmetic_and_qk_norm_is_put_back(bench, variant):
    scheme = get_scale("qk_norm", 8)
    with torch.no_grad():
        scheme.q_gain.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(2, 3, 4, 8, generator=gen)
    q, k = base.transpose(1, 2).requires_grad_(), torch.randn(2, 4, 3, 8, generator=gen).requires_grad_()
    own = QKNorm.__dict__["prepare"]
    want = _prepared(scheme, q, k)
    with bench.variant_code(variant):
        assert QKNorm.prepare is not own
        got = _prepared(scheme, q, k)
    assert QKNorm.__dict__["prepare"] is own
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    with bench.variant_code("ops"):
        assert QKNorm.prepare is own


def test_smoke_run_prints_every_ratio_under_both_flush_settings(bench, capsys):
    assert bench.main(["--rounds", "2", "--steps", "6", "--width", "16", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    for setting in ("flushed to zero", "kept"):
        assert re.search(rf"^subnormals {setting}: off median [\d.]+ ms, ops median [\d.]+ ms, "
                         rf"F.rms_norm median [\d.]+ ms, hand median [\d.]+ ms$", out, re.M)
    for ratio in ("ops/off", "F.rms_norm/off", "hand/off", "F.rms_norm/ops", "hand/ops"):
        assert len(re.findall(rf"^  {ratio} [\d.]+ \[-?[\d.]+, [\d.]+\]$", out, re.M)) == 2

