"""Running the host agent (`orchestrator/agent`): its archive and version, the command
lines that run it on a host, and its replies parsed at the boundary.

The agent travels as a deterministic archive: canonical JSON of {path: source} of
the package's modules, sorted. Its sha256 is the agent's version. Every command is
run by a small loader that unpacks the archive, when it comes first on stdin, once
per version under WORKDIR/agent/<version>, compiled, so that each command starts
from cached bytecode and imports only its own module. The archive goes only to a
host that lacks its version: a command is first sent without it, and where the
version is not there the loader says so (exit MISSING) before it reads any of
stdin, and the command goes again with the archive (`execute`). One round trip
either way, two the first time a host sees a version; the rest of stdin is the
command's. A job's own commands run the version that built its snapshot
(`job_command`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Generic, TypeVar

from orchestrator.agent.kernel import layout, messages
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes.shell import sh_join, sh_path
from orchestrator.transport import CommandResult, Transport

PACKAGE = "orch_agent"  # the agent's package name on hosts
SHELL_NOT_FOUND = (126, 127)  # sh could not find or run the interpreter
MISSING = 75  # the loader's exit code: no archive came, and this version is not here
MISSING_NOTE = "orch agent: version not unpacked here"  # its line on stderr
R = TypeVar("R", bound=messages.Message)
T = TypeVar("T")
log = logging.getLogger(__name__)

# Runs an agent command. -I -S: the standard library is all the agent needs, and the
# site-packages of a torch venv take time to import. A version is unpacked beside its
# final name and renamed into place, so that hosts sharing one home (NFS) and
# commands racing on one host each see it whole; where the workdir is read-only, it
# runs from a temporary copy. compileall writes every module's bytecode at once.
# Files are the user's alone (umask 077), and code is run only from directories that
# are the user's and nobody else can write (the workdir, its agent/, the version):
# in a shared place (/tmp/orch) another user could plant one and run as this user.
LOADER = f"""\
import os,sys
os.umask(63)
n,v,r=int(sys.argv[1]),sys.argv[2],os.path.expanduser(sys.argv[3])
z=sys.stdin.buffer.read(n)
d=os.path.join(r,v)
def mine(p):
    s=os.stat(p)
    if s.st_uid!=os.getuid() or s.st_mode&18:
        sys.stderr.write("orch agent: refusing to run code from %s: it is not yours alone "
            "(owner uid %d, mode %o); give this host a workdir only you can write\\n"
            %(p,s.st_uid,s.st_mode&4095))
        sys.exit(3)
if os.path.isdir(r):mine(os.path.dirname(r));mine(r)
if not n and not os.path.isdir(d):
    sys.stderr.write("{MISSING_NOTE}\\n");sys.exit({MISSING})
if not os.path.isdir(d):
    import compileall,json,shutil,socket,tempfile,zlib
    def unpack(t):
        for k,s in json.loads(zlib.decompress(z)).items():
            p=os.path.join(t,k)
            os.makedirs(os.path.dirname(p),exist_ok=True)
            with open(p,"w") as f:f.write(s)
        compileall.compile_dir(t,quiet=2)
    try:
        t="%s.%s-%d.part"%(d,socket.gethostname(),os.getpid())
        unpack(t)
        try:os.rename(t,d)
        except OSError:shutil.rmtree(t,True)
    except OSError:
        d=tempfile.mkdtemp(prefix="orch-agent-")
        unpack(d)
        import atexit;atexit.register(shutil.rmtree,d,True)
if os.path.dirname(d)==r:mine(os.path.dirname(r));mine(r)
mine(d)
sys.path.insert(0,d)
from orch_agent.main import main
sys.exit(main(sys.argv[4:]))
"""
# The agent as a script, for a job's own commands and torchrun's rank entry. -I
# leaves the script's directory off sys.path: it puts itself there.
RUN_SCRIPT = f"""\
import os,sys
sys.path.insert(0,os.path.dirname(os.path.realpath(__file__)))
from {PACKAGE}.main import main
sys.exit(main(sys.argv[1:]))
"""


class _Once(Generic[T]):
    """A value made once, on first use. The hosts' threads that ask at the same time
    (every command line names the version) wait for the first, rather than each
    reading every module again, or compressing them again (20 ms of CPU each)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: tuple[T] | None = None
        self.__doc__ = make.__doc__

    def __call__(self) -> T:
        with self._lock:
            if self._made is None:
                self._made = (self._make(),)
            return self._made[0]

    def cache_clear(self) -> None:
        with self._lock:
            self._made = None


@_Once
def archive() -> bytes:
    """The agent's modules, its subpackages' too, as canonical JSON: the same bytes for
    the same code."""
    files = dict(_sources(resources.files("orchestrator.agent"), PACKAGE))
    files[layout.RUN_SCRIPT] = RUN_SCRIPT
    return json.dumps(files, sort_keys=True, ensure_ascii=True).encode()


def _sources(folder: Traversable, prefix: str) -> Iterator[tuple[str, str]]:
    """(path in the archive, source) of every module below `folder`; bytecode caches
    and other files stay behind."""
    for item in folder.iterdir():
        if item.is_dir():
            if item.name != "__pycache__":
                yield from _sources(item, f"{prefix}/{item.name}")
        elif item.name.endswith(".py"):
            yield f"{prefix}/{item.name}", item.read_text(encoding="utf-8")


@_Once
def version() -> str:
    """The agent's version: the hash of its archive."""
    return hashlib.sha256(archive()).hexdigest()[:16]


@_Once
def packed() -> bytes:
    """The archive as the loader wants it first on stdin."""
    return zlib.compress(archive(), 9)


def command(host: Host, *args: str, isolated: bool = True, archive: bool = True) -> str:
    """The command line that runs agent command `args` through the loader; with
    `archive`, `packed()` must come first on its stdin (`execute` sends it), else the
    loader runs the version installed on the host, or exits MISSING.

    Args:
        isolated: run with -I -S (no site-packages, no PYTHON* variables): faster, and
            all the agent needs, except the probe, which must see what a job would.
    """
    where = sh_path(layout.agent_dir(host.workdir))
    loader_args = f"{len(packed()) if archive else 0} {version()} {where}"
    flags = "-I -S " if isolated else ""
    loader = shlex.quote(LOADER)
    return f"{sh_path(host.python)} {flags}-c {loader} {loader_args} {sh_join(args)}"


class _Installed:
    """What this process saw of where this agent version is unpacked, per host and
    workdir: where a command found it, the next ones go without the archive at once;
    where it was missing even after the archive came (a read-only workdir runs each
    command from a temporary copy), every command carries the archive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: set[tuple[object, ...]] = set()
        self._sent: set[tuple[object, ...]] = set()
        self._always: set[tuple[object, ...]] = set()

    @staticmethod
    def _key(host: Host) -> tuple[object, ...]:
        return (host.name, host.address, host.port, host.user, host.workdir)

    def found(self, host: Host) -> bool:
        return self._key(host) in self._found

    def needs_archive(self, host: Host) -> bool:
        return self._key(host) in self._always

    def saw(self, host: Host, missing: bool) -> None:
        """A command without the archive found the version, or found it missing (and
        the archive goes next)."""
        key = self._key(host)
        with self._lock:
            if not missing:
                self._found.add(key)
                self._sent.discard(key)
            elif key in self._sent:
                self._always.add(key)  # the archive came last time, and did not stay
            else:
                self._sent.add(key)

    def forget(self, host: Host) -> None:
        """The version went missing under a command told it was there."""
        with self._lock:
            self._found.discard(self._key(host))


_installed = _Installed()


def invocation(host: Host, *args: str, isolated: bool = True) -> tuple[str, bytes]:
    """The command line of agent command `args`, and what goes first on its stdin: for
    a caller whose stdin cannot be sent twice (a stream, a push's frames), so the
    archive stays off only where a command of this process found the version on the
    host; `reply_of` tells if it went missing since."""
    if _installed.found(host):
        return command(host, *args, isolated=isolated, archive=False), b""
    return command(host, *args, isolated=isolated), packed()


def execute(
    host: Host,
    transport: Transport,
    args: Sequence[str],
    stdin: Iterable[bytes] = (),
    timeout: float | None = None,
    isolated: bool = True,
) -> CommandResult:
    """Run an agent command, `stdin` after the archive where the host needs it: first
    without, unless the host is known to need it every time, then again with it where
    the loader says its version is missing (the first command of a version there).

    Args:
        isolated: as for `command`.
    """
    parts = list(stdin)  # sent twice where the version is missing
    if not _installed.needs_archive(host):
        line = command(host, *args, isolated=isolated, archive=False)
        result = transport.run(line, stdin=parts, timeout=timeout)
        missing = _missing(result.exit_code, result.stderr)
        if result.exit_code not in SHELL_NOT_FOUND:
            _installed.saw(host, missing)
        if not missing:
            return result
        log.debug("[host=%s] agent %s not unpacked there: sending it", host.name, version())
    line = command(host, *args, isolated=isolated)
    return transport.run(line, stdin=[packed(), *parts], timeout=timeout)


def _missing(exit_code: int, stderr: str) -> bool:
    return exit_code == MISSING and MISSING_NOTE in stderr


def installed_command(host: Host, *args: str) -> str:
    """The command line that runs agent command `args` from this version, unpacked on
    the host by an earlier `run` (a streamed command sends no stdin for the loader)."""
    script = f"{layout.agent_dir(host.workdir)}/{version()}/{layout.RUN_SCRIPT}"
    return f"{sh_path(host.python)} -I -S {sh_path(script)} {sh_join(args)}"


def job_command(host: Host, job_dir: str, *args: str) -> str:
    """The command line that runs agent command `args` in a job directory, with the
    agent version the job pinned when its snapshot was built."""
    script = f"{layout.AGENT}/{layout.RUN_SCRIPT}"
    python = sh_path(host.python)
    return f"cd {sh_path(job_dir)} && exec {python} -I -S {script} {sh_join(args)}"


def run(
    host: Host,
    transport: Transport,
    args: list[str],
    stdin: Iterable[bytes] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run an agent command (`execute`: the archive first on stdin where the host lacks
    its version, then `stdin`) and return its reply: the JSON object it printed last.

    Raises:
        HostError: python is missing on the host.
        RemoteCommandError: the command printed no reply.
    """
    result = execute(host, transport, args, stdin, timeout)
    return reply_of(host, result, args[0])


def reply_of(host: Host, result: CommandResult, name: str) -> dict[str, Any]:
    """The JSON object an agent command printed last.

    Raises:
        HostError: python is missing on the host, or the agent version went missing
            there under a command sent without it (`invocation`).
        RemoteCommandError: the command printed no reply.
    """
    data = messages.last_json(result.stdout)
    if data is not None:
        return data
    if result.exit_code in SHELL_NOT_FOUND:
        raise python_not_found(host)
    if _missing(result.exit_code, result.stderr):
        _installed.forget(host)
        raise HostError(
            host.name,
            f"orch agent {name}: agent version {version()} went missing from "
            f"{layout.agent_dir(host.workdir)} while this orch ran",
            "is something cleaning that directory? run the command again",
        )
    raise RemoteCommandError(host.name, f"orch agent {name}", result.exit_code, result.stderr)


def parse(host: Host, cls: type[R], data: dict[str, Any]) -> R:
    """A reply as its class (kernel/replies.py), its fields' types checked.

    Raises:
        HostError: the reply lacks a field this controller needs, or a field has the
            wrong type; names the host.
    """
    try:
        return messages.parse_message(cls, data)
    except messages.MessageError as exc:
        raise HostError(
            host.name,
            f"unreadable agent reply: {exc}",
            "is another orch version using this host's workdir? run orch check",
        ) from None


def python_not_found(host: Host) -> HostError:
    return HostError(
        host.name,
        f"python not found at {host.python}",
        f"set 'python:' for {host.name} in the inventory to an interpreter that has torch",
    )
