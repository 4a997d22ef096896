"""Warm starts, the pure parts: the job keys, the node's torchrun command read back,
each rank's environment as torchrun builds it, the warm key."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.kernel import placement
from orchestrator.agent.kernel.requests import NodeTemplate
from orchestrator.agent.node.warm import fork, launch
from orchestrator.agent.node.warm import interpreters as warm
from orchestrator.models.job import Overrides, load_job, with_overrides
from tests.support import REPO_ROOT
from tests.unit.conftest import WriteFile, expect_input_error


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hello')\n")
    return tmp_path / "code"


def test_warm_keys_default_to_torch_ten_minutes_and_warm(write: WriteFile, code: Path) -> None:
    job = load_job(write("job.yaml", "workdir: code\nscript: train.py\n"))
    assert (job.preload, job.warm_idle, job.cold) == (("torch",), 600, None)
    job = load_job(
        write(
            "job.yaml",
            "workdir: code\nscript: train.py\npreload: [torch, numpy.linalg]\n"
            "warm_idle: 30\nwarm: false\n",
        )
    )
    assert (job.preload, job.warm_idle, job.cold) == (
        ("torch", "numpy.linalg"),
        30,
        "warm: false in the job file",
    )
    assert with_overrides(job, Overrides(cold=True)).cold == "--cold"


@pytest.mark.parametrize(
    ("line", "where"),
    [("warm: maybe", "warm: 'maybe' is not true or false"), ("preload: [torch, 'a b']", "preload")],
)
def test_bad_warm_keys_are_input_errors_at_their_line(
    write: WriteFile, code: Path, line: str, where: str
) -> None:
    path = write("job.yaml", f"workdir: code\nscript: train.py\n{line}\n")
    error = expect_input_error(lambda: load_job(path))
    assert error.line == 3
    assert where in error.message


def node_argv(max_restarts: int = 0, launcher: str = "torchrun") -> list[str]:
    template = NodeTemplate(
        job_id="j-1",
        launcher=launcher,
        entry=["script", "train.py"],
        local_rank_arg=None,
        max_restarts=max_restarts,
        args=["--lr", "{node_rank}"],
        env={},
        host="b",
        python="/venv/bin/python",
        workdir="~/.orch",
        host_env={},
        gpus=[],
        iface="eth0",
        addr="10.0.0.2",
    )
    place = placement.placement(["a", "b"], [2, 3], "10.0.0.1", 29500)
    return placement.render(template, place)[0]


def test_the_node_command_reads_back_as_what_torchrun_was_told() -> None:
    request = launch.node_request(node_argv())
    assert request["nnodes"] == 2 and request["node_rank"] == 1 and request["nproc"] == 3
    assert (request["master_addr"], request["master_port"]) == ("10.0.0.1", 29500)
    assert request["rank_args"] == ["logs", "code", "script", "train.py"]
    assert request["user_args"] == ["--lr", "1"]


def test_what_warm_cannot_stand_in_for_starts_cold_with_its_reason() -> None:
    assert launch.node_request(node_argv(max_restarts=2)) == {
        "cold": "max_restarts: torchrun restarts its own workers"
    }
    assert launch.node_request(node_argv(launcher="python")) == {
        "cold": "the job's launcher is not torchrun"
    }


def test_each_rank_gets_torchrun_s_variables() -> None:
    request = launch.node_request(node_argv())
    env = {"ORCH_NPROCS_LIST": "2,3", "PATH": "/bin"}
    first, world = launch.ranks_of(env, request)
    assert (first, world) == (2, 5)
    node, said = launch.node_env(env, 3)
    assert node["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" in said
    assert launch.node_env({**env, "OMP_NUM_THREADS": "4"}, 3) == (
        {
            **env,
            "OMP_NUM_THREADS": "4",
            "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        },
        "",
    )
    rank = launch.rank_env(node, request, 2, first, world)
    assert {k: rank[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")} == {
        "RANK": "4",
        "LOCAL_RANK": "2",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "5",
    }
    assert rank["LOCAL_WORLD_SIZE"] == "3" and rank["GROUP_WORLD_SIZE"] == "2"
    assert rank["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert rank["TORCHELASTIC_RUN_ID"] == "none" and rank["ROLE_NAME"] == "default"
    assert rank["MASTER_ADDR"] == "10.0.0.1" and rank["MASTER_PORT"] == "29500"


def test_the_warm_key_ignores_the_session_and_the_job_but_not_the_env() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/lib"}
    key = warm.key_of("/usr/bin/python3", base, ["torch"], 1)
    session = {**base, "SSH_CONNECTION": "1 2 3 4", "ORCH_JOB_ID": "j-2", "PWD": "/x"}
    assert warm.key_of("/usr/bin/python3", session, ["torch"], 1) == key
    assert warm.key_of("/usr/bin/python3", {**base, "OMP_NUM_THREADS": "2"}, ["torch"], 1) != key
    assert warm.key_of("/usr/bin/python3", base, ["torch", "numpy"], 1) != key


def test_an_environment_s_python_linked_to_the_base_one_has_a_key_of_its_own(
    tmp_path: Path,
) -> None:
    """A venv's bin/python is a link to the base interpreter but runs with the venv's
    packages: its warm process must not be the base one's (an environment job's ranks
    were forked from a warm process without the environment's packages)."""
    base = tmp_path / "base" / "python3"
    base.parent.mkdir()
    base.write_text("")
    venv_bin = tmp_path / "env" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(base)
    (tmp_path / "linked").symlink_to(venv_bin)
    env = {"PATH": "/bin"}
    venv = warm.key_of(str(venv_bin / "python"), env, ["torch"], 1)
    assert venv != warm.key_of(str(base), env, ["torch"], 1)
    # A link to the environment's folder is still that environment.
    assert warm.key_of(str(tmp_path / "linked" / "python"), env, ["torch"], 1) == venv


def test_the_warm_key_holds_the_thread_count_torchrun_gives_the_ranks() -> None:
    """Two ranks a node: torchrun sets OMP_NUM_THREADS=1, which thread pools read once
    at import; so a node of one rank and a node of two need two warm interpreters, and
    a node of two ranks and one that sets OMP_NUM_THREADS=1 itself share one."""
    base = {"PATH": "/bin"}
    one, two = (warm.key_of("/usr/bin/python3", base, ["torch"], n) for n in (1, 2))
    assert one != two
    assert warm.key_of("/usr/bin/python3", {**base, "OMP_NUM_THREADS": "1"}, ["torch"], 2) == two
    assert warm.key_of("/usr/bin/python3", {**base, "OMP_NUM_THREADS": "4"}, ["torch"], 2) != two
    assert warm.rank_env_at_import(base, 2) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert warm.rank_env_at_import(base, 1) == base
    assert launch.node_env(base, 2)[0]["OMP_NUM_THREADS"] == "1"


def test_a_warm_interpreter_carries_no_job_s_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with the environment of the job whose node just ended, it must not
    carry that job's tag: the job's teardown, `orch kill` and `orch top` find a job's
    processes by it, and would take the warm interpreter for one of them."""
    import os
    import subprocess
    import sys

    monkeypatch.setattr(warm, "warm_dir", lambda: str(tmp_path / "warm" / "host"))
    given: dict[str, str] = {}

    class Started:
        def __init__(self, argv: list[str], env: dict[str, str], **_: object) -> None:
            given.update(env)
            self.pid = os.getpid()

    monkeypatch.setattr(subprocess, "Popen", Started)
    env = {"ORCH_JOB_ID": "train-1", "ORCH_NODE_RANK": "0", "LR": "0.1", "PATH": "/bin"}
    assert warm.ensure(sys.executable, env, ["torch"], 60.0, 2)["started"] is True
    assert not any(name.startswith("ORCH_") and name != warm.ROOM_VAR for name in given)
    assert (given["LR"], given["PATH"]) == ("0.1", "/bin")
    assert given["OMP_NUM_THREADS"] == "1"  # what torchrun gives two ranks a node


def test_a_node_waits_for_a_warm_interpreter_still_importing_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ready in time: that record; gone: cold, saying so; the node killed: nothing to
    start; still importing past IMPORT_WAIT_S: cold, saying so."""
    import os
    import threading

    from orchestrator.agent.host import proc
    from orchestrator.agent.kernel.fileio import write_json
    from orchestrator.agent.kernel.layout import KILLED

    monkeypatch.setattr(warm, "warm_dir", lambda: str(tmp_path / "warm"))
    monkeypatch.chdir(tmp_path)  # the node's directory
    (tmp_path / "warm").mkdir()
    me = {"key": "k", "pid": os.getpid(), "start_time": proc.start_time(os.getpid())}
    starting = {**me, "state": "starting"}
    write_json(warm.key_file("k", ".json"), starting)
    later = threading.Timer(
        0.2, write_json, (warm.key_file("k", ".json"), {**me, "state": "ready"})
    )
    later.start()
    assert fork.until_imported(starting) == ({**me, "state": "ready"}, None)

    write_json(warm.key_file("k", ".json"), {**starting, "pid": 1 << 22})  # another, dead
    assert "ended while it imported" in str(fork.until_imported(starting)[1])

    monkeypatch.setattr(fork, "IMPORT_WAIT_S", 0.3)
    write_json(warm.key_file("k", ".json"), starting)
    assert fork.until_imported(starting) == (
        None,
        "cold start: the warm interpreter was still importing after 0 s",
    )
    open(KILLED, "w").close()
    assert fork.until_imported(starting) == (None, None)


def test_a_wait_status_reads_as_torchrun_reports_it() -> None:
    assert launch.exit_code(3 << 8) == 3
    assert launch.exit_code(9) == -9


def test_the_warm_replies_are_typed_both_ways() -> None:
    """What `warm list` and `warm ahead` answer is parsed with its types checked: a
    wrong one names the host, a good one reads back as it was built."""
    from orchestrator.agent.kernel.messages import MessageError, parse_message
    from orchestrator.agent.kernel.replies import WarmAhead, WarmList, WarmRow

    row = WarmRow(pid=42, key="k", state="ready", preload=["torch"], pss_kb=1024, idle_s=3.5)
    listed = parse_message(WarmList, WarmList(warm=[row]).as_dict())
    assert [(r.pid, list(r.preload), r.pss_kb) for r in listed.warm] == [(42, ["torch"], 1024)]
    with pytest.raises(MessageError, match="node1"):
        parse_message(WarmList, {"warm": [{"pid": "42"}]}, "node1")
    refused = parse_message(WarmAhead, {"error": "the job starts cold: --cold"})
    assert (refused.pid, refused.error) == (None, "the job starts cold: --cold")
    started = parse_message(WarmAhead, {"key": "k", "pid": 7, "started": True})
    assert (started.pid, started.started) == (7, True)


def test_a_forked_rank_draws_fresh_random_numbers_as_a_new_process_would() -> None:
    """Forked from one process that imported torch and numpy: without a reseed the
    children draw the same numbers; after `fresh_random_state` each its own, from
    torch's default generator (its initial seed too), numpy's legacy global state and
    Python's `random`; a seed set afterwards gives what it gives anywhere."""
    import json
    import os

    import numpy
    import torch

    def draws(reseed: bool) -> list[dict[str, object]]:
        found = []
        for _ in range(2):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child)
                os.close(read)
                if reseed:
                    launch.fresh_random_state()
                drawn = {
                    "torch": torch.rand(1).item(),
                    "seed": torch.initial_seed(),
                    "numpy": float(numpy.random.rand()),
                }
                torch.manual_seed(7)
                drawn["seeded"] = torch.rand(1).item()
                os.write(write, json.dumps(drawn).encode())
                os._exit(0)
            os.close(write)
            with os.fdopen(read) as f:
                found.append(json.loads(f.read()))
            os.waitpid(pid, 0)
        return found

    numpy.random.get_state()  # numpy seeds its global state at first use: now, here
    same = draws(reseed=False)
    assert same[0]["torch"] == same[1]["torch"] and same[0]["numpy"] == same[1]["numpy"]
    fresh = draws(reseed=True)
    for name in ("torch", "seed", "numpy"):
        assert fresh[0][name] != fresh[1][name], name
        assert fresh[0][name] != same[0][name], name
    torch.manual_seed(7)
    assert fresh[0]["seeded"] == fresh[1]["seeded"] == torch.rand(1).item()


def test_a_preload_that_keeps_a_random_generator_of_its_own_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether a module's own generator was seeded from the OS cannot be told, and a
    fork would give every rank its draws: such a preload is refused, by name; the
    generators a rank's fork reseeds (Python's, torch's, numpy's global) are not."""
    import random
    import sys
    import types

    import numpy.random
    import torch

    from orchestrator.agent.node.warm import serve

    assert torch.default_generator is not None and numpy.random.mtrand._rand is not None
    # The test process's own (hypothesis keeps one) are not the point here.
    before = serve.kept_generators()
    assert not [name for name in before if name.startswith(("torch", "numpy", "random."))]
    mine = types.ModuleType("augment")
    mine.rng = numpy.random.default_rng()  # type: ignore[attr-defined]
    mine.system = random.SystemRandom()  # type: ignore[attr-defined]  # the OS's: fine
    monkeypatch.setitem(sys.modules, "augment", mine)
    assert sorted(set(serve.kept_generators()) - set(before)) == ["augment.rng"]
    monkeypatch.setitem(sys.modules, "augment_pure", types.ModuleType("augment_pure"))
    monkeypatch.setattr(sys.modules["augment_pure"], "shuffle", random.Random(), raising=False)
    added = set(serve.kept_generators()) - set(before)
    assert sorted(added) == ["augment.rng", "augment_pure.shuffle"]


def test_two_nodes_ending_together_on_one_host_start_one_warm_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both nodes of a job on one host (a local inventory) end at once and each asks
    for the job's warm interpreter: one is started, the other finds it."""
    import os
    import subprocess
    import sys
    import threading
    import time

    monkeypatch.setattr(warm, "warm_dir", lambda: str(tmp_path / "warm" / "host"))
    started: list[int] = []

    class Started:
        def __init__(self, argv: list[str], **_: object) -> None:
            time.sleep(0.2)  # a real start takes a while: the race's window
            started.append(1)
            self.pid = os.getpid()

    monkeypatch.setattr(subprocess, "Popen", Started)
    env = {"PATH": "/bin"}
    answers: list[dict[str, object]] = []
    both = [
        threading.Thread(
            target=lambda: answers.append(warm.ensure(sys.executable, env, ["torch"], 60.0, 1))
        )
        for _ in range(2)
    ]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join()
    assert len(started) == 1
    assert sorted(bool(a["started"]) for a in answers) == [False, True]


def test_a_node_whose_python_cannot_start_a_warm_interpreter_starts_cold_saying_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first submit starts its warm interpreter with the job's python; where that
    python cannot run (a broken environment) the node starts cold, whose own error
    names the python, and the supervisor does not die on the way."""
    from orchestrator.agent.kernel.requests import StartRequest, WarmOptions

    monkeypatch.setattr(warm, "warm_dir", lambda: str(tmp_path / "warm" / "host"))
    spec = StartRequest(argv=["torchrun"], env={}, warm=WarmOptions(preload=["torch"]))
    launch = {"python": str(tmp_path / "no-such-env" / "bin" / "python"), "nproc": 1}
    for check in (True, False):
        assert fork.choose(spec, {"PATH": "/bin"}, launch, check=check) == (None, None)
    assert warm.records() == []


EXITING = """\
import atexit, ctypes, os, sys, threading, time
class Noisy:
    def __del__(self):
        print("del", os.getpid() > 0)  # a module global, still there as the script ends
class Log:  # a file an object holds, never closed
    def __init__(self, path):
        self.file = open(path, "w")
keep, log = Noisy(), Log(sys.argv[1])
log.file.write("written, never closed")
def failing():
    raise RuntimeError("in atexit")
atexit.register(failing)
atexit.register(print, "atexit")
main_done = threading.Event()
threading.Thread(target=lambda: (main_done.wait(), print("thread"))).start()
ctypes.CDLL(None).printf(b"c stdio\\n")
print("main", list(globals()))
how = sys.argv[2]
if how == "held":  # a daemon thread blocked reading a C stream, holding its lock
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    stream = libc.fdopen(os.pipe()[0], b"r")
    line = ctypes.create_string_buffer(64)
    threading.Thread(target=libc.fgets, args=(line, 64, ctypes.c_void_p(stream)), daemon=True).start()
    time.sleep(0.2)
    how = "0"
main_done.set()
if how == "raise":
    raise ValueError("uncaught")
if how == "interrupt":
    raise KeyboardInterrupt
sys.exit(2**64 if how == "huge" else int(how) if how.isdigit() else how)
"""

# A "warm interpreter" (not `python -u`) that registered a C exit handler (as torch's
# static destructors are), here abort(), then runs the script or module in a fork,
# with a rank's stdio, as a rank runs and ends (launch.py, rank_end.py).
FORKED = """\
import ctypes, functools, os, signal, sys
sys.path.insert(0, os.environ["REPO_ROOT"])
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
from orchestrator.agent.node.warm import launch
from orchestrator.agent.node.warm.rank_end import end_rank
pid = os.fork()
if pid == 0:
    kind, target, *args = sys.argv[1:]
    launch._unbuffered()
    if kind == "script":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        end_rank(functools.partial(launch.run_script, os.path.abspath(target)))
    sys.argv = ["-m", *args]
    sys.path[0] = os.getcwd()
    end_rank(functools.partial(launch.run_module, target))
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
"""

ENDS = {  # how the script ends: its exit status, cold
    "0": 0,
    "held": 0,
    "3": 3,
    "a message": 1,
    "huge": 255,
    "raise": 1,
    "interrupt": -signal.SIGINT,
}


@pytest.mark.parametrize(
    ("kind", "how"),
    [("script", how) for how in ENDS] + [("module", "3"), ("module", "raise")],
)
def test_a_forked_rank_ends_as_a_cold_one_without_tearing_down_the_preload(
    tmp_path: Path, kind: str, how: str
) -> None:
    """C's stdio unbuffered as `-u` makes it; the interpreter's own end: threads
    joined, atexit run (one that raises printed), the script's objects finalized with
    their globals in place, a file an object holds written; the same exit status (an
    exception, a message, a code beyond a C long, a Ctrl-C's SIGINT) and the same
    stderr, tracebacks included, as `python -u script` or `python -u -m module`; a
    thread blocked in a C stream's read does not hang it. The C exit handler the warm
    interpreter registered (abort) does not run in the rank."""
    (tmp_path / "exiting.py").write_text(EXITING)
    target = "exiting.py" if kind == "script" else "exiting"
    entry = [target] if kind == "script" else ["-m", target]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["REPO_ROOT"] = str(REPO_ROOT)
    runs = {}
    for name, argv in (
        ("cold", [sys.executable, "-u", *entry]),
        ("forked", [sys.executable, "-c", FORKED, kind, target]),
    ):
        left_open = tmp_path / f"{name}.txt"
        done = subprocess.run(
            [*argv, str(left_open), how],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
            env=env,
        )
        stderr = re.sub(r"0x[0-9a-f]+", "0x", done.stderr)
        runs[name] = (done.returncode, done.stdout, stderr, left_open.read_text())
    code, stdout, stderr, written = runs["cold"]
    names = ["__name__", "__doc__", "__package__", "__loader__", "__spec__"]
    assert (code, written) == (ENDS[how], "written, never closed")
    assert stdout.splitlines()[0] == "c stdio"  # `-u`: C's stdio unbuffered too
    assert stdout.splitlines()[2:] == ["thread", "atexit", "del True"]
    assert "RuntimeError: in atexit" in stderr
    assert all(name in stdout for name in names)
    assert runs["forked"] == runs["cold"]
