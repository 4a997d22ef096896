"""A hung job: the last rank sleeps before a collective (argv[1] seconds) while the
others wait in it; a restarted attempt runs through. tests/integration/test_stack.py
names these lines."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def load_batch() -> None:
    time.sleep(float(sys.argv[1]))  # the sleeping rank: line 17


def step(tensor: torch.Tensor) -> None:
    if rank == world - 1 and os.environ.get("ORCH_ATTEMPT", "0") == "0":
        load_batch()
    dist.all_reduce(tensor)  # the others wait here: line 23


print(f"ready {rank}", flush=True)
step(torch.ones(1))
dist.destroy_process_group()  # else gloo may abort the exit (SIGABRT)
print(f"done {rank}", flush=True)
