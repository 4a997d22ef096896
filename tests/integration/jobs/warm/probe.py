"""Integration-test job for orch's warm starts: each rank reports what it was started
with (environment, argv, paths, __name__, how torch sees its launcher), joins a gloo
group and all-reduces, then prints one ``REPORT {json}`` line.

``--fail-rank N``: rank N exits 3 after the all_reduce; ``--sleep S``: every rank
sleeps S seconds before it ends (tests kill it there).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def launcher_views() -> dict[str, object]:
    """How libraries that look at the launcher see this process (those installed)."""
    views: dict[str, object] = {"torch": dist.is_torchelastic_launched()}
    try:
        from lightning.fabric.plugins.environments import TorchElasticEnvironment

        views["lightning"] = TorchElasticEnvironment.detect()
    except ImportError:
        pass
    try:
        from accelerate.state import PartialState  # noqa: F401

        views["accelerate"] = int(os.environ.get("LOCAL_RANK", "-1"))
    except ImportError:
        pass
    return views


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.tensor([rank + 1])
    dist.all_reduce(tensor)
    report = {
        "rank": rank,
        "sum": int(tensor.item()),
        "env": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "name": __name__,
        "main_file": getattr(sys.modules["__main__"], "__file__", None),
        "launchers": launcher_views(),
        "stdin_is_devnull": stat.S_ISCHR(os.fstat(0).st_mode),
        "own_session": os.getsid(0) == os.getpid(),
        "stdout_raw": type(sys.stdout.buffer).__name__ if hasattr(sys.stdout, "buffer") else None,
        "executable": sys.executable,
    }
    print("REPORT " + json.dumps(report, sort_keys=True), flush=True)
    if args.sleep:
        print(f"rank {rank} sleeping", flush=True)
        time.sleep(args.sleep)
    if args.fail_rank == rank:
        sys.exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
