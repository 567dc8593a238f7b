"""benchmarks/step_kernels.py at a tiny size: each row's ratio from its own times, the shapes and the
parameter count from the model's shape by hand, and its softmax errors against a float64 gradient
written out here."""

from __future__ import annotations

import re

import pytest
import torch

from benchmark_scripts import load_benchmark, run_bench

ROW = re.compile(r"^\s+1 (.{13}) (\S+)\s+(.{20}) +([0-9.]+) \| (.{22}) +([0-9.]+) +([0-9.]+)x$", re.M)
SPREAD = re.compile(r"^scores of spread (\S+): .* error (\S+) \(fp32 softmax\), (\S+) \(bf16 softmax, (\S+)x\); "
                    r"forwards the same bits$", re.M)


def test_step_kernels_times_each_kernel_beside_its_alternative():
    B, T, H, C, V = 2, 8, 2, 8, 11
    out = run_bench("step_kernels.py", "--d-model", str(C), "--heads", str(H), "--batch", str(B), "--context", str(T),
                    "--vocab", str(V), "--rounds", "2", "--threads", "1")
    rows = ROW.findall(out)
    assert [r[0].strip() for r in rows] == ["GELU", "LayerNorm", "softmax, @ v", "clip, copy"], out
    block = 2 * C + 4 * C * C + (C * 4 * C + 4 * C) + (4 * C * C + C) + 2 * C  # ln1, attn (no biases), mlp, ln2
    params = V * C + T * C + 2 * block + 2 * C + C * V  # embeddings, blocks, ln_f, untied read-out
    assert [r[1] for r in rows] == [f"{B}x{T}x{4 * C}", f"{B}x{T}x{C}", f"{B}x{H}x{T}x{T}", str(params)]
    for *_, a, _, b, ratio in rows:
        a, b = float(a), float(b)
        # times print to 0.05 us and the ratio to 0.005
        assert float(ratio) == pytest.approx(b / a, abs=(b / a) * (0.05 / a + 0.05 / b) + 0.005)
    spreads = SPREAD.findall(out)
    assert [float(s[0]) for s in spreads] == [1.0, 5.0, 30.0]
    for _, fp32, bf16, ratio in spreads:
        assert 0 < float(fp32) < 0.05 and 0 < float(bf16) < 0.05
        assert float(ratio) == pytest.approx(float(bf16) / float(fp32), abs=0.01)


def _scores_gradient(s, v, g):
    """d loss / d scores for z = softmax(s + causal mask) @ v with dL/dz = g, by hand in float64:
    dP = g vᵀ, ds = P ⊙ (dP − Σ_k dP ⊙ P)."""
    s, v, g = s.double(), v.double(), g.double()
    T = s.shape[-1]
    p = torch.softmax(s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    dp = g @ v.transpose(-1, -2)
    return p * (dp - (dp * p).sum(-1, keepdim=True))


@pytest.mark.parametrize("spread", [1.0, 30.0])
def test_the_softmax_errors_are_against_the_gradient_by_hand(spread):
    bench = load_benchmark("step_kernels.py")
    s, v, g = bench.scores_for((2, 2, 16, 4), spread)
    want = _scores_gradient(s, v, g)
    errors = bench.softmax_errors(s, v, g)
    for upcast in (True, False):
        x = s.clone().requires_grad_()
        z = bench.attention_chain(upcast)(x, bench.causal_bias(16, torch.bfloat16), v)
        z.backward(g)
        mine = float((x.grad.double() - want).norm() / want.norm())
        assert errors["fp32" if upcast else "bf16"] == pytest.approx(mine, rel=1e-6, abs=1e-9)
    assert errors["same_forward"] is True
    assert errors["fp32"] > 0  # bf16 numbers: never the float64 gradient exactly
