"""What the controller and the host agent say to each other, written once for both.

Standard library only, and valid on the oldest Python a host may run (3.8): the agent
imports it on every host, the controller from the package.

**Commands** run as `python -I -S -c LOADER N VERSION AGENT_ROOT COMMAND ARGS...`
(`nodes/agent.py`): the agent's archive comes first on stdin, then the command's own
input. A command answers with one JSON object on the last line of its stdout; the
controller parses it into one of the reply classes below (`parse_message`): fields a
newer agent adds are ignored, a missing one is an error that names the host.

**Frames** carry the code push and gc on stdin, so that no name or byte of the
user's ever passes through a shell: one kind byte, an 8-byte big-endian length,
the payload.

    H  {"store": DIR, "push": TOKEN}                       always first
    P  {"k": KEY, "off": N, "size": N, "z": 0|1}  then B  a piece of an object
    M  zlib(canonical manifest)                            a manifest the host lacks
    S  {"digest", "job_dir", "setup", "keep"[, "nodes"]}   build the job's snapshot
    Z  (empty)                                             the end

**Follow records** (`follow`): a JSON header line per record; a `data` record is
followed by its N raw bytes (Z bytes when zlib-compressed):

    {"k": "data", "s": STREAM, "o": OFFSET, "n": N[, "z": Z]}   complete lines of a log
                                                                (and a \\r bar's redraws)
    {"k": "hb"}                                                 idle heartbeat
    {"k": "exit", EXIT RECORD}                                  the node ended, all sent
    {"k": "end", NODE STATUS}                                   --once: all sent for now

**The job directory** `WORKDIR/jobs/<job id>/<host>` (`job_dir`) holds the files named
below. Where hosts share a filesystem, their nodes share one snapshot: code/, agent
and snapshot.json sit one level up, in `WORKDIR/jobs/<job id>` (`job_root`), and each
node's directory links to them. **The content store** `WORKDIR/store` holds objects/<sha256>[.x] (read-only;
`.x` executable), manifests/<digest> and setup/<key> (done markers); **the agent**
is unpacked once per version under `WORKDIR/agent/<version>`.
"""

from __future__ import annotations

import json
import os
import re
import struct

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeVar

    M = TypeVar("M", bound="Message")

# ---------------------------------------------------------------- job directory

NODE_SPEC = "node.json"  # argv and env of the node's torchrun
PIDS = "pid.json"  # torchrun's pid and group, the supervisor's pid
EXIT = "exit.json"  # how torchrun ended (ExitRecord)
KILLED = "killed"  # present once orch kill ran
LOGS = "logs"  # rank-N.log and rank-N.pid of every rank
TORCHRUN_LOG = "torchrun.log"
SETUP_LOG = "setup.log"
SUPERVISOR_LOG = "supervisor.log"
CODE = "code"  # the job's snapshot of the pushed tree
OUTPUTS = "outputs"  # beside the nodes' directories: what the job keeps (ORCH_OUTPUT_DIR)
SNAPSHOT = "snapshot.json"  # which manifest code/ was built from
AGENT = "agent"  # link to the agent version that built the snapshot: the job's own
RUN_SCRIPT = "run.py"  # the agent's entry as a script, in each version's directory
# Names a node's directory may not have: a shared snapshot's entries beside it.
SEAL = "seal.json"  # beside snapshot.json, as root: each file's inode and ctime (takeover.py)
RESERVED_NAMES = frozenset({CODE, AGENT, SNAPSHOT, SEAL, OUTPUTS, ".", ".."})
FS_MARKS = "fsmarks"  # WORKDIR/fsmarks/<nonce>: which hosts see one filesystem (probe)
HEARTBEAT_S = 60.0  # a supervisor touches its PIDS file this often while torchrun runs
MEMBER_FILE = "member.json"  # a keeper's member lives in this node directory (touched too)


def job_root(workdir: str, job_id: str) -> str:
    """A job's directory on a host: its nodes' directories, and a shared snapshot."""
    return f"{workdir.rstrip('/')}/jobs/{job_id}"


def job_dir(workdir: str, job_id: str, host: str, attempt: int = 0) -> str:
    """A node's job directory on its host (may start with ~); a restarted job's nodes
    get one per attempt, beside the first: the output directory stays theirs."""
    name = host if attempt == 0 else f"{host}.attempt{attempt}"
    return f"{job_root(workdir, job_id)}/{name}"


def outputs_dir(job_dir: str) -> str:
    """A node's output directory, beside its job directory: kept when gc removes the
    code, and one for every node of a shared filesystem (may start with ~)."""
    return f"{job_dir.rstrip('/').rpartition('/')[0]}/{OUTPUTS}"


def store_dir(workdir: str) -> str:
    """The host's content store (may start with ~)."""
    return f"{workdir.rstrip('/')}/store"


def agent_dir(workdir: str) -> str:
    """Where the host keeps each agent version it was sent (may start with ~)."""
    return f"{workdir.rstrip('/')}/agent"


def setup_marker(store: str, key: str) -> str:
    """Where a store records that setup `key` succeeded."""
    if not DIGEST_RE.fullmatch(key):
        raise ValueError(f"bad setup key {key!r}")
    return f"{store}/setup/{key}"


# ---------------------------------------------------------------- content keys

KIND_FILE, KIND_EXEC, KIND_LINK, KIND_DIR = "f", "x", "l", "d"
KEY_RE = re.compile(r"[0-9a-f]{64}(\.x)?")
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
TOKEN_RE = re.compile(r"[0-9A-Za-z_-]{1,64}")


def entry_key(kind: str, value: str) -> str | None:
    """The content-store key of a manifest entry: a file's hash, marked when executable
    (hard links share their mode, so the same bytes with and without the executable
    bit are two objects); None for links and directories."""
    if kind == KIND_FILE:
        return value
    if kind == KIND_EXEC:
        return value + ".x"
    return None


# ---------------------------------------------------------------- frames

FRAME = struct.Struct(">cQ")  # kind, payload length
MAX_FRAME = 256 << 20


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return FRAME.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, data: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(data, ensure_ascii=True).encode())


def read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("input ended in the middle of a frame")
    return bytes(data)


def read_frame(stream: Any) -> tuple[bytes, bytes]:
    kind, size = FRAME.unpack(read_exact(stream, FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is too large")
    return kind, read_exact(stream, size)


# ---------------------------------------------------------------- files


def write_bytes(path: str, data: bytes, mode: int | None = None) -> None:
    """Write atomically, so that a reader never sees half a file.

    Without `mode` the file gets the user's umask, as open() gives it: node.json
    holds the job's env, and a user whose umask is 077 keeps it to themselves. The
    temporary name carries the host's name too: hosts that share a home (NFS) may
    write the same file with the same pid.
    """
    tmp = f"{path}.tmp-{os.uname().nodename}-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_json(path: str, data: object) -> None:
    write_bytes(path, json.dumps(data).encode())


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object a command printed last, or None."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None


def send_record(out: Any, record: dict[str, Any]) -> None:
    """One JSON record line; all but data records go out at once."""
    out.write(json.dumps(record).encode() + b"\n")
    if record.get("k") != "data":
        out.flush()


def widen_pipe(fd: int) -> None:
    """Give the pipe to or from sshd 1 MB instead of 64 kB (Linux): each side then
    waits for the other far less often (a push of 8 hosts on 2 cores: -20% CPU).
    Anything else (a file, a terminal) is left as it is."""
    import contextlib
    import fcntl

    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


# ---------------------------------------------------------------- messages


class MessageError(ValueError):
    """A message lacks a field this side needs, or a field has the wrong type (an older,
    newer or broken peer)."""


_MESSAGES: dict[str, type[Message]] = {}  # every message class, by name
_FIELDS: dict[type[Message], dict[str, str]] = {}
_CHECKS: dict[type[Message], dict[str, Any]] = {}  # per class: field -> check(value)


class Message:
    """A message of the wire, built on one side (`as_dict`) and parsed on the other
    (`parse_message`). A subclass's annotated names are its fields; those with a
    class-level default may be missing. Each field's annotation (a string: this module
    uses postponed annotations) is checked against the value at the boundary; another
    message's class name in an annotation parses that field as that message. (Not a
    dataclass and no `typing.get_type_hints`: importing dataclasses costs every host
    command 6 ms; the checks are compiled from the strings once per class, on first
    parse.)"""

    def __init__(self, **values: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _MESSAGES[cls.__name__] = cls

    @classmethod
    def fields(cls) -> dict[str, str]:
        """Every field's name and annotation, the base classes' first."""
        found = _FIELDS.get(cls)
        if found is None:
            found = {}
            for klass in reversed(cls.__mro__):  # a class's own: 3.8 inherits them
                found.update(klass.__dict__.get("__annotations__", {}))  # noqa: RUF063 (3.8)
            _FIELDS[cls] = found
        return found

    def as_dict(self) -> dict[str, Any]:
        """The message as JSON data: the fields it was given (the others' defaults are
        the reader's), a message inside as its own dict."""
        given = vars(self)
        return {name: _plain(given[name]) for name in self.fields() if name in given}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in self.fields())
        return f"{type(self).__name__}({fields})"


class Reply(Message):
    """What an agent command answers: one JSON object, its stdout's last line."""


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.as_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def parse_message(cls: type[M], data: dict[str, Any], host: str | None = None) -> M:
    """`data` as a message of `cls`: unknown keys ignored (a newer peer may send more),
    missing required ones and values of the wrong type refused. A field that names
    another message class is parsed as one.

    Raises:
        MessageError: a field without a default is missing, or a value has the wrong
            type; says which message, field and (when given) host.
    """
    checks = _CHECKS.get(cls)
    if checks is None:
        checks = _CHECKS[cls] = {n: _compile(a) for n, a in cls.fields().items()}
    values: dict[str, Any] = {}
    where = f" from {host}" if host else ""
    if not isinstance(data, dict):
        raise MessageError(f"{cls.__name__}{where} is {type(data).__name__}, not an object")
    for name, check in checks.items():
        if name in data:
            try:
                values[name] = check(data[name])
            except _Wrong as wrong:
                raise MessageError(
                    f"{cls.__name__}.{name}{where} is {wrong.args[0]}, not {cls.fields()[name]}"
                ) from None
            except MessageError as inner:
                raise MessageError(f"{cls.__name__}.{name}{where}: {inner}") from None
        elif not hasattr(cls, name):
            raise MessageError(f"{cls.__name__}{where} lacks '{name}'")
    return cls(**values)


class _Wrong(Exception):
    """A value does not fit its annotation (args: what it is)."""


def _split(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets."""
    parts: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == sep and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _what(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_SCALARS: dict[str, Any] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
}


def _compile(annotation: str) -> Any:
    """A check of a value against an annotation string: returns the value (a message
    class's dict parsed as that class), raises _Wrong. Knows None, bool, int, float,
    str, Any, X | Y, Optional[X], Sequence[X] / list[X] / tuple[X, ...] (a JSON
    array), dict[str, X] / Mapping[str, X] (a JSON object), Literal strings, and
    the message classes by name."""
    options = _split(annotation, "|")
    if len(options) > 1:
        checks = [_compile(o) for o in options]

        def either(value: Any) -> Any:
            for check in checks:
                try:
                    return check(value)
                except _Wrong:
                    continue
            raise _Wrong(_what(value))

        return either
    text = options[0]
    if text == "Any":
        return lambda value: value
    head, _, rest = text.partition("[")
    inner = rest[:-1] if rest.endswith("]") else ""
    if head == "Optional":
        return _compile(f"{inner} | None")
    if head == "Literal":
        allowed = [json.loads(a.replace("'", '"')) for a in _split(inner, ",")]

        def literal(value: Any) -> Any:
            if value in allowed and isinstance(value, str):
                return value
            raise _Wrong(repr(value) if isinstance(value, str) else _what(value))

        return literal
    if head in ("Sequence", "list", "List", "tuple", "Tuple"):
        item = _compile(_split(inner, ",")[0] if inner else "Any")

        def array(value: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                raise _Wrong(_what(value))
            try:
                return [item(v) for v in value]
            except _Wrong as wrong:
                raise _Wrong(f"a list holding {wrong.args[0]}") from None

        return array
    if head in ("dict", "Dict", "Mapping"):
        each = _compile(_split(inner, ",")[1] if inner else "Any")

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Wrong(_what(value))
            try:
                return {k: each(v) for k, v in value.items()}
            except _Wrong as wrong:
                raise _Wrong(f"an object holding {wrong.args[0]}") from None

        return mapping
    if text in _SCALARS:
        fits = _SCALARS[text]

        def scalar(value: Any) -> Any:
            if not fits(value):
                raise _Wrong(_what(value))
            return value

        return scalar
    if text in _MESSAGES:
        kind = _MESSAGES[text]

        def message(value: Any) -> Any:
            if isinstance(value, kind):
                return value
            if not isinstance(value, dict):
                raise _Wrong(_what(value))
            return parse_message(kind, value)

        return message
    raise TypeError(f"the wire cannot check the annotation {annotation!r}")


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
    """One warm interpreter of this user on a host (agent/node/warm.py `listing`): its
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
