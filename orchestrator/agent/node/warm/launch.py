"""torchrun's job for one node, done by a launcher forked from a warm process
(interpreters.py): it forks each local rank instead of starting an interpreter per rank.

What each rank gets is what torchrun 2.x (static rendezvous, `LocalElasticAgent`)
gives a worker, and what the agent's `rank` entry (rank.py) then does:

- its own session (torchrun starts workers with `start_new_session`), stdin
  /dev/null, stdout and stderr to `logs/rank-N.log`, its pid in `logs/rank-N.pid`;
- the node's environment and torchrun's variables: RANK, LOCAL_RANK, GROUP_RANK,
  ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE,
  ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_{RESTART_COUNT,
  MAX_RESTARTS, RUN_ID, USE_AGENT_STORE, ERROR_FILE, SIGNALS_TO_HANDLE},
  TORCH_NCCL_ASYNC_ERROR_HANDLING, OMP_NUM_THREADS=1 where unset and more than one
  process runs (torchrun says so in its log, as here);
- cwd the code snapshot, argv `[script, *args]` (`-m`: the module's path),
  `sys.path[0]` the script's directory (`-m`: the cwd), `__name__ == "__main__"`,
  unbuffered stdio, `sys.orig_argv` of `python -u ...`.

The rendezvous is torchrun's: node 0's launcher serves the TCPStore at the master's
port (`TORCHELASTIC_USE_AGENT_STORE`: the ranks connect to it as clients), every
launcher writes its role info and reads its assigned ranks there under the run id
`none`, and waits at torchrun's exit barrier once its ranks succeeded: a node may run
warm beside nodes that run torchrun. When a rank fails the launcher ends the others
(TERM, 30 s, KILL, as torchrun) and reports the first failure as torchrun does
(`Root Cause ... rank ... exitcode`), exiting 1.

Runs in a process that imported torch; standard library otherwise (an agent module).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from ...host import proc
from ...kernel.layout import AGENT, RUN_SCRIPT
from .. import spawn
from ..rank import to_own_log
from .interpreters import rank_env_at_import, version_dir

RUN_ID = "none"  # torchrun's default --rdzv-id
ROLE = "default"
STOP_GRACE_S = 30.0  # torchrun's _shutdown timeout
EXIT_BARRIER_S = 300.0  # torchrun's --exit-barrier-timeout... default
STORE_TIMEOUT_S = 600  # static rendezvous's default
TERMINAL_STATE = "torchelastic/agent/terminal_state"
C_UNBUFFERED = 2  # _IONBF, for setvbuf
OMP_NOTICE = (
    "*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
    "to avoid your system being overloaded, please further tune the variable for optimal "
    "performance in your application as needed. \n"
    "*****************************************\n"
)
_FLAGS = {
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--nproc-per-node": "nproc",
    "--master-addr": "master_addr",
    "--master-port": "master_port",
    "--max-restarts": "max_restarts",
    "--local-addr": "local_addr",
}


def node_request(argv: list[str]) -> dict[str, Any]:
    """What the launcher needs, from the node's torchrun command (placement.py's
    `torchrun_argv` and `_entry_argv`); `{"cold": why}` where it cannot do that
    command's job exactly."""
    if argv[1:3] != ["-m", "torch.distributed.run"]:
        return {"cold": "the job's launcher is not torchrun"}
    given: dict[str, Any] = {"python": argv[0], "argv": list(argv)}
    at = 3
    while at < len(argv) and argv[at].startswith("--"):
        name = _FLAGS.get(argv[at])
        if name is None or at + 1 >= len(argv):
            return {"cold": f"torchrun option {argv[at]} is not one the warm start knows"}
        given[name] = argv[at + 1]
        at += 2
    entry = argv[at : at + 2]
    if entry != [f"{AGENT}/{RUN_SCRIPT}", "rank"] or "--" not in argv[at:]:
        return {"cold": "the node's command is not orch's torchrun command"}
    if not all(k in given for k in ("nnodes", "node_rank", "nproc", "master_addr", "master_port")):
        return {"cold": "the node's torchrun command lacks a rendezvous option"}
    if int(given.get("max_restarts") or 0):
        return {"cold": "max_restarts: torchrun restarts its own workers"}
    split = argv.index("--", at)
    given["rank_args"], given["user_args"] = argv[at + 2 : split], argv[split + 1 :]
    for name in ("nnodes", "node_rank", "nproc", "master_port", "max_restarts"):
        given[name] = int(given.get(name) or 0)
    return given


def launch_request(start: spawn.NodeStart) -> dict[str, Any]:
    """What the supervisor sends a warm interpreter for this node: the node's start as
    spawn.py planned it, and its torchrun command read back (`node_request`)."""
    return {**node_request(start.argv), **start.as_dict()}


def rank_env(
    env: dict[str, str], request: dict[str, Any], local_rank: int, first: int, world: int
) -> dict[str, str]:
    """A rank's environment as torchrun's LocalElasticAgent builds it (static
    rendezvous, no restart yet), over the node's."""
    nproc, nnodes = int(request["nproc"]), int(request["nnodes"])
    rank = str(first + local_rank)
    worker = {
        "RANK": rank,
        "GROUP_RANK": str(request["node_rank"]),
        "ROLE_RANK": rank,
        "ROLE_NAME": ROLE,
        "LOCAL_WORLD_SIZE": str(nproc),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": str(request["master_addr"]),
        "MASTER_PORT": str(request["master_port"]),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(request.get("max_restarts") or 0),
        "TORCHELASTIC_RUN_ID": RUN_ID,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "LOCAL_RANK": str(local_rank),
    }
    return {**env, **worker}


def node_env(env: dict[str, str], nproc: int) -> tuple[dict[str, str], str]:
    """The node's environment as torchrun's own process has it once it started, and
    what torchrun printed about it."""
    said = "" if "OMP_NUM_THREADS" in env or nproc <= 1 else OMP_NOTICE
    env = rank_env_at_import(env, nproc)
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    return env, said


def ranks_of(env: dict[str, str], request: dict[str, Any]) -> tuple[int, int]:
    """The node's first global rank and the world size: torchrun's rank assignment
    (nodes in node-rank order, each its process count), from orch's process counts."""
    counts = [int(n) for n in env.get("ORCH_NPROCS_LIST", "").split(",") if n.strip()]
    node_rank = int(request["node_rank"])
    if len(counts) != int(request["nnodes"]):
        raise ValueError("ORCH_NPROCS_LIST does not match --nnodes")
    return sum(counts[:node_rank]), sum(counts)


# ---------------------------------------------------------------- the launcher


def run_node(conn: socket.socket, request: dict[str, Any]) -> RankRun:
    """In the launcher forked from the warm process: start the node's ranks, watch
    them, answer on `conn` how the node ended and exit. Returns only in a rank."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # The node's session, directory, environment and output, as a cold start's torchrun
    # under its supervisor has them (spawn.py decides them for both).
    spawn.enter(spawn.NodeStart.from_dict(request))
    env, said = node_env(dict(os.environ), int(request["nproc"]))
    os.environ.update(env)
    retitle(request["argv"], env)
    conn.sendall(
        json.dumps({"pid": os.getpid(), "start_time": proc.start_time(os.getpid())}).encode()
        + b"\n"
    )
    if said:
        sys.stderr.write(said)
    node = Node(conn, request, env)
    rank = node.start()
    if rank is not None:
        return rank
    code = node.watch()
    # The ranks' error files were read (`_report`): nothing reads them once the node
    # ended. torchrun leaves its directory in /tmp; one per node start piles up there.
    shutil.rmtree(node.errors, ignore_errors=True)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Stop(Exception):
    """A signal to the launcher: end the ranks, then the node."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Node:
    """The ranks of one node, launched, watched and stopped as torchrun would."""

    def __init__(self, conn: socket.socket, request: dict[str, Any], env: dict[str, str]) -> None:
        self.conn, self.request, self.env = conn, request, env
        self.ranks: dict[int, tuple[int, int]] = {}  # pid -> (local rank, global rank)
        self.store: Any = None
        self.store_error: str | None = None
        self.errors = tempfile.mkdtemp(prefix="torchelastic_")

    def start(self) -> RankRun | None:
        """Fork the ranks; in each rank, what runs its code. None in the launcher."""
        first, world = ranks_of(self.env, self.request)
        run_dir = tempfile.mkdtemp(prefix=f"{RUN_ID}_", dir=self.errors)
        for local_rank in range(int(self.request["nproc"])):
            env = rank_env(self.env, self.request, local_rank, first, world)
            error_dir = os.path.join(run_dir, "attempt_0", str(local_rank))
            os.makedirs(error_dir)
            env["TORCHELASTIC_ERROR_FILE"] = os.path.join(error_dir, "error.json")
            pid = os.fork()
            if pid == 0:
                fresh_random_state()
                self.conn.close()
                os.setsid()  # each rank its own session, as torchrun's workers
                os.environ.clear()
                os.environ.update(env)
                return RankRun(self.request, env)
            self.ranks[pid] = (local_rank, first + local_rank)
        threading.Thread(target=self._rendezvous, daemon=True).start()
        return None

    def _rendezvous(self) -> None:
        """torchrun's static rendezvous and rank assignment, through its store, so that
        torchrun nodes of the same job find this one as they would another torchrun."""
        try:
            import importlib
            from datetime import timedelta

            dist: Any = importlib.import_module("torch.distributed")
            request, node_rank = self.request, int(self.request["node_rank"])
            nnodes = int(request["nnodes"])
            tcp = dist.TCPStore(
                str(request["master_addr"]),
                int(request["master_port"]),
                nnodes,
                node_rank == 0,
                timedelta(seconds=STORE_TIMEOUT_S),
                multi_tenant=True,
            )
            store = dist.PrefixStore(RUN_ID, tcp)
            info = {"role": ROLE, "rank": node_rank, "local_world_size": int(request["nproc"])}
            store.set(f"torchelastic/role_info/{node_rank}", json.dumps(info).encode("UTF-8"))
            if node_rank == 0:
                infos = store.multi_get([f"torchelastic/role_info/{i}" for i in range(nnodes)])
                base, keys, values = 0, [], []
                sizes = [int(json.loads(raw)["local_world_size"]) for raw in infos]
                for i, size in enumerate(sizes):
                    keys.append(f"torchelastic/assigned_ranks/{i}")
                    values.append(json.dumps([base, sum(sizes), base, sum(sizes)]))
                    base += size
                store.multi_set(keys, values)
            store.get(f"torchelastic/assigned_ranks/{node_rank}")
            self.store = store
        except Exception as exc:
            self.store_error = f"{type(exc).__name__}: {exc}"
            sys.stderr.write(f"orch warm launcher: rendezvous store: {self.store_error}\n")

    def watch(self) -> int:
        """Wait for the ranks; the node's exit code (torchrun's: 0, or 1 on failure)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, _raise_stop)
        live = dict(self.ranks)
        failures: list[tuple[int, int, int, float]] = []  # local, global rank, code, when
        try:
            while live:
                pid, status = os.waitpid(-1, 0)
                if pid not in live:
                    continue
                local_rank, global_rank = live.pop(pid)
                code = exit_code(status)
                if code != 0:
                    failures.append((local_rank, global_rank, code, time.time()))
                    self._stop(live, signal.SIGTERM)
                    live.clear()
        except Stop as stop:
            self._stop(live, stop.signum)
            return 128 + stop.signum
        if failures:
            self._report(failures)
            return 1
        self._exit_barrier()
        return 0

    def _stop(self, live: dict[int, tuple[int, int]], sig: int) -> None:
        """End the remaining ranks' groups: `sig`, then up to 30 s, then KILL."""
        for pid in live:
            proc.signal_group(pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while live and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, Stop):
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid:
                    live.pop(pid, None)
                    continue
            time.sleep(0.05)
        for pid in live:
            proc.signal_group(pid, signal.SIGKILL)

    def _exit_barrier(self) -> None:
        """torchrun's: node 0 serves the store the other nodes' ranks still use."""
        deadline = time.monotonic() + EXIT_BARRIER_S
        while self.store is None and self.store_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.store is None:
            return
        try:
            from datetime import timedelta

            store = self.store
            store.set_timeout(timedelta(seconds=EXIT_BARRIER_S))
            nnodes = int(self.request["nnodes"])
            index = store.add(f"{TERMINAL_STATE}/num_members", 1)
            last = f"{TERMINAL_STATE}/last_member"
            if index == nnodes:
                store.set(last, "<val_ignored>")
            store.wait([last])
        except Exception as exc:
            sys.stderr.write(f"orch warm launcher: exit barrier: {exc}\n")

    def _report(self, failures: list[tuple[int, int, int, float]]) -> None:
        """The failures, as torchrun's ChildFailedError prints them (failure.py reads
        the root cause from it)."""
        first = min(failures, key=lambda f: f[3])
        kind = self.request["rank_args"][2:4]
        title = kind[1] if kind and kind[0] == "script" else " ".join(kind[1:])

        def block(failure: tuple[int, int, int, float]) -> list[str]:
            local_rank, global_rank, code, when = failure
            return [
                f"[{global_rank}]:",
                f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(when))}",
                f"  host      : {socket.getfqdn(socket.gethostname())}",
                f"  rank      : {global_rank} (local_rank: {local_rank})",
                f"  exitcode  : {code} (pid: ?)",
                "  error_file: <N/A>",
                "  traceback : To enable traceback see: "
                "https://pytorch.org/docs/stable/elastic/errors.html",
            ]

        others = [f for f in failures if f is not first]
        lines = ["=" * 60, f"{title} FAILED", "-" * 60, "Failures:"]
        for failure in others:
            lines += ["  " + line for line in block(failure)]
        if not others:
            lines.append("  <NO_OTHER_FAILURES>")
        lines += ["-" * 60, "Root Cause (first observed failure):", *block(first), "=" * 60]
        sys.stderr.write("\n".join(lines) + "\n")


def fresh_random_state() -> None:
    """In a forked rank: every random generator a new interpreter seeds from the OS,
    seeded so again, as a cold rank's would be: torch's default CPU generator
    (`torch.initial_seed()` then differs per rank and per run) and numpy's legacy
    global state. Python's `random` reseeds itself after a fork (its own at-fork
    hook). CUDA's generators are never made in the warm process (it refuses to serve
    where CUDA was initialised): each rank seeds its own at first use, as a new
    process does (tests/gpu/check_warm_fork_cuda.py). serve.py's
    `generator_refusal` makes sure there is no other generator a preload made at
    import. A script that seeds explicitly afterwards gets what it gets cold."""
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()  # the legacy global RandomState, from the OS as at import


def _raise_stop(signum: int, _frame: Any) -> None:
    raise Stop(signum)


def exit_code(status: int) -> int:
    """A wait status as torchrun reports it: the exit code, or minus the signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


# ---------------------------------------------------------------- a rank


class RankRun:
    """One rank, forked: what rank.py and the exec of `python -u` would do, then the
    user's code in this interpreter."""

    def __init__(self, request: dict[str, Any], env: dict[str, str]) -> None:
        self.request, self.env = request, env

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log_dir, code_dir, kind, target, *flag = self.request["rank_args"]
        to_own_log(log_dir, self.env.get("RANK", "0"))
        _unbuffered()
        os.chdir(code_dir)
        given = [f"{flag[0]}={self.env.get('LOCAL_RANK', '0')}"] if flag else []
        args = [*given, *self.request["user_args"]]
        entry = [target] if kind == "script" else ["-m", target]
        retitle([self.request["python"], "-u", *entry, *args], self.env)
        agent = version_dir()
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != agent]
        sys.orig_argv = [sys.executable, "-u", *entry, *args]
        if kind == "script":
            sys.argv = [target, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            return run_script(os.path.abspath(target))
        sys.argv = ["-m", *args]
        sys.path.insert(0, os.getcwd())
        return run_module(target)


def run_module(name: str) -> int:
    """Run a module as `python -m name` would. runpy runs it in `__main__`'s namespace:
    a new one, as `python -m` starts with, not the warm interpreter's (whose names
    would be among the module's globals)."""
    import runpy

    sys.modules["__main__"] = new_main()
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
    return 0


def run_script(path: str) -> int:
    """Run a script as `python path` would, in a new `__main__`. What it raises goes
    on to the rank's end (rank_end.py), which prints it as the interpreter would."""
    from importlib.machinery import SourceFileLoader

    main = new_main(
        __file__=path,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
        __cached__=None,
    )
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        source = f.read()
    exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    return 0


def new_main(**names: Any) -> Any:
    """A new `__main__` module, with what the interpreter gives it before the code
    runs (`__builtins__`, `__annotations__`) and `names`."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    for name, value in names.items():
        setattr(main, name, value)
    return main


def _unbuffered() -> None:
    """stdio as `python -u` has it: Python's stdout and stderr write through, and so
    do C's (what a C extension prints comes out where it printed it, not at exit)."""
    import ctypes

    with contextlib.suppress(OSError, ValueError, AttributeError):
        libc = ctypes.CDLL(None)
        for name in ("stdin", "stdout", "stderr"):
            libc.setvbuf(ctypes.c_void_p.in_dll(libc, name), None, C_UNBUFFERED, 0)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding=old.encoding,
            errors=old.errors,
            write_through=True,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def retitle(argv: list[str], env: dict[str, str]) -> None:
    """Write `argv` and `env` over this process's command line and environment in
    /proc (the room the warm process was started with), as an exec would have shown
    them: ps and orch top show the command, kill.py finds the job's tag. Call after
    the C environment no longer points into it (os.environ replaced) or before it
    is read again."""
    fields = proc.stat(os.getpid())
    if not fields or len(fields) < 49:
        return
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    tag = {k: v for k, v in env.items() if k == "ORCH_JOB_ID"}
    rest = {k: v for k, v in env.items() if k != "ORCH_JOB_ID"}
    words = [f"{k}={v}" for k, v in {**tag, **rest}.items()]
    with contextlib.suppress(OSError), open("/proc/self/mem", "r+b", buffering=0) as mem:
        for start, end, parts in ((arg_start, arg_end, argv), (env_start, env_end, words)):
            room = end - start
            data = b"".join(p.encode(errors="replace") + b"\0" for p in parts)
            if len(data) > room:  # whole entries only, the tag first
                kept = b""
                for part in data.split(b"\0")[:-1]:
                    if len(kept) + len(part) + 1 > room:
                        break
                    kept += part + b"\0"
                data = kept
            mem.seek(start)
            mem.write(data + b"\0" * (room - len(data)))
