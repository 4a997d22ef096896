"""Files on a host, written whole or not at all, and read without trusting them."""

from __future__ import annotations

import os

from . import cjson

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any


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
    write_bytes(path, cjson.dumps(data).encode())


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = cjson.loads(f.read())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
