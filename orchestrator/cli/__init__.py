"""The `orch` command line: parse, print, exit. The only module that does any of those.

Results go to stdout (the job id, the ranks' lines), diagnostics to stderr. Every
OrchError is caught in `main` and shown as `error: ...` and `hint: ...` with its exit
code; no traceback ever reaches the user.

Each verb is its own `cmd_*` module, imported when the verb runs (`app.VERBS`);
`app` holds the options they share and `console` what a running job shows.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import NoReturn

from orchestrator.api import raise_open_files
from orchestrator.api.errors import EXIT_INTERRUPTED, OrchError
from orchestrator.cli.app import app
from orchestrator.cli.console import ConsoleReporter

__all__ = ["ConsoleReporter", "app", "main"]


def main() -> NoReturn:
    """Entry point: run the app; map errors to `error:`/`hint:` lines and exit codes.

    typer itself turns usage errors into exit 2 and Ctrl-C into exit 130.
    """
    # Whatever orch writes (job records with the inventory's env, the log mirror,
    # what it pushed where) is the user's alone.
    os.umask(0o077)
    raise_open_files()  # a socket per host and a mirror file per rank: docs/SCALE.md
    try:
        app()
    except OrchError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", "", EXIT_INTERRUPTED)
    except Exception as exc:  # anything unforeseen: still never a traceback
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
        _fail(f"internal error: {exc!r}", "run again with -vv and report the output", 1)
    finally:
        # The interpreter's exit collects every object the imports made, again and
        # again while it clears the modules: 80 ms of each command (`orch kill`:
        # bench/failure.py --only kill).
        # Frozen, they are left to the exit itself, which still runs in full.
        gc.freeze()
    sys.exit(0)


def _fail(message: str, hint: str, code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.exit(code)
