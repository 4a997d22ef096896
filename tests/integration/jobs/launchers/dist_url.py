"""The ImageNet example's launcher: one command per node with

    python dist_url.py --dist-url tcp://HOST:PORT --world-size 2 --rank 0 \
        --multiprocessing-distributed

``--world-size`` counts nodes and ``--rank`` is the node's rank, until the script
turns them into process counts (``--procs`` per node here, the GPU count there).
Each process all-reduces rank + 1 over gloo and prints

    rank=<R> world=<W> host=<hostname> sum=<S>
"""

from __future__ import annotations

import argparse
import socket
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def worker(local: int, args: argparse.Namespace) -> None:
    rank = args.rank * args.procs + local
    dist.init_process_group(
        "gloo", init_method=args.dist_url, world_size=args.world_size, rank=rank
    )
    value = torch.tensor([rank + 1])
    dist.all_reduce(value)
    print(
        f"rank={rank} world={args.world_size} host={socket.gethostname()} sum={int(value.item())}"
    )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-url", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    args = parser.parse_args()
    assert args.multiprocessing_distributed
    args.world_size *= args.procs
    mp.spawn(worker, nprocs=args.procs, args=(args,))


if __name__ == "__main__":
    main()
