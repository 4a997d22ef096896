"""A real Slurm cluster on the namespace test cluster (tests/cluster/), for integration tests.

One host is the login node, running ``munged`` and ``slurmctld``; the others are compute
nodes running ``slurmd``; every host mounts one shared home, as on an HPC cluster with
NFS homes. Debian's slurm 22.05 and munge (``make test-deps``) do the work; nothing of
it touches this machine's own ``/etc``, ``/sys`` or ``/run``:

- ``slurm.conf`` and ``cgroup.conf`` are written into the cluster's temp dir and
  bind-mounted on ``/etc/slurm`` inside each host's mount namespace, so ``sbatch`` on the
  login node finds them with no environment.
- One ``munged`` on the login host serves every host: its socket lies in the temp dir,
  which all hosts see (``AuthInfo=socket=...``).
- ``slurmd`` refuses to start without cgroup hierarchies, which a network namespace's
  fresh ``/sys`` lacks: each compute host mounts a tmpfs on ``/sys/fs/cgroup`` and the
  v1 hierarchies under it, in its own mount namespace; ``proctrack/linuxproc`` and
  ``task/none`` then never use them.

    with SlurmCluster(compute_nodes=3) as slurm:        # or SlurmCluster(cluster) to borrow
        slurm.write_inventory(tmp / "hpc.yaml")
        slurm.squeue()                                  # what the login node's squeue says

Every daemon is started through ``nsenter`` into its host's namespaces and stopped by
its PID (a pidfd); the hosts' PID 1 dying takes anything left with it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.cluster.commands import ClusterError, _child_pid
from tests.cluster.controller import Controller, repo_python
from tests.cluster.hosts import Host
from tests.cluster.lifecycle import Cluster

__all__ = ["PARTITION", "SlurmCluster", "slurm_unavailable_reason"]

PARTITION = "debug"
SLURM_BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch")
CPUS_PER_NODE = 2
# cgroup v1 hierarchies slurmd 22.05 looks for before it starts (verified on Debian 12).
CGROUP_HIERARCHIES = (
    ("freezer", "freezer"),
    ("cpuset", "cpuset"),
    ("memory", "memory"),
    ("devices", "devices"),
    ("systemd", "none,name=systemd"),
)
# Processes of the cluster itself, not of any job, as a compute host's process list shows them.
INFRASTRUCTURE = ("sshd", "slurmd")


def slurm_unavailable_reason() -> str | None:
    """Why this machine cannot run the Slurm test cluster, or None when it can."""
    missing = [path for path in SLURM_BINARIES if not os.access(path, os.X_OK)]
    if missing:
        return (
            f"needs {', '.join(missing)} (make test-deps: slurmctld, slurmd, slurm-client, munge)"
        )
    return None


@dataclass
class _Daemon:
    """A daemon running inside a host: its nsenter and the daemon's own pid (a pidfd)."""

    name: str
    host: Host
    nsenter: subprocess.Popen[bytes]
    pidfd: int

    def stop(self) -> None:
        """SIGTERM, a grace of 5 s, then SIGKILL; reap the nsenter around it."""
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, sig)
            try:
                self.nsenter.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        os.close(self.pidfd)


class SlurmCluster:
    """Slurm on test hosts: ``login`` (slurmctld, munged) and ``compute`` (slurmd each).

    Given a started ``Cluster``, borrows it: adds hosts until there are enough, has all of
    them share one home, and hands it back as found on ``stop``. Without one, starts its own
    (holding the machine lock, as any ``Cluster``).
    """

    def __init__(
        self, cluster: Cluster | None = None, compute_nodes: int = 3, gpus_per_node: int = 0
    ) -> None:
        self.compute_nodes = compute_nodes
        self.gpus_per_node = gpus_per_node  # count-only GRES: Slurm hands out GPUs none has
        self.cluster = cluster or Cluster(compute_nodes + 1)
        self._owns_cluster = cluster is None
        self._stack = contextlib.ExitStack()
        self._daemons: list[_Daemon] = []
        self.hosts: list[Host] = []
        self.home: Path | None = None
        self.confdir: Path | None = None
        # What ran on each host before this cluster shared their home (the worker's warm
        # interpreters, from its earlier tests): it lives on, and is not a job's.
        self._before: dict[int, set[tuple[int, str]]] = {}

    # -- lifecycle ------------------------------------------------------------------

    @property
    def login(self) -> Host:
        return self.hosts[0]

    @property
    def compute(self) -> list[Host]:
        return self.hosts[1 : self.compute_nodes + 1]

    def start(self) -> SlurmCluster:
        """Boot (or borrow) the hosts, share their home and start munged, slurmctld, slurmd.

        Returns once ``sinfo`` shows every compute node idle.

        Raises:
            ClusterError: a daemon did not come up; its log is in the message.
        """
        try:
            if self._owns_cluster:
                self.cluster.start()
                self._stack.callback(self.cluster.stop)
            missing = self.compute_nodes + 1 - len(self.cluster.hosts)
            if missing > 0:
                self._stack.enter_context(self.cluster.extra_hosts(missing))
            self.hosts = list(self.cluster.hosts[: self.compute_nodes + 1])
            self._before = {
                host.index: set(self.cluster.host_pids(host.index)) for host in self.hosts
            }
            self.home = self._stack.enter_context(
                self.cluster.shared_home([host.index for host in self.hosts])
            )
            assert self.cluster.workdir is not None
            # A fresh directory each time: two Slurm modules may share one worker's hosts.
            root = Path(tempfile.mkdtemp(prefix="slurm-", dir=self.cluster.workdir))
            self._stack.callback(shutil.rmtree, root, ignore_errors=True)
            self.confdir = self._write_files(root)
            for host in self.hosts:
                self._stack.callback(self._unmount, host)
                self._mount(host)
            self._start_daemon(self.login, "munged", self._munged_argv(), self.state / "munged.log")
            self._wait_for_file(self.state / "munge.sock", "munged", self.state / "munged.log")
            slurmctld_log = self.state / "slurmctld.log"
            self._start_daemon(self.login, "slurmctld", ["slurmctld", "-D"], slurmctld_log)
            for host in self.compute:
                self._start_daemon(
                    host, "slurmd", ["slurmd", "-D"], self.state / f"{host.name}.out"
                )
            self._wait_until_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every daemon by its PID, then hand back (or stop) the cluster. Idempotent."""
        for daemon in reversed(self._daemons):
            daemon.stop()
        self._daemons = []
        self._stack.close()
        self.hosts, self.home, self.confdir = [], None, None

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- using it -------------------------------------------------------------------

    @property
    def state(self) -> Path:
        """Slurm's and munge's files: sockets, state, spool, pid and log files."""
        assert self.confdir is not None, "slurm cluster not started"
        return self.confdir / "state"

    def run_on_login(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a shell ``command`` on the login node (no SSH), as its users' shells would."""
        return self.cluster.exec_on(self.login.index, ["sh", "-c", command], timeout=timeout)

    def squeue(self) -> list[dict[str, str]]:
        """Every job Slurm still knows of: id, name, state, reason and nodes."""
        result = self.run_on_login("squeue --states=all --noheader --format='%i|%j|%T|%r|%N'")
        if result.returncode != 0:
            raise ClusterError(f"squeue failed: {result.stderr.strip()}")
        keys = ("id", "name", "state", "reason", "nodes")
        return [
            dict(zip(keys, line.split("|"), strict=True)) for line in result.stdout.splitlines()
        ]

    def active_jobs(self) -> list[dict[str, str]]:
        """The jobs that are pending, running or completing (an allocation not yet gone)."""
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        return [job for job in self.squeue() if job["state"] not in done]

    def job_processes(self, host: Host | int | str) -> list[tuple[int, str]]:
        """Processes on a compute host that are not the cluster's own (sshd, slurmd),
        nor there before it started."""
        index = self.cluster.host(host).index if not isinstance(host, Host) else host.index
        before = self._before.get(index, set())
        return [
            (pid, cmdline)
            for pid, cmdline in self.cluster.host_pids(index)
            if Path(cmdline.split(" ", 1)[0].rstrip(":")).name not in INFRASTRUCTURE
            and (pid, cmdline) not in before
        ]

    def wait_for(self, predicate: Any, what: str, timeout: float = 30) -> None:
        """Poll ``predicate()`` every 0.2 s until true; raise naming ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)

    def write_inventory(
        self, path: Path, defaults: Mapping[str, Any] | None = None, **slurm: Any
    ) -> Path:
        """An orch inventory with a ``slurm:`` section for this cluster's login node.

        Args:
            path: where to write the YAML.
            defaults: keys merged over the default section.
            **slurm: keys merged over the slurm section (``partition``, ``sbatch``...);
                a None value removes one.
        """
        base = {"user": "root", "identity_file": str(self.cluster.client_key)}
        section = {
            "login": self.login.address,
            "partition": PARTITION,
            "python": str(repo_python()),
        }
        section.update(slurm)
        doc = {
            "defaults": {**base, **(defaults or {})},
            "slurm": {key: value for key, value in section.items() if value is not None},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def fail_node(self, host: Host) -> None:
        """A compute node dies under a job, as far as Slurm and the job can tell: its
        slurmd and every job process on it (slurmstepd, the launcher, torchrun, the
        ranks) killed at once, SIGKILL. The host itself (its sshd, its namespace)
        stays, so that ``revive_node`` can bring it back for the next test."""
        daemon = next(d for d in self._daemons if d.name == "slurmd" and d.host == host)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(daemon.pidfd, signal.SIGKILL)
        daemon.nsenter.wait(timeout=10)
        os.close(daemon.pidfd)
        self._daemons.remove(daemon)
        pids = [str(pid) for pid, _ in self.job_processes(host)]
        if pids:
            self.cluster.exec_on(host.index, ["kill", "-9", *pids])

    def revive_node(self, host: Host, timeout: float = 60) -> None:
        """slurmd on ``host`` again after ``fail_node``, and the node back in service
        (idle) however far Slurm had got with taking it out."""
        if not any(d.name == "slurmd" and d.host == host for d in self._daemons):
            self._start_daemon(host, "slurmd", ["slurmd", "-D"], self.state / f"{host.name}.out")

        def idle() -> bool:
            state = self.run_on_login(f"sinfo --noheader --Node --nodes={host.name} --format=%t")
            word = state.stdout.strip()
            if word.startswith(("down", "drain", "fail")):
                self.run_on_login(f"scontrol update NodeName={host.name} State=RESUME")
            return word == "idle"

        self.wait_for(idle, f"{host.name} idle again", timeout)

    def new_controller(self) -> Controller:
        """A fresh controller that trusts every host (see ``Cluster.new_controller``)."""
        return self.cluster.new_controller()

    # -- building -------------------------------------------------------------------

    def _write_files(self, root: Path) -> Path:
        """slurm.conf, cgroup.conf and the munge key under ``root``; the state dirs."""
        etc = root / "etc"
        state = root / "state"
        for path in (etc, state, state / "ctld", state / "spool"):
            path.mkdir(parents=True, mode=0o700)
        key = state / "munge.key"
        key.touch(mode=0o600)
        key.write_bytes(os.urandom(1024))
        (state / "munge.seed").touch(mode=0o600)
        (etc / "slurm.conf").write_text(self._slurm_conf(state))
        (etc / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
        (etc / "plugstack.conf").write_text("")
        (etc / "gres.conf").write_text(self._gres_conf(state))
        return root

    def _gres_conf(self, state: Path) -> str:
        """GPUs no host has: Slurm 22.05's gres/gpu drops a count without device files
        (the node then registers with 0 and is INVAL), so each GPU is a plain file of the
        state dir (`gpus/nvidia<N>`), never opened: task/none constrains no device.
        Slurm schedules, counts and numbers them (CUDA_VISIBLE_DEVICES) as real ones."""
        if not self.gpus_per_node:
            return ""
        devices = state / "gpus"
        devices.mkdir(mode=0o755, exist_ok=True)
        for index in range(self.gpus_per_node):
            (devices / f"nvidia{index}").touch()
        files = f"{devices}/nvidia[0-{self.gpus_per_node - 1}]"
        lines = ["AutoDetect=off"]
        lines += [f"NodeName={h.name} Name=gpu File={files}" for h in self.compute]
        return "\n".join(lines) + "\n"

    def _slurm_conf(self, state: Path) -> str:
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        nodes = "\n".join(
            f"NodeName={host.name} NodeAddr={host.address} CPUs={CPUS_PER_NODE}{gres} State=UNKNOWN"
            for host in self.compute
        )
        names = ",".join(host.name for host in self.compute)
        # GPUs need cons_tres: select/linear hands a job whole nodes but none of their
        # GRES (JOB_GRES=gpu:0), and srun's step then asks for GPUs the job lacks.
        types = "GresTypes=gpu\n" if self.gpus_per_node else ""
        select = (
            "select/cons_tres\nSelectTypeParameters=CR_CPU"
            if self.gpus_per_node
            else "select/linear"
        )
        return f"""\
{types}ClusterName=orchtest
SlurmctldHost={self.login.name}({self.login.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={state}/munge.sock
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType={select}
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""

    def _mount(self, host: Host) -> None:
        """Inside ``host``'s mount namespace: /etc/slurm from the temp dir, cgroup hierarchies."""
        assert self.confdir is not None
        q = shlex.quote
        lines = ["set -e", f"mount --bind {q(str(self.confdir / 'etc'))} /etc/slurm"]
        lines.append("mount -t tmpfs -o mode=755 orch-cgroup /sys/fs/cgroup")
        for directory, options in CGROUP_HIERARCHIES:
            lines.append(f"mkdir -p /sys/fs/cgroup/{directory}")
            lines.append(f"mount -t cgroup -o {options} orch-cgroup /sys/fs/cgroup/{directory}")
        result = self.cluster.exec_on(host.index, ["sh", "-c", "\n".join(lines)])
        if result.returncode != 0:
            raise ClusterError(f"mounting Slurm's files on {host.name}: {result.stderr.strip()}")

    def _unmount(self, host: Host) -> None:
        """Undo ``_mount`` on ``host``, innermost first, so the next Slurm cluster starts bare."""
        lines = [f"umount /sys/fs/cgroup/{directory}" for directory, _ in CGROUP_HIERARCHIES]
        lines += ["umount /sys/fs/cgroup", "umount /etc/slurm"]
        self.cluster.exec_on(host.index, ["sh", "-c", "; ".join(lines)])

    def _munged_argv(self) -> list[str]:
        state = self.state
        return [
            "munged",
            "--foreground",
            "--force",
            f"--socket={state}/munge.sock",
            f"--key-file={state}/munge.key",
            f"--pid-file={state}/munged.pid",
            f"--log-file={state}/munged.log",
            f"--seed-file={state}/munge.seed",
        ]

    def _start_daemon(self, host: Host, name: str, argv: Sequence[str], output: Path) -> None:
        """Start ``argv`` in ``host``'s namespaces; remember it to stop by PID."""
        assert host.init_pid is not None
        with output.open("ab") as out:
            nsenter = subprocess.Popen(
                ["nsenter", "-t", str(host.init_pid), "-n", "-p", "-m", "-u", "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
            )
        try:
            pid = _child_pid(nsenter.pid)
            pidfd = os.pidfd_open(pid)
        except (ClusterError, OSError) as exc:
            nsenter.kill()
            nsenter.wait()
            raise ClusterError(
                f"{name} on {host.name} did not start: {self._tail(output)}"
            ) from exc
        self._daemons.append(_Daemon(name, host, nsenter, pidfd))

    def _wait_for_file(self, path: Path, name: str, log_file: Path, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or any(
                d.nsenter.poll() is not None for d in self._daemons
            ):
                raise ClusterError(f"{name} did not come up: {self._tail(log_file)}")
            time.sleep(0.05)

    def _wait_until_idle(self, timeout: float = 30) -> None:
        """Until sinfo shows every compute node idle; a daemon that died fails at once."""
        deadline = time.monotonic() + timeout
        states: str = ""
        while time.monotonic() < deadline:
            dead = [d for d in self._daemons if d.nsenter.poll() is not None]
            if dead:
                logs = "; ".join(f"{d.name} on {d.host.name}: {self._logs_of(d)}" for d in dead)
                raise ClusterError(f"Slurm daemons exited: {logs}")
            result = self.run_on_login("sinfo --noheader --Node --format='%N %t'")
            states = result.stdout.strip() or result.stderr.strip()
            lines = [line.split() for line in result.stdout.splitlines()]
            if len(lines) == self.compute_nodes and all(state == "idle" for _, state in lines):
                return
            time.sleep(0.1)
        raise ClusterError(f"compute nodes not idle after {timeout}s: {states}")

    def _logs_of(self, daemon: _Daemon) -> str:
        name = {"slurmd": f"slurmd-{daemon.host.name}.log"}.get(daemon.name, f"{daemon.name}.log")
        return self._tail(self.state / name) or self._tail(self.state / f"{daemon.host.name}.out")

    @staticmethod
    def _tail(path: Path, chars: int = 1500) -> str:
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError:
            return f"(no {path.name})"
