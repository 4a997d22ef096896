"""Running the host agent (`orchestrator/agent`): its archive and version, the command
lines that run it on a host, and its replies parsed at the boundary.

The agent travels as a deterministic archive: canonical JSON of {path: source} of
the package's modules, sorted. Its sha256 is the agent's version. Every command is
run by a small loader that reads the archive from the front of stdin and unpacks it
once per version under WORKDIR/agent/<version>, compiled, so that each command
starts from cached bytecode and imports only its own module. One round trip either
way; the rest of stdin is the command's. A job's own commands run the version that
built its snapshot (`job_command`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
import zlib
from collections.abc import Iterable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TypeVar

from orchestrator.agent.kernel import protocol
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes.shell import sh_join, sh_path
from orchestrator.transport import CommandResult, Transport

PACKAGE = "orch_agent"  # the agent's package name on hosts
SHELL_NOT_FOUND = (126, 127)  # sh could not find or run the interpreter
R = TypeVar("R", bound=protocol.Message)

# Runs an agent command. -I -S: the standard library is all the agent needs, and the
# site-packages of a torch venv take time to import. A version is unpacked beside its
# final name and renamed into place, so that hosts sharing one home (NFS) and
# commands racing on one host each see it whole; where the workdir is read-only, it
# runs from a temporary copy. compileall writes every module's bytecode at once.
# Files are the user's alone (umask 077), and code is run only from directories that
# are the user's and nobody else can write (the workdir, its agent/, the version):
# in a shared place (/tmp/orch) another user could plant one and run as this user.
LOADER = """\
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


@functools.cache
def archive() -> bytes:
    """The agent's modules, its subpackages' too, as canonical JSON: the same bytes for
    the same code."""
    files = dict(_sources(resources.files("orchestrator.agent"), PACKAGE))
    files[protocol.RUN_SCRIPT] = RUN_SCRIPT
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


@functools.cache
def version() -> str:
    """The agent's version: the hash of its archive."""
    return hashlib.sha256(archive()).hexdigest()[:16]


@functools.cache
def packed() -> bytes:
    """The archive as the loader wants it first on stdin."""
    return zlib.compress(archive(), 9)


def command(host: Host, *args: str, isolated: bool = True) -> str:
    """The command line that runs agent command `args` through the loader; `packed()`
    must come first on its stdin (`run` sends it).

    Args:
        isolated: run with -I -S (no site-packages, no PYTHON* variables): faster, and
            all the agent needs, except the probe, which must see what a job would.
    """
    where = sh_path(protocol.agent_dir(host.workdir))
    loader_args = f"{len(packed())} {version()} {where}"
    flags = "-I -S " if isolated else ""
    loader = shlex.quote(LOADER)
    return f"{sh_path(host.python)} {flags}-c {loader} {loader_args} {sh_join(args)}"


def installed_command(host: Host, *args: str) -> str:
    """The command line that runs agent command `args` from this version, unpacked on
    the host by an earlier `run` (a streamed command sends no stdin for the loader)."""
    script = f"{protocol.agent_dir(host.workdir)}/{version()}/{protocol.RUN_SCRIPT}"
    return f"{sh_path(host.python)} -I -S {sh_path(script)} {sh_join(args)}"


def job_command(host: Host, job_dir: str, *args: str) -> str:
    """The command line that runs agent command `args` in a job directory, with the
    agent version the job pinned when its snapshot was built."""
    script = f"{protocol.AGENT}/{protocol.RUN_SCRIPT}"
    python = sh_path(host.python)
    return f"cd {sh_path(job_dir)} && exec {python} -I -S {script} {sh_join(args)}"


def run(
    host: Host,
    transport: Transport,
    args: list[str],
    stdin: Iterable[bytes] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run an agent command (the archive goes first on stdin, then `stdin`) and return
    its reply: the JSON object it printed last.

    Raises:
        HostError: python is missing on the host.
        RemoteCommandError: the command printed no reply.
    """
    parts: list[bytes] = [packed(), *stdin]
    result = transport.run(command(host, *args), stdin=parts, timeout=timeout)
    return reply_of(host, result, args[0])


def reply_of(host: Host, result: CommandResult, name: str) -> dict[str, Any]:
    """The JSON object an agent command printed last.

    Raises:
        HostError: python is missing on the host.
        RemoteCommandError: the command printed no reply.
    """
    data = protocol.last_json(result.stdout)
    if data is not None:
        return data
    if result.exit_code in SHELL_NOT_FOUND:
        raise python_not_found(host)
    raise RemoteCommandError(host.name, f"orch agent {name}", result.exit_code, result.stderr)


def parse(host: Host, cls: type[R], data: dict[str, Any]) -> R:
    """A reply as its class (protocol.py), its fields' types checked.

    Raises:
        HostError: the reply lacks a field this controller needs, or a field has the
            wrong type; names the host.
    """
    try:
        return protocol.parse_message(cls, data)
    except protocol.MessageError as exc:
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
