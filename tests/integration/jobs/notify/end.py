"""The notify tests' job (tests/integration/test_notify.py), torch-free, for launcher
python: each node prints a line, waits `--sleep` seconds, and ends; `--fail-node N`:
node N raises an error (a traceback, exit 1), in every attempt, or with
`--first-only` in the first attempt only."""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--fail-node", type=int, default=-1)
parser.add_argument("--first-only", action="store_true")
args = parser.parse_args()
node, attempt = int(os.environ["ORCH_NODE_RANK"]), int(os.environ.get("ORCH_ATTEMPT", "0"))
print(f"node {node} attempt {attempt} started", flush=True)
time.sleep(args.sleep)
if node == args.fail_node and not (args.first_only and attempt > 0):
    raise RuntimeError(f"node {node} gave up on purpose")
print(f"node {node} done", flush=True)
