"""`orch top` of a Slurm job: the srun line that samples every node of the allocation,
each node's answer (the agent's slurm-top, run here in a real node directory), and
those answers read back, srun's own lines skipped."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from orchestrator.agent.kernel.layout import EXIT, NODE_SPEC
from orchestrator.models.states import JobState
from orchestrator.records.db import JobRecord
from orchestrator.slurm.top import parse_samples, top_command


def run_slurm_top(root: Path, node: str, request: dict[str, object]) -> str:
    code = "import sys; from orchestrator.agent.node import slurm_top; sys.exit(slurm_top.main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, str(root), json.dumps(request)],
        env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return result.stdout


def test_each_node_answers_one_line_that_reads_back_as_its_sample(tmp_path: Path) -> None:
    node = tmp_path / "node2"
    (node / "logs").mkdir(parents=True)
    (node / "logs" / "rank-0.log").write_text("a\nb\n")
    (node / NODE_SPEC).write_text(json.dumps({"argv": ["python", "-m", "torch.distributed.run"]}))
    running = run_slurm_top(tmp_path, "node2", {"job_id": "j-1", "offsets": {"node2": {"0": 2}}})
    absent = run_slurm_top(tmp_path, "node3", {})
    (node / EXIT).write_text(json.dumps({"returncode": 0, "ended": 1.0}))
    ended = run_slurm_top(tmp_path, "node2", {})
    assert running.count("\n") == 1 and absent.count("\n") == 1
    samples = parse_samples("srun: warning: something\n" + running + absent + "{not json\n")
    assert set(samples) == {"node2", "node3"}
    assert samples["node2"].exists and samples["node2"].running and samples["node2"].started
    (rank,) = samples["node2"].ranks
    assert rank["rank"] == 0 and rank["log"]["lines"] == 1  # past offset 2: "b" alone
    assert not samples["node3"].exists
    (after,) = parse_samples(ended).values()
    assert not after.running and after.ended is not None and after.ended.returncode == 0


def test_the_srun_line_overlaps_the_jobs_allocation_and_quotes_the_request() -> None:
    spec = {"backend": "slurm", "slurm": {"job_id": "42", "job_root": "~/.orch/jobs/j 1"}}
    record = JobRecord("j-1", "j", JobState.RUNNING, "", None, spec)
    request = json.dumps({"job_id": "j-1", "offsets": {"node2": {"0": 5}}})
    command = top_command(record, "/opt/py thon", 3, request)
    argv = shlex.split(command.split(" && ", 1)[1])
    assert argv[:6] == [
        "srun",
        "--overlap",
        "--jobid=42",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--quiet",
    ]
    assert argv[6:11] == ["/opt/py thon", "-I", "-S", "agent/run.py", "slurm-top"]
    assert argv[-1] == request and len(argv) == 13
    assert argv[-2].endswith("/.orch/jobs/j 1")
