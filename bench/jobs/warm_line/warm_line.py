"""Benchmark job for warm starts: imports torch, joins a gloo group, one all_reduce,
prints `ready rank R`; `--hold S` keeps every rank S seconds more (memory is read then)."""

import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from helper import VALUE  # noqa: E402  (the file a changed-file run edits)

dist.init_process_group("gloo")
tensor = torch.tensor([VALUE])
dist.all_reduce(tensor)
print(f"ready rank {os.environ['RANK']} sum {int(tensor.item())}", flush=True)
if "--hold" in sys.argv:
    time.sleep(float(sys.argv[sys.argv.index("--hold") + 1]))
dist.destroy_process_group()
