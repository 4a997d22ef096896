"""How a rank's stack can be read while it runs (`orch stack`), arranged in the rank's
own process before the user's code starts: cold (rank.py, before it execs the user's
interpreter) and warm (warm/launch.py, in the forked rank) alike, both through
`rank.to_own_log`.

Two ways, the first wherever it holds:

- **ptrace** (py-spy, stack.py): another process of the same user reads the rank.
  Under Yama's `kernel.yama.ptrace_scope` 1 (Ubuntu's default) a process may trace
  only its descendants, and the `stack` command is no ancestor of the ranks: the rank
  names every process of its user as an allowed tracer (`prctl(PR_SET_PTRACER,
  PR_SET_PTRACER_ANY)`). Yama keeps that exception on the task, across the exec of
  the user's interpreter, until the rank exits; it widens nothing beyond the user:
  the kernel's own check (same uid, a dumpable process) still applies, so another
  user never reads these ranks. Scope 0 needs nothing; 2 (admins only) and 3 (no
  ptrace at all) leave only the second way.
- **faulthandler**: the rank prints its own Python stack when sent `SIGNAL` (a
  real-time signal, so that no library's use of SIGUSR1/2 is disturbed), to
  `logs/rank-N.faults`. Arranged where ptrace cannot hold (scope 2 or 3, or a
  prctl that fails), and where the job's env asks for it (`ORCH_STACKS=faulthandler`:
  a container whose seccomp forbids ptrace cannot be told from here). A warm rank
  registers it in its own interpreter; a cold rank's interpreter is the user's, which
  rank.py then starts through `BOOT`, which registers it before the user's code runs.

What was arranged is written to `logs/rank-N.trace` (JSON: `way`, `signal`,
`scope`, `why`) for the `stack` command to read.
"""

from __future__ import annotations

import os

from ..kernel import cjson

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Callable

YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
PR_SET_PTRACER = 0x59616D61  # "Yama"
PR_SET_PTRACER_ANY = (1 << 64) - 1  # (unsigned long)-1
ENV_WAY = "ORCH_STACKS"  # the job's env may say `faulthandler`
PTRACE, FAULTHANDLER = "ptrace", "faulthandler"
SIGNAL_OFFSET = 3  # SIGRTMIN+3: glibc keeps the two below SIGRTMIN for itself


def stack_signal() -> int:
    """The signal a faulthandler rank dumps its stack on."""
    import signal

    return int(signal.SIGRTMIN) + SIGNAL_OFFSET


def trace_file(log_dir: str, rank: str) -> str:
    return os.path.join(log_dir, f"rank-{rank}.trace")


def faults_file(log_dir: str, rank: str) -> str:
    return os.path.join(log_dir, f"rank-{rank}.faults")


def yama_scope(path: str = YAMA_SCOPE) -> int | None:
    """Yama's ptrace scope (0 to 3), or None where the kernel has no Yama."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def allow_tracing() -> str | None:
    """Name every process of this user as an allowed tracer of this one (Yama); None,
    or why it could not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ulong = ctypes.c_ulong
        done = libc.prctl(
            ctypes.c_int(PR_SET_PTRACER), ulong(PR_SET_PTRACER_ANY), ulong(0), ulong(0), ulong(0)
        )
    except (OSError, AttributeError, ImportError) as exc:
        return f"prctl: {exc}"
    if done != 0:
        return f"prctl(PR_SET_PTRACER): {os.strerror(ctypes.get_errno())}"
    return None


def decide(
    scope: int | None, asked: str | None, allow: Callable[[], str | None] = allow_tracing
) -> dict[str, object]:
    """Which way this rank's stack is read, making it possible where needed.

    Args:
        scope: Yama's ptrace scope (None: no Yama, as scope 0).
        asked: the job's ORCH_STACKS, if any.
        allow: what names this user's processes as tracers (scope 1).

    Returns:
        The trace record: {"way", "scope", "why"} (`signal` is added for faulthandler).
    """
    if asked == FAULTHANDLER:
        return {"way": FAULTHANDLER, "scope": scope, "why": f"the job's env sets {ENV_WAY}"}
    if scope is None or scope == 0:
        return {"way": PTRACE, "scope": scope, "why": "any process of the user may trace"}
    if scope == 1:
        failed = allow()
        if failed is None:
            return {"way": PTRACE, "scope": scope, "why": "PR_SET_PTRACER_ANY set"}
        return {"way": FAULTHANDLER, "scope": scope, "why": failed}
    return {
        "way": FAULTHANDLER,
        "scope": scope,
        "why": f"kernel.yama.ptrace_scope is {scope}: "
        + ("only root may trace" if scope == 2 else "no process may be traced"),
    }


def arrange(log_dir: str, rank: str) -> dict[str, object]:
    """Make this rank's stack readable, register faulthandler where that is the way
    (it holds in this interpreter: a warm rank's; a cold rank's exec starts `BOOT`),
    and record what was done. Never raises: a rank starts whatever happens here."""
    record = decide(yama_scope(), os.environ.get(ENV_WAY))
    if record["way"] == FAULTHANDLER:
        record["signal"] = stack_signal()
        record["faults"] = os.path.abspath(faults_file(log_dir, rank))
        register(str(record["faults"]), int(str(record["signal"])))
    try:
        fd = os.open(trace_file(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cjson.dumps(record))
    except OSError:
        pass
    return record


def register(path: str, signum: int) -> None:
    """faulthandler on `signum`, every thread, appended to `path` (kept open: the dump
    is written from the signal handler, where nothing may be opened)."""
    import faulthandler

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        faulthandler.register(signum, file=os.fdopen(fd, "ab", buffering=0), all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


# A cold faulthandler rank's interpreter starts here (`python -u -c BOOT FAULTS SIGNAL
# KIND TARGET ARGS...`): faulthandler registered, then the user's script run as
# `python script` would (argv, sys.path[0], __main__), or its module as `python -m`.
# Standard library only: the user's interpreter runs it, not the agent's.
BOOT = """\
import faulthandler,os,runpy,sys
_f=open(sys.argv[1],"ab",buffering=0)
faulthandler.register(int(sys.argv[2]),file=_f,all_threads=True)
_k,_t=sys.argv[3],sys.argv[4]
del sys.argv[:5]
if _k=="script":
    sys.argv.insert(0,_t);sys.path[0]=os.path.dirname(os.path.abspath(_t))
    del _k,_t;runpy.run_path(sys.argv[0],run_name="__main__")
else:
    sys.argv.insert(0,"-m");sys.path[0]=os.getcwd()
    runpy._run_module_as_main(_t,alter_argv=True)
"""


def boot_argv(python: str, record: dict[str, object], entry: list[str]) -> list[str]:
    """The cold rank's command: `python -u ENTRY` (`entry`: [script, args...] or ["-m",
    module, args...]), started through BOOT where faulthandler is the way (`record`:
    what `arrange` returned)."""
    if record.get("way") != FAULTHANDLER or "signal" not in record:
        return [python, "-u", *entry]
    kind, target, rest = (
        ("module", entry[1], entry[2:]) if entry[0] == "-m" else ("script", entry[0], entry[1:])
    )
    faults, signum = str(record["faults"]), str(record["signal"])
    return [python, "-u", "-c", BOOT, faults, signum, kind, target, *rest]
