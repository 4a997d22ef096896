"""`slurm-attempt begin|watch|end JOB_ROOT ATTEMPT [PREVIOUS_ID|SRUN_PID|RETURNCODE]`: the two steps
a Slurm job with `restarts:` runs in its batch script, before and after its srun, on
the allocation's first node. The design (a chain of batch jobs, each queuing the next
with `--dependency=afternotok`) and the files are kernel/slurm_chain.py's.

- `begin` decides whether this attempt runs (exit 0) or is skipped (exit 1: the job
  was killed, or the previous attempt ended in a way no restart follows), and queues
  the next attempt while restarts are left;
- `watch` ends an attempt whose srun waits on a lost node (see `watch`);
- `end` records how the attempt ended and settles the next one: cancelled after a
  success or a kill, else told which nodes to leave out.

Every step writes `slurm/attempt-<k>.json`, which the controller reads to follow the
chain (slurm/restarts.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from typing import Any

from ..host import proc
from ..kernel.fileio import read_json, write_json
from ..kernel.layout import EXIT
from ..kernel.messages import parse_message
from ..kernel.requests import SlurmChain
from ..kernel.slurm import expand_nodelist, node_dir_name
from ..kernel.slurm_chain import (
    ATTEMPT_ENV,
    CHAIN,
    KILLED_MARK,
    attempt_dir,
    attempt_record,
    culprits,
    exclude,
    restartable,
)

TIMEOUT_S = 60
POLL_S = 0.5
# A node failed and the others that can have recorded their end: this long without
# more news and the nodes still silent are lost (their launchers write within a second
# of srun's kill-on-bad-exit TERM).
QUIET_S = 3.0
BATCH = "slurm/batch.sh"


def _run(argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """A Slurm command, with none of this job's own Slurm variables: sbatch run inside
    an allocation would otherwise read them as its options."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) or k == "SLURM_CONF"
    }
    env.pop(ATTEMPT_ENV, None)
    try:
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def job_state(slurm_id: str) -> str | None:
    """Slurm's state of a job it still remembers (scontrol), else None."""
    found = _run(["scontrol", "show", "job", "--oneliner", slurm_id])
    match = re.search(r"\bJobState=(\S+)", found.stdout)
    return match.group(1) if match else None


def _queue_next(root: str, chain: SlurmChain, attempt: int, slurm_id: str) -> dict[str, Any]:
    """Queue attempt `attempt`, to start once this job ends in a failed state."""
    argv = [
        "sbatch",
        "--parsable",
        "--dependency=afternotok:" + slurm_id,
        "--kill-on-invalid-dep=yes",
        *[str(a) for a in chain.sbatch],
        BATCH,
        str(attempt),
        slurm_id,
    ]
    done = _run(argv, cwd=root)
    next_id = done.stdout.strip().split(";", 1)[0]
    if done.returncode != 0 or not next_id.isdigit():
        said = (done.stderr.strip() or done.stdout.strip())[-500:]
        return {"next_error": f"sbatch of attempt {attempt + 1} failed: {said}"}
    return {"next": next_id}


def begin(root: str, attempt: int, previous: str) -> int:
    path = os.path.join(root, attempt_record(attempt))
    record: dict[str, Any] = {
        "attempt": attempt,
        "slurm_id": os.environ.get("SLURM_JOB_ID", ""),
        "after": previous or None,
    }
    if os.path.exists(os.path.join(root, KILLED_MARK)):
        record["skipped"] = "the job was killed (orch kill or Ctrl-C)"
        write_json(path, record)
        return 1
    if previous:
        earlier = read_json(os.path.join(root, attempt_record(attempt - 1))) or {}
        state = job_state(previous)
        if earlier.get("released"):  # its end step let this one go: failed, Slurm still busy
            state = "FAILED"
        elif state is None:  # Slurm forgot it: its own record, where its batch script wrote one
            state = "COMPLETED" if earlier.get("returncode") == 0 else "FAILED"
        record["previous_state"] = state
        if not restartable(state):
            record["skipped"] = f"attempt {attempt} ended {state}: no restart follows that"
            write_json(path, record)
            return 1
    record["started"] = time.time()
    record["nodelist"] = os.environ.get("SLURM_JOB_NODELIST", "")
    chain = parse_message(SlurmChain, read_json(os.path.join(root, CHAIN)) or {})
    if attempt < chain.restarts:
        record.update(_queue_next(root, chain, attempt + 1, record["slurm_id"]))
    write_json(path, record)
    return 0


def _partition(name: str) -> dict[str, str]:
    """Every node of the partition and its state, as sinfo shows them."""
    found = _run(["sinfo", "--noheader", "--Node", "--partition", name, "--format=%N %t"])
    states: dict[str, str] = {}
    for line in found.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def end(root: str, attempt: int, returncode: int) -> int:
    path = os.path.join(root, attempt_record(attempt))
    record: dict[str, Any] = read_json(path) or {"attempt": attempt}
    record.update(returncode=returncode, ended=time.time())
    following = record.get("next")
    if returncode == 0 or os.path.exists(os.path.join(root, KILLED_MARK)):
        if following:
            _run(["scancel", str(following)])
            record["next_cancelled"] = True
        write_json(path, record)
        return 0
    nodes = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", ""))
    exits = {
        n: read_json(os.path.join(root, attempt_dir(node_dir_name(n), attempt), EXIT))
        for n in nodes
    }
    failed = culprits(exits)
    partition = _partition(os.environ.get("SLURM_JOB_PARTITION", ""))
    left_out = exclude(partition, failed, nodes, len(nodes))
    record.update(failed=failed, excluded=left_out)
    if following and left_out:
        update = ["scontrol", "update", f"JobId={following}", "ExcNodeList=" + ",".join(left_out)]
        done = _run(update)
        if done.returncode != 0:
            record["exclude_error"] = done.stderr.strip()[-500:]
    if following:
        release(record, path, str(following))
    write_json(path, record)
    return 0


def release(record: dict[str, Any], path: str, following: str) -> None:
    """Let the next attempt start now instead of when Slurm calls this one ended: a
    lost node holds it COMPLETING until SlurmdTimeout declares the node down (5 min by
    default), and only then does --dependency=afternotok let the next one go. The
    record says so first, for the next attempt's `begin`."""
    record["released"] = True
    write_json(path, record)
    done = _run(["scontrol", "update", f"JobId={following}", "Dependency="])
    if done.returncode != 0:  # the dependency still holds: the next one starts later
        record["released"] = False
        record["release_error"] = done.stderr.strip()[-500:]


def watch(root: str, attempt: int, pid: int) -> int:
    """Until srun (`pid`) ends; but once a node failed and every other node that still
    can has said how it ended, srun waits for the lost node's slurmstepd until Slurm
    declares the node down (SlurmdTimeout: minutes on a real cluster, and only then
    does the job end NODE_FAIL). Past QUIET_S of no further news, the attempt is over:
    srun is killed, so that the batch script records the end and the next attempt
    starts on the nodes that are left."""
    nodes = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", ""))
    paths = [os.path.join(root, attempt_dir(node_dir_name(n), attempt), EXIT) for n in nodes]
    seen, news, failed = 0, time.monotonic(), False
    while proc.alive(pid):  # srun; a zombie waiting for the batch script's `wait` is not
        exits = [read_json(path) for path in paths]
        count = sum(rec is not None for rec in exits)
        if count != seen:
            seen, news = count, time.monotonic()
        failed = failed or any(r is not None and r.get("returncode") != 0 for r in exits)
        if failed and seen < len(paths) and time.monotonic() - news > QUIET_S:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return 0
        time.sleep(POLL_S)
    return 0


def main(args: list[str]) -> int:
    step, root, attempt = args[0], os.path.abspath(os.path.expanduser(args[1])), int(args[2])
    rest = args[3] if len(args) > 3 else ""
    if step == "begin":
        return begin(root, attempt, rest)
    if step == "end":
        return end(root, attempt, int(rest or 1))
    if step == "watch":
        return watch(root, attempt, int(rest))
    raise SystemExit(f"orch: slurm-attempt: unknown step {step!r}")
