"""A node that holds its GPUs or slots for a while: prints what it was given and
when, sleeps, prints when it ended (launcher: python, no torch). The argument is
the seconds to hold, or a file path: hold until that file exists (at most 120 s;
the test hosts see this machine's /tmp). With `--fail-first`, attempt 0 exits 3
at once instead."""

import os
import sys
import time

given = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
slots = os.environ.get("ORCH_SLOTS", "-")
node = os.environ.get("ORCH_NODE_RANK")
attempt = os.environ.get("ORCH_ATTEMPT")
print(f"start gpus={given} slots={slots} node={node} t={time.time():.3f}", flush=True)
if "--fail-first" in sys.argv and attempt == "0":
    sys.exit(3)
held = sys.argv[1] if len(sys.argv) > 1 else "2"
if held.startswith("/"):
    deadline = time.monotonic() + 120
    while not os.path.exists(held) and time.monotonic() < deadline:
        time.sleep(0.1)
else:
    time.sleep(float(held))
print(f"end t={time.time():.3f}", flush=True)
