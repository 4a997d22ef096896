"""A job that orch may restart (`restarts:`): six steps of a gloo all_reduce, one a
second; rank 0 records the step reached in ORCH_OUTPUT_DIR/step, and an attempt after
the first (ORCH_ATTEMPT > 0) resumes from there. Prints

    step <n> attempt <a> world <w>
    resumed at step <n>                  (a later attempt, when there was a step)
    finished attempt <a>
"""

import os
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

STEPS = 6
attempt = int(os.environ["ORCH_ATTEMPT"])
state = os.path.join(os.environ["ORCH_OUTPUT_DIR"], "step")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = torch.tensor([0])
if rank == 0 and attempt > 0 and os.path.exists(state):
    with open(state) as f:
        start[0] = int(f.read())
    print("resumed at step", int(start[0]), flush=True)
dist.broadcast(start, 0)
for step in range(int(start[0]), STEPS):
    value = torch.tensor([1])
    dist.all_reduce(value)
    if rank == 0:
        with open(state + ".part", "w") as f:
            f.write(str(step + 1))
        os.replace(state + ".part", state)
        print("step", step + 1, "attempt", attempt, "world", int(value[0]), flush=True)
    time.sleep(1)
dist.barrier()
if rank == 0:
    print("finished attempt", attempt, flush=True)
dist.destroy_process_group()
