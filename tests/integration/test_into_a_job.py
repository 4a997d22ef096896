"""Into a running job: `orch ssh` (a shell or a command in the node's directory with
the job's environment, on a terminal where there is one) and `orch forward` (a port of
a running job's host at the laptop's localhost, until Ctrl-C); and their bad input."""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner, orch_command
from tests.support import Lines, job_id_of, wait_for, write_job

pytestmark = pytest.mark.cluster

HOSTS = [1, 2]
PORT = 8631  # on the hosts: each a network namespace of its own


def page(address: str) -> str:
    with urllib.request.urlopen(address, timeout=5) as answer:
        return str(answer.read().decode())


def serving_job(orch: OrchRunner, cluster: Cluster, tmp_path: Path, **keys: object) -> str:
    """A detached job of two nodes, each serving its page on PORT; its id."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", HOSTS)
    job = write_job(tmp_path, "serve", "serve.py", nodes=2, args=[str(PORT)], **keys)
    submitted = orch("submit", job, "-i", inventory, "-d", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    return job_id_of(submitted.stdout)


def local_port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_forward_carries_the_masters_page_and_another_nodes_and_ends_on_ctrl_c(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    job_id = serving_job(orch, cluster, tmp_path)
    try:
        forward = subprocess.Popen(
            [*orch_command(), "forward", job_id, f"{PORT}:0"],
            env=orch.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert forward.stdout is not None and forward.stderr is not None
        address = forward.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:") and address.endswith("/"), address
        local = int(address.rsplit(":", 1)[1].rstrip("/"))
        errors = Lines(forward.stderr)

        def served() -> bool:  # the rank may not listen yet: refused, said once
            try:
                return page(address) == "served by node 0\n"
            except OSError:
                return False

        wait_for(served, 30, "the master's page through the forward", poll=0.2)
        assert page(address) == "served by node 0\n"  # again: each request its own tunnel
        forward.send_signal(signal.SIGINT)
        assert forward.wait(timeout=15) == 130, errors.text()
        assert local_port_free(local)
        assert "Traceback" not in errors.text()

        other = subprocess.Popen(
            [*orch_command(), "forward", job_id, f"{PORT}:0", "--node", "node2"],
            env=orch.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert other.stdout is not None
        second = other.stdout.readline().strip()
        wait_for(lambda: served_by(second) == "served by node 1\n", 30, "node2's page", poll=0.2)
        other.send_signal(signal.SIGINT)
        assert other.wait(timeout=15) == 130
    finally:
        orch("kill", job_id, timeout=60)

    ended = orch("forward", job_id, str(PORT), timeout=30)
    assert ended.returncode == 2
    assert "has ended" in ended.stderr and "hint:" in ended.stderr


def served_by(address: str) -> str | None:
    try:
        return page(address)
    except OSError:
        return None


def test_a_local_port_in_use_an_unknown_node_and_a_bad_port_are_exit_2_with_a_hint(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    job_id = serving_job(orch, cluster, tmp_path)
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            busy = orch("forward", job_id, f"{PORT}:{port}", timeout=30)
        assert busy.returncode == 2
        assert f"port {port} on this machine is in use" in busy.stderr
        assert "hint:" in busy.stderr and "Traceback" not in busy.stderr
        nowhere = orch("forward", job_id, str(PORT), "--node", "node9", timeout=30)
        assert nowhere.returncode == 2 and "has no node on node9" in nowhere.stderr
        bad = orch("forward", job_id, "http", timeout=30)
        assert bad.returncode == 2 and "not a port" in bad.stderr
    finally:
        orch("kill", job_id, timeout=60)


def read_until(terminal: int, done: Callable[[bytes], bool], timeout: float = 60) -> bytes:
    """What ``terminal`` shows until ``done(what it showed)``, it closes, or ``timeout``."""
    seen = b""
    deadline = time.monotonic() + timeout
    while not done(seen) and time.monotonic() < deadline:
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_orch_ssh_and_exec_land_in_the_nodes_directory_with_the_jobs_environment(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    job_id = serving_job(orch, cluster, tmp_path, env={"MY_SETTING": "set"})
    probe = 'pwd; echo "setting=$MY_SETTING rank=${RANK:-none} job=$ORCH_JOB_ID"; exit 4'
    try:
        ran = orch("ssh", job_id, "--", probe, timeout=60)
        assert ran.returncode == 4, ran.stderr
        where, said = ran.stdout.splitlines()[:2]
        assert where.endswith("/code") and job_id in where and "/node1/" in where, where
        assert said == f"setting=set rank=none job={job_id}"
        other = orch("ssh", job_id, "node2", "--", "pwd", timeout=60)
        assert other.returncode == 0 and "/node2/" in other.stdout, other.stderr

        # orch exec JOB: the command on every node at once, each line named by its host.
        line = 'echo "at $(pwd) $MY_SETTING"; exit $((ORCH_NODE_RANK * 3))'
        everywhere = orch("exec", job_id, "--", line, timeout=60)
        assert everywhere.returncode == 3, everywhere.stderr
        said = sorted(everywhere.stdout.splitlines())
        assert [s.split()[0] for s in said] == ["[node1]", "[node2]"], said
        assert all(f"/{job_id}/" in s and s.endswith("/code set") for s in said), said
        assert "command failed on node2 (exit 3); succeeded on node1" in everywhere.stderr

        # Ctrl-C stops the command on every node, and nothing of it is left.
        stopped = subprocess.Popen(
            [*orch_command(), "exec", job_id, "--", "echo started; sleep 96; echo never"],
            env=orch.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert stopped.stdout is not None
        begun = {stopped.stdout.readline().strip() for _ in HOSTS}
        assert begun == {"[node1] started", "[node2] started"}, begun
        stopped.send_signal(signal.SIGINT)
        out, err = stopped.communicate(timeout=30)
        assert stopped.returncode == 130 and "never" not in out, err
        assert "error: interrupted: stopped the command on node1, node2" in err

        def sleeping() -> list[str]:
            return [c for i in HOSTS for _, c in cluster.host_pids(i) if "sleep 96" in c]

        wait_for(lambda: not sleeping(), 5, "the command gone from every node")

        # On a terminal: a shell of the host's, typed into.
        mine, theirs = pty.openpty()
        shell = subprocess.Popen(
            [*orch_command(), "ssh", job_id],
            env={**orch.controller.env(), "TERM": "dumb"},
            stdin=theirs,
            stdout=theirs,
            stderr=theirs,
            start_new_session=True,
        )
        os.close(theirs)
        seen = read_until(mine, lambda seen: seen.rstrip().endswith(b"#"))  # the prompt
        # Every line up to the exit arrives before orch ssh ends, though sshd sends the
        # exit status first where the shell's last output still waits in its terminal:
        # the host's sshd is paused while the shell prints and exits.
        os.write(mine, b"sleep 1; echo typed-$MY_SETTING; seq 3000; exit 5\n")
        seen += read_until(mine, lambda seen: b"exit 5" in seen)  # the host's echo
        sessions = [pid for pid, c in cluster.host_pids(1) if c.startswith("sshd: root@pts")]
        assert sessions, cluster.host_pids(1)
        for pid in sessions:
            cluster.exec_on(1, ["kill", "-STOP", str(pid)])
        time.sleep(2.5)  # the shell prints into its terminal, and exits
        for pid in sessions:
            cluster.exec_on(1, ["kill", "-CONT", str(pid)])
        seen += read_until(mine, lambda _: False)  # to the end: orch ssh has closed it
        os.close(mine)
        if shell.poll() is None:
            shell.kill()
        assert shell.wait(timeout=30) == 5, seen
        assert b"typed-set" in seen, seen
        assert b"\r\n2999\r\n3000\r\n" in seen, seen[-200:]
    finally:
        orch("kill", job_id, timeout=60)

    ended = orch("ssh", job_id, timeout=30)
    assert ended.returncode == 2 and "has ended" in ended.stderr
    assert "its files:" in ended.stderr and "Traceback" not in ended.stderr
    gone = orch("exec", job_id, "--", "true", timeout=30)
    assert gone.returncode == 2 and "has ended" in gone.stderr and "its files:" in gone.stderr


def test_forward_in_the_job_file_opens_with_an_attached_submit_and_closes_with_the_job(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", HOSTS)
    job = write_job(
        tmp_path, "serve", "serve.py", nodes=2, args=[str(PORT), "20"], forward=[f"{PORT}:0"]
    )
    submit = subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=orch.controller.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert submit.stderr is not None
    errors = Lines(submit.stderr)
    try:
        errors.wait_for(f"forwarding port {PORT} of node1 to http://127.0.0.1:", 60)
        said = next(line for line in errors.lines if f"forwarding port {PORT}" in line)
        address = said.rsplit(" to ", 1)[1].strip()
        wait_for(lambda: served_by(address) == "served by node 0\n", 30, "the page", poll=0.2)
        assert submit.wait(timeout=90) == 0, errors.text()
        local = int(address.rsplit(":", 1)[1].rstrip("/"))
        assert local_port_free(local)
    finally:
        if submit.poll() is None:
            submit.send_signal(signal.SIGINT)
            submit.wait(timeout=60)
