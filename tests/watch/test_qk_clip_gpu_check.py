"""benchmarks/gpu_check.py's check 7, the watch and QK-Clip on each attention kernel: one SKIP line without
CUDA, and its row's figures computed as on a GPU where the CPU can run them (SDPA)."""

import re

import torch

from benchmark_scripts import load_benchmark, run_bench


def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    out = run_bench("gpu_check.py", "--device", "cpu", "--only", "7", timeout=120)
    assert re.search(r"^\s+SKIP\s+watch and QK-Clip on CUDA\s+needs CUDA; this machine runs on cpu$", out, re.M), out
    assert re.search(r"^0 ok, 0 failed, 1 skipped$", out, re.M)


def test_its_row_on_the_cpu_with_sdpa():
    """The same row a GPU gives, on the CPU: the probe equals the CPU copy's, and after one more clip the first
    layer's S_max is at most tau (a later layer's input moves with the clip below it)."""
    gpu_check = load_benchmark("gpu_check.py")
    rows = gpu_check.watch_rows(torch.device("cpu"), {"sdpa": None, "flash": "flash-attn is not installed"},
                                steps=6, T=32)
    (status, label, detail), skipped = rows
    assert (status, label) == ("ok", "watch and QK-Clip, sdpa"), detail
    assert skipped == ("SKIP", "watch and QK-Clip, flash", "flash-attn is not installed")
    found = re.search(r"max_score ([0-9.]+) vs ([0-9.]+) on the CPU .* clipped at tau ([0-9.]+), [0-9.]+ after one "
                      r"more clip, ([0-9.]+) in layer 0 \(held\)", detail)
    assert found, detail
    here, there, tau, first = (float(x) for x in found.groups())
    assert here == there and abs(tau - 0.8 * there) <= 1e-3 * tau and first <= tau * 1.001
    # the CPU's SDPA gives no max of its own: the exact method, equal to the replay of the same calls
    replay = re.search(r"S_max by exact against the exact replay: rel\. ([0-9.e+-]+)$", detail)
    assert replay and float(replay.group(1)) <= 1e-5, detail
