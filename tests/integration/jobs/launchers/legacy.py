"""A torch.distributed.launch-era script: it needs ``--local_rank`` as an argument
and never reads LOCAL_RANK (under plain torchrun it fails: the argument is required
here, where older scripts silently took a default). Prints

    rank=<R> local_rank=<L> host=<hostname> sum=<S>
"""

from __future__ import annotations

import argparse
import socket
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([rank + 1])
    dist.all_reduce(value)
    print(
        f"rank={rank} local_rank={args.local_rank} host={socket.gethostname()} "
        f"sum={int(value.item())} tag={args.tag}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
