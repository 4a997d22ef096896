"""Benchmark job: every rank prints one line as soon as the whole world has met."""

import os
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
print(f"ready rank {os.environ['RANK']}", flush=True)
dist.barrier()
dist.destroy_process_group()
