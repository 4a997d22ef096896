"""How a forked rank ends: through the interpreter's own exit, as a cold rank's, except
for the C-level exit handlers the warm interpreter registered before the fork.

A cold rank ends by running Python's shutdown (join the threads, run `atexit`, tear
down every module) and then C's `exit()`: the C `atexit` handlers and C++ static
destructors of every library it loaded, then C's stdio flushed. In a rank forked from
a warm interpreter, the destructors of what the warm interpreter loaded (torch's
static registries) write to pages the rank shares with it, so the kernel copies them:
about half of what a rank's end cost (bench/rank_end.py), to free memory the process
gives back anyway.

So a forked rank ends as the interpreter ends any process, with Python's whole
shutdown, and C's `exit()` then stops early: `_exit` is an exit handler the rank
registers at its start (glibc's `on_exit`), so it runs before every handler registered
earlier, the warm interpreter's, and before the libraries' destructor functions.
Handlers the rank registers afterwards (`atexit`, a C++ static object of a library it
loads) and the main thread's `thread_local` destructors run as in a cold rank. C's
stdio buffers are flushed after the script's `atexit` functions, waiting at most
FLUSH_WAIT_S; what C code writes to a C stream after that is not flushed. Where
`on_exit` is missing (not glibc), C's `exit()` runs in full, as before.

An uncaught exception is printed as `python script` or `python -m module` prints it,
without orch's frames, and the rank's exit status is 1; a KeyboardInterrupt ends it by
SIGINT after the shutdown, as CPython does.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

# What holds the agent's package (a host's agent version directory, with run.py): a
# rank's traceback is printed from the first frame after the last one in here.
AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
FLUSH_WAIT_S = 1.0


def end_rank(run: Callable[[], int]) -> NoReturn:
    """Run a forked rank's code (`run`, returning its exit code) and end the process
    as the module docstring says. Never returns: raises SystemExit."""
    libc = _libc()
    if libc is not None:
        atexit.register(_flush_c_stdio, libc.fflush)  # after the script's atexit functions
        _on_exit(libc, "_exit")
    try:
        code = run()
    except SystemExit:
        raise  # the interpreter makes its exit status and message, as cold
    except BaseException as exc:
        _print_uncaught(exc)
        code = 1
        # CPython kills itself with SIGINT once its shutdown is done: here C's exit()
        # does, with the status as the signal: `signal(status, SIG_DFL)` (SIG_DFL is
        # NULL, on_exit's argument), then `raise(status)`, newest first. Once `raise`
        # is registered the status must be SIGINT, whatever else fails.
        if type(exc) is KeyboardInterrupt and libc is not None and _on_exit(libc, "raise"):
            _on_exit(libc, "signal")
            code = signal.SIGINT
    raise SystemExit(code)


def _flush_c_stdio(fflush: Callable[[Any], object]) -> None:
    """C's `fflush(NULL)`, in a thread of its own, waited for at most FLUSH_WAIT_S:
    it takes each stream's lock, and a thread that holds one (blocked reading a C
    stream) would hang the rank's end, where `exit()`'s own flush takes none."""
    try:
        flusher = threading.Thread(target=fflush, args=(None,), daemon=True)
        flusher.start()
    except RuntimeError:  # no new thread at this point of the shutdown
        return
    flusher.join(FLUSH_WAIT_S)


def _libc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except (ImportError, OSError):
        return None
    glibc = all(hasattr(libc, name) for name in ("on_exit", "_exit", "raise", "signal", "fflush"))
    return libc if glibc else None


def _on_exit(libc: Any, name: str) -> bool:
    """Register libc's `name` as an exit handler, before every handler registered
    earlier: `on_exit` calls it with the exit status and NULL (`_exit(status)` and
    `raise(status)` leave the NULL unread; `signal(status, NULL)` is SIG_DFL)."""
    import ctypes

    try:
        function = ctypes.cast(getattr(libc, name), ctypes.c_void_p)
        return bool(libc.on_exit(function, None) == 0)
    except (AttributeError, OSError, ctypes.ArgumentError):
        return False


def _print_uncaught(exc: BaseException) -> None:
    """Print an uncaught exception as the interpreter does (`sys.last_*` set, then
    `sys.excepthook`), from the first frame after orch's last: the script's, or
    runpy's for `-m`, as a cold rank's traceback starts."""
    trace, after = exc.__traceback__, exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename.startswith(AGENT_ROOT + os.sep):
            after = trace.tb_next
        trace = trace.tb_next
    exc.__traceback__ = after
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, after
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(type(exc), exc, after)
    except BaseException as hook_failed:  # as the interpreter: both, with its own hook
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_failed), hook_failed, hook_failed.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, after)
