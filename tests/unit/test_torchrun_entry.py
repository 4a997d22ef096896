"""The agent's `torchrun` entry (agent/node/torchrun.py): a node's torchrun command
starts through it, and it is torchrun: the ranks' output, its exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.agent.kernel.placement import torchrun_argv
from orchestrator.agent.node import torchrun

ENTRY = (
    "from orchestrator.agent.node.torchrun import main; import sys; sys.exit(main(sys.argv[1:]))"
)


def test_a_torchrun_command_starts_through_the_entry_and_any_other_as_it_is() -> None:
    argv = torchrun_argv("py", "2", "1", "4", "10.0.0.1", "29500", 0, None)
    entry = ["agent/run.py", "rank", "logs", "code", "script", "train.py", "--", "--lr", "1"]
    assert torchrun.command([*argv, *entry]) == [
        "py",
        "agent/run.py",
        "torchrun",
        *argv[3:],
        *entry,
    ]
    plain = ["py", "-u", "agent/run.py", "rank", "-", "code", "script", "train.py", "--"]
    assert torchrun.command(plain) == plain
    legacy = ["py", "-m", "torch.distributed.launch", "--nnodes", "2"]
    assert torchrun.command(legacy) == legacy


def _torchrun(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rank.py").write_text(script)
    return subprocess.run(
        [sys.executable, "-c", ENTRY, "--standalone", "--nproc-per-node", "2", "rank.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_the_entry_runs_every_rank_and_exits_as_torchrun_does(tmp_path: Path) -> None:
    # One write per rank: the two ranks share one pipe, and print's parts can interleave.
    ran = _torchrun(
        tmp_path, "import os\nos.write(1, b'rank %s\\n' % os.environ['RANK'].encode())\n"
    )
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.split("\n")[:2]) == ["rank 0", "rank 1"]
    failed = _torchrun(
        tmp_path, "import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
    )
    assert failed.returncode == 1, failed.stderr  # torchrun's ChildFailedError
    assert "ChildFailedError" in failed.stderr and "exitcode  : 3" in failed.stderr, failed.stderr
