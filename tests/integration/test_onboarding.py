"""First contact on the real cluster: `orch keys` installs the controller's key for a
host user who has only a password (a second sshd on the host that takes passwords,
`Cluster.password_user`), proves key login, changes nothing the second time, and never
lets the password show in a process or a file; `orch init` writes an inventory from
~/.ssh/config aliases that `orch check` accepts."""

from __future__ import annotations

import os
import pty
import secrets
import select
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.models.inventory import load_inventory
from tests.cluster import Cluster, OrchRunner, PasswordLogin, orch_command, repo_python

pytestmark = pytest.mark.cluster


def password_inventory(
    path: Path, cluster: Cluster, logins: dict[str, tuple[int, PasswordLogin]]
) -> Path:
    """node1 as root with the cluster's key (key login works), and per name a host
    that takes only the login's password; no identity_file: the controller's own key."""
    hosts: list[dict[str, object]] = [
        {
            "name": "node1",
            "address": cluster.host(1).address,
            "user": "root",
            "identity_file": str(cluster.client_key),
        }
    ]
    for name, (index, login) in logins.items():
        address = cluster.host(index).address
        hosts.append({"name": name, "address": address, "user": login.user, "port": login.port})
    path.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    return path


def stat_on(cluster: Cluster, i: int, path: str) -> str:
    """`MODE OWNER` of a path on host `i` (`700 orchpw`), or what stat said."""
    found = cluster.exec_on(i, ["stat", "-c", "%a %u", path])
    return found.stdout.strip() or found.stderr.strip()


def processes_showing(secret: bytes) -> list[str]:
    """Every process on this machine (the hosts' too: their pid namespaces are inside
    this one) whose argv or environment holds `secret`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            if secret in data:
                found.append(f"{pid} {part}")
    return found


def files_holding(secret: bytes, *roots: Path) -> list[str]:
    """The files at or under `roots` that hold `secret`."""
    paths = [p for root in roots for p in (root, *root.rglob("*"))]
    return [str(p) for p in paths if p.is_file() and secret in p.read_bytes()]


def test_keys_installs_the_key_with_the_password_then_finds_it_working_and_changes_nothing(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    password = f"pw-{secrets.token_hex(8)}"
    with cluster.password_user(2, password) as login:
        inventory = password_inventory(tmp_path / "inv.yaml", cluster, {"fresh": (2, login)})
        proc = subprocess.Popen(
            [*orch_command(), "-vv", "keys", "-i", str(inventory), "--password-stdin", "--yes"],
            cwd=orch.cwd,
            env=orch.controller.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(password + "\n")
        proc.stdin.close()
        shown: list[str] = []
        while proc.poll() is None:  # look while it logs in and installs
            shown += processes_showing(password.encode())
            time.sleep(0.02)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()

        assert proc.returncode == 0, err
        assert out.splitlines() == ["[node1] key already works", "[fresh] key installed"], out
        assert shown == []
        assert "DEBUG" in err and password not in out + err  # not even paramiko's debug log
        key = orch.controller.home / ".ssh" / "id_ed25519"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
        public = (key.parent / "id_ed25519.pub").read_text()
        uid = stat_on(cluster, 2, login.home).split()[1]
        assert stat_on(cluster, 2, f"{login.home}/.ssh") == f"700 {uid}"
        authorized = f"{login.home}/.ssh/authorized_keys"
        assert stat_on(cluster, 2, authorized) == f"600 {uid}"
        first = cluster.exec_on(2, ["cat", authorized]).stdout
        assert first == public
        before = (
            stat_on(cluster, 2, authorized)
            + cluster.exec_on(2, ["stat", "-c", "%Y.%y", authorized]).stdout
        )

        again = orch("keys", "-i", inventory, input="")  # no terminal, no password

        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [
            "[node1] key already works",
            "[fresh] key already works",
        ]
        assert cluster.exec_on(2, ["cat", authorized]).stdout == first
        after = (
            stat_on(cluster, 2, authorized)
            + cluster.exec_on(2, ["stat", "-c", "%Y.%y", authorized]).stdout
        )
        assert after == before
        controller = orch.controller
        assert (
            files_holding(
                password.encode(),
                controller.home,
                controller.state_dir,
                controller.known_hosts,
                tmp_path,
            )
            == []
        )


def test_a_wrong_password_fails_naming_the_host_writes_nothing_there_and_the_others_still_done(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    with cluster.password_user(2, f"pw-{secrets.token_hex(8)}") as login:
        inventory = password_inventory(tmp_path / "inv.yaml", cluster, {"fresh": (2, login)})

        result = orch("keys", "-i", inventory, "--password-stdin", "--yes", input="wrong\n")

        assert result.returncode == 3, result.stderr
        assert result.stdout.splitlines() == [
            "[node1] key already works",
            f"[fresh] failed: password refused for {login.user}@{cluster.host(2).address}:{login.port}",
        ]
        assert "error: key login does not work on fresh (it does on node1)" in result.stderr
        assert "hint: check the password" in result.stderr
        assert "Traceback" not in result.stderr
        assert cluster.exec_on(2, ["ls", "-A", login.home]).stdout == ""


def test_hosts_that_take_no_password_or_cannot_be_reached_are_each_named_with_the_reason(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    hosts = [  # the controller's own new key, which no host has: node2 wants a password
        {"name": "node2", "address": cluster.host(2).address, "user": "root"},
        {"name": "gone", "address": cluster.host(3).address, "user": "root", "port": 2},
    ]
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": hosts}))

    result = orch("keys", "-i", inventory, "--password-stdin", "--yes", input="whatever\n")

    assert result.returncode == 3, result.stderr
    address2, address3 = cluster.host(2).address, cluster.host(3).address
    assert result.stdout.splitlines() == [
        f"[node2] failed: root@{address2} takes no password (it allows publickey)",
        f"[gone] failed: connection refused by root@{address3}:2",
    ]
    assert "error: key login does not work on node2, gone\n" in result.stderr
    assert "hint: install the key another way" in result.stderr


def test_keys_on_a_terminal_asks_without_echo_once_and_again_only_where_refused(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    first, other = f"pw-{secrets.token_hex(8)}", f"pw-{secrets.token_hex(8)}"
    with (
        cluster.password_user(2, first) as a,
        cluster.password_user(3, first) as b,
        cluster.password_user(1, other) as c,
    ):
        logins = {"a": (2, a), "b": (3, b), "c": (1, c)}
        inventory = password_inventory(tmp_path / "inv.yaml", cluster, logins)
        answers = {
            "Create one": "y",
            f"password for {a.user}@{cluster.host(2).address}:{a.port}: ": first,
            f"password refused; password for {c.user}@{cluster.host(1).address}:{c.port}: ": other,
        }
        transcript, code = run_on_terminal(orch, ["keys", "-i", str(inventory)], answers)

    assert code == 0, transcript
    assert first not in transcript and other not in transcript  # never echoed
    assert transcript.count("password for") == 2, transcript  # b took a's without asking
    lines = [line.strip() for line in transcript.splitlines() if line.startswith("[")]
    assert lines == [
        "[node1] key already works",
        "[a] key installed",
        "[b] key installed",
        "[c] key installed",
    ], transcript


def run_on_terminal(orch: OrchRunner, args: list[str], answers: dict[str, str]) -> tuple[str, int]:
    """Run orch with a pseudo-terminal as its controlling terminal, typing each answer
    when its prompt shows; the transcript (what the terminal showed) and exit code."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout, stderr and /dev/tty are the terminal
        try:
            os.chdir(orch.cwd)
            os.execve(orch_command()[0], [*orch_command(), *args], orch.controller.env())
        finally:
            os._exit(127)  # never back into pytest
    transcript = b""
    pending = dict(answers)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal: it ended
                    break
                if not chunk:
                    break
                transcript += chunk
            shown = transcript.decode(errors="replace")
            for prompt, answer in list(pending.items()):
                if prompt in shown:
                    os.write(fd, answer.encode() + b"\n")
                    del pending[prompt]
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return transcript.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def test_init_writes_an_inventory_that_check_accepts_with_unreachable_hosts_commented_out(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    ssh = orch.controller.home / ".ssh"
    ssh.mkdir(mode=0o700)
    entries = [
        f"Host {host.name}\n  HostName {host.address}\n  User root\n  IdentityFile {cluster.client_key}\n"
        for host in cluster.hosts[:2]
    ]
    # Its sshd is not on port 2: refused at once.
    entries.append(f"Host gone\n  HostName {cluster.host(3).address}\n  Port 2\n  User root\n")
    (ssh / "config").write_text("\n".join(entries))
    output = tmp_path / "inventory" / "hosts.yaml"

    made = orch("init", "node1", "--hosts", "node2,gone", "-o", output)

    assert made.returncode == 3, made.stderr
    assert f"wrote {output}: 2 hosts" in made.stdout
    assert f"next: orch check -i {output}" in made.stdout
    assert "[gone] not probed: connection refused" in made.stdout
    assert "error: gone could not be probed: commented out in" in made.stderr
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    text = output.read_text()
    assert "  # gone: not probed, so left out: connection refused" in text
    assert "  # - name: gone" in text
    inventory = load_inventory(output)
    assert inventory.names() == ["node1", "node2"]
    for host in inventory.hosts:
        assert host.address == host.name  # the alias: ~/.ssh/config applies
        # The interpreter with torch: the venv's (python or python3, as the orch
        # command's own was installed: its symlink selects the venv's site-packages).
        assert Path(host.python).parent == repo_python().parent, host.python
        assert host.slots == 1 and host.gpus == ()

    again = orch("init", "node1", "-o", output)
    assert again.returncode == 2 and "exists already" in again.stderr and "--force" in again.stderr
    assert output.read_text() == text

    checked = orch("check", "-i", output)
    assert checked.returncode == 0, checked.stdout + checked.stderr
