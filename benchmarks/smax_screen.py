"""QK-Clip's S_max with and without the bfloat16 screen, side by side, at each size: where the screen pays.

``capture.smax.head_max`` screens a long call in bfloat16 on a CPU with bfloat16
arithmetic and makes only the rows that may hold each head's largest |score|
again in float32 (``capture.smax.screened``). This times both routes on the same
causal call (one sequence unless ``--batch``, ``--heads`` heads of width
``--head-dim``, q and k drawn from a normal), the order flipped each round, the
median of ``--repeat`` rounds, and checks that both give the same numbers as
float64 where T is at most ``--check-up-to``. ``screen/float32`` under 1 is a
gain; ``SCREEN_FROM`` (entries: rows × keys × heads × sequences) is set from it.

    python benchmarks/smax_screen.py                          # T = 64 … 8,192, 8 heads, 2 threads
    python benchmarks/smax_screen.py --lengths 32 64 --repeat 1   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics

import torch
from experiments_speed import median_time
from probe_cost import cpu_features

from attnscale.capture import smax
from attnscale.capture.call import AttentionCall
from attnscale.capture.reduce import tiled


def one(T: int, args) -> dict:
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(args.batch, args.heads, T, args.head_dim, generator=gen)
    k = torch.randn(args.batch, args.heads, T, args.head_dim, generator=gen)
    call = AttentionCall(q, k, is_causal=True)
    qt, kt, _, _ = tiled(call, None)
    routes = {"float32": lambda: smax.float32_max(call, qt, kt),
              "screen": lambda: smax.screened(call, qt, kt)}
    seconds = {name: [] for name in routes}
    for r in range(args.repeat):
        for name in (("float32", "screen") if r % 2 == 0 else ("screen", "float32")):
            seconds[name].append(median_time(routes[name], 1))  # each warmed first
    row = {"T": T, "entries": args.batch * args.heads * T * T,
           **{name: statistics.median(s) for name, s in seconds.items()}}
    row["ratio"] = row["screen"] / row["float32"]
    got = routes["screen"]()
    row["screened"] = got is not None  # None: the screen handed every row to float32
    if T <= args.check_up_to:
        want = (q.double() @ k.double().mT).tril_().abs().amax((0, 2, 3))
        f32 = routes["float32"]()
        row["max_rel_error"] = max(float(((x.double() - want).abs() / want).max())
                                   for x in (f32, got if got is not None else f32))
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 512, 1024, 2048, 8192])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--check-up-to", type=int, default=2048, help="the longest T checked against float64")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"S_max, float32 blocks against the bfloat16 screen: {args.batch} sequence(s), {args.heads} heads of width "
          f"{args.head_dim}, causal; torch {torch.__version__}; {cpu_features()}; SCREEN_FROM {smax.SCREEN_FROM:,}")
    print(f"{'T':>6} {'entries':>13} {'float32 s':>10} {'screen s':>10} {'screen/float32':>15} {'max rel. error':>15}")
    rows = []
    for T in args.lengths:
        row = one(T, args)
        rows.append(row)
        err = f"{row['max_rel_error']:.1e}" if "max_rel_error" in row else "not checked"
        note = "" if row["screened"] else "  (every row left to float32)"
        print(f"{T:>6,} {row['entries']:>13,} {row['float32']:>10.4f} {row['screen']:>10.4f} {row['ratio']:>15.2f} "
              f"{err:>15}{note}")
    return rows


if __name__ == "__main__":
    main()
