"""A check for a machine with an NVIDIA GPU (not collected by pytest; no GPU in CI):
that the variables orch gives a GPU node (agent/node/spawn.py `flight_recorder`) make
PyTorch's NCCL flight recorder record a rank's collectives and dump them when NCCL's
watchdog times out, into the node's directory, and that the agent's `stack` lists the
dump (agent/node/stack.py `flight_dumps`).

One GPU is enough: a one-rank NCCL job whose all_reduce waits behind a GPU kernel
that spins for a minute (`torch.cuda._sleep`), with a 5 s process-group timeout: the
watchdog times the collective out, dumps, and ends the rank.

    python3 tests/gpu/check_flight_recorder.py     # exit 0: every check held

Its rank, with the variables orch sets, ran on an H200 (torch 2.11.0+cu130): the
watchdog timed the second all_reduce out and the dump held both (docs/STACKS.md).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.agent.kernel.requests import StackRequest
from orchestrator.agent.node import spawn, stack

RANK = """\
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5))
t = torch.ones(1, device="cuda")
dist.all_reduce(t)  # one that completes: the recorder's first entry
torch.cuda.synchronize()
torch.cuda._sleep(int(120e9))  # ~a minute of spinning, ahead of the next collective
dist.all_reduce(t)
print("enqueued", flush=True)
t.cpu()  # waits; NCCL's watchdog times the collective out first
print("not reached", flush=True)
"""


def main() -> int:
    node_dir = tempfile.mkdtemp(prefix="orch-gpu-node-")
    added = spawn.flight_recorder({"CUDA_VISIBLE_DEVICES": "0"}, node_dir)
    print("orch adds:", json.dumps(added, indent=1))
    env = {
        **os.environ,
        **added,
        "CUDA_VISIBLE_DEVICES": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29533",
    }
    with open(os.path.join(node_dir, "node.json"), "w") as f:
        json.dump({"argv": [], "env": {}}, f)  # the job set none of them itself
    os.makedirs(os.path.join(node_dir, "logs"))
    done = subprocess.run(
        [sys.executable, "-c", RANK], env=env, capture_output=True, text=True, timeout=240
    )
    print("rank exit:", done.returncode)
    print("rank stderr (last lines):", *done.stderr.splitlines()[-8:], sep="\n  ")
    reply = stack.take(node_dir, StackRequest(taken="gpu-check"))
    print("stack's flight:", reply.flight)
    ok = True
    if not reply.flight or "0" not in reply.flight:
        print("FAIL: no dump of rank 0 listed")
        return 1
    with open(reply.flight["0"], "rb") as f:
        dump = pickle.load(f)
    entries = dump.get("entries") or []
    print("dump keys:", sorted(dump))
    print("entries:", len(entries), [e.get("profiling_name") for e in entries][:4])
    if done.returncode == 0:
        print("FAIL: the rank was not ended by the watchdog")
        ok = False
    if "deprecated" in done.stderr:
        print("FAIL: the rank's log warns of a deprecated variable")
        ok = False
    if not any("all_reduce" in str(e.get("profiling_name")) for e in entries):
        print("FAIL: no all_reduce recorded")
        ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
