"""Warm starts: a resubmitted job's ranks forked from a host's warm interpreter see what
torchrun gives them, tear down as torchrun's do, and whatever is not provably the same
starts cold and says why."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    assert_no_job_left,
    job_id_of,
    job_processes,
    start_attached,
    stop_warm,
    two_and_one_inventory,
    wait_for,
    warm_processes,
    write_job,
)

pytestmark = pytest.mark.cluster

HOSTS = [1, 2]
# What differs between two submits of one job whatever starts the ranks: the job's id
# and port, the SSH session, torchrun's temporary error file.
PER_SUBMIT = ("MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "SSH_CLIENT", "SSH_CONNECTION")


@pytest.fixture
def two_and_one(cluster: Cluster, tmp_path: Path) -> Path:
    """node1 with 2 slots, node2 with 1; no warm interpreter before. The ones the
    test's jobs leave stay, as any job's do: ended at once, each would have imported
    torch for nothing, and the worker's next test on these hosts may fork from one."""
    stop_warm(cluster, HOSTS)
    return two_and_one_inventory(cluster, tmp_path)


@pytest.fixture
def two_and_one_as_found(cluster: Cluster, tmp_path: Path) -> Path:
    """The same hosts with the warm interpreters earlier tests left: for a test that
    holds with or without one of its key there (each stop costs its next submit an
    import of torch on each host)."""
    return two_and_one_inventory(cluster, tmp_path)


def warm_records(cluster: Cluster, i: int) -> list[dict[str, Any]]:
    folder = cluster.home(i) / ".orch" / "warm"
    found = []
    for path in sorted(folder.glob("*/*.json")) if folder.exists() else []:
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:  # being written
            continue
    return found


def wait_warm_ready(cluster: Cluster, pids: dict[int, int] | None = None) -> None:
    """Until every host has a ready warm interpreter; with `pids` (host index: pid),
    that one, not one of another key an earlier test left."""

    def ready() -> bool:
        return all(
            any(
                r.get("state") == "ready" and (pids is None or r.get("pid") == pids[i])
                for r in warm_records(cluster, i)
            )
            for i in HOSTS
        )

    wait_for(ready, 90, "a ready warm interpreter on every host", poll=0.2)


def node_record(cluster: Cluster, i: int, job_id: str) -> dict[str, Any]:
    path = cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "pid.json"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def ran_warm(cluster: Cluster, job_id: str) -> list[bool]:
    return [bool(node_record(cluster, i, job_id).get("warm")) for i in HOSTS]


def reports(stdout: str, job_id: str) -> dict[int, dict[str, Any]]:
    """Each rank's report, with what differs between any two submits made equal."""
    found = {}
    for line in stdout.splitlines():
        _, sep, text = line.partition("] REPORT ")
        if sep:
            report = json.loads(text.replace(job_id, "<job>"))
            for name in PER_SUBMIT:
                report["env"].pop(name, None)
            found[int(report["rank"])] = report
    return found


def error_files(stdout: str) -> dict[int, str]:
    """Each rank's TORCHELASTIC_ERROR_FILE, from its report."""
    found = {}
    for line in stdout.splitlines():
        _, sep, text = line.partition("] REPORT ")
        if sep:
            report = json.loads(text)
            found[int(report["rank"])] = str(report["env"]["TORCHELASTIC_ERROR_FILE"])
    return found


def probe_job(tmp_path: Path, *args: str, **keys: Any) -> Path:
    return write_job(tmp_path, "warm", "probe.py", nodes=2, args=list(args), **keys)


def submit_cold(orch: OrchRunner, cluster: Cluster, job: Path, inventory: Path) -> str:
    """A submit with `--cold` on hosts with no warm interpreter: torchrun's own start,
    saying nothing, and leaving no warm interpreter."""
    cold = orch("submit", job, "-i", inventory, "--cold", timeout=180)
    assert cold.returncode == 0, cold.stderr
    assert ran_warm(cluster, job_id_of(cold.stdout)) == [False, False]
    assert "cold start" not in cold.stderr, cold.stderr
    assert all(warm_records(cluster, i) == [] for i in HOSTS)
    return cold.stdout


def warm_ahead(orch: OrchRunner, cluster: Cluster, job: Path, inventory: Path) -> None:
    """`orch warm JOB`: the job's warm interpreters, ready before its first submit (what
    a cold submit would leave, for five imports of torch fewer)."""
    ahead = orch("warm", job, "-i", inventory, timeout=180)
    assert ahead.returncode == 0, ahead.stderr
    said = dict(re.findall(r"^node(\d+): warm interpreter pid (\d+)", ahead.stdout, re.M))
    wait_warm_ready(cluster, {i: int(said[str(i)]) for i in HOSTS})  # a pid namespace a host


def lines_of(stdout: str, kind: str) -> dict[int, dict[str, Any]]:
    """Each rank's `KIND {json}` line (the probe's DRAWS and KEPT), by rank."""
    found = {}
    for line in stdout.splitlines():
        prefix, sep, text = line.partition(f"] {kind} ")
        if sep:
            found[int(prefix.rsplit(" r", 1)[1])] = json.loads(text)
    return found


def ended(stdout: str) -> dict[int, list[str]]:
    """Each rank's `ENDED STEP` lines (the probe's end), in order, by rank."""
    found: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        prefix, sep, step = line.partition("] ENDED ")
        if sep:
            found.setdefault(int(prefix.rsplit(" r", 1)[1]), []).append(step)
    return found


def test_a_warm_rank_is_the_process_a_cold_rank_would_be_and_draws_its_own_numbers(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    """One probe, cold (`--cold`) and then warm twice (node1 runs two ranks, node2 one):
    the first warm submit forked from the warm interpreters it started (none ran), the
    second from those it left. Rank by rank, the environment, argv, paths, launcher
    views, thread pools, signals, descriptors, umask, limits, stdio, flags, start
    method, a loader with workers, explicitly seeded draws and how the process ends
    (C's stdio, a thread, atexit, the script's objects) are the same; unseeded draws
    differ per rank and per run as they do cold."""
    job = probe_job(tmp_path, "--deep", "a b", "--", "{node_rank}")
    outs = [submit_cold(orch, cluster, job, two_and_one)]
    started = []
    for _ in range(2):
        again = orch("submit", job, "-i", two_and_one, timeout=180)
        assert again.returncode == 0, again.stderr
        assert ran_warm(cluster, job_id_of(again.stdout)) == [True, True]
        assert "cold start" not in again.stderr and "warm interpreter" not in again.stderr
        outs.append(again.stdout)
        started.append([warm_processes(cluster, i) for i in HOSTS])
    assert started[0] == started[1], "the second warm submit forked from the first's"
    # A warm node's launcher removes the directory of its ranks' error files (torchrun's
    # `torchelastic_*` in the host's /tmp) once the node ended; torchrun leaves its own.
    for out in outs[1:]:
        for rank, error_file in error_files(out).items():
            folder = error_file.split("/attempt_0/")[0].rsplit("/", 1)[0]
            assert "torchelastic_" in folder, error_file
            host = 1 if rank < 2 else 2
            assert cluster.exec_on(host, ["test", "-e", folder]).returncode == 1, folder
    runs = [reports(out, job_id_of(out)) for out in outs]
    cold, warm = runs[0], runs[1:]

    assert sorted(cold) == [0, 1, 2]
    for run in warm:
        assert sorted(run) == [0, 1, 2]
        for rank in cold:
            assert run[rank]["sum"] == 6
            assert run[rank]["env"] == cold[rank]["env"], f"rank {rank}"
            state, cold_state = run[rank]["process_state"], cold[rank]["process_state"]
            # The warnings filters a preloaded module adds at import come before the
            # script's first line: the same filters, in another order (docs/WARM.md).
            state["warnings"].sort()
            cold_state["warnings"].sort()
            for name in cold_state:
                assert state[name] == cold_state[name], f"rank {rank}: {name}"
            assert run[rank] == cold[rank], f"rank {rank}"
    # Two ranks on node1: torchrun's one thread each, at import as cold; one on node2.
    assert [cold[r]["process_state"]["threads"][0] for r in (0, 1)] == [1, 1]
    assert warm[0][2]["argv"] == ["probe.py", "--deep", "a b", "--", "1"]
    assert warm[0][0]["launchers"]["torch"] is True

    drawn = [lines_of(out, "DRAWS") for out in outs]
    for name in ("torch", "torch_seed", "numpy", "random"):
        values = [run[rank][name] for run in drawn for rank in (0, 1, 2)]
        assert len(set(values)) == 9, f"{name}: {values}"
    seeds = [seed for run in drawn for rank in (0, 1, 2) for seed in run[rank]["loader_seeds"]]
    assert len(set(seeds)) == 18, seeds
    # Kept of the warm parent on purpose (docs/WARM.md): its frozen objects.
    kept = [lines_of(out, "KEPT") for out in outs]
    assert [kept[i][0]["gc_frozen"] for i in range(3)] == [False, True, True]
    # And each ends as a cold rank does, in the same order (rank_end.py).
    steps = ["c stdio", "thread", "atexit", "del"]
    assert [ended(out) for out in outs] == [{0: steps, 1: steps, 2: steps}] * 3

    assert "[node1 r1] REPORT" in outs[1]
    assert len(warm_processes(cluster, 1)) == 1
    assert_no_job_left(cluster, HOSTS)


def test_a_failing_rank_on_the_warm_path_ends_the_job_as_torchrun_does(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    warm_ahead(orch, cluster, probe_job(tmp_path), two_and_one_as_found)
    warm_before = warm_processes(cluster, 1)

    failing = probe_job(tmp_path, "--fail-rank", "1", "--sleep", "1")
    result = orch("submit", failing, "-i", two_and_one_as_found, timeout=180)
    assert result.returncode == 1, result.stderr
    assert ran_warm(cluster, job_id_of(result.stdout)) == [True, True], result.stderr
    assert "failed: node node1 exited with code 1" in result.stderr, result.stderr
    assert re.search(r"rank 1\b.*exit(ed with)? code 3|exit code 3", result.stderr), result.stderr
    assert_no_job_left(cluster, HOSTS)
    assert warm_processes(cluster, 1) == warm_before, "the warm interpreter is unharmed"


def test_orch_warm_with_a_job_file_makes_even_its_first_submit_warm(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path)
    ahead = orch("warm", job, "-i", two_and_one, timeout=180)
    assert ahead.returncode == 0, ahead.stderr
    pids = [[pid for pid, _ in warm_processes(cluster, i)] for i in HOSTS]
    assert all(len(p) == 1 for p in pids), pids
    for i, (pid,) in zip(HOSTS, pids, strict=True):
        assert f"node{i}: warm interpreter pid {pid} starting (it imports torch)" in ahead.stdout
    wait_warm_ready(cluster)

    first = orch("submit", job, "-i", two_and_one, timeout=180)
    assert first.returncode == 0, first.stderr
    assert ran_warm(cluster, job_id_of(first.stdout)) == [True, True], first.stderr
    again = orch("warm", job, "-i", two_and_one, timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"node1: warm interpreter pid {pids[0][0]} there already" in again.stdout

    cold = orch("warm", probe_job(tmp_path, warm=False), "-i", two_and_one, timeout=60)
    assert cold.returncode == 2, cold.stderr
    assert "error: the job starts cold: warm: false in the job file" in cold.stderr
    assert [[pid for pid, _ in warm_processes(cluster, i)] for i in HOSTS] == pids


def test_ctrl_c_on_the_warm_path_leaves_nothing_but_the_warm_interpreters(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    warm_ahead(orch, cluster, probe_job(tmp_path), two_and_one_as_found)
    warm_before = [warm_processes(cluster, i) for i in HOSTS]

    with attached_submit(
        orch, probe_job(tmp_path, "--sleep", "120"), two_and_one_as_found
    ) as attached:
        wait_for(
            lambda: sum("sleeping" in line for line in attached_lines(attached)) >= 3,
            120,
            "every rank to sleep",
        )
        # orch top shows each host's warm interpreters beside the job's ranks.
        top = orch("top", "--once", "--json", timeout=60)
        assert top.returncode == 0, top.stderr
        nodes = json.loads(top.stdout)["nodes"]
        shown = {n["host"]: sorted(w["pid"] for w in n["warm"]) for n in nodes}
        expected = {f"node{i}": sorted(p for p, _ in warm_before[k]) for k, i in enumerate(HOSTS)}
        assert shown == expected  # every one on the host, this job's key or another's
        assert all(w["pss_kb"] > 0 for n in json.loads(top.stdout)["nodes"] for w in n["warm"])
        said = interrupt(attached)
    assert "cold start" not in said, said
    assert_no_job_left(cluster, HOSTS)
    assert [warm_processes(cluster, i) for i in HOSTS] == warm_before, said


def test_a_first_submit_waiting_in_line_imports_during_the_wait_and_runs_forked(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    """A node with no warm interpreter for its key starts one before it waits in line
    for its slot, so the import runs while another job holds the host; at its turn it
    is forked from that one."""
    stop_warm(cluster, [2])
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[2], node2={"slots": 1})
    (tmp_path / "holder").mkdir()
    (tmp_path / "waiter").mkdir()
    holder = write_job(tmp_path / "holder", "warm", "probe.py", args=["--sleep", "120"], warm=False)
    waiter = write_job(tmp_path / "waiter", "warm", "probe.py", env={"WARM_TEST": "in line"})
    held = orch("submit", "-d", holder, "-i", inventory, timeout=120)
    assert held.returncode == 0, held.stderr
    held_id = job_id_of(held.stdout)
    node = cluster.home(2) / ".orch" / "jobs"
    wait_for(lambda: (node / held_id / "node2" / "pid.json").exists(), 60, "the holder's start")

    queued = orch("submit", "-d", waiter, "-i", inventory, timeout=120)
    assert queued.returncode == 0, queued.stderr
    assert "queued: 1 slot on node2 held by warm-" in queued.stderr, queued.stderr
    waiter_id = job_id_of(queued.stdout)
    # The waiter's warm interpreter imports, and is ready, while its node still waits.
    wait_for(
        lambda: any(r.get("state") == "ready" for r in warm_records(cluster, 2)),
        90,
        "the waiter's warm interpreter, ready while it waits in line",
    )
    assert not (node / waiter_id / "node2" / "pid.json").exists(), "still in line"
    (started,) = [pid for pid, _ in warm_processes(cluster, 2)]

    killed = orch("kill", held_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    logs = orch("logs", waiter_id, "-f", timeout=120)
    assert logs.returncode == 0, logs.stderr
    assert "REPORT" in logs.stdout
    assert node_record(cluster, 2, waiter_id).get("warm") is True
    assert [pid for pid, _ in warm_processes(cluster, 2)] == [started]
    assert_no_job_left(cluster, [2])


def slow_import_job(tmp_path: Path, name: str, seconds: int, *args: str) -> Path:
    """The probe job, preloading torch and a module of its own whose import takes
    `seconds` (on its PYTHONPATH): its warm interpreters stay importing that long."""
    site = tmp_path / "slow_site"
    site.mkdir(exist_ok=True)
    (site / "orch_slow_import.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return probe_job(
        tmp_path,
        *args,
        name=name,
        env={"PYTHONPATH": str(site)},
        preload=["torch", "orch_slow_import"],
    )


def test_a_submit_while_the_warm_interpreter_still_imports_waits_for_it_and_runs_warm(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = slow_import_job(tmp_path, "slowimport", 8)
    ahead = orch("warm", job, "-i", two_and_one, timeout=180)
    assert ahead.returncode == 0, ahead.stderr
    assert all(r["state"] == "starting" for i in HOSTS for r in warm_records(cluster, i))

    result = orch("submit", job, "-i", two_and_one, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "cold start" not in result.stderr, result.stderr
    assert ran_warm(cluster, job_id_of(result.stdout)) == [True, True]
    assert len(reports(result.stdout, job_id_of(result.stdout))) == 3
    assert_no_job_left(cluster, HOSTS)


def test_ctrl_c_while_a_node_waits_for_the_warm_import_starts_nothing_and_exits_130(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = slow_import_job(tmp_path, "slowctrlc", 60, "--sleep", "120")
    ahead = orch("warm", job, "-i", two_and_one, timeout=180)
    assert ahead.returncode == 0, ahead.stderr
    warm_before = [warm_processes(cluster, i) for i in HOSTS]

    def waiting() -> list[Path]:  # each node's directory, once its supervisor runs
        return [
            d
            for i in HOSTS
            for d in (cluster.home(i) / ".orch" / "jobs").glob(f"slowctrlc-*/node{i}")
            if (d / "supervisor.log").exists()
        ]

    with attached_submit(orch, job, two_and_one) as attached:
        wait_for(lambda: len(waiting()) == 2, 60, "both nodes' supervisors")
        time.sleep(1)
        assert not any((d / "pid.json").exists() for d in waiting())  # still waiting
        said = interrupt(attached)
    assert "Traceback" not in said, said
    # Each supervisor saw the kill, ended, and never started the node.
    wait_for(lambda: all((d / "exit.json").exists() for d in waiting()), 10, "exit records")
    time.sleep(1)
    assert not any((d / "pid.json").exists() for d in waiting())
    assert_no_job_left(cluster, HOSTS)
    assert [warm_processes(cluster, i) for i in HOSTS] == warm_before, said


@contextlib.contextmanager
def attached_submit(
    orch: OrchRunner, job: Path, inventory: Path
) -> Iterator[subprocess.Popen[str]]:
    """An attached `orch submit`, killed on the way out if the test left it running."""
    attached = start_attached(orch, job, inventory)
    try:
        yield attached
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait()


def interrupt(attached: subprocess.Popen[str]) -> str:
    """Ctrl-C an attached submit; it exits 130. Returns what it said on stderr."""
    attached.send_signal(signal.SIGINT)
    assert attached.wait(60) == 130
    return attached.stderr.read() if attached.stderr else ""


_LINES: dict[int, list[str]] = {}


def attached_lines(process: subprocess.Popen[str]) -> list[str]:
    """What an attached submit printed so far (its stdout read without blocking)."""
    import os
    import select

    lines = _LINES.setdefault(process.pid, [])
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        lines.extend(chunk.decode(errors="replace").splitlines())
    return lines


def test_cold_and_warm_false_start_cold_and_say_so_once(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path)
    warm_ahead(orch, cluster, job, two_and_one_as_found)

    forced = orch("submit", job, "-i", two_and_one_as_found, "--cold", timeout=180)
    assert forced.returncode == 0, forced.stderr
    assert ran_warm(cluster, job_id_of(forced.stdout)) == [False, False]
    assert forced.stderr.count("cold start: --cold (hosts node1, node2)") == 1, forced.stderr

    off = probe_job(tmp_path, warm=False)
    result = orch("submit", off, "-i", two_and_one_as_found, timeout=180)
    assert "cold start: warm: false in the job file (hosts node1, node2)" in result.stderr


def test_restarts_by_torchrun_and_another_env_start_cold_and_say_why(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path)
    warm_ahead(orch, cluster, job, two_and_one)
    restarts = probe_job(tmp_path, max_restarts=1)
    result = orch("submit", restarts, "-i", two_and_one, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "cold start: max_restarts: torchrun restarts its own workers" in result.stderr

    # Another env: a warm interpreter of its own, started for its first submit, which
    # is forked from it (saying nothing: as any first submit); the first one is kept.
    other_env = probe_job(tmp_path, env={"WARM_TEST": "other"})
    result = orch("submit", other_env, "-i", two_and_one, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "cold start" not in result.stderr and "warm interpreter" not in result.stderr
    assert ran_warm(cluster, job_id_of(result.stdout)) == [True, True]
    assert all(len(warm_processes(cluster, i)) == 2 for i in HOSTS)


def test_a_package_installed_since_the_warm_interpreter_started_gives_a_new_one(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    # A folder of the job's own on its path (PYTHONPATH, as a user's site would be):
    # the venv's site-packages is every test cluster's, and a distribution put there
    # would make every other test's warm interpreters stale too.
    site = tmp_path / "site"
    site.mkdir()
    job = probe_job(tmp_path, env={"PYTHONPATH": str(site)})
    warm_ahead(orch, cluster, job, two_and_one)
    before = [warm_processes(cluster, i) for i in HOSTS]
    (site / "orch_warm_test_marker-1.0.dist-info").mkdir()
    changed = orch("submit", job, "-i", two_and_one, timeout=180)
    assert changed.returncode == 0, changed.stderr
    # The stale one ended; the node was forked from a new one, which saw the package.
    assert ran_warm(cluster, job_id_of(changed.stdout)) == [True, True]
    said = "a new warm interpreter: the installed packages changed (orch_warm_test_marker"
    assert said in changed.stderr, changed.stderr
    assert "cold start" not in changed.stderr, changed.stderr
    after = [warm_processes(cluster, i) for i in HOSTS]
    assert all(len(a) == 1 and a != b for a, b in zip(after, before, strict=True)), after


def test_a_killed_warm_interpreter_is_replaced_saying_so_and_the_job_succeeds(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path)
    warm_ahead(orch, cluster, job, two_and_one_as_found)
    for pid, _ in warm_processes(cluster, 2):
        cluster.exec_on(2, ["kill", "-KILL", str(pid)])
    wait_for(lambda: not warm_processes(cluster, 2), 10, "node2's warm interpreter to die")

    result = orch("submit", job, "-i", two_and_one_as_found, timeout=180)
    assert result.returncode == 0, result.stderr
    assert ran_warm(cluster, job_id_of(result.stdout)) == [True, True]
    assert "a new warm interpreter: the last one (pid " in result.stderr, result.stderr
    assert ") is gone (host node2)" in result.stderr, result.stderr
    assert "cold start" not in result.stderr, result.stderr
    assert len(reports(result.stdout, job_id_of(result.stdout))) == 3
    assert_no_job_left(cluster, HOSTS)


def test_no_job_process_is_left_and_the_warm_one_stays_after_a_warm_job(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path)
    warm_ahead(orch, cluster, job, two_and_one_as_found)
    result = orch("submit", job, "-i", two_and_one_as_found, timeout=180)
    assert result.returncode == 0
    assert all(not job_processes(cluster, i) for i in HOSTS)


def test_an_idle_warm_interpreter_ends_after_warm_idle(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = probe_job(tmp_path, warm_idle=40)
    warm_ahead(orch, cluster, job, two_and_one)
    listed = orch("warm", "-i", two_and_one, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"node1: pid \d+ ready, preload torch, \d+ MB PSS", listed.stdout)
    hosts = orch("status", "--hosts", "--json", "-i", two_and_one, timeout=60)
    assert hosts.returncode == 0, hosts.stderr
    shown = json.loads(hosts.stdout)["warm"]
    assert sorted(row["host"] for row in shown) == ["node1", "node2"]
    assert all(row["pss_kb"] > 10_000 and row["preload"] == ["torch"] for row in shown)
    wait_for(lambda: not any(warm_processes(cluster, i) for i in HOSTS), 90, "the idle ones to end")
    assert all(warm_records(cluster, i) == [] for i in HOSTS)


def test_kill_all_leaves_no_warm_interpreter(
    orch: OrchRunner, cluster: Cluster, two_and_one_as_found: Path, tmp_path: Path
) -> None:
    warm_ahead(orch, cluster, probe_job(tmp_path), two_and_one_as_found)
    result = orch("kill", "--all", timeout=120)
    assert result.returncode == 0, result.stderr
    assert all(warm_processes(cluster, i) == [] for i in HOSTS)


_CONNECT = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("refused", type(exc).__name__)
    sys.exit(0)
try:
    s.sendall(json.dumps({"check": True}).encode() + b"\n")
    print("answer", repr(s.recv(100)))
except OSError as exc:  # closed on it already
    print("answer", type(exc).__name__)
"""


def test_another_user_cannot_reach_a_warm_interpreter(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    from tests.cluster.controller_side import repo_python

    warm_ahead(orch, cluster, probe_job(tmp_path), two_and_one)
    (record,) = warm_records(cluster, 1)
    (where,) = (cluster.home(1) / ".orch" / "warm").iterdir()
    folder = f"/root/.orch/warm/{where.name}"
    sock = f"{folder}/{record['key']}.sock"
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [*as_nobody, str(repo_python()), "-I", "-c", _CONNECT, sock]

    behind_its_directory = cluster.exec_on(1, argv)
    assert behind_its_directory.stdout.startswith("refused PermissionError"), (
        behind_its_directory.stdout + behind_its_directory.stderr
    )
    # Even with the directory and socket opened to all, its peer check turns them away.
    paths = ["/root", "/root/.orch", "/root/.orch/warm", folder]
    modes = cluster.exec_on(1, ["stat", "-c", "%a", *paths]).stdout.split()
    opened = cluster.exec_on(1, ["sh", "-c", f"chmod 711 {' '.join(paths)} && chmod 777 {sock}"])
    assert opened.returncode == 0, opened.stderr
    try:
        through = cluster.exec_on(1, argv)
    finally:
        for mode, path in zip(modes, paths, strict=True):
            cluster.exec_on(1, ["chmod", mode, path])
        cluster.exec_on(1, ["chmod", "600", sock])
    closed = ("answer b''", "answer BrokenPipeError", "answer ConnectionResetError")
    assert through.stdout.strip() in closed, through.stdout + through.stderr
    assert [pid for pid, _ in warm_processes(cluster, 1)] == [record["pid"]]
