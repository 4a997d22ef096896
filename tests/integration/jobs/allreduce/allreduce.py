"""Integration-test job for orch: a minimal torchrun / gloo all_reduce check.

Every rank all-reduces a tensor holding ``rank + 1`` and prints exactly one line::

    rank=<RANK> world=<WORLD_SIZE> local_rank=<LOCAL_RANK> node_rank=<ORCH_NODE_RANK> host=<hostname> sum=<int>

so tests can check rank/host placement and that the collective spanned the whole
world (``sum == world * (world + 1) / 2``).

Failure injection for exit-code tests:

* ``--fail-rank N``  -- rank N raises ``RuntimeError("boom from rank N")`` after the all_reduce;
* ``--exit-code N``  -- rank 0 exits with status N (``sys.exit``) after a clean shutdown.

Note that torchrun itself exits with status 1 whenever any worker fails, whatever
the worker's own status; the worker's status appears in torchrun's error report
(``exitcode  : N``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import warnings

# numpy is not required; silence torch's import-time warning about it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="orch integration test: gloo all_reduce")
    parser.add_argument(
        "--fail-rank",
        type=int,
        default=None,
        help="this rank raises RuntimeError after the all_reduce",
    )
    parser.add_argument(
        "--exit-code",
        type=int,
        default=None,
        help="rank 0 exits with this status after the all_reduce",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    value = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)

    line = (
        f"rank={rank} world={world} local_rank={os.environ.get('LOCAL_RANK')} "
        f"node_rank={os.environ.get('ORCH_NODE_RANK')} host={socket.gethostname()} sum={int(value.item())}"
    )
    # One write() per line so output of ranks sharing a pipe never interleaves.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

    # Leave the process group before any injected failure: a gloo group that is
    # still alive during interpreter shutdown can turn the intended clean exit
    # status into a SIGABRT.
    dist.destroy_process_group()

    if args.fail_rank is not None and rank == args.fail_rank:
        raise RuntimeError(f"boom from rank {rank}")
    if args.exit_code is not None and rank == 0:
        sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
