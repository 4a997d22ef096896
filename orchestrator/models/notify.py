"""`notify:`: where word of a job's events goes (docs/RUNNING.md, "Word when a job
ends"), read and checked at load: a webhook's URL (http:// or https://) or a shell
command; the job file's key, `orch submit --notify`, else the default in the user's
config (`config_path`). The sending is agent/kernel/notify.py's.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

from orchestrator.models.errors import InputError
from orchestrator.models.schema import Where, check_keys, get_str, load_yaml

WEBHOOK_SCHEMES = ("http", "https")  # as agent/kernel/notify.py sends them
CONFIG_FILE = "notify.yaml"  # in $XDG_CONFIG_HOME/orch (else ~/.config/orch)
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
HINT = (
    "a webhook's URL (https://hooks.slack.com/services/..., a JSON POST of the message's "
    "text) or a shell command that gets ORCH_JOB_ID, ORCH_EVENT, ORCH_STATE and "
    "ORCH_EXIT_CODE, e.g. notify: 'echo \"$ORCH_JOB_ID $ORCH_STATE\" >> ~/jobs.log'"
)


def target_problem(target: str) -> str | None:
    """Why `target` is no notify target, or None: a URL whose scheme orch does not
    send to, or one that does not parse (no host, a bad port, spaces); an empty
    command. The problem names no more of a URL than its scheme: it may hold a token.
    """
    text = target.strip()
    if not text:
        return "an empty notify target"
    scheme = _SCHEME_RE.match(text)
    if scheme is None:
        return None  # a shell command: its text is the user's
    name = scheme.group(1).lower()
    if name not in WEBHOOK_SCHEMES:
        return f"a {name}:// URL: orch posts to http:// and https:// webhooks only"
    if any(c.isspace() for c in text):
        return f"the {name}:// URL has a space in it"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises on a port that is not a number, or out of range
    except ValueError:
        return f"the {name}:// URL does not parse (a bad port or address)"
    if not parts.hostname:
        return f"the {name}:// URL names no host"
    if port == 0:
        return f"the {name}:// URL's port is 0"
    return None


def load_notify(where: Where) -> str | None:
    """The job file's `notify:`, checked.

    Raises:
        SpecError: not a string, or not a target (target_problem), at the key.
    """
    value = get_str(where, "notify")
    if value is None:
        return None
    problem = target_problem(value)
    if problem is not None:
        raise where.error("notify", problem, HINT)
    return value.strip()


def check_flag(target: str) -> str:
    """`orch submit --notify TARGET`, checked.

    Raises:
        InputError: not a target (exit 2).
    """
    problem = target_problem(target)
    if problem is not None:
        raise InputError(f"--notify: {problem}", HINT)
    return target.strip()


def config_path() -> Path:
    """The user's default notify target's file: $XDG_CONFIG_HOME/orch/notify.yaml,
    else ~/.config/orch/notify.yaml."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "orch" / CONFIG_FILE


def default_notify(path: Path | None = None) -> str | None:
    """The default notify target (`notify: TARGET` in `path`, else config_path()), or
    None where there is no such file.

    Raises:
        SpecError: the file is there but wrong: its syntax, a key, or the target.
    """
    path = path or config_path()
    if not path.is_file():
        return None
    where = Where(str(path), load_yaml(path, "notify config"))
    check_keys(where, {"notify": None})
    return load_notify(where)
