"""How a forked rank ends: as a cold rank's interpreter ends, for everything the rank
made, without tearing down what the warm interpreter preloaded.

A cold rank ends by running Python's shutdown (join the threads, run `atexit`, tear
down every module) and then C's `exit()` (C `atexit` handlers, C++ static
destructors, C stdio flushed). In a rank forked from a warm interpreter, tearing down
the preloaded modules and torch's static destructors writes to most pages the rank
shares with the warm interpreter, so the kernel copies them: with torch preloaded,
0.16 CPU-seconds and about 120 MB copied per rank, just to free memory the process
gives back anyway. That cost grows with the preload (transformers' is several times
torch's), once per rank, at the moment a node's ranks all end at once.

So a forked rank ends here, in Python's own order:

1. an uncaught exception is printed (`sys.excepthook`), a `SystemExit` becomes its
   exit code (a non-integer code is printed, exit 1), as the interpreter does;
2. the non-daemon threads are joined (`threading._shutdown`);
3. the `atexit` functions run (logging's shutdown, multiprocessing's, the script's);
4. the modules the rank imported or made (`__main__` among them) are torn down, last
   imported first, then garbage is collected: the script's objects are finalized,
   their `__del__` runs and the files it left open are flushed and closed;
5. `sys.stdout`, `sys.stderr` and C's stdio buffers are flushed;
6. the process exits with `os._exit`; a rank ended by an uncaught KeyboardInterrupt
   kills itself with SIGINT, as Python does.

Not done, and so a difference from a cold rank that docs/WARM.md states: the preloaded
modules are not torn down (an object that only a preloaded module's state still holds
is not finalized) and C's `atexit` handlers and C++ static destructors do not run.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn


def end_rank(run: Callable[[], int]) -> NoReturn:
    """Run a forked rank's code (`run`, returning its exit code), then end the process
    as the module docstring says. Never returns."""
    before = dict(sys.modules)
    interrupted = False
    try:
        code = run()
    except SystemExit as exc:
        code = exit_status(exc.code)
    except KeyboardInterrupt as exc:
        interrupted = True
        code = 1
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException as exc:
        code = 1
        sys.excepthook(type(exc), exc, exc.__traceback__)
    shut_down(before)
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def exit_status(code: object) -> int:
    """The exit status of `SystemExit(code)`, as the interpreter makes it: None is 0,
    an integer is itself, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):  # a broken stderr: Python says nothing either
        sys.stderr.write(f"{code}\n")
    return 1


def shut_down(before: dict[str, Any]) -> None:
    """Python's shutdown for what the rank made since `before` (a copy of sys.modules
    from the rank's start): threads, atexit, its modules, garbage, stdio."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    _tear_down(made_since(before))
    _flush()


def made_since(before: dict[str, Any]) -> list[str]:
    """The modules in sys.modules that were not there, or were another module, in
    `before`, in import order (`__main__`, replaced by the script's, keeps its place)."""
    return [name for name, module in list(sys.modules.items()) if before.get(name) is not module]


def _tear_down(names: list[str]) -> None:
    """As the interpreter tears its modules down: out of sys.modules, garbage
    collected, then each module still alive cleared, last imported first (names with
    one leading underscore first, `__builtins__` kept), and garbage collected again."""
    modules = [sys.modules.pop(name) for name in names if name in sys.modules]
    gc.collect()
    for module in reversed(modules):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for underscored in (True, False):
            for key in list(namespace):
                if key == "__builtins__" or not isinstance(key, str):
                    continue
                if (key.startswith("_") and not key.startswith("__")) == underscored:
                    namespace[key] = None
    del modules
    gc.collect()


def _flush() -> None:
    """sys.stdout and sys.stderr, then every C stdio buffer (what a C extension
    printed), as `exit()` would."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    ctypes = sys.modules.get("ctypes")  # torch imports it; a preload without it has no C output
    if ctypes is not None:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).fflush(None)
