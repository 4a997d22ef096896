"""A cluster of real SSH hosts on one Linux machine, for integration tests.

Each host is a network namespace joined to the bridge ``orchbr0`` by a veth pair,
running its own ``sshd`` as PID 1 of a private pid/mount/uts namespace: it has its
own address, process table, hostname and home directory (DESIGN.md, "Test cluster").

    with Cluster(3) as cluster:
        cluster.write_inventory(tmp / "inventory.yaml")
        subprocess.run(["orch", "check"], env=cluster.env(inventory=tmp / "inventory.yaml"))
        cluster.crash(2)

Everything is created under fixed names (``orchbr0``, ``orch-node{i}``, ``orchv{i}``),
so one cluster exists per network at a time; a lock makes a second session on the same
network wait. ``ORCH_TEST_NET=N`` (and each pytest-xdist worker) picks another network:
``orchbrN``, ``orchN-node{i}``, ``orchvNx{i}`` and 10.77.N.0/24. Traffic only ever goes
to the addresses of these namespaces.

Public surface, for ``tests/`` and ``bench/`` alike: the names in ``__all__``, listed
below. Every other name here (constants, module functions, ``Host`` fields not listed)
is how the harness builds the hosts, and may change without notice.

- ``Cluster``: ``start``/``stop`` (or ``with``); its ``hosts`` (``Host``),
  ``client_key`` and ``host_ca`` (the CA that signed every host's certificate, a
  ``HostCertificate`` its sshd offers to clients that ask for one); faults (``crash``, ``restart``, ``partition``, ``heal``, ``cut_controller``,
  ``limit_controller`` (a slow link from this machine, as a laptop's),
  ``reconnect_controller``,
  ``ensure_healthy``); other shapes, each a ``with`` block that undoes itself on exit
  (``password_user(i, password)``: a user with a password and no key, ``PasswordLogin``;
  ``shared_home(hosts)``: one ``/root`` for several hosts, NFS-style;
  ``extra_hosts(n)``: node4.. beside the session's hosts, which a ``new_controller()``
  made inside the block trusts); looking inside a host (``host``, ``home``, ``exec_on``,
  ``host_pids``, ``ssh``); the controller side (``write_inventory``, ``new_controller``,
  ``env``); a second cable between two hosts (``add_link``, ``route_via_link``,
  ``remove_link``), firewalls (``block_port``, ``unblock_port``) and leftover
  listeners (``hold_port``, ``release_port``).
- ``Host``: read ``index``, ``name``, ``address``, ``home`` (its ``/root``, as seen
  from this machine: the shared one inside ``shared_home``) and ``known_hosts_line()``;
  its other fields are the harness's bookkeeping, which only the harness's own tests
  look at.
- ``Controller``: a machine running ``orch``: ``home``, ``known_hosts``, ``state_dir``
  and ``env()``. ``OrchRunner`` runs the real CLI as one.
- ``orch_command()``, ``repo_python()``, ``REPO_ROOT``: the CLI, the hosts' interpreter
  and the repository this harness belongs to.
- ``require_cluster_support()``, ``skip_or_fail()``, ``cluster_unavailable_reason()``:
  skip (in CI, fail) where the cluster cannot run; ``ClusterError`` when it breaks.
- ``BRIDGE``, ``SUBNET``, ``ROOT_HOME``: the bridge's name, the first three octets of
  the hosts' addresses, and the home directory every host hides.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

__all__ = [
    "BRIDGE",
    "REPO_ROOT",
    "ROOT_HOME",
    "SUBNET",
    "Cluster",
    "ClusterError",
    "Controller",
    "Host",
    "OrchRunner",
    "PasswordLogin",
    "cluster_unavailable_reason",
    "orch_command",
    "repo_python",
    "require_cluster_support",
    "skip_or_fail",
]

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SSHD = "/usr/sbin/sshd"


def _net_number(environ: Mapping[str, str] = os.environ) -> int:
    """Which of the machine's test networks this process builds its cluster on.

    ``ORCH_TEST_NET`` (default 0) plus the pytest-xdist worker's number (``gw3`` is 3):
    each worker gets a cluster of its own, with its own bridge, namespaces, subnet
    (10.77.N.0/24, inside 10.77.0.0/16) and lock, so workers never wait for each other.
    """
    base = int(environ.get("ORCH_TEST_NET", "0") or 0)
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    number = base + (int(worker[2:]) if worker.startswith("gw") else 0)
    if not 0 <= number <= 250:
        raise ValueError(f"ORCH_TEST_NET plus the worker number must be within 0..250: {number}")
    return number


NET = _net_number()
# Network 0 keeps the names the harness always had; network N > 0 carries N in each.
_TAG = "" if NET == 0 else str(NET)
BRIDGE = f"orchbr{NET}"
SUBNET = f"10.77.{NET}"
BRIDGE_ADDRESS = f"{SUBNET}.1"
NETNS_PREFIX = f"orch{_TAG}-node"
VETH_PREFIX = "orchv" if NET == 0 else f"orchv{NET}x"
PEER_PREFIX = "orchi" if NET == 0 else f"orchi{NET}x"  # a veth's host end, before its rename
TMP_PREFIX = f"orch-testcluster{_TAG}-"
MAX_HOSTS = 50
# The kernel's one IPv4 neighbour (ARP) table, shared by every network namespace.
NEIGH_SYSCTLS = Path("/proc/sys/net/ipv4/neigh/default")
NEIGH_LIMITS = ("gc_thresh2", "gc_thresh3")
NEIGH_SAVED = Path(tempfile.gettempdir()) / f"orch-testcluster{_TAG}-arp-limits.json"
# An abstract unix socket: machine-wide (per network namespace, and every test runs in
# the root one), released by the kernel when its holder dies, and leaves no file behind.
LOCK_ADDRESS = f"\0orch-testcluster{_TAG}.lock"
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "mount", "ssh-keygen", "ssh")
# sshd reads the home directory of root from passwd; that is what the private home hides.
ROOT_HOME = Path(pwd.getpwuid(0).pw_dir)

_LIST_PROCESSES = r"""
import json, os
found = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open(f"/proc/{name}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{name}/stat") as f:
            stat = f.read()
    except OSError:  # exited while we looked
        continue
    comm, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
    if state == "Z":
        cmdline = f"[{comm}] <defunct>"
    found.append([int(name), cmdline or f"[{comm}]"])
print(json.dumps(sorted(found)))
"""

_CHECK_REACHABLE = r"""
import socket, sys
for address in sys.argv[1:]:
    with socket.create_connection((address, 22), timeout=3) as conn:
        assert conn.recv(64).startswith(b"SSH-"), address
        conn.sendall(b"SSH-2.0-orch-test-probe\r\n")
"""


class ClusterError(RuntimeError):
    """The test cluster could not be built, or a host is not in the state asked for."""


def cluster_unavailable_reason() -> str | None:
    """Say why this machine cannot run the test cluster.

    Returns:
        None when it can, else a short reason for a skip or failure message.
    """
    if not sys.platform.startswith("linux"):
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    if not os.access(SSHD, os.X_OK):
        return f"needs {SSHD} (Debian package openssh-server)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    # Root inside an unprivileged container still lacks CAP_SYS_ADMIN: ask the kernel.
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--mount", "--uts", "--fork", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return None


def skip_or_fail(reason: str, environ: Mapping[str, str] = os.environ) -> None:
    """Skip the calling test because the cluster is unavailable; fail instead in CI.

    A skipped cluster test in CI would let the integration suite pass without running.

    Raises:
        pytest.fail.Exception: when ``CI`` is true in ``environ``.
        pytest.skip.Exception: otherwise.
    """
    import pytest  # only the fixtures need it; the harness itself is plain Python

    if environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"test cluster unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"test cluster unavailable: {reason}")


def require_cluster_support() -> None:
    """Skip (or in CI fail) the calling test unless this machine can run the cluster."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)


def repo_python() -> Path:
    """The interpreter the hosts use: the repository's venv, else the running one.

    Not resolved: the venv's symlink is what selects its site-packages (torch).
    """
    venv_python = REPO_ROOT / ".venv" / "bin" / "python"
    return venv_python if venv_python.exists() else Path(sys.executable)


def orch_command() -> list[str]:
    """The argv prefix that runs the real ``orch`` CLI of this repository."""
    script = REPO_ROOT / ".venv" / "bin" / "orch"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "orchestrator"]


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


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a setup command; a failure raises with its stderr."""
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise ClusterError(
            f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result


def _run_input(argv: Sequence[str], stdin: str) -> str:
    """Run a setup command with ``stdin`` (a secret stays out of its argv); its stdout."""
    result = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise ClusterError(
            f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def _json_list(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Parse the ``-j`` output of an ``ip`` listing (empty output means none)."""
    out = _run(argv).stdout.strip()
    return json.loads(out) if out else []


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


def _child_pid(parent: int, timeout: float = 5) -> int:
    """The single child of ``parent``: the process ``unshare --fork`` made PID 1."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pids = children.read_text().split()
        except OSError as exc:
            raise ClusterError(f"unshare ({parent}) exited before forking its PID 1") from exc
        if pids:
            return int(pids[0])
        time.sleep(0.01)
    raise ClusterError(f"unshare ({parent}) forked no PID 1 within {timeout}s")


def _acquire_machine_lock(timeout: float) -> socket.socket:
    """Hold the one-cluster-per-machine lock, waiting up to ``timeout`` seconds for it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.bind(LOCK_ADDRESS)
            return sock
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                sock.close()
                raise ClusterError(
                    f"another test cluster holds the machine for over {timeout}s"
                ) from exc
            time.sleep(0.5)


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


@dataclass(frozen=True)
class Controller:
    """The machine that runs ``orch``: its own HOME, known_hosts and job state."""

    home: Path
    known_hosts: Path
    state_dir: Path

    def env(self, inventory: Path | None = None, **extra: str) -> dict[str, str]:
        """Environment for running the ``orch`` CLI as this controller.

        Inherits PATH and the rest, but not the caller's ORCH_* variables or SSH agent,
        which would make results depend on who runs the tests.
        """
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("ORCH_") and key not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID")
        }
        env.update(
            HOME=str(self.home),
            ORCH_KNOWN_HOSTS=str(self.known_hosts),
            ORCH_HOME=str(self.state_dir),
        )
        if inventory is not None:
            env["ORCH_INVENTORY"] = str(inventory)
        env.update(extra)
        return env


class OrchRunner:
    """Runs the real ``orch`` CLI as a subprocess on behalf of one controller."""

    def __init__(self, controller: Controller, cwd: Path = REPO_ROOT, timeout: float = 120) -> None:
        self.controller = controller
        self.cwd = cwd
        self.timeout = timeout

    def __call__(
        self,
        *args: str | os.PathLike[str],
        timeout: float | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``orch *args`` and return its exit code, stdout and stderr (text)."""
        return subprocess.run(
            [*orch_command(), *map(str, args)],
            cwd=cwd or self.cwd,
            env={**self.controller.env(), **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout or self.timeout,
            check=False,
        )

    def popen(self, *args: str | os.PathLike[str]) -> subprocess.Popen[str]:
        """Start ``orch *args`` in a session of its own (``os.killpg`` reaches it and
        nothing else); ``communicate`` reads its output (text)."""
        return subprocess.Popen(
            [*orch_command(), *map(str, args)],
            cwd=self.cwd,
            env=self.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


class Cluster:
    """Real SSH hosts ``node1..nodeN`` at 10.77.NET.11.. on this machine (needs root).

    Hosts are numbered from 1. ``crash``, ``partition`` and ``heal`` inject faults;
    ``restart`` and ``ensure_healthy`` undo them. ``stop`` removes everything created.
    """

    def __init__(self, n_hosts: int = 3) -> None:
        self.n_hosts = n_hosts
        self.hosts: list[Host] = []
        self.workdir: Path | None = None
        self.client_key: Path | None = None
        self.host_ca: Path | None = None
        self._controller: Controller | None = None
        self._controllers_made = 0
        self._shared_homes_made = 0
        self._lock: socket.socket | None = None
        self._neigh_saved: dict[str, str] = {}  # ARP table limits as they were (NEIGH_SAVED)
        self.controller_cut = False  # cut_controller: this machine is off the cluster

    # -- lifecycle --------------------------------------------------------------

    def start(self, n_hosts: int | None = None, lock_timeout: float = 900) -> Cluster:
        """Build the network and boot every host; return once each sshd answers.

        Args:
            n_hosts: how many hosts (default: the constructor's).
            lock_timeout: seconds to wait for another session's cluster to go away.

        Raises:
            ClusterError: a setup command failed or a host did not come up.
        """
        if self.hosts:
            raise ClusterError("cluster already started")
        self.n_hosts = n_hosts or self.n_hosts
        if not 1 <= self.n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts must be within 1..{MAX_HOSTS}, not {self.n_hosts}")
        self._lock = _acquire_machine_lock(lock_timeout)
        atexit.register(self.stop)
        try:
            remove_leftovers()
            self.workdir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
            self.hosts = [Host(i, self.workdir / f"node{i}") for i in range(1, self.n_hosts + 1)]
            self._write_keys_and_configs()
            self._fit_neighbour_table(self.n_hosts)
            self._create_network()
            for host in self.hosts:
                self._boot(host)
            self._check_hosts_reach_each_other()
            self._controller = self.new_controller()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill the hosts' processes and remove the links, namespaces and files made.

        Idempotent, and safe after a partial ``start``.
        """
        for host in self.hosts:
            self._kill(host)
        for host in self.hosts:
            self._unplug(host)
        if self.hosts:
            _run(["ip", "link", "del", BRIDGE], check=False)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._neigh_saved:
            _restore_neighbour_limits()
            self._neigh_saved = {}
        self.hosts, self.workdir, self._controller = [], None, None
        self.client_key = self.host_ca = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Cluster:
        return self if self.hosts else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------

    def crash(self, i: int) -> None:
        """Kill host ``i``'s PID 1: the kernel kills every process on that host.

        Its address stays up with nothing listening, so connections are refused;
        combine with ``partition`` for a host that goes silent instead.
        """
        self._kill(self.host(i))

    def restart(self, i: int) -> None:
        """Boot host ``i`` again (crashing it first if up): same disk and host key."""
        host = self.host(i)
        self._kill(host)
        self._boot(host)

    def partition(self, i: int) -> None:
        """Cut host ``i`` off the network; its processes keep running."""
        host = self.host(i)
        _run(["ip", "link", "set", host.veth, "down"])
        host.partitioned = True

    def heal(self, i: int) -> None:
        """Reconnect host ``i`` after ``partition``."""
        host = self.host(i)
        _run(["ip", "link", "set", host.veth, "up"])
        host.partitioned = False

    @contextlib.contextmanager
    def limit_controller(self, mbit: int) -> Iterator[None]:
        """This machine's link to the hosts at ``mbit`` Mbit/s, as a laptop's on Wi-Fi:
        a tc token bucket on the bridge shapes what this machine sends to the hosts,
        while hosts still talk to each other at full speed (bridged between their own
        links). Undone on exit; the bridge takes it along if the cluster stops first."""
        shape = ["tc", "qdisc", "replace", "dev", BRIDGE, "root", "tbf", "rate", f"{mbit}mbit"]
        _run([*shape, "burst", "256kb", "latency", "100ms"])
        try:
            yield
        finally:
            _run(["tc", "qdisc", "del", "dev", BRIDGE, "root"], check=False)

    def cut_controller(self) -> None:
        """Take this machine off the cluster, as a laptop's Wi-Fi drops: the bridge's
        side here goes down (new connections: network unreachable; open ones go
        silent). Undo with ``reconnect_controller``."""
        _run(["ip", "link", "set", BRIDGE, "down"])
        self.controller_cut = True

    def reconnect_controller(self) -> None:
        """Bring this machine back onto the cluster after ``cut_controller``."""
        _run(["ip", "link", "set", BRIDGE, "up"])
        self.controller_cut = False

    def ensure_healthy(self) -> None:
        """Undo every fault: start if stopped, reconnect this machine, heal partitions,
        boot crashed hosts."""
        if not self.hosts:
            self.start()
            return
        if self.controller_cut:
            self.reconnect_controller()
        for host in self.hosts:
            if host.partitioned:
                self.heal(host.index)
            if not host.running:
                self._boot(host)

    # -- other shapes: shared homes, more hosts -----------------------------------
    # Both are context managers: the session shares one cluster, so a test borrows a
    # shape and hands the cluster back as it found it.

    @contextlib.contextmanager
    def shared_home(self, hosts: Sequence[int | str]) -> Iterator[Path]:
        """Have ``hosts`` mount one fresh directory as their ``/root``, as with NFS homes.

        Those hosts reboot (as ``restart``: same address and host key, their processes
        die) into the shared home; on exit they reboot into their private homes and the
        directory is removed. Other hosts are left alone, so one ``with`` per group
        makes a mixed layout::

            with cluster.shared_home([1, 2]) as home:  # node3 keeps its own
                cluster.exec_on(1, ["touch", "/root/x"])
                assert (home / "x").exists() and cluster.home(2) == home

        Meanwhile ``home(i)`` and ``Host.home`` name the shared directory for those
        hosts. Each still has its own mount namespace: binds made inside one stay its
        own. A host partitioned at exit is left down, for ``ensure_healthy`` to boot.

        Args:
            hosts: indices or names of the hosts that share; none may share already.

        Yields:
            The shared directory, as a path on this machine.

        Raises:
            ValueError: no hosts, or one listed twice.
            ClusterError: a host shares a home already, or did not come back up.
        """
        selected = [self.host(i) for i in hosts]
        if not selected or len({host.index for host in selected}) != len(selected):
            raise ValueError(f"shared_home needs distinct hosts, not {list(hosts)}")
        busy = [host.name for host in selected if host.shared_home is not None]
        if busy:
            raise ClusterError(f"{', '.join(busy)} already share a home")
        assert self.workdir is not None
        self._shared_homes_made += 1
        home = self.workdir / "shared-homes" / str(self._shared_homes_made)
        _prepare_home(home)
        try:
            for host in selected:
                host.shared_home = home
                self.restart(host.index)
            yield home
        finally:
            # A stop() inside the block already removed these hosts (and the directory).
            moved = [host for host in selected if host.shared_home == home and self._has(host)]
            try:
                self._reboot_into_private_homes(moved)
            finally:
                shutil.rmtree(home, ignore_errors=True)

    def _reboot_into_private_homes(self, hosts: Sequence[Host]) -> None:
        """Kill ``hosts``, then boot each with its private home (partitioned ones stay down).

        Raises:
            ClusterError: naming every host that did not come up, after trying them all.
        """
        for host in hosts:
            self._kill(host)
            host.shared_home = None
        failures = []
        for host in hosts:
            if host.partitioned:
                continue
            try:
                self._boot(host)
            except ClusterError as exc:
                failures.append(f"{host.name}: {exc}")
        if failures:
            raise ClusterError("hosts did not boot into their own homes: " + "; ".join(failures))

    @contextlib.contextmanager
    def extra_hosts(self, n: int = 1) -> Iterator[list[Host]]:
        """Plug in and boot ``n`` more hosts after the last one, for a test that needs more.

        ``with cluster.extra_hosts(1) as (node4,):`` adds node4 (10.77.NET.14) to ``hosts``,
        built as the others (fresh host key, private home); ``write_inventory`` lists it
        from then on. This cluster's own controller (``ssh``, ``env``) trusts the added
        hosts until exit, but controllers made before do not: make one that does with
        ``new_controller()`` inside the block. On exit the added hosts are killed, their
        veth pairs and namespaces deleted, and ``hosts`` is as before; ``stop`` inside the
        block removes them too.

        Args:
            n: how many hosts to add.

        Yields:
            The added hosts, by index.

        Raises:
            ValueError: ``n`` below 1, or more than ``MAX_HOSTS`` hosts in all.
            ClusterError: the cluster is not started, or a host did not come up.
        """
        if not self.hosts or self.workdir is None or self._controller is None:
            raise ClusterError("cluster not started")
        first = max(host.index for host in self.hosts) + 1
        if n < 1 or first + n - 1 > MAX_HOSTS:
            raise ValueError(f"n must be within 1..{MAX_HOSTS - first + 1}, not {n}")
        added: list[Host] = []
        self._fit_neighbour_table(len(self.hosts) + n)
        try:
            for index in range(first, first + n):
                host = Host(index, self.workdir / f"node{index}")
                self.hosts.append(host)  # from here on, stop() removes it too
                added.append(host)
                self._write_host_files(host)
                self._plug_in(host)
                self._boot(host)
            with self._controller.known_hosts.open("a") as known_hosts:
                known_hosts.writelines(host.known_hosts_line() for host in added)
            yield list(added)
        finally:
            self._remove_hosts([host for host in added if self._has(host)])

    def _remove_hosts(self, hosts: Sequence[Host]) -> None:
        """Kill ``hosts``, delete their links, namespaces and files, and forget them.

        The default controller forgets their keys, as a later host of the same address
        will have another.
        """
        for host in hosts:
            self._kill(host)
        for host in hosts:
            self._unplug(host)
            shutil.rmtree(host.workdir, ignore_errors=True)
        self.hosts = [host for host in self.hosts if not any(host is gone for gone in hosts)]
        if self._controller is not None and self._controller.known_hosts.exists():
            addresses = {host.address for host in hosts}
            lines = self._controller.known_hosts.read_text().splitlines(keepends=True)
            kept = [line for line in lines if line.split(" ", 1)[0] not in addresses]
            self._controller.known_hosts.write_text("".join(kept))

    def _has(self, host: Host) -> bool:
        """Whether ``host`` is this very cluster's (not one a ``stop`` has since removed)."""
        return any(host is mine for mine in self.hosts)

    # -- looking inside hosts ---------------------------------------------------

    def host(self, i: int | str) -> Host:
        """Host by 1-based index or by name (``"node2"``)."""
        for host in self.hosts:
            if i in (host.index, host.name):
                return host
        raise ClusterError(f"no host {i!r} in a cluster of {len(self.hosts)}")

    def home(self, i: int | str) -> Path:
        """Host ``i``'s home directory (its ``/root``), as a path on this machine."""
        return self.host(i).home

    def exec_on(
        self, i: int | str, argv: Sequence[str], *, timeout: float = 30, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``i`` without SSH: in its network, pid, mount and uts namespaces.

        Sees what the host's own processes see (its /proc, its /root, its hostname).
        """
        host = self.host(i)
        if not host.running or host.init_pid is None:
            raise ClusterError(f"{host.name} is down")
        return subprocess.run(
            ["nsenter", "-t", str(host.init_pid), "-n", "-p", "-m", "-u", "--", *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
            env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(ROOT_HOME)},
        )

    def host_pids(self, i: int | str) -> list[tuple[int, str]]:
        """Every process in host ``i``'s own process table, as (pid there, command line).

        Zombies read ``[name] <defunct>``; the lister itself is left out.
        """
        result = self.exec_on(i, [sys.executable, "-I", "-S", "-c", _LIST_PROCESSES])
        if result.returncode != 0:
            raise ClusterError(
                f"listing processes on {self.host(i).name} failed: {result.stderr.strip()}"
            )
        return [(pid, cmdline) for pid, cmdline in json.loads(result.stdout)]

    def ssh(
        self, i: int | str, command: str, *, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``i`` through the system ``ssh`` client as root."""
        host = self.host(i)
        assert self.client_key is not None and self._controller is not None
        options = [
            "IdentitiesOnly=yes",
            f"UserKnownHostsFile={self._controller.known_hosts}",
            "StrictHostKeyChecking=accept-new",
            "BatchMode=yes",
            "ConnectTimeout=5",
            "LogLevel=ERROR",
        ]
        # -F: the caller's ~/.ssh/config must not change the result.
        argv = ["ssh", "-F", os.devnull, "-i", str(self.client_key)]
        argv += [arg for option in options for arg in ("-o", option)]
        argv += [f"root@{host.address}", command]
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    # -- controller side ----------------------------------------------------------

    def write_inventory(
        self,
        path: Path,
        hosts: Sequence[int | str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        **host_extras: Mapping[str, Any],
    ) -> Path:
        """Write an orch inventory of (some of) the hosts.

        Args:
            path: where to write the YAML.
            hosts: indices or names to include (default: all).
            defaults: keys merged over the default section; a None value removes a key.
            **host_extras: per host name, keys merged over its entry, e.g.
                ``node2={"slots": 2}``.

        Returns:
            ``path``.
        """
        unknown = set(host_extras) - {host.name for host in self.hosts}
        if unknown:
            raise ValueError(f"extras for unknown hosts: {sorted(unknown)}")
        selected = self.hosts if hosts is None else [self.host(h) for h in hosts]
        base = {"user": "root", "identity_file": str(self.client_key), "python": str(repo_python())}
        doc = {
            "defaults": _merged(base, defaults or {}),
            "hosts": [
                _merged(
                    {"name": host.name, "address": host.address}, host_extras.get(host.name, {})
                )
                for host in selected
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def new_controller(self, trust_hosts: bool = True) -> Controller:
        """A fresh controller: empty HOME and job state, known_hosts as asked.

        Args:
            trust_hosts: pre-fill known_hosts with every host key (as after a first
                ``ssh`` by hand); False leaves it empty.
        """
        assert self.workdir is not None, "cluster not started"
        self._controllers_made += 1
        root = self.workdir / "controllers" / str(self._controllers_made)
        controller = Controller(
            home=root / "home", known_hosts=root / "known_hosts", state_dir=root / "state"
        )
        controller.home.mkdir(parents=True, mode=0o700)
        controller.state_dir.mkdir()
        lines = [host.known_hosts_line() for host in self.hosts] if trust_hosts else []
        controller.known_hosts.write_text("".join(lines))
        return controller

    def env(self, inventory: Path | None = None, **extra: str) -> dict[str, str]:
        """Environment for running ``orch`` as this cluster's default controller."""
        assert self._controller is not None, "cluster not started"
        return self._controller.env(inventory, **extra)

    # -- building -----------------------------------------------------------------

    def _write_keys_and_configs(self) -> None:
        """Fresh client key and host CA, then each host's files (``_write_host_files``)."""
        assert self.workdir is not None
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
        host.sshd_config.write_text(_sshd_config(host))

    def _fit_neighbour_table(self, n_hosts: int) -> None:
        """Raise the kernel's ARP table limits where ``n_hosts`` hosts could overflow them;
        ``stop`` puts the values back. Where they cannot be raised, jobs whose ranks all
        talk to each other may not work past 31 hosts: a warning says so."""
        try:
            current = {name: int((NEIGH_SYSCTLS / name).read_text()) for name in NEIGH_LIMITS}
            wanted = _neighbour_limits(n_hosts, current)
            if wanted == current:
                return
            if not self._neigh_saved:  # a run killed before stop: remove_leftovers restores
                NEIGH_SAVED.write_text(json.dumps(current))
                self._neigh_saved = {name: str(value) for name, value in current.items()}
            for name, value in wanted.items():
                (NEIGH_SYSCTLS / name).write_text(str(value))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the ARP table limits for %d hosts: %s", n_hosts, exc)

    def _create_network(self) -> None:
        """Bridge on the machine, and per host a namespace plugged in by a veth pair."""
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        # Else the bridge takes the lowest MAC of its ports, which changes as extra hosts
        # come and go and leaves the hosts' ARP entries for it pointing nowhere.
        _run(["ip", "link", "set", BRIDGE, "address", _mac_for(BRIDGE_ADDRESS)])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        for host in self.hosts:
            self._plug_in(host)

    def _plug_in(self, host: Host) -> None:
        """The host's network namespace, joined to the bridge by the veth pair ``orchv{i}``.

        The host gets no default route: it can reach the bridge subnet and nothing else.
        """
        peer = f"{PEER_PREFIX}{host.index}"
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
        _run(["ip", "link", "set", peer, "netns", host.netns])
        inside = ["ip", "-n", host.netns]
        _run([*inside, "link", "set", peer, "name", "eth0"])
        # A random MAC would make a host plugged in again at this index (extra_hosts)
        # unreachable for a while: the machine's and the hosts' ARP caches keep the old one.
        _run([*inside, "link", "set", "eth0", "address", host.mac])
        _run([*inside, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run([*inside, "link", "set", "lo", "up"])

    @staticmethod
    def _unplug(host: Host) -> None:
        """Remove the host's veth pair and network namespace, whichever of them exists."""
        _run(["ip", "link", "del", host.veth], check=False)
        _run(["ip", "netns", "del", host.netns], check=False)

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

    def _check_hosts_reach_each_other(self) -> None:
        """Fail early, and clearly, if the bridge drops traffic between hosts.

        With br_netfilter loaded, an iptables FORWARD policy of DROP (Docker sets one)
        filters bridged packets: hosts would reach the machine but not each other.
        """
        others = [host.address for host in self.hosts[1:]]
        if not others:
            return
        result = self.exec_on(1, [sys.executable, "-I", "-S", "-c", _CHECK_REACHABLE, *others])
        if result.returncode != 0:
            raise ClusterError(
                f"node1 cannot reach the other hosts on {BRIDGE}: {result.stderr.strip()[-500:]}; "
                "check iptables FORWARD policy and net.bridge.bridge-nf-call-iptables"
            )

    # -- extra networks, firewalls and port holders (orch check tests) -------------
    # Each is undone by its own method; all of it also dies with the host's namespaces.

    def add_link(self, a: int, b: int, subnet: int = 240) -> tuple[str, str]:
        """A second interface, ``eth1``, on hosts ``a`` and ``b``: a direct cable between them.

        The two ends get 10.77.NET.{subnet+1} and {subnet+2} in a /30, a more specific
        route than the bridge's /24, so only traffic for those two addresses takes it.

        Returns:
            The addresses of host ``a``'s and host ``b``'s ends.
        """
        if subnet % 4 or not 16 <= subnet <= 252:
            raise ValueError(f"subnet must be a /30 boundary of {SUBNET}.x above the hosts")
        ends = [(self.host(a), f"{SUBNET}.{subnet + 1}"), (self.host(b), f"{SUBNET}.{subnet + 2}")]
        first, second = (f"{VETH_PREFIX}l{h.index}" for h, _ in ends)
        _run(["ip", "link", "add", first, "type", "veth", "peer", "name", second])
        for (host, address), name in zip(ends, (first, second), strict=True):
            _run(["ip", "link", "set", name, "netns", host.netns])
            inside = ["ip", "-n", host.netns]
            _run([*inside, "link", "set", name, "name", "eth1"])
            _run([*inside, "addr", "add", f"{address}/30", "dev", "eth1"])
            _run([*inside, "link", "set", "eth1", "up"])
        return ends[0][1], ends[1][1]

    def route_via_link(self, i: int, target: int | str, source: str) -> None:
        """Make host ``i`` reach host ``target``'s bridge address over its ``eth1``."""
        host, address = self.host(i), self.host(target).address
        _run(
            ["ip", "-n", host.netns, "route", "add", f"{address}/32", "dev", "eth1", "src", source]
        )

    def remove_link(self, i: int) -> None:
        """Remove host ``i``'s ``eth1`` (both ends of the cable, and routes over it)."""
        _run(["ip", "-n", self.host(i).netns, "link", "del", "eth1"], check=False)

    def _firewall_rule(self, i: int, port: int, source: int | str | None) -> list[str]:
        rule = ["INPUT", "-p", "tcp", "--dport", str(port)]
        if source is not None:
            rule += ["-s", self.host(source).address]
        return [*rule, "-m", "comment", "--comment", "orch-test", "-j", "DROP"]

    def block_port(self, i: int, port: int, source: int | str | None = None) -> None:
        """Drop TCP packets to ``port`` on host ``i`` (from host ``source``, else from anyone).

        Raises:
            ClusterError: iptables is missing or refuses (callers may skip).
        """
        if shutil.which("iptables") is None:
            raise ClusterError("iptables is not installed")
        argv = ["ip", "netns", "exec", self.host(i).netns, "iptables", "-A"]
        _run([*argv, *self._firewall_rule(i, port, source)])

    def unblock_port(self, i: int, port: int, source: int | str | None = None) -> None:
        argv = ["ip", "netns", "exec", self.host(i).netns, "iptables", "-D"]
        _run([*argv, *self._firewall_rule(i, port, source)], check=False)

    def hold_port(
        self, i: int | str, port: int, address: str = "0.0.0.0", name: str = "leftover-trainer"
    ) -> subprocess.Popen[str]:
        """Start a process on host ``i`` that listens on ``port`` (a previous run's leftover).

        Its command line ends with ``name``. Stop it with ``release_port``.
        """
        host = self.host(i)
        if host.init_pid is None:
            raise ClusterError(f"{host.name} is down")
        code = (
            "import socket, sys, time\n"
            "s = socket.socket()\n"
            f"s.bind(({address!r}, {port}))\n"
            "s.listen()\n"
            "print('listening', flush=True)\n"
            "time.sleep(600)\n"
        )
        holder = subprocess.Popen(
            [
                "nsenter",
                "-t",
                str(host.init_pid),
                "-n",
                "-p",
                "-m",
                "-u",
                "--",
                sys.executable,
                "-I",
                "-S",
                "-c",
                code,
                name,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "listening":
            self.release_port(holder)
            raise ClusterError(
                f"cannot hold port {port} on {host.name}: {holder.stderr.read() if holder.stderr else ''}"
            )
        return holder

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
        config.write_text(_password_sshd_config(host, user, port))
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

    def release_port(self, holder: subprocess.Popen[str]) -> None:
        """Stop a ``hold_port`` process: the listener inside the host, then its nsenter."""
        with contextlib.suppress(ClusterError, ProcessLookupError):
            os.kill(_child_pid(holder.pid, timeout=1), signal.SIGKILL)
        holder.wait(timeout=10)


@dataclass(frozen=True)
class PasswordLogin:
    """A Unix user that logs in with a password (``Cluster.password_user``): its name,
    password, the port of the sshd that takes it, and its home as the host sees it."""

    user: str
    password: str
    port: int
    home: str


def _password_sshd_config(host: Host, user: str, port: int) -> str:
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
    config = _sshd_config(host)
    for old, new in swaps.items():
        assert old in config, old
        config = config.replace(old, new)
    return config + f"AllowUsers {user}\n"


def _free_uid(start: int = 62000) -> int:
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    return next(uid for uid in range(start, 65000) if uid not in taken)


def remove_leftovers() -> None:
    """Remove what a crashed earlier run left: namespaces (and their processes), links, temp dirs.

    Only things with this harness's exact names; callers hold the machine lock, so
    none of them can belong to a live cluster.
    """
    for netns in _json_list(["ip", "-j", "netns", "list"]):
        name = netns["name"]
        if re.fullmatch(rf"{NETNS_PREFIX}\d+", name):
            pids = [
                int(pid) for pid in _run(["ip", "netns", "pids", name], check=False).stdout.split()
            ]
            log.warning("removing stale namespace %s and its processes %s", name, pids)
            _kill_children_first(pids)
            _run(["ip", "netns", "del", name], check=False)
    for link in _json_list(["ip", "-j", "link", "show"]):
        name = link["ifname"]
        if name == BRIDGE or re.fullmatch(rf"{VETH_PREFIX}\d+", name):
            log.warning("removing stale link %s", name)
            _run(["ip", "link", "del", name], check=False)
    _restore_neighbour_limits()
    for stale_dir in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(stale_dir, ignore_errors=True)


def _restore_neighbour_limits() -> None:
    """Put back the ARP table limits a cluster raised (``NEIGH_SAVED``), if any."""
    try:
        saved = json.loads(NEIGH_SAVED.read_text())
    except (OSError, ValueError):
        return
    for name in NEIGH_LIMITS:
        if name in saved:
            with contextlib.suppress(OSError):
                (NEIGH_SYSCTLS / name).write_text(str(int(saved[name])))
    NEIGH_SAVED.unlink(missing_ok=True)


def _kill_children_first(pids: Sequence[int]) -> None:
    """SIGKILL ``pids``; those whose parent is among them go first.

    A parent killed before its child is reaped orphans the child to the machine's
    init, which may never reap it; given time, the parents (unshare) reap and exit.
    """

    def parent_of(pid: int) -> int | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return int(stat[stat.rindex(")") + 2 :].split()[1])

    def kill(group: Sequence[int]) -> None:
        for pid in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    children = [pid for pid in pids if parent_of(pid) in pids]
    kill(children)
    time.sleep(0.2)
    kill([pid for pid in pids if pid not in children])


def _neighbour_limits(n_hosts: int, current: Mapping[str, int]) -> dict[str, int]:
    """The ARP table limits (``NEIGH_LIMITS``) a cluster of ``n_hosts`` needs, never
    below ``current``.

    Every network namespace's entries count against one kernel-wide table. A job whose
    ranks all talk to each other (gloo's full mesh) makes an entry per pair of hosts,
    beside this machine's one per host: (n+1)^2 in all. Past gc_thresh3 (1024 by
    default, so 32 hosts) a new entry is refused ("neighbour table overflow" in dmesg)
    and hosts whose entries expired stop answering this machine: `orch kill` of a
    32-host job found half of the hosts unreachable. Twice and four times the need
    leave the garbage collector room.
    """
    entries = (n_hosts + 1) ** 2
    wanted = {"gc_thresh2": 2 * entries, "gc_thresh3": 4 * entries}
    return {name: max(wanted[name], current[name]) for name in NEIGH_LIMITS}


def _mac_for(address: str) -> str:
    """A locally administered unicast MAC that spells the IPv4 ``address`` in its last bytes."""
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))


def _prepare_home(path: Path) -> None:
    """Create an empty home at ``path`` with the mount points ``_init_script`` binds onto."""
    path.mkdir(parents=True, mode=0o700)
    for hidden in paths_hidden_by_private_home():
        (path / hidden.relative_to(ROOT_HOME)).mkdir(parents=True, exist_ok=True)


def _merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, where a None override removes the key."""
    merged = {**base, **overrides}
    return {key: value for key, value in merged.items() if value is not None}


def _sshd_config(host: Host) -> str:
    """An sshd config that lets the client key in as root and nothing else."""
    return f"""\
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
    # The private home hides whatever lives under root's home (a pyenv, the repository):
    # bind those into it first, so the rbind below shows them at their usual paths.
    for path in paths_hidden_by_private_home():
        lines.append(
            f"mount --bind {q(str(path.resolve()))} {q(str(host.home / path.relative_to(ROOT_HOME)))}"
        )
    lines.append(f"mount --rbind {q(str(host.home))} {q(str(ROOT_HOME))}")
    shadow = _unlocked_shadow(host)
    if shadow is not None:
        lines.append(f"mount --bind {q(str(shadow))} /etc/shadow")
    lines.append(f"exec {SSHD} -D -e -f {q(str(host.sshd_config))}")
    return "\n".join(lines)
