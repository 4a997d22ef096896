"""`warm serve KEY IDLE PRELOAD ROOM`: the warm process itself (interpreters.py has the rest).

It imports the preload modules, refuses to serve where they left a thread a fork would
break or initialised CUDA, takes the fingerprint of everything it imported and of the
installed distributions, then waits on its owner-only socket. For each request of its
owner it checks the fingerprint (a changed file: it answers `stale` and ends) and forks
the node's launcher (launch.py). It ends after IDLE seconds unused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from typing import Any

from ...host import proc
from ...kernel.fileio import read_json, write_json
from ...kernel.limits import raise_open_files

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Callable

# A warm process answers in milliseconds on a quiet host (it stats every file it
# imported first); one that does not within this is replaced. 3 s was too short for a
# host whose cores are saturated, which then started cold.
ANSWER_S = 10.0


def serve(
    args: list[str], path: Callable[[str, str], str], agent_dir: str
) -> int | tuple[socket.socket, dict[str, Any]]:
    """The warm process. Returns its exit code; in a launcher it forked, the request
    and the connection to answer on.

    Args:
        path: where a key's file with this suffix is (interpreters.py says where they live).
        agent_dir: the agent version's directory (not a place of installed packages).
    """
    key, idle, preload = args[0], float(args[1]), json.loads(args[2])
    # The limits a cold rank inherits from its supervisor (`orch warm` starts this
    # process from a plain SSH session, the supervisor from its own).
    raise_open_files()
    record: dict[str, Any] = {
        "key": key,
        "pid": os.getpid(),
        "start_time": proc.start_time(os.getpid()),
        "python": sys.executable,
        "preload": preload,
        "idle": idle,
        "started": time.time(),
        "used": time.time(),
        "state": "starting",
    }
    write_json(path(key, ".json"), record)
    why = preload_refusal(preload)
    if why:  # stays, refused, so that each submit says why (until it expires)
        record.update(state="refused", why=why)
        write_json(path(key, ".json"), record)
        print(why, flush=True)
        # The same process (pid, start time) holds the record till it expires, without
        # the memory of what it imported.
        os.execv("/bin/sleep", ["orch-agent warm serve (refused)", str(int(idle))])
    fingerprint = Fingerprint(agent_dir)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(OSError):
        os.unlink(path(key, ".sock"))
    listener.bind(path(key, ".sock"))
    os.chmod(path(key, ".sock"), 0o600)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # launchers are reaped by the kernel
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    import gc

    gc.collect()
    gc.freeze()  # the forks' reference counts do not touch the objects imported here
    record["state"] = "ready"
    write_json(path(key, ".json"), record)
    import select

    while True:
        left = float(record["used"]) + idle - time.time()
        if left <= 0 or read_json(path(key, ".json")) != record:
            break  # expired, or stopped: another record took its place
        if not select.select([listener], [], [], min(left, 5.0))[0]:
            continue
        conn, _ = listener.accept()
        if peer_uid(conn) != os.getuid():
            conn.close()  # the socket is owner-only already; root aside, nobody comes here
            continue
        try:
            conn.settimeout(ANSWER_S)
            given = b""
            while b"\n" not in given:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    raise OSError("the supervisor went away")
                given += chunk
            launch = json.loads(given.split(b"\n", 1)[0])
        except (OSError, ValueError):
            conn.close()
            continue
        changed = fingerprint.changed()
        if changed or launch.get("check"):
            answer = {"stale": changed} if changed else {"fresh": True}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")
            conn.close()
            if changed:
                break
            continue
        if os.fork() == 0:
            listener.close()
            conn.settimeout(None)
            return conn, launch
        conn.close()
        record["used"] = time.time()
        write_json(path(key, ".json"), record)
    if read_json(path(key, ".json")) == record:
        for suffix in (".json", ".sock"):
            with contextlib.suppress(OSError):
                os.unlink(path(key, suffix))
    return 0


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[1])
    except OSError:
        return None


def preload_refusal(preload: list[str]) -> str | None:
    """Import the preload modules; why a fork of this process could not be trusted,
    or None: an import failed, a thread survives a fork (OpenBLAS's pool does not:
    its own fork handler stops it), CUDA was initialised."""
    import importlib

    from ..torchrun import collector_off

    for name in preload:
        try:
            with collector_off():
                importlib.import_module(name)
        except BaseException as exc:
            return f"preload {name} failed: {type(exc).__name__}: {exc}"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "a preload module initialised CUDA, and a forked rank cannot use it"
    held = kept_generators()
    if held:
        return (
            f"a preload module keeps a random generator made at import ({held[0]}): "
            "every forked rank would draw the same numbers from it"
        )
    pid = os.fork()  # a trial fork: the pools that stop for a fork stop now
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threads = os.listdir("/proc/self/task")
    if len(threads) > 1:
        return f"the preload left {len(threads) - 1} thread(s) running, which a fork would break"
    return None


def kept_generators() -> list[str]:
    """Random generators held by a module's globals that a rank's fork does not make
    fresh (launch.py's `fresh_random_state` reseeds Python's, torch's default and
    numpy's legacy global one): whether another was seeded from the OS or by its
    module cannot be told, and if from the OS every rank would share its draws."""
    import random

    kinds: list[type] = [random.Random]
    fresh = {id(getattr(random, "_inst", None))}
    numpy_random = sys.modules.get("numpy.random")
    for name in ("RandomState", "Generator", "BitGenerator"):
        kind = getattr(numpy_random, name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    fresh.add(id(getattr(getattr(numpy_random, "mtrand", None), "_rand", None)))
    torch = sys.modules.get("torch")
    torch_kind = getattr(torch, "Generator", None)
    if isinstance(torch_kind, type):
        kinds.append(torch_kind)
        fresh.add(id(getattr(torch, "default_generator", None)))
    held = []
    for name, module in list(sys.modules.items()):
        values = getattr(module, "__dict__", None)
        if not isinstance(values, dict):
            continue
        for attr, value in list(values.items()):
            # The class's own MRO: isinstance would run a metaclass's hooks.
            mro = type(value).__mro__
            if id(value) in fresh or random.SystemRandom in mro:
                continue
            if any(kind in mro for kind in kinds):
                held.append(f"{name}.{attr}")
    return sorted(held)


class Fingerprint:
    """What the warm process imported (each file's size and time) and which
    distributions are installed where it looks for modules: a change to either means
    a fresh interpreter would not be the same."""

    def __init__(self, agent_dir: str) -> None:
        self.agent_dir = agent_dir
        self.files = dict(self._files())
        self.dists = self._dists()

    @staticmethod
    def _files() -> list[tuple[str, tuple[int, int] | None]]:
        found = []
        paths = {os.path.realpath(sys.executable)}
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str):
                paths.add(path)
        for path in paths:
            found.append((path, _stat(path)))
        return found

    def _dists(self) -> dict[str, tuple[int, int] | None]:
        listed = {}
        for folder in sys.path:
            if not folder or not os.path.isdir(folder) or folder == self.agent_dir:
                continue
            with contextlib.suppress(OSError):
                for name in os.listdir(folder):
                    if name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")):
                        where = os.path.join(folder, name)
                        listed[where] = _stat(where)
        return listed

    def changed(self) -> str | None:
        """What changed since the fingerprint was taken, or None."""
        for path, seen in self.files.items():
            if _stat(path) != seen:
                return f"{path} changed since the warm interpreter started"
        now = self._dists()
        if now != self.dists:
            names = sorted(set(now).symmetric_difference(self.dists)) or sorted(
                p for p in now if now[p] != self.dists.get(p)
            )
            return f"the installed packages changed ({os.path.basename(names[0])})"
        return None


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
