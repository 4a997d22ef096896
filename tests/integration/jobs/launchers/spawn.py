"""A self-spawning script, as tutorials write them: run once per node by hand with

    python spawn.py -n 2 -g 2,1 -i 0     # on the master
    python spawn.py -n 2 -g 2,1 -i 1     # on the other node

It reads its node index, the node count and every node's process count from its own
arguments, takes MASTER_ADDR/MASTER_PORT with setdefault, and spawns its processes
with torch.multiprocessing. Each process all-reduces rank + 1 over gloo and prints

    rank=<R> world=<W> node=<I> host=<hostname> sum=<S>

``--fail-rank R``: that process raises after the all_reduce. ``--sleep S``: every
process sleeps S seconds after printing (for kill tests). ``--plain``: the same
processes without torch (the standard library's spawn, no process group, each line
ending in ``plain`` instead of a sum), for the tests of how orch stops the tree: no
import of torch in any of them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def work(local: int, args: argparse.Namespace, counts: list[int]) -> None:
    import torch
    import torch.distributed as dist

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


def plain_work(local: int, args: argparse.Namespace, counts: list[int]) -> None:
    rank = sum(counts[: args.index]) + local
    line = f"rank={rank} world={sum(counts)} node={args.index} host={socket.gethostname()} "
    os.write(1, f"{line}plain\n".encode())
    if rank == args.fail_rank:
        raise RuntimeError(f"boom from rank {rank}")
    time.sleep(args.sleep)


def plain_spawn(args: argparse.Namespace, counts: list[int]) -> None:
    """mp.spawn's contract without torch: every process started, the others ended
    and exit 1 as soon as one fails, exit 0 once all succeeded."""
    spawn = multiprocessing.get_context("spawn")
    procs = [
        spawn.Process(target=plain_work, args=(local, args, counts))
        for local in range(counts[args.index])
    ]
    for proc in procs:
        proc.start()
    while any(proc.is_alive() for proc in procs):
        if any(proc.exitcode not in (None, 0) for proc in procs):
            break
        time.sleep(0.05)
    if any(proc.exitcode != 0 for proc in procs):
        for proc in procs:
            proc.terminate()
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", "--nodes", type=int, required=True)
    parser.add_argument("-g", "--gpus", required=True, help="processes per node: 8,2")
    parser.add_argument("-i", "--index", type=int, required=True)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.gpus.split(",")]
    assert len(counts) == args.nodes, "one count per node"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if args.plain:
        plain_spawn(args, counts)
        return
    import torch.multiprocessing as mp

    mp.spawn(work, args=(args, counts), nprocs=counts[args.index], join=True)


if __name__ == "__main__":
    main()
