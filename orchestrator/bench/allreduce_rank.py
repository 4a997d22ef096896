"""`orch bench allreduce` on the hosts: a torch.distributed all_reduce sweep.

Started by torchrun on every node, like any orch job. For each size it checks one
all_reduce for correctness, warms up, then times `--iters` of them; rank 0 prints one
JSON line per size, after `@orch-allreduce `, with the slowest rank's mean time (what
the collective costs everyone) and the count of wrong elements over all ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is optional

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MARK = "@orch-allreduce "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    parser.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    return parser.parse_args()


def emit(record: dict[str, object]) -> None:
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(size: int, device: torch.device, iters: int, warmup: int) -> dict[str, object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    count = max(1, size // 4)
    data = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(data)
    wrong = (data != world * (world + 1) / 2).sum().to(torch.float64)
    # Zeros for the timed runs: sums stay exact and no value ever turns denormal.
    data.zero_()
    for _ in range(warmup):
        dist.all_reduce(data)
    sync(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data)
    sync(device)
    mean_s = (time.perf_counter() - started) / max(1, iters)
    slowest = torch.tensor([mean_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong)
    return {
        "size": count * 4,
        "count": count,
        "time_us": slowest.item() * 1e6,
        "wrong": int(wrong.item()),
    }


def main() -> None:
    args = parse_args()
    dist.init_process_group(backend=args.backend)
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        emit({"world": world, "backend": args.backend, "torch": torch.__version__})
    for size in (int(s) for s in args.sizes.split(",")):
        result = measure(size, device, args.iters, args.warmup)
        if rank == 0:
            emit(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
