"""Integration-test job for orch: a torchrun workload with dials for every failure.

Every rank joins a gloo process group (with `--plain`: none, and no torch at all; its
rank is torchrun's RANK), then, in order:
- prints `--lines` numbered lines `r<RANK> <i>` (with `--junk`: also partial writes,
  binary bytes and one 200 kB line, in between; with `--interval S`: one every S s);
- with `--daemon`, leaves behind a process that escaped via double fork + setsid;
- with `--on-term cleanup`, answers SIGTERM by printing `cleanup r<RANK> done` after
  1 s of "cleaning up"; with `--on-term ignore`, ignores SIGTERM;
- prints `ready r<RANK>`;
- rank `--fail-rank` fails after `--fail-after` s: `--fail-how` raise | sigkill | exit;
  rank `--later-fail-rank` exits with code 7 after `--later-fail-after` s (a failure
  that follows the first one, as a peer's broken connection would);
- sleeps `--sleep` s (0 = forever with `--hang`; with `--until PATH`, until PATH
  exists on its host: a test says when, not the clock), then meets the others in a barrier
  (where survivors of a failure would block; with `--plain`, no barrier), and exits 0.

`--plain` is for tests of orch's own handling of a job (streaming, status, kill,
failures): their ranks start without an import of torch, about 2 CPU-seconds each.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from types import ModuleType

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def escape() -> None:
    """Double fork + setsid: a process outside torchrun's process groups."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            time.sleep(3600)
        os._exit(0)
    os.wait()


def on_term(how: str, rank: int) -> None:
    if how == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif how == "cleanup":

        def cleanup(*_: object) -> None:
            time.sleep(1)
            print(f"cleanup r{rank} done", flush=True)
            os._exit(0)

        signal.signal(signal.SIGTERM, cleanup)


def print_lines(rank: int, count: int, junk: bool, interval: float) -> None:
    out = sys.stdout.buffer
    for i in range(count):
        if interval:
            time.sleep(interval)
            out.flush()
        if junk and i % 100 == 7:
            out.write(f"r{rank} {i} partial".encode())  # a line written in pieces
            out.flush()
            time.sleep(0.001)
            out.write(b" \xff\xfe\x00junk end\n")
        elif junk and i == 500:
            out.write(f"r{rank} {i} long ".encode() + b"x" * 200_000 + b"\n")
        else:
            out.write(f"r{rank} {i}\n".encode())
    out.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--junk", action="store_true")
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--daemon", action="store_true")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-after", type=float, default=0.0)
    parser.add_argument("--fail-how", choices=["raise", "sigkill", "exit"], default="raise")
    parser.add_argument("--later-fail-rank", type=int, default=None)
    parser.add_argument("--later-fail-after", type=float, default=0.0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--until", default=None)
    parser.add_argument("--on-term", choices=["exit", "cleanup", "ignore"], default="exit")
    parser.add_argument("--plain", action="store_true", help="no torch, no process group")
    args = parser.parse_args()

    dist: ModuleType | None = None
    if args.plain:
        rank = int(os.environ["RANK"])
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    print_lines(rank, args.lines, args.junk, args.interval)
    if args.daemon:
        escape()
    on_term(args.on_term, rank)
    print(f"ready r{rank}", flush=True)
    if rank == args.fail_rank:
        time.sleep(args.fail_after)
        print(f"crash at {time.time():.6f}", flush=True)  # benchmarks time the teardown from here
        if args.fail_how == "raise":
            raise RuntimeError(f"boom from rank {rank}")
        if args.fail_how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    if rank == args.later_fail_rank:
        time.sleep(args.later_fail_after)
        print(f"later failure at {time.time():.6f}", flush=True)
        sys.exit(7)
    deadline = time.monotonic() + args.sleep
    release = os.path.expanduser(args.until) if args.until else None
    while args.hang or time.monotonic() < deadline or (release and not os.path.exists(release)):
        time.sleep(0.2)
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
