"""`tool-put TOOLS_DIR NAME SHA256` (stdin: the binary): keep a tool orch carries to
hosts (py-spy), under its hash, as the agent is kept per version.

The bytes are checked against the hash before they are kept, written beside their
final name and renamed into place (hosts that share a home may race), executable by
the user alone, in a directory that is the user's alone: a tool in a place another
user can write would run as this user. Reply: {"kept": path} or {"error": why}.
"""

from __future__ import annotations

import os
import sys

from ..kernel import cjson
from ..kernel.layout import tool_name


def main(args: list[str]) -> int:
    if len(args) != 3:
        sys.stderr.write("usage: tool-put TOOLS_DIR NAME SHA256\n")
        return 2
    folder, name, sha = os.path.expanduser(args[0]), args[1], args[2]
    try:
        path = os.path.join(folder, tool_name(name, sha))
    except ValueError as exc:
        return answer({"error": str(exc)})
    # Here, not at the top: `stack` imports this module for `mine` on every host, and
    # hashlib loads OpenSSL (3 to 5 ms of each host's CPU there, for nothing).
    import hashlib

    data = sys.stdin.buffer.read()
    if hashlib.sha256(data).hexdigest() != sha:
        return answer({"error": f"{name}: the bytes that came do not match their hash"})
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        mine(folder)
        tmp = f"{path}.{os.uname().nodename}-{os.getpid()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        return answer({"error": f"{name}: {exc}"})
    return answer({"kept": path})


def mine(folder: str) -> None:
    """Raise ValueError unless `folder` is this user's, and nobody else may write it."""
    info = os.stat(folder)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ValueError(
            f"{folder} is not yours alone (owner uid {info.st_uid}, mode "
            f"{info.st_mode & 0o7777:o}): orch runs no tool from there"
        )


def answer(reply: dict[str, str]) -> int:
    sys.stdout.write(cjson.dumps(reply) + "\n")
    return 0 if "kept" in reply else 1
