"""`torchrun ARGS`: a node's torchrun, `python -m torch.distributed.run ARGS` itself,
started and ended for about a third less CPU.

Importing torch allocates about a million objects, and the cycle collector walks
every survivor again and again while it does, then once more per module as the
interpreter clears them at exit: measured on 2 cores, a one-rank torchrun used 2.7 s
of CPU that way and 1.9 s this way (2.8 s and 2.0 s wall). Here torch is imported
with the collector off, and what was imported is frozen (`gc.freeze`): later
collections skip it, the exit's too. Nothing else differs: the same parser and
`main` (argument errors, exit codes, its own signal handling), the normal exit
(atexit, threads, logging).

The node's command keeps its `-m torch.distributed.run` form everywhere a person or
the warm start reads it (node.json, the dry run); `command` turns it into this entry
only where the supervisor or Slurm's node launcher starts it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator, Sequence

from ..kernel.layout import AGENT, RUN_SCRIPT

MODULE = "torch.distributed.run"


def command(argv: Sequence[str]) -> list[str]:
    """The command that starts `argv` (a node's command, run in its node directory):
    through this entry where it is torchrun, else unchanged."""
    if list(argv[1:3]) == ["-m", MODULE]:
        return [argv[0], f"{AGENT}/{RUN_SCRIPT}", "torchrun", *argv[3:]]
    return list(argv)


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Imports in here are not slowed by the cycle collector; what they left is
    frozen after: it is kept for the life of the process anyway."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()


def main(args: list[str]) -> int:
    with collector_off():  # by name: the agent imports nothing but the standard library,
        run = importlib.import_module(MODULE)  # and this process is the job's torchrun
    sys.argv = [run.__file__ or MODULE, *args]  # as `-m` leaves it, for torchrun's usage lines
    run.main(args)
    return 0
