"""Explicit vs fused attention on this CPU: forward and forward+backward, as ratios.

    python benchmarks/attention_paths.py [--threads 1] [--repeats 7] [--lengths 64 256] [--widths 32 ... 1024]

For each sequence length T and head width d_k, times attnscale's explicit path
(q @ kᵀ · scale -> mask -> fp32 softmax -> @ v, what the diagnostics read) and
``F.scaled_dot_product_attention`` on the same causal inputs, alternating A and
B and reporting medians so a busy second core hurts both alike. A ratio > 1
means the fused path is faster.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from attnscale.core.attention import attend, build_mask
from attnscale.core.scales import get_scale


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(T: int, d: int, batch: int, heads: int, repeats: int, dtype) -> dict:
    gen = torch.Generator().manual_seed(0)
    shape = (batch, heads, T, d)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype).requires_grad_(True) for _ in range(3))
    scale = get_scale("inv_sqrt_d", d)
    mask = build_mask(T, causal=True)

    def explicit_fwd():
        with torch.no_grad():
            attend(q, k, v, scale, mask)

    def fused_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale.factor())

    def explicit_fb():
        attend(q, k, v, scale, mask)[0].sum().backward()

    def fused_fb():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale.factor()).sum().backward()

    out = {}
    for name, a, b in (("fwd", explicit_fwd, fused_fwd), ("fwd+bwd", explicit_fb, fused_fb)):
        ta, tb = [], []
        for _ in range(repeats):  # alternate, so drift in machine load hits both
            ta.append(_time(a, 1))
            tb.append(_time(b, 1))
        out[name] = (statistics.median(ta), statistics.median(tb))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256], help="sequence lengths T")
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024], help="head widths d_k")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, heads {args.heads}, causal")
    print(f"{'dtype':<5} {'T':>4} {'d_k':>5} | {'explicit fwd ms':>15} {'fused fwd ms':>12} {'ratio':>6} | "
          f"{'explicit f+b ms':>15} {'fused f+b ms':>12} {'ratio':>6}")
    for dname in args.dtypes:
        for T in args.lengths:
            for d in args.widths:
                r = bench(T, d, args.batch, args.heads, args.repeats, dtypes[dname])
                (ef, ff), (eb, fb) = r["fwd"], r["fwd+bwd"]
                print(f"{dname:<5} {T:>4} {d:>5} | {1e3 * ef:>15.2f} {1e3 * ff:>12.2f} {ef / ff:>6.2f} | "
                      f"{1e3 * eb:>15.2f} {1e3 * fb:>12.2f} {eb / fb:>6.2f}")


if __name__ == "__main__":
    main()
