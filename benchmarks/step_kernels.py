"""The training step's work besides its matrix products, kernel by kernel, beside the alternatives tried.

``step_limit.py`` says how much of a step is not matrix products; this says what that rest is made of
and why it stays as it is. At its shape (batch 32, T 64, 4 heads, ``--d-model``), in bf16 (native where
the CPU has avx512_bf16 or AMX, emulated elsewhere: the features are printed first), forward and
backward of each kernel as the step runs it, beside an alternative, in one process, alternating,
medians of ``--rounds``:

- GELU on the MLP's hidden layer (B×T×4C): ATen's exact (erf) GELU against the same function through
  ``torch.compile`` (inductor), with ``--compile``; the tanh approximation is timed for scale only, as a
  different function (it would change the model);
- LayerNorm on the residual stream (B×T×C): in bf16 (the bf16 copy's residual stream) and in fp32
  (autocast's);
- the scores' softmax and the weights' product with v (B×H×T×T): the softmax in fp32 with a cast either
  side (training's path) against the softmax in bf16, whose forward gives the same bits; and the
  gradient of the scores against float64, at score spreads 1, 5 and 30 (an unscaled wide head's);
- the gradients clipped and the bf16 copy's handed to fp32 masters: in one flat tensor each (training's
  ``lm.precision.clip_`` and one copy) against per tensor (``clip_grad_norm_`` and ``_foreach_copy_``, what
  training did before).

Times: CPU time of the process at one thread, wall time at more, after ``keep_freed_memory`` (as
training runs).

    python benchmarks/step_kernels.py [--d-model 128] [--threads 1 2] [--rounds 50] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from step_limit import cpu_features
from vs_nanogpt import load_average

from attnscale.core.attention import build_mask
from attnscale.core.device import keep_freed_memory
from attnscale.lm.model import ModelConfig, TinyLM
from attnscale.lm.precision import clip_, flat_grads

BF16 = torch.bfloat16
SPREADS = (1.0, 5.0, 30.0)


def side_by_side(a: Callable[[], None], b: Callable[[], None], rounds: int, threads: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, called alternately ``rounds`` times each after 3 untimed calls."""
    now = time.process_time if threads == 1 else time.perf_counter
    for _ in range(3):
        a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, acc in ((a, times[0]), (b, times[1])):
            t = now()
            fn()
            acc.append(now() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def forward_backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], None]:
    """``fn(*inputs)`` and its backward from a fixed random gradient, as one call."""
    out = fn(*inputs)
    grad = torch.randn_like(out)
    return lambda: fn(*inputs).backward(grad)


def attention_chain(upcast: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """Masked scores -> softmax -> @ v; ``upcast``: the softmax in fp32 with a cast either side (training's
    path), else in the scores' own dtype."""
    def chain(s_BHTT, bias_TT, v_BHTD):
        masked = s_BHTT + bias_TT
        if upcast:
            return torch.softmax(masked.float(), dim=-1).to(v_BHTD.dtype) @ v_BHTD
        return torch.softmax(masked, dim=-1) @ v_BHTD
    return chain


def causal_bias(T_: int, dtype: torch.dtype) -> torch.Tensor:
    """0 where a query sees a key, -inf elsewhere (training's additive mask)."""
    visible = build_mask(T_, causal=True)[0, 0]
    return torch.zeros(T_, T_, dtype=dtype).masked_fill_(~visible, float("-inf"))


def scores_for(shape: tuple[int, int, int, int], spread: float, seed: int = 0):
    """bf16 scores of standard deviation ``spread``, values and an output gradient, for a (B, H, T, D) head."""
    B, H, T_, D = shape
    gen = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(*size, generator=gen) * k).to(BF16)
                 for size, k in (((B, H, T_, T_), spread), ((B, H, T_, D), 1.0), ((B, H, T_, D), 1.0)))


def softmax_errors(s_BHTT: torch.Tensor, v_BHTD: torch.Tensor, g_BHTD: torch.Tensor) -> dict[str, object]:
    """The relative error (Frobenius) of the gradient of the scores, the softmax in fp32 and in bf16, against
    the same chain in float64 from the same bf16 numbers; and whether the two bf16 forwards give the same bits."""
    T_ = s_BHTT.shape[-1]
    outs, grads = {}, {}
    for name, dtype, chain in (("fp32", BF16, attention_chain(upcast=True)), ("bf16", BF16, attention_chain(upcast=False)),
                               ("float64", torch.float64, attention_chain(upcast=False))):
        s = s_BHTT.detach().to(dtype, copy=True).requires_grad_()
        z = chain(s, causal_bias(T_, dtype), v_BHTD.to(dtype))
        z.backward(g_BHTD.to(dtype))
        outs[name], grads[name] = z.detach(), s.grad.double()
    ref = grads["float64"]
    err = {k: float((grads[k] - ref).norm() / ref.norm()) for k in ("fp32", "bf16")}
    return {**err, "same_forward": torch.equal(outs["fp32"], outs["bf16"])}


def clip_and_copy(d_model: int, vocab: int, context: int, heads: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(per tensor, flat): a bf16 copy's gradients copied into a model's, which are then clipped to norm 1."""
    cfg = ModelConfig(vocab_size=vocab, context=context, d_model=d_model, n_layers=2, n_heads=heads)
    per_tensor, copy_per_tensor = TinyLM(cfg), TinyLM(cfg).to(BF16)
    for model in (per_tensor, copy_per_tensor):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
    flat_model, flat_copy = TinyLM(cfg), TinyLM(cfg).to(BF16)
    flat, copy_flat = flat_grads(flat_model), flat_grads(flat_copy)
    flat.normal_(), copy_flat.normal_()
    masters, grads = [p.grad for p in per_tensor.parameters()], [p.grad for p in copy_per_tensor.parameters()]

    def tensors():
        torch._foreach_copy_(masters, grads)
        torch.nn.utils.clip_grad_norm_(per_tensor.parameters(), 1.0)

    def one():
        flat.copy_(copy_flat)
        clip_(flat, 1.0)
    return tensors, one


def comparisons(d: int, batch: int, context: int, heads: int, compiled: bool, vocab: int):
    """(kernel, shape, name a, a, name b, b) for each comparison: a as the step runs it, b the alternative."""
    hidden = torch.randn(batch, context, 4 * d, dtype=BF16, requires_grad=True)
    exact = forward_backward(F.gelu, hidden)
    yield "GELU", tuple(hidden.shape), "exact", exact, "tanh, not the model's", \
        forward_backward(lambda h: F.gelu(h, approximate="tanh"), hidden)
    if compiled:
        yield "GELU", tuple(hidden.shape), "exact", exact, "exact, compiled", forward_backward(torch.compile(F.gelu), hidden)
    norms = {}
    for dtype in (BF16, torch.float32):
        x = torch.randn(batch, context, d, dtype=dtype, requires_grad=True)
        w, b = torch.ones(d, dtype=dtype, requires_grad=True), torch.zeros(d, dtype=dtype, requires_grad=True)
        norms[dtype] = forward_backward(lambda x_, w=w, b=b: F.layer_norm(x_, (d,), w, b), x)
    yield "LayerNorm", (batch, context, d), "bf16", norms[BF16], "fp32", norms[torch.float32]
    s = torch.randn(batch, heads, context, context, dtype=BF16, requires_grad=True)
    v = torch.randn(batch, heads, context, max(1, d // heads), dtype=BF16, requires_grad=True)
    bias = causal_bias(context, BF16)
    yield "softmax, @ v", tuple(s.shape), "fp32 softmax", forward_backward(attention_chain(upcast=True), s, bias, v), \
        "bf16 softmax", forward_backward(attention_chain(upcast=False), s, bias, v)
    params = sum(p.numel() for p in TinyLM(ModelConfig(vocab_size=vocab, context=context, d_model=d, n_layers=2,
                                                       n_heads=heads)).parameters())
    tensors, flat = clip_and_copy(d, vocab, context, heads)
    yield "clip, copy", (params,), "flat", flat, "per tensor", tensors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=65, help="the read-out's size (Tiny Shakespeare's characters)")
    ap.add_argument("--compile", action="store_true", help="add GELU through torch.compile (inductor)")
    args = ap.parse_args()
    for name in ("d_model", "rounds", "batch", "context", "heads", "vocab"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.d_model % args.heads:
        ap.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    keep_freed_memory()
    print(f"torch {torch.__version__}; CPU features: {' '.join(cpu_features()) or 'none of the bf16 ones'}; "
          f"bf16, forward and backward, median of {args.rounds} alternating calls; load before: {load_average()}")
    print(f"{'threads':>7} {'kernel':<13} {'shape':<16} {'as the step runs it':<20} {'us':>9} | "
          f"{'alternative':<22} {'us':>9} {'alt / step':>10}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for kernel, shape, name_a, a, name_b, b in comparisons(args.d_model, args.batch, args.context, args.heads,
                                                              args.compile, args.vocab):
            ta, tb = side_by_side(a, b, args.rounds, threads)
            print(f"{threads:7d} {kernel:<13} {'x'.join(map(str, shape)):<16} {name_a:<20} {1e6 * ta:9.1f} | "
                  f"{name_b:<22} {1e6 * tb:9.1f} {tb / ta:9.2f}x", flush=True)
    shape = (args.batch, args.heads, args.context, args.d_model // args.heads)
    for spread in SPREADS:
        e = softmax_errors(*scores_for(shape, spread))
        print(f"scores of spread {spread:g}: gradient of the scores against float64, relative error "
              f"{e['fp32']:.2e} (fp32 softmax), {e['bf16']:.2e} (bf16 softmax, {e['bf16'] / e['fp32']:.2f}x); "
              f"forwards {'the same bits' if e['same_forward'] else 'differ'}")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
