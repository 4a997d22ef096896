"""Looking inside a running host, without SSH (``exec_on``, ``host_pids``, ``hold_port``:
through its namespaces) or with it (``ssh``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from tests.cluster.commands import ClusterError, _child_pid
from tests.cluster.hosts import ROOT_HOME, HostsMixin

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


class InsideMixin(HostsMixin):
    """Running commands on a ``Cluster``'s hosts, and leftover listeners on them."""

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

    def release_port(self, holder: subprocess.Popen[str]) -> None:
        """Stop a ``hold_port`` process: the listener inside the host, then its nsenter."""
        with contextlib.suppress(ClusterError, ProcessLookupError):
            os.kill(_child_pid(holder.pid, timeout=1), signal.SIGKILL)
        holder.wait(timeout=10)
