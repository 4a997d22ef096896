"""A job that orch may restart (`restarts:`): six steps of a gloo all_reduce, one a
second; rank 0 records the step reached in ORCH_OUTPUT_DIR/step, and an attempt after
the first (ORCH_ATTEMPT > 0) resumes from there. Prints

    step <n> attempt <a> world <w>
    resumed at step <n>                  (a later attempt, when there was a step)
    finished attempt <a>

`--plain`: the same steps without torch (no process group; `world` is torchrun's
WORLD_SIZE, which it gives once every node's agent met in its rendezvous), for the tests
of orch's restarts that need no collective: no import of torch, about 2 CPU-seconds.
Every rank then first prints `rank <r> attempt <a>` (a test sees that it runs).
"""

import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

STEPS = 6
PLAIN = "--plain" in sys.argv[1:]
attempt = int(os.environ["ORCH_ATTEMPT"])
state = os.path.join(os.environ["ORCH_OUTPUT_DIR"], "step")


def resume_from(rank: int) -> int:
    """Rank 0's step to resume from (0 in a first attempt or with nothing kept)."""
    if rank != 0 or attempt == 0 or not os.path.exists(state):
        return 0
    with open(state) as f:
        start = int(f.read())
    print("resumed at step", start, flush=True)
    return start


def record(step: int, world: int) -> None:
    """Rank 0 keeps the step reached, atomically, and says it."""
    with open(state + ".part", "w") as f:
        f.write(str(step + 1))
    os.replace(state + ".part", state)
    print("step", step + 1, "attempt", attempt, "world", world, flush=True)


if PLAIN:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print("rank", rank, "attempt", attempt, flush=True)
    for step in range(resume_from(rank), STEPS):
        if rank == 0:
            record(step, world)
        time.sleep(1)
    if rank == 0:
        print("finished attempt", attempt, flush=True)
    raise SystemExit(0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
start = torch.tensor([resume_from(rank)])
dist.broadcast(start, 0)
for step in range(int(start[0]), STEPS):
    value = torch.tensor([1])
    dist.all_reduce(value)
    if rank == 0:
        record(step, int(value[0]))
    time.sleep(1)
dist.barrier()
if rank == 0:
    print("finished attempt", attempt, flush=True)
dist.destroy_process_group()
