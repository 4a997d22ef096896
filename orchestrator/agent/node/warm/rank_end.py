"""How a forked rank ends: as a cold rank's interpreter ends, for everything the rank
made, without tearing down what the warm interpreter preloaded.

A cold rank ends by running Python's shutdown (join the threads, run `atexit`, tear
down every module) and then C's `exit()` (C `atexit` handlers, C++ static
destructors, C stdio flushed). In a rank forked from a warm interpreter, tearing down
the preloaded modules and torch's static destructors writes to most pages the rank
shares with the warm interpreter, so the kernel copies them: with torch preloaded,
about 0.15 CPU-seconds and 90 MB more per rank (bench/rank_end.py), to free memory
the process gives back anyway. That cost grows with the preload, once per rank, at the
moment a node's ranks all end together.

So a forked rank ends here, in the order CPython's own exit takes:

1. an uncaught exception is printed (`sys.excepthook`, orch's frames left out, as
   `python script` or `python -m module` would print it) and its exit status is 1; a
   `SystemExit` becomes its exit status as the interpreter makes it (a non-integer is
   printed, 1);
2. the non-daemon threads are joined (`threading._shutdown`);
3. the `atexit` functions run;
4. other threads get no more turns (a long switch interval: CPython stops its daemon
   threads here);
5. the modules the rank imported, and its `__main__`, are dropped and garbage is
   collected: the script's objects are finalized with their globals in place, their
   `__del__` runs and the files it left open are flushed (those its modules' globals
   hold first) and closed; what is still alive after that is cleared, last imported
   first, and collected again;
6. `sys.stdout` and `sys.stderr`, then C's stdio buffers, are flushed (a failed flush
   of Python's is exit status 120, as CPython makes it);
7. the process exits with `os._exit`; a rank ended by an uncaught KeyboardInterrupt
   kills itself with SIGINT, as CPython does.

A step that raises is printed and the end goes on, as in CPython's finalization. Not
done, and so a difference from a cold rank that docs/WARM.md states: the preloaded
modules are not torn down (an object that only a preloaded module's state still holds
is not finalized), and C's `atexit` handlers and C++ static destructors do not run.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

# orch's own package: its frames are left out of a rank's traceback
ORCH_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
C_LONG_MAX = 2**63 - 1
SIGINT_UNKILLED = 130  # CPython's exit status when SIGINT does not end it


def end_rank(run: Callable[[], int]) -> NoReturn:
    """Run a forked rank's code (`run`, returning its exit code), then end the process
    as the module docstring says. Never returns."""
    before = dict(sys.modules)
    code, interrupted = 1, False
    try:
        try:
            code = run()
        except SystemExit as exc:
            code = exit_status(exc.code)
        except BaseException as exc:
            interrupted = type(exc) is KeyboardInterrupt
            _print_uncaught(exc)
        if not shut_down(before):
            code = 120
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = SIGINT_UNKILLED
    finally:
        os._exit(code)


def exit_status(code: object) -> int:
    """The exit status of `SystemExit(code)`, as the interpreter makes it: None is 0,
    an integer is itself (one beyond a C long is -1), modulo 256; anything else is
    printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -C_LONG_MAX - 1 <= code <= C_LONG_MAX else -1) & 0xFF
    with contextlib.suppress(Exception):  # a broken stderr: Python says nothing either
        sys.stderr.write(str(code) + "\n")
    return 1


def shut_down(before: dict[str, Any]) -> bool:
    """Python's shutdown for what the rank made since `before` (a copy of sys.modules
    from the rank's start): threads, atexit, its modules, garbage, stdio. False where
    flushing Python's stdout or stderr failed."""
    c_flush = _c_flush()  # before the teardown, which may drop ctypes
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        _step(shutdown)
    _step(atexit._run_exitfuncs)  # Python 3.8 and 3.9 raise the last failure again
    _step(lambda: sys.setswitchinterval(1e6))
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        sys.__dict__.pop(name, None)  # as CPython's teardown begins: they hold frames
    _step(lambda: _tear_down(made_since(before)))
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            flushed = False
    if c_flush is not None:
        _step(c_flush)
    return flushed


def made_since(before: dict[str, Any]) -> list[str]:
    """`__main__` and the modules in sys.modules that were not there, or were another
    module, in `before`, in import order."""
    made = [name for name, module in list(sys.modules.items()) if before.get(name) is not module]
    return made if "__main__" in made else ["__main__", *made]


def _tear_down(names: list[str]) -> None:
    """As CPython tears its modules down: out of sys.modules and garbage collected, so
    that what they held is finalized with its module's globals in place; then each
    module still alive is cleared, last imported first (names with one leading
    underscore first, `__builtins__` kept), and garbage collected again."""
    alive = []
    module = None
    for name in names:
        module = sys.modules.pop(name, None)
        _flush_files(module)
        with contextlib.suppress(TypeError):  # a module without weak references
            alive.append(weakref.ref(module))
    del module
    gc.collect()
    for ref in reversed(alive):
        namespace = getattr(ref(), "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for underscored in (True, False):
            for key in list(namespace):
                if key == "__builtins__" or not isinstance(key, str):
                    continue
                if (key.startswith("_") and not key.startswith("__")) == underscored:
                    namespace[key] = None
        del namespace
    gc.collect()


def _flush_files(module: object) -> None:
    """Flush the files a module's globals hold open. Collected in one cycle with
    their module, a file's descriptor can be closed before its buffer is written (the
    collector finalizes them in no set order); a cold exit writes them."""
    import io

    for value in list(getattr(module, "__dict__", {}).values()):
        if isinstance(value, io.IOBase) and not value.closed:
            with contextlib.suppress(Exception):
                value.flush()


def _print_uncaught(exc: BaseException) -> None:
    """Print an uncaught exception as the interpreter does (`sys.last_*` set, then
    `sys.excepthook`), without the frames of orch that ran the rank's code."""
    trace = exc.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename.startswith(ORCH_PACKAGE + os.sep):
        trace = trace.tb_next
    exc.__traceback__ = trace
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, trace
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(type(exc), exc, trace)
    except BaseException:  # a hook that raises: Python falls back to its own
        _step(lambda: sys.__excepthook__(type(exc), exc, trace))


def _step(call: Callable[[], object]) -> None:
    """One step of the end: what it raises is printed, and the end goes on."""
    try:
        call()
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()


def _c_flush() -> Callable[[], object] | None:
    """C's `fflush(NULL)`: what a C extension printed into a buffer, written, as
    `exit()` writes it."""
    try:
        import ctypes

        fflush = ctypes.CDLL(None).fflush
    except (ImportError, OSError, AttributeError):
        return None
    return lambda: fflush(None)
