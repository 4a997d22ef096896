"""The host's policy file: what whoever administers the host says of its line (who may
use `high`, each user's limit, how fast waiting raises a job; fairness.py reads its
lines), trusted only where no user could have written it.

A policy file counts when it is a regular file of at most 64 KiB, owned by root or
by the host's owner (the owner of `/`: in a container or a user namespace, whoever
runs the host), writable by nobody else, in a folder that is owned by one of them
and writable by nobody else either. Any other file at the path is ignored, with a
warning that names it: the line then runs as if there were no policy. Every user's
agent reads the same path. ORCH_POLICY_FILE (the test harness sets it: its hosts share
this machine's /etc) is read only where POLICY_FILE does not exist: on a host whose
administrator wrote a policy, no user's environment can point their own agent at
another file (a root-owned file of no rules would lift their limit), and where there
is none, there is no limit to lift; the file it names must pass the same check.

The format is lines of words, not YAML or JSON: the agent is the standard library
on Python 3.8 (no PyYAML on the hosts), a bad line must be ignored alone with its
number named (a JSON file with one bad comma would be ignored whole), and whoever
administers the hosts writes it by hand (comments: `#`).
"""

from __future__ import annotations

import os
import pwd
import stat

from ..host import proc
from .fairness import MAX_POLICY, Rules, parse_policy
from .storage import O_CLOEXEC

POLICY_FILE = "/etc/orch/policy"


def policy_path() -> str:
    """Where this host's policy is: POLICY_FILE, or where that does not exist,
    ORCH_POLICY_FILE where set (the tests)."""
    if os.path.lexists(POLICY_FILE):
        return POLICY_FILE
    return os.environ.get("ORCH_POLICY_FILE") or POLICY_FILE


def trusted_owners() -> set[int]:
    """Who may write the policy: root, and the owner of `/` (the host's owner)."""
    return {0, os.stat("/").st_uid}


def load_policy(path: str | None = None) -> tuple[Rules, list[str]]:
    """The host's rules and what was ignored of them: the default rules (no
    limits, `high` for nobody) where there is no policy file or it is not trusted,
    with a warning naming it in the second case; each bad line named."""
    path = path or policy_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except FileNotFoundError:
        return Rules(), []
    except OSError as exc:
        return Rules(), [_ignored(path, f"it cannot be read ({exc.strerror})")]
    try:
        why = _untrusted(path, os.fstat(fd))
        if why:
            return Rules(), [_ignored(path, why)]
        data = os.read(fd, MAX_POLICY + 1)
    except OSError as exc:
        return Rules(), [_ignored(path, f"it cannot be read ({exc.strerror})")]
    finally:
        os.close(fd)
    if len(data) > MAX_POLICY:
        return Rules(), [_ignored(path, f"it is larger than {MAX_POLICY >> 10} KiB")]
    return parse_policy(data.decode("utf-8", "replace"), path, _user_id)


def _untrusted(path: str, info: os.stat_result) -> str:
    """Why the opened policy file (`info`) is not the administrator's, or ''."""
    owners = trusted_owners()
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid not in owners:
        return f"it belongs to {proc.user_name(info.st_uid)}, not root"
    if info.st_mode & 0o022:
        return f"its mode is {info.st_mode & 0o777:o}: others than its owner can change it"
    folder = os.path.dirname(os.path.abspath(path))
    try:
        where = os.lstat(folder)
    except OSError as exc:
        return f"its folder {folder} cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(where.st_mode):
        return f"its folder {folder} is a link"
    if where.st_uid not in owners:
        return f"its folder {folder} belongs to {proc.user_name(where.st_uid)}, not root"
    if where.st_mode & 0o022:
        return f"its folder {folder} has mode {where.st_mode & 0o777:o}: others can replace it"
    return ""


def _ignored(path: str, why: str) -> str:
    return f"ignored the policy file {path}: {why}; the line runs as if there were none"


def _user_id(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):  # no such user; a NUL or a lone surrogate in it
        return None
