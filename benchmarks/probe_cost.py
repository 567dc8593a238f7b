"""What a probe costs at long context, beside one training step: peak extra memory and time, in one run.

A one-layer causal model (``--heads`` heads of width 64, SDPA's fused path, as the models the watch
meets are) at each ``--lengths`` T, one sequence. For each T, side by side:

- ``train step``: forward, backward and an AdamW step on that sequence (what the probe is weighed against);
- ``probe``: ``watch.measure_heads`` under the default memory budget (every head measure, every row);
- ``probe, sampled``: the same with ``sample_rows=256`` (each row measure with its standard error): the fused
  route where T > 256 (``capture.fused``: effective words, spread and max |score| from every row);
- ``call: replay 256`` and ``call: fused 256``: the layer's call alone (no forward) measured both ways with
  ``sample_rows=256``, the replay of the sampled rows (``reduce_call``) and the fused route (``measure_call``);
- ``qk-clip S_max``: the per-step ``head_max`` QK-Clip runs on each attention call;
- ``materialised``: the whole T×T scores and weights at once (``capture.reduce.dense``, the path the
  tests compare against), up to ``--dense-up-to``.

Peak extra memory is the process's resident high-water mark during the call over its resident size
before it (Linux: ``/proc/self/clear_refs`` resets the mark, ``malloc_trim`` hands freed memory back
first, so one case's leftovers cannot hide the next one's peak). Times are the median of ``--repeat``.

    python benchmarks/probe_cost.py                     # T = 512, 2,048, 8,192; 8 heads
    python benchmarks/probe_cost.py --lengths 16 32 --heads 2 --repeat 1    # a smoke run
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnscale import watch
from attnscale.capture.call import AttentionCall
from attnscale.capture.fused import measure_call
from attnscale.capture.reduce import DEFAULT_MEMORY, dense, reduce_call
from attnscale.capture.smax import head_max
from attnscale.capture.sums import HeadSums

MIB = 1 << 20


class OneLayer(nn.Module):
    """Embedding, one causal attention layer through SDPA, a head over the vocabulary."""

    def __init__(self, heads: int, head_dim: int = 64, vocab: int = 256):
        super().__init__()
        d = heads * head_dim
        self.heads = heads
        self.emb, self.qkv, self.out, self.lm = nn.Embedding(vocab, d), nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, vocab)

    def qk(self, ids):
        B, T = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, ids):
        B, T = ids.shape
        q, k, v = self.qk(ids)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        return self.lm(self.out(y))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_extra(fn):
    """(fn's result, seconds, peak resident bytes above the resident size before it)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
    before = _status("VmRSS")
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    return out, seconds, max(0, _status("VmHWM") - before)


def cases(model: OneLayer, ids: torch.Tensor, dense_up_to: int):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    T = ids.shape[1]

    def step():
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def call():
        with torch.no_grad():
            q, k, _ = model.qk(ids)
        return AttentionCall(q, k, is_causal=True)

    yield "train step", step
    yield "probe", lambda: watch.measure_heads(model, ids)
    yield "probe, sampled", lambda: watch.measure_heads(model, ids, sample_rows=min(256, T))
    c = call()
    yield "call: replay 256", lambda: reduce_call(c, sample_rows=min(256, T))
    yield "call: fused 256", lambda: measure_call(c, HeadSums(c.heads), sample_rows=min(256, T))
    yield "qk-clip S_max", lambda: head_max(c)
    if T <= dense_up_to:
        yield "materialised", lambda: dense(c)


def run(lengths, heads: int, repeat: int, dense_up_to: int) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for T in lengths:
        model = OneLayer(heads)
        ids = torch.randint(0, 256, (1, T))
        for name, fn in cases(model, ids, dense_up_to):
            fn()  # warm: first-call allocations and kernels
            got = [peak_extra(fn) for _ in range(repeat)]
            rows.append({"T": T, "case": name, "seconds": statistics.median(s for _, s, _ in got),
                         "peak_extra_mib": max(p for _, _, p in got) / MIB})
            del got
    return rows


def table(rows: list[dict]) -> str:
    step = {r["T"]: r for r in rows if r["case"] == "train step"}
    lines = [f"{'T':>6}  {'case':<17} {'seconds':>9} {'x step':>7} {'peak extra MiB':>15} {'x step':>7}"]
    for r in rows:
        s = step[r["T"]]
        t_ratio = r["seconds"] / s["seconds"] if s["seconds"] else float("nan")
        m_ratio = r["peak_extra_mib"] / s["peak_extra_mib"] if s["peak_extra_mib"] else float("nan")
        lines.append(f"{r['T']:>6,}  {r['case']:<17} {r['seconds']:>9.3f} {t_ratio:>7.2f} {r['peak_extra_mib']:>15,.1f} {m_ratio:>7.2f}")
    return "\n".join(lines)


def cpu_features() -> str:
    flags = ""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, " + (", ".join(found) or "no avx512_bf16/amx_bf16")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dense-up-to", type=int, default=2048, help="the longest T at which the whole T×T scores are made")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = run(args.lengths, args.heads, args.repeat, args.dense_up_to)
    print(f"probe cost: one layer, {args.heads} heads of width 64, one sequence; default budget "
          f"{DEFAULT_MEMORY // MIB} MiB; torch {torch.__version__}; {cpu_features()}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
