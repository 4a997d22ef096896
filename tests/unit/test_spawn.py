"""How a node's process starts is decided in one place (agent/node/spawn.py): a cold
start, a warm fork and srun's launcher give the node the same command, environment,
directory and output for the same spec; only srun keeps the step's session. Each is
run for real here: a child started as a cold start starts it, a fork that takes the
start on itself as a warm launcher does, and the launcher srun starts."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.node import spawn

# What the node's process finds itself to be, written where SEEN says.
OBSERVE = """
import json, os
seen = {
    "cwd": os.getcwd(),
    "env": {k: os.environ.get(k) for k in ("LR", "ORCH_OUTPUT_DIR", "CUDA_VISIBLE_DEVICES")},
    "outputs_made": os.path.isdir(os.environ["ORCH_OUTPUT_DIR"]),
    "own_session": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
    "stdout": os.readlink("/proc/self/fd/1"),
    "stderr": os.readlink("/proc/self/fd/2"),
}
with open(os.environ["SEEN"], "w") as f:
    json.dump(seen, f)
os.write(1, b"out\\n")
os.write(2, b"err\\n")
"""


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    (tmp_path / "job" / "node").mkdir(parents=True)
    return tmp_path / "job" / "node"


def planned(way: str, node_dir: Path, seen: Path) -> spawn.NodeStart:
    env = {"PATH": os.environ["PATH"], "LR": "0.1", "CUDA_VISIBLE_DEVICES": "1", "SEEN": str(seen)}
    argv = [sys.executable, "-c", OBSERVE, "--lr", "0.1"]
    return spawn.plan(way, argv, env, str(node_dir), str(node_dir.parent / "outputs"))


def test_a_cold_start_and_a_warm_fork_plan_the_same_process_and_srun_its_own_session(
    tmp_path: Path,
) -> None:
    seen = tmp_path / "seen.json"
    cold, warm, srun = (planned(w, tmp_path, seen).as_dict() for w in spawn.WAYS)
    assert {**warm, "way": "cold"} == cold
    assert {**srun, "way": "cold", "new_session": True} == cold
    assert cold["new_session"] is True and srun["new_session"] is False
    assert cold["env"]["ORCH_OUTPUT_DIR"] == str(tmp_path.parent / "outputs")
    assert cold["log"] == "torchrun.log" and cold["cwd"] == str(tmp_path)
    again = spawn.NodeStart.from_dict({**cold, "nproc": 2})  # as the warm launcher reads it
    assert again.as_dict() == cold


def test_a_torchrun_node_runs_through_the_lean_entry_and_its_interpreter_expands() -> None:
    argv = ["~/venv/bin/python", "-m", "torch.distributed.run", "--nnodes", "1", "x.py"]
    start = spawn.plan(spawn.COLD, argv, {}, "/n", "/o")
    home = os.path.expanduser("~")
    assert start.argv == [f"{home}/venv/bin/python", *argv[1:]]
    assert start.command == [f"{home}/venv/bin/python", "agent/run.py", "torchrun", *argv[3:]]
    with pytest.raises(ValueError, match="unknown way"):
        spawn.plan("container", argv, {}, "/n", "/o")


def cold_start(start: spawn.NodeStart) -> None:
    assert spawn.spawn(start).wait(timeout=60) == 0


def warm_fork(start: spawn.NodeStart) -> None:
    """What a warm interpreter's forked launcher does with its start: take it on
    itself, in the process that was forked (no exec)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            spawn.enter(start)
            exec(compile(OBSERVE, "observe", "exec"), {})
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def run_as(way: str, node_dir: Path) -> dict[str, Any]:
    seen = node_dir.parent / f"seen-{way}.json"
    start = planned(way, node_dir, seen)
    (cold_start if way == spawn.COLD else warm_fork)(start)
    return dict(json.loads(seen.read_text()))


def test_a_cold_start_and_a_warm_fork_give_the_node_the_same_process(node_dir: Path) -> None:
    cold = run_as(spawn.COLD, node_dir)
    assert run_as(spawn.WARM, node_dir) == cold
    log = str(node_dir / "torchrun.log")
    assert cold == {
        "cwd": str(node_dir),
        "env": {
            "LR": "0.1",
            "ORCH_OUTPUT_DIR": str(node_dir.parent / "outputs"),
            "CUDA_VISIBLE_DEVICES": "1",
        },
        "outputs_made": True,
        "own_session": True,
        "stdin": os.devnull,
        "stdout": log,
        "stderr": log,
    }
    assert (node_dir / "torchrun.log").read_text() == "out\nerr\n" * 2


def test_srun_s_launcher_starts_the_node_as_planned_in_the_step_s_session(tmp_path: Path) -> None:
    """`slurm-node` on a compute node, for real in its own process, with Slurm's
    variables as srun sets them (no scontrol on its PATH: the node's own name is
    the master's address)."""
    root = tmp_path / "job"
    (root / "slurm").mkdir(parents=True)
    (root / "code").mkdir()
    seen = tmp_path / "seen.json"
    spec = {
        "job_id": "j-7",
        "python": sys.executable,
        "launcher": "python",
        "entry": ["-c", OBSERVE],
        "nodes": [{"nproc": 1, "args": ["--lr", "0.1"], "env": {"LR": "0.1", "SEEN": str(seen)}}],
        "port": 29500,
        "max_restarts": 0,
    }
    (root / "slurm" / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "bin").mkdir()
    env = {
        "PATH": str(tmp_path / "bin"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "CUDA_VISIBLE_DEVICES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_NODELIST": "localhost",
    }
    code = "import sys; from orchestrator.agent.node import srun; sys.exit(srun.main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    node_dir = root / "n1"
    start = spawn.plan(spawn.SRUN, [sys.executable], {}, str(node_dir), str(root / "outputs"))
    log = str(node_dir / start.log)
    assert json.loads(seen.read_text()) == {
        "cwd": start.cwd,
        "env": {"LR": "0.1", "ORCH_OUTPUT_DIR": start.outputs, "CUDA_VISIBLE_DEVICES": "1"},
        "outputs_made": True,
        "own_session": False,  # Slurm's: it signals and tracks the step's processes
        "stdin": os.devnull,
        "stdout": log,
        "stderr": log,
    }
    assert (node_dir / "torchrun.log").read_text() == "out\nerr\n"


NODE = Path(spawn.__file__).parent


def calls(path: Path) -> set[str]:
    """The dotted names a module calls (`torchrun.command`, `subprocess.Popen`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func, parts = node.func, []
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                found.add(".".join([func.id, *reversed(parts)]))
    return found


def test_no_other_node_module_makes_the_node_s_command_a_process() -> None:
    """The supervisor, srun's launcher and the warm launcher go through spawn.py:
    none of them starts the node's command, or takes its session, itself."""
    makers = {
        str(p.relative_to(NODE)) for p in NODE.rglob("*.py") if "torchrun.command" in calls(p)
    }
    assert makers == {"spawn.py"}
    for starter in ("start.py", "srun.py"):
        assert not {"subprocess.Popen", "os.setsid"} & calls(NODE / starter), starter
    assert {"spawn.plan", "spawn.spawn"} <= calls(NODE / "start.py")
    assert {"spawn.plan", "spawn.spawn"} <= calls(NODE / "srun.py")
    assert "spawn.enter" in calls(NODE / "warm" / "launch.py")
