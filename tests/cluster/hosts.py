"""One host: its names and files (host key, certificate, sshd config, private home),
the script its PID 1 runs before it becomes sshd, and ``HostsMixin``: finding a host,
writing its files, booting and killing it."""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.commands import ClusterError, _child_pid, _run
from tests.cluster.controller import REPO_ROOT, Controller, repo_python
from tests.cluster.network import NETNS_PREFIX, SUBNET, VETH_PREFIX, _mac_for

SSHD = "/usr/sbin/sshd"
# sshd reads the home directory of root from passwd; that is what the private home hides.
ROOT_HOME = Path(pwd.getpwuid(0).pw_dir)
# Where every host's agent reads the host's line policy (agent/leases/admin.py): on the
# host's own tmpfs /run/lock, not this machine's /etc, which the hosts share with it.
POLICY_FILE = "/run/lock/orch-policy/policy"


def paths_hidden_by_private_home() -> list[Path]:
    """Paths under root's home that the hosts need although their home is private.

    The interpreters (a pyenv under ~ is common), the venv, the repository (CI often
    clones under ~) and the temp dir. Both the spelled and the resolved form of each
    count, since a symlink under ~ disappears with the home that holds it.

    Returns:
        Absolute paths under ``ROOT_HOME``, none inside another.
    """
    candidates: set[Path] = set()
    for path in (
        Path(sys.base_prefix),
        Path(sys.prefix),
        Path(sys.executable).resolve().parents[1],
        repo_python().resolve().parents[1],
        REPO_ROOT,
        Path(tempfile.gettempdir()),
    ):
        candidates.update({Path(os.path.abspath(path)), path.resolve()})
    under_home = sorted(p for p in candidates if p.is_relative_to(ROOT_HOME) and p != ROOT_HOME)
    outermost: list[Path] = []
    for path in under_home:  # sorted: a parent comes before its children
        if not any(path.is_relative_to(kept) for kept in outermost):
            outermost.append(path)
    return outermost


def _generate_key(path: Path, comment: str) -> None:
    """Write a fresh passphrase-less ed25519 keypair at ``path`` and ``path.pub``."""
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _wait_for_sshd(
    address: str,
    process: subprocess.Popen[bytes],
    log_path: Path,
    timeout: float = 10,
    port: int = 22,
) -> None:
    """Return once an SSH banner comes from ``address:port``; raise if sshd dies or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(
                f"sshd for {address} exited {process.returncode}: {log_path.read_text()[-2000:]}"
            )
        try:
            with socket.create_connection((address, port), timeout=0.5) as conn:
                conn.settimeout(2)
                if conn.recv(64).startswith(b"SSH-"):
                    # Answering with a banner keeps "kex_exchange_identification"
                    # errors out of the sshd log, which should show real problems only.
                    conn.sendall(b"SSH-2.0-orch-test-probe\r\n")
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise ClusterError(
        f"sshd on {address}:{port} not answering after {timeout}s: {log_path.read_text()[-2000:]}"
    )


@dataclass
class Host:
    """One host of the cluster: names, files, and its running sshd (if any)."""

    index: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    init_pid: int | None = None  # root-namespace pid of the host's PID 1 (its sshd)
    init_pidfd: int | None = None  # kills that very process even if its pid is reused
    partitioned: bool = False
    shared_home: Path | None = None  # mounted as /root instead of the private home

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.index}"

    @property
    def mac(self) -> str:
        """The MAC address of the host's ``eth0``: the same for every host at this index."""
        return _mac_for(self.address)

    @property
    def private_home(self) -> Path:
        """The home this host has alone, as seen from the machine."""
        return self.workdir / "home"

    @property
    def home(self) -> Path:
        """The directory this host mounts as ``/root``: a shared home if any, else its own."""
        return self.shared_home or self.private_home

    @property
    def host_key(self) -> Path:
        return self.workdir / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.workdir / "authorized_keys"

    @property
    def sshd_config(self) -> Path:
        return self.workdir / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.workdir / "sshd.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def known_hosts_line(self) -> str:
        """This host's entry for a known_hosts file."""
        key_type, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{self.address} {key_type} {key}\n"


class HostsMixin:
    """The hosts of a ``Cluster``: finding one, writing its files, booting and killing it.

    Declares the state every room of ``Cluster`` shares; ``Cluster.__init__`` sets it.
    """

    hosts: list[Host]
    workdir: Path | None
    client_key: Path | None
    host_ca: Path | None
    _controller: Controller | None

    def host(self, i: int | str) -> Host:
        """Host by 1-based index or by name (``"node2"``)."""
        for host in self.hosts:
            if i in (host.index, host.name):
                return host
        raise ClusterError(f"no host {i!r} in a cluster of {len(self.hosts)}")

    def home(self, i: int | str) -> Path:
        """Host ``i``'s home directory (its ``/root``), as a path on this machine."""
        return self.host(i).home

    @property
    def hosts_tmp(self) -> Path:
        """The hosts' TMPDIR, which sshd sets for every session: what torchrun and the
        ranks leave in temporary directories goes with the cluster, not into this
        machine's /tmp, which the hosts share. Sticky and world-writable, as /tmp is."""
        assert self.workdir is not None
        return Path(f"{self.workdir}-tmp")  # TMP_PREFIX: a crashed run's is removed too

    def _write_keys_and_configs(self) -> None:
        """Fresh client key and host CA, then each host's files (``_write_host_files``)."""
        assert self.workdir is not None
        self.hosts_tmp.mkdir()
        self.hosts_tmp.chmod(0o1777)
        self.client_key = self.workdir / "client" / "id_ed25519"
        self.client_key.parent.mkdir(mode=0o700)
        _generate_key(self.client_key, "orch-test-client")
        self.host_ca = self.workdir / "client" / "host_ca"
        _generate_key(self.host_ca, "orch-test-host-ca")
        for host in self.hosts:
            self._write_host_files(host)

    def _write_host_files(self, host: Host) -> None:
        """The host's private home, fresh host key and its certificate (for its
        address, valid for a day), authorized client key and sshd config."""
        assert self.client_key is not None and self.host_ca is not None
        _prepare_home(host.private_home)
        _generate_key(host.host_key, host.name)
        sign = ["ssh-keygen", "-q", "-s", str(self.host_ca), "-I", host.name, "-h"]
        _run([*sign, "-n", host.address, "-V", "-5m:+1d", str(host.host_key.with_suffix(".pub"))])
        host.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        host.sshd_config.write_text(_sshd_config(host, self.hosts_tmp))

    def _boot(self, host: Host) -> None:
        """Start the host's sshd as PID 1 of fresh pid/mount/uts namespaces and wait for it."""
        unshare = ["unshare", "--pid", "--mount", "--uts", "--fork", "--mount-proc"]
        argv = ["ip", "netns", "exec", host.netns, *unshare, "sh", "-c", _init_script(host)]
        with host.sshd_log.open("ab") as log_file:
            host.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the terminal's Ctrl-C must not reach the hosts
            )
        host.init_pid = _child_pid(host.process.pid)
        host.init_pidfd = os.pidfd_open(host.init_pid)
        _wait_for_sshd(host.address, host.process, host.sshd_log)

    def _kill(self, host: Host) -> None:
        """SIGKILL the host's PID 1 (so the whole pid namespace) and reap its unshare."""
        if host.init_pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(host.init_pidfd, signal.SIGKILL)
            os.close(host.init_pidfd)
            host.init_pidfd = None
        if host.process is not None:
            try:
                # unshare reaps its PID 1 and exits. Killing it first would orphan that
                # PID 1 to the machine's init, which may never reap it.
                host.process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # PID 1 never found: kill unshare's group
                os.killpg(host.process.pid, signal.SIGKILL)  # unreaped, so the id is ours
                host.process.wait(timeout=10)
        host.init_pid = None


def _prepare_home(path: Path) -> None:
    """Create an empty home at ``path`` with the mount points ``_init_script`` binds onto."""
    path.mkdir(parents=True, mode=0o700)
    for hidden in paths_hidden_by_private_home():
        (path / hidden.relative_to(ROOT_HOME)).mkdir(parents=True, exist_ok=True)


def _sshd_config(host: Host, tmpdir: Path) -> str:
    """An sshd config that lets the client key in as root and nothing else."""
    return f"""\
SetEnv TMPDIR={tmpdir} ORCH_POLICY_FILE={POLICY_FILE}
Port 22
ListenAddress 0.0.0.0
HostKey "{host.host_key}"
HostCertificate "{host.host_key}-cert.pub"
AuthorizedKeysFile "{host.authorized_keys}"
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PidFile none
StrictModes no
MaxStartups 100
MaxSessions 100
UseDNS no
PrintMotd no
PrintLastLog no
LogLevel ERROR
Subsystem sftp internal-sftp
"""


def _unlocked_shadow(host: Host) -> Path | None:
    """A copy of /etc/shadow where root's password is unset rather than locked, if needed.

    Without PAM, sshd refuses every login (keys too) to an account whose password
    starts with "!", as root's does on many images. The copy is bound over
    /etc/shadow in the host's own mount namespace only.

    Returns:
        The copy's path, or None when root is not locked.
    """
    lines = Path("/etc/shadow").read_text().splitlines(keepends=True)
    for n, line in enumerate(lines):
        user, password, rest = [*line.split(":", 2), "", ""][:3]
        if user == "root" and password.startswith("!"):
            lines[n] = f"root:{password.lstrip('!') or '*'}:{rest}"
            copy = host.workdir / "shadow"
            copy.touch(mode=0o600)  # it holds the machine's password hashes
            copy.write_text("".join(lines))
            return copy
    return None


def home_mount_lines(home: Path) -> list[str]:
    """Shell lines that mount ``home`` as ``/root`` (in a host's own mount namespace).

    A home hides whatever lives under root's home (a pyenv, the repository): those are
    bound into it first, so that the rbind shows them at their usual paths."""
    q = shlex.quote
    lines = [f"mount --bind {q(str(src))} {q(str(dst))}" for src, dst in hidden_binds(home)]
    return [*lines, f"mount --rbind {q(str(home))} {q(str(ROOT_HOME))}"]


def hidden_binds(home: Path) -> list[tuple[Path, Path]]:
    """What ``home`` needs bound into it (the venv, the repository under ~): (from, onto)."""
    return [
        (path.resolve(), home / path.relative_to(ROOT_HOME))
        for path in paths_hidden_by_private_home()
    ]


def _init_script(host: Host) -> str:
    """What runs as the host's PID 1 before it becomes sshd.

    Mounts happen in the host's own mount namespace, so nothing shows on the machine.
    """
    q = shlex.quote
    lines = [
        "set -e",
        f"hostname {host.name}",
        # Debian's sshd wants /run/sshd; a private /run gives every host its own and
        # leaves nothing behind on the machine.
        "mount -t tmpfs -o mode=755 orch-run /run",
        "mkdir /run/sshd && mkdir -m 1777 /run/lock && ln -s /dev/shm /run/shm",
    ]
    lines += home_mount_lines(host.home)
    shadow = _unlocked_shadow(host)
    if shadow is not None:
        lines.append(f"mount --bind {q(str(shadow))} /etc/shadow")
    lines.append(f"exec {SSHD} -D -e -f {q(str(host.sshd_config))}")
    return "\n".join(lines)
