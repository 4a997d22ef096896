"""The open-files limit, raised to what the system allows before anything opens many.

A shell hands its processes a soft limit of 1,024 open files on most Linux systems
and 256 on macOS, far below the hard limit. Two parts of a job need more at scale:
the controller holds a socket per host and, while it follows a job, a mirror file per
rank (10 per 8-GPU host); the master's torchrun serves its rendezvous store to every
torchrun and rank of the job (9 per 8-GPU host) and drops clients past its limit with
"Broken pipe". Raising the soft limit needs no privilege; torchrun and the ranks
inherit it from the supervisor. See docs/SCALE.md.
"""

from __future__ import annotations

import resource
import sys

# macOS refuses a soft limit above OPEN_MAX even when the hard limit is unlimited.
UNLIMITED_CAP = 10_240 if sys.platform == "darwin" else 1 << 20


def raise_open_files() -> int:
    """Lift this process's soft limit on open files to its hard limit; never lowers
    it and never fails. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the limit stays as it was: orch works below scale
    return soft
