"""A self-spawning script, as tutorials write them: run once per node by hand with

    python spawn.py -n 2 -g 2,1 -i 0     # on the master
    python spawn.py -n 2 -g 2,1 -i 1     # on the other node

It reads its node index, the node count and every node's process count from its own
arguments, takes MASTER_ADDR/MASTER_PORT with setdefault, and spawns its processes
with torch.multiprocessing. Each process all-reduces rank + 1 over gloo and prints

    rank=<R> world=<W> node=<I> host=<hostname> sum=<S>

``--fail-rank R``: that process raises after the all_reduce. ``--sleep S``: every
process sleeps S seconds after printing (for kill tests).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def work(local: int, args: argparse.Namespace, counts: list[int]) -> None:
    rank = sum(counts[: args.index]) + local
    world = sum(counts)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    value = torch.tensor([rank + 1])
    dist.all_reduce(value)
    # One write per line: the node's processes share its stdout, and print() writes the
    # text and its newline apart (unbuffered), so two lines could interleave.
    line = f"rank={rank} world={world} node={args.index} host={socket.gethostname()} "
    os.write(1, f"{line}sum={int(value.item())}\n".encode())
    if rank == args.fail_rank:
        raise RuntimeError(f"boom from rank {rank}")
    time.sleep(args.sleep)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", "--nodes", type=int, required=True)
    parser.add_argument("-g", "--gpus", required=True, help="processes per node: 8,2")
    parser.add_argument("-i", "--index", type=int, required=True)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0)
    args = parser.parse_args()
    counts = [int(c) for c in args.gpus.split(",")]
    assert len(counts) == args.nodes, "one count per node"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    mp.spawn(work, args=(args, counts), nprocs=counts[args.index], join=True)


if __name__ == "__main__":
    main()
