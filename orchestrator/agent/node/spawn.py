"""How a node's process starts, decided in this one place: its command line, its
environment, its working directory, its session and where its output goes, whichever
way it starts. Everything else reads the job's spec and composes the node's
environment (the job's over this process's, a lease's devices, Slurm's names); what
then runs, and how, is `plan`'s alone.

The ways a node starts:

- `COLD`: its supervisor (start.py) starts torchrun as a child (`spawn`);
- `WARM`: a warm interpreter forks the node's launcher (warm/), which takes the same
  start on itself (`enter`) before it does torchrun's job;
- `SRUN`: on a Slurm compute node, the launcher srun started (srun.py) starts
  torchrun as a child (`spawn`).

The same spec gives the same start whichever way it goes (tests/unit/test_spawn.py);
only the session differs, where Slurm needs it. A node that is to run inside
something (an environment, a container) is a change to `plan` and to nothing else.
One limit: a warm fork runs inside the warm interpreter that warm/interpreters.py
`ensure` started, so what a fork cannot take on itself (a container) must reach that
start too, or send the node cold.
"""

from __future__ import annotations

import os

from ..kernel.layout import FLIGHT_FILES, FLIGHT_PREFIX, TORCHRUN_LOG
from . import torchrun

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import Any

COLD, WARM, SRUN = "cold", "warm", "srun"
WAYS = (COLD, WARM, SRUN)


class NodeStart:
    """A node's process as it is to start.

    Attributes:
        way: COLD, WARM or SRUN.
        argv: the node's command as a person reads it (node.json, the dry run): the
            `-m torch.distributed.run` form, which the warm launcher reads too.
        command: what is executed for it (torchrun.py's leaner entry for torchrun).
        env: its whole environment.
        cwd: the node's directory (each rank moves into code/ itself).
        outputs: ORCH_OUTPUT_DIR, made before the process starts.
        log: its stdout and stderr, appended to; stdin is /dev/null.
        new_session: whether it leads a session of its own, so that its pid is the
            node's process group: what kill signals, and the supervisor stays out of.
    """

    FIELDS = ("way", "argv", "command", "env", "cwd", "outputs", "log", "new_session")

    def __init__(
        self,
        way: str,
        argv: list[str],
        command: list[str],
        env: dict[str, str],
        cwd: str,
        outputs: str,
        log: str,
        new_session: bool,
    ) -> None:
        self.way, self.argv, self.command, self.env = way, argv, command, env
        self.cwd, self.outputs, self.log, self.new_session = cwd, outputs, log, new_session

    def as_dict(self) -> dict[str, Any]:
        """As JSON data: how the supervisor hands it to a warm interpreter."""
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, given: Mapping[str, Any]) -> NodeStart:
        """Back from `as_dict` (other keys, such as the warm launcher's, are left)."""
        return cls(**{name: given[name] for name in cls.FIELDS})


def in_environment(argv: Sequence[str], python: str | None) -> list[str]:
    """The node's command run by its job's environment's python (agent/host/envs.py)
    in place of the host's, which the spec names (None: no environment). A warm
    interpreter is keyed by its python, so an environment gets its own (pure)."""
    argv = list(argv)
    if python:
        argv[0] = python
    argv[0] = os.path.expanduser(argv[0])
    return argv


def plan(
    way: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    outputs: str,
    python: str | None = None,
) -> NodeStart:
    """How the node's process starts (pure).

    Args:
        way: COLD, WARM or SRUN.
        argv: the node's command, from its spec (its interpreter may start with ~).
        python: the job's environment's python, which runs the node instead of the
            host's (`in_environment`); None: the spec's.
        env: the node's whole environment, as its caller composed it.
        cwd: the node's directory.
        outputs: the job's output directory on this host (layout.outputs_dir).

    Raises:
        ValueError: an unknown way.
    """
    if way not in WAYS:
        raise ValueError(f"unknown way to start a node: {way}")
    argv = in_environment(argv, python)
    return NodeStart(
        way=way,
        argv=argv,
        command=torchrun.command(argv),
        env={**env, **flight_recorder(env, cwd), "ORCH_OUTPUT_DIR": outputs},
        cwd=cwd,
        outputs=outputs,
        log=TORCHRUN_LOG,
        # Slurm signals every process of the step (scancel, a time limit,
        # --kill-on-bad-exit), and its process tracking may go by session: under
        # srun the node stays in the step's.
        new_session=way != SRUN,
    )


# PyTorch's NCCL flight recorder: a ring buffer of each rank's last collectives, dumped
# when NCCL's watchdog times out, so that a hang that ends in a timeout leaves what each
# rank was doing (orch stack lists the dumps). Its current names only: torch 2.11 still
# reads TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE, but warns in
# every rank's log that they are deprecated (seen on an H200, tests/gpu/).
FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
# Either spelling in the job's env is the job saying how it wants the recorder.
FLIGHT_NAMES = (*FLIGHT_RECORDER, *FLIGHT_FILES, "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder(env: Mapping[str, str], node_dir: str) -> dict[str, str]:
    """The flight recorder's variables for a node whose ranks have GPUs (where NCCL is
    used: `CUDA_VISIBLE_DEVICES` set, by the inventory, a lease or Slurm), its dumps
    into the node's directory; none where the job sets any of them itself (a
    `TORCH_NCCL_TRACE_BUFFER_SIZE: "0"` turns it off) or the node has no GPU (pure)."""
    if not env.get("CUDA_VISIBLE_DEVICES") or any(name in env for name in FLIGHT_NAMES):
        return {}
    return {**FLIGHT_RECORDER, FLIGHT_FILES[0]: os.path.join(node_dir, FLIGHT_PREFIX)}


def spawn(start: NodeStart) -> subprocess.Popen[bytes]:
    """Start the node's process as a child of this one (COLD, SRUN).

    Raises:
        OSError, ValueError: it could not start (as subprocess.Popen).
    """
    import subprocess

    os.makedirs(start.outputs, exist_ok=True)
    # Owner-only whatever the session's umask: the log holds what the ranks print.
    fd = os.open(os.path.join(start.cwd, start.log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        return subprocess.Popen(
            start.command,
            env=start.env,
            cwd=start.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=start.new_session,
        )


def enter(start: NodeStart) -> None:
    """Make this process the node's, as `spawn` would have started it (WARM: the
    launcher a warm interpreter forked). Its command line stays the caller's to show
    (warm/launch.py `retitle`): there is no exec here."""
    if start.new_session:
        os.setsid()
    os.chdir(start.cwd)
    os.makedirs(start.outputs, exist_ok=True)
    _redirect(start.log)
    os.environ.clear()  # first: the C environment then no longer points into the room
    os.environ.update(start.env)


def _redirect(log: str) -> None:
    """stdin from /dev/null, stdout and stderr appended to `log`."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)
