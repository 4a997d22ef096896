"""A node that holds its GPUs or slots for a while: prints what it was given and
when, sleeps, prints when it ended (launcher: python, no torch)."""

import os
import sys
import time

given = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
slots = os.environ.get("ORCH_SLOTS", "-")
node = os.environ.get("ORCH_NODE_RANK")
print(f"start gpus={given} slots={slots} node={node} t={time.time():.3f}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
print(f"end t={time.time():.3f}", flush=True)
