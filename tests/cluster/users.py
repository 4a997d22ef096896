"""Users other than root on a host: one with a password and no key, as on a machine one
has just been given (``password_user``, ``PasswordLogin``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.commands import ClusterError, _child_pid, _run_input
from tests.cluster.hosts import SSHD, Host, HostsMixin, _sshd_config, _wait_for_sshd


class UsersMixin(HostsMixin):
    """Other users on a ``Cluster``'s hosts."""

    @contextlib.contextmanager
    def password_user(
        self, i: int | str, password: str, user: str = "orchpw", port: int = 2222
    ) -> Iterator[PasswordLogin]:
        """A user on host ``i`` who has a password and no authorized key, as on a machine
        one has just been given: a second sshd there, on ``port``, lets ``user`` alone in,
        with that password or a key in its own ``~/.ssh/authorized_keys``.

        The user exists for that sshd and its sessions only (its own mount namespace
        binds copies of /etc/passwd, group and shadow that add it); its home is an empty
        directory in the host's /run, 0755 and its own. On exit the sshd is killed and
        the home removed: the host is as before.

        Yields:
            The login: user, password, port, and the home's path on the host.
        """
        host = self.host(i)
        if host.init_pid is None:
            raise ClusterError(f"{host.name} is down")
        uid = _free_uid()
        home = f"/run/orch-users/{user}"
        made = self.exec_on(i, ["sh", "-c", f"mkdir -p {home} && chown {uid}:{uid} {home}"])
        if made.returncode != 0:
            raise ClusterError(f"cannot make {home} on {host.name}: {made.stderr.strip()}")
        files = host.workdir / f"user-{user}"
        files.mkdir(mode=0o700)
        hashed = _run_input(["openssl", "passwd", "-6", "-stdin"], password + "\n").strip()
        shadow = host.workdir / "shadow"
        shadow_text = (shadow if shadow.exists() else Path("/etc/shadow")).read_text()
        days = int(time.time() // 86400)
        for name, text in (
            ("passwd", Path("/etc/passwd").read_text() + f"{user}:x:{uid}:{uid}::{home}:/bin/sh\n"),
            ("group", Path("/etc/group").read_text() + f"{user}:x:{uid}:\n"),
            ("shadow", shadow_text + f"{user}:{hashed}:{days}:0:99999:7:::\n"),
        ):
            (files / name).write_text(text)
            (files / name).chmod(0o600 if name == "shadow" else 0o644)
        config = files / "sshd_config"
        config.write_text(_password_sshd_config(host, user, port, self.hosts_tmp))
        q = shlex.quote
        binds = " && ".join(
            f"mount --bind {q(str(files / n))} /etc/{n}" for n in ("passwd", "group", "shadow")
        )
        script = f"{binds} && exec {SSHD} -D -e -f {q(str(config))}"
        inside = ["nsenter", "-t", str(host.init_pid), "-n", "-p", "-m", "-u", "--"]
        log_path = files / "sshd.log"
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                [*inside, "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_for_sshd(host.address, process, log_path, port=port)
            yield PasswordLogin(user, password, port, home)
        finally:
            with contextlib.suppress(ClusterError, ProcessLookupError):
                os.kill(_child_pid(process.pid, timeout=1), signal.SIGKILL)
            process.wait(timeout=10)
            if host.running:
                self.exec_on(i, ["sh", "-c", f"rm -rf {home}; rmdir /run/orch-users"])
            shutil.rmtree(files, ignore_errors=True)


@dataclass(frozen=True)
class PasswordLogin:
    """A Unix user that logs in with a password (``Cluster.password_user``): its name,
    password, the port of the sshd that takes it, and its home as the host sees it."""

    user: str
    password: str
    port: int
    home: str


def _password_sshd_config(host: Host, user: str, port: int, tmpdir: Path) -> str:
    """The host's sshd config, for a second sshd that lets ``user`` alone in with a
    password or a key of its own ``~/.ssh/authorized_keys``, checked as sshd does by
    default (StrictModes)."""
    swaps = {
        "Port 22": f"Port {port}",
        f'AuthorizedKeysFile "{host.authorized_keys}"': "AuthorizedKeysFile .ssh/authorized_keys",
        "PermitRootLogin prohibit-password": "PermitRootLogin no",
        "PasswordAuthentication no": "PasswordAuthentication yes",
        "StrictModes no": "StrictModes yes",
    }
    config = _sshd_config(host, tmpdir)
    for old, new in swaps.items():
        assert old in config, old
        config = config.replace(old, new)
    return config + f"AllowUsers {user}\n"


def _free_uid(start: int = 62000) -> int:
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    return next(uid for uid in range(start, 65000) if uid not in taken)
