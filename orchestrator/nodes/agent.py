"""Running the host agent: the command line that runs an agent command from the
host's cached copy, and reading its reply.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
import zlib
from importlib import resources
from typing import Any

from orchestrator.models.inventory import Host
from orchestrator.nodes.shell import sh_path
from orchestrator.sync.store import store_dir


def supervisor_source() -> bytes:
    """The node supervisor script that runs on every host."""
    return resources.files("orchestrator.remote").joinpath("supervisor.py").read_bytes()


# Runs a supervisor command from a copy in the host's store (store/bin), imported, so
# that Python keeps its bytecode: compiling 50 kB on every push would cost more than
# the push. The copy comes first on stdin (zlib), always, and is written only when the
# host lacks it; the rest of stdin is the command's. One round trip either way. -I -S:
# the stdlib is all it needs, and site-packages of a torch venv take time to import.
LOADER = """\
import os,sys,zlib
n,tag,d=int(sys.argv[1]),sys.argv[2],os.path.expanduser(sys.argv[3])
z=sys.stdin.buffer.read(n)
name="orch_supervisor_"+tag
f=os.path.join(d,name+".py")
if not os.path.exists(f):
    os.makedirs(d,exist_ok=True)
    t="%s.%d"%(f,os.getpid())
    with open(t,"wb") as o:
        o.write(zlib.decompress(z))
    os.replace(t,f)
sys.path.insert(0,d)
sys.exit(__import__(name).main(sys.argv[4:]))
"""


SHELL_NOT_FOUND = (126, 127)


@functools.cache
def packed_supervisor() -> bytes:
    """The supervisor as `supervisor_command` wants it first on stdin."""
    return zlib.compress(supervisor_source(), 9)


@functools.cache
def _supervisor_tag() -> str:
    return hashlib.sha256(supervisor_source()).hexdigest()[:16]


def supervisor_command(host: Host, command: str) -> str:
    """The command line that runs a supervisor command; `packed_supervisor()` must come
    first on its stdin."""
    python, loader = sh_path(host.python), shlex.quote(LOADER)
    args = f"{len(packed_supervisor())} {_supervisor_tag()} {sh_path(store_dir(host) + '/bin')}"
    return f"{python} -I -S -c {loader} {args} {command}"


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object a supervisor command printed last, or None."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None
