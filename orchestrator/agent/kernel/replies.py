"""What the agent's commands answer, each a message the controller parses by name."""

from __future__ import annotations

from .messages import Message

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class Reply(Message):
    """What an agent command answers: one JSON object, its stdout's last line."""


class ExitRecord(Reply):
    """How a node's torchrun ended, as its host recorded it. `returncode` None: the
    outcome is unknown there too (the supervisor vanished, the node never started)."""

    returncode: int | None
    ended: float | None = None
    error: str | None = None
    killed: bool = False


class StatusReply(Reply):
    """`status`, and the `end` record of `follow --once`."""

    started: bool
    running: bool
    ended: ExitRecord | None = None
    exists: bool = True
    idle_s: float | None = None  # `status`: seconds since its ranks last printed (state.idle)


class Started(Reply):
    """`start`: torchrun runs, in its own process group, under a detached supervisor
    (also what the supervisor records in PIDS)."""

    pid: int
    pgid: int
    supervisor: int
    started: float
    start_time: int | None = None  # torchrun's, in clock ticks since boot: pids are reused
    host: str | None = None  # which host recorded the pids (proc.host_id)
    warnings: Sequence[str] = ()  # in the reply only: what the node's lease noted


class EnvReady(Reply):
    """`env ensure`: the environment's python on this host and its key; `built` when
    this command built it (else it was there, or another's build made it meanwhile),
    and with which installer (`uv` or `pip`); or why it could not be built: `error`,
    the packages that could not be found (`missing`), and the installer's last lines."""

    key: str | None = None
    python: str | None = None
    built: bool = False
    installer: str = ""
    seconds: float = 0.0
    error: str | None = None
    missing: Sequence[str] = ()
    tail: Sequence[str] = ()


class EnvRow(Message):
    """One environment of `env list`: its key, bytes on disk, when a job last used it,
    what it holds."""

    key: str
    size: int
    used: float
    requirements: Sequence[str] = ()


class EnvList(Reply):
    """`env list` and `env gc` (`removed`: the keys gone)."""

    envs: Sequence[EnvRow] = ()
    removed: Sequence[str] = ()


class KillReport(Reply):
    """`kill`: what was signalled, what needed KILL, what is left, where time went."""

    killed: Sequence[Sequence[Any]]  # [pid, command line]
    forced: Sequence[int]
    remaining: Sequence[int]
    seconds: dict[str, float] | None = None
    port_free: bool | None = None  # asked only on the master


class SyncReply(Reply):
    """`sync`: objects stored, and the snapshot built or what it still lacks."""

    stored: int = 0
    bytes: int = 0
    snapshot: bool = False
    setup_done: bool = False
    missing: Sequence[str] = ()
    need_manifest: bool = False
    env_python: str | None = None  # the job's environment's, where it is built here
    error: str | None = None
    changed: str | None = None  # an object whose bytes did not match their key
    relayed: int = 0  # objects fetched from the seed host's relay, and their bytes
    relayed_bytes: int = 0
    relay_error: str | None = None  # why not all of them: the controller sends the rest


class GcReport(Reply):
    """`gc`: what went from the host's store and job directories."""

    snapshots_removed: int = 0
    snapshots_kept: int = 0
    running: int = 0
    objects_removed: int = 0
    bytes_freed: int = 0
    busy: bool = False  # another gc was at it
    outputs_removed: int = 0  # with --outputs: ended jobs' output directories
    outputs_bytes_freed: int = 0
    error: str | None = None


class WarmRow(Message):
    """One warm interpreter of this user on a host (agent/node/warm/interpreters.py `listing`): its
    memory is its proportional set size, `idle_s` the seconds since it last launched."""

    pid: int
    key: str | None = None
    state: str = "?"
    python: str | None = None
    preload: Sequence[str] = ()
    pss_kb: int | None = None
    idle_s: float | None = None
    expires_s: float | None = None


class WarmList(Reply):
    """`warm list`: this user's warm interpreters on the host."""

    warm: Sequence[WarmRow] = ()


class WarmAhead(Reply):
    """`warm ahead`: the job's warm interpreter on the host (`started`: now, else one
    ran already), or why the job's node would start cold there whatever runs."""

    pid: int | None = None
    key: str | None = None
    started: bool = False
    error: str | None = None


class TopSample(Reply):
    """`top`: one sample of a node's ranks (agent/node/top.py says what each field holds).
    `ranks`, `launcher` and `gpus` stay plain JSON here; `ssh/top.py` reads them."""

    exists: bool
    started: bool
    running: bool
    ended: ExitRecord | None = None
    clock: float = 0.0  # the host's monotonic clock: rates are measured on it
    ranks: Sequence[dict[str, Any]] = ()
    launcher: dict[str, Any] | None = None
    gpus: Sequence[dict[str, Any]] | None = None  # None: no nvidia-smi on the host
    gpu_error: str | None = None
    warm: Sequence[WarmRow] = ()  # this user's warm interpreters on the host


class RankStack(Message):
    """One rank's stack, as the `stack` command read it (agent/node/stack.py).

    `via`: "py-spy" or "faulthandler" (None: not read); `error` and `hint` say why not;
    `ended`: the rank was gone. `threads`: [{"id", "name", "active", "frames":
    [{"function", "file", "line"}]}], innermost frame first."""

    rank: int
    pid: int | None = None
    via: str | None = None
    native: bool = False
    error: str | None = None
    hint: str | None = None
    ended: bool = False
    threads: Sequence[dict[str, Any]] = ()


class StackReply(Reply):
    """`stack`: every asked rank of the node (`ranks`), or `need_tool`: the hash of the
    py-spy this host lacks (the controller sends it, `tool-put`, and asks again).
    `code`: the node's code directory, as its ranks see their files; `machine`: its
    `uname -m`; `saved`: the node's copy of the dump; `flight`: NCCL flight-recorder
    dumps found, {rank: path}. `idle_s`: seconds since any of the node's ranks (or its
    launcher) last wrote a line, on the host's clock (None: no rank started yet);
    `skipped`: the request's `if_idle` was not reached, and no stack was taken."""

    exists: bool = True
    idle_s: float | None = None
    skipped: bool = False
    need_tool: str | None = None
    machine: str = ""
    code: str | None = None
    saved: str | None = None
    ranks: Sequence[RankStack] = ()
    flight: dict[str, str] | None = None
