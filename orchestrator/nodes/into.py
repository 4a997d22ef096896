"""Into a running job: `orch ssh` (a shell where a node runs, in its directory, with
its environment), `orch exec JOB` (one command so on every node at once) and
`orch forward` (a port on a job's host, at the laptop's localhost).

`orch ssh` runs the agent's `shell` command in the node's directory (the agent version
the job pinned) over one SSH connection, on a terminal of the host's where this one
is a terminal (`Transport.interactive`): the environment reaches the shell through the
node's own node.json, never an argv.

`orch forward`:
A listening socket on 127.0.0.1 (only this machine reaches it); each connection made
to it gets a tunnel to the port on the host's own loopback, made from the host's side
over the one SSH connection (`Transport.tunnel`: SSH's direct-tcpip channel), and the
bytes are carried both ways by two threads until either side closes. Nothing runs on
the host beyond what sshd does for `ssh -L`.

1. A connection the host refuses (nothing listens there yet: TensorBoard still
   starting) is closed and said once per streak; the forward keeps serving.
2. The SSH connection lost: `serve` raises the HostError that names the host.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.models.errors import HostError, InputError
from orchestrator.models.inventory import Host
from orchestrator.models.job_run import port_pair
from orchestrator.nodes.agent import job_command
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.transport import ConnectOptions, Transport, open_transport
from orchestrator.transport.base import Tunnel

if TYPE_CHECKING:
    from orchestrator.nodes.execute import HostRun

CHUNK = 1 << 16
ACCEPT_WAKE_S = 0.5  # how often `serve` looks whether it was closed
LINK_CHECK_S = 5.0  # how often an idle forward asks the host whether the link holds


@dataclass(frozen=True)
class ForwardOptions:
    """`orch forward JOB PORT[:LOCAL] [--node NODE]`: the job's node (None: its
    master, node rank 0), the port there, and the laptop's port (None: the same
    number; 0: any free one)."""

    port: int
    local_port: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class ShellOptions:
    """`orch ssh JOB [NODE] [-- COMMAND...]`: the node's host (None: the master's),
    and a command to run instead of a shell."""

    node: str | None = None
    command: tuple[str, ...] = ()


def shell(record: JobRecord, options: ShellOptions, notice: Callable[[str], None]) -> int:
    """A shell (or the command) in the node's code directory with the job's
    environment, on this process's terminal; its exit status.

    Raises:
        InputError: the job has ended, or has no node on that host.
        HostError: the host does not answer.
    """
    node = running_node(record, options.node, "orch ssh")
    transport = open_transport(node.host, ConnectOptions(notice=notice))
    try:
        transport.connect()
        args = ("shell", "--", *options.command) if options.command else ("shell",)
        return transport.interactive(job_command(node.host, node.job_dir, *args))
    finally:
        transport.close()


def exec_in_job(
    record: JobRecord,
    command: Sequence[str],
    on_line: Callable[[str, str], None],
    notice: Callable[[str], None],
) -> list[HostRun]:
    """`orch exec JOB -- COMMAND`: the command on every node of the running job at once,
    each in its node's code directory with the job's environment (as `orch ssh JOB NODE
    -- COMMAND`), in a session of its own that Ctrl-C stops (`run_lines`).

    Returns:
        Each node's run, in node rank order.

    Raises:
        InputError: the job has ended, or no command.
        Interrupted: Ctrl-C; the command was stopped on every node first.
    """
    from orchestrator.nodes.execute import remote_command, run_lines  # exec's alone

    nodes = exec_nodes(record, command)
    lines = {
        n.host.name: remote_command([job_command(n.host, n.job_dir, "shell", "--", *command)])
        for n in nodes
    }
    return run_lines([n.host for n in nodes], lines, on_line, ConnectOptions(notice=notice))


def exec_nodes(record: JobRecord, command: Sequence[str]) -> list[NodeRecord]:
    """The nodes `orch exec JOB -- COMMAND` runs on, in node rank order.

    Raises:
        InputError: the job has ended (the hint says where its files are), or no command.
    """
    running_node(record, None, "orch exec")
    if not command:
        raise InputError("no command to run", f"orch exec {record.id} -- COMMAND [ARGS...]")
    return sorted(record.nodes, key=lambda n: n.node_rank)


def parse_ports(text: str) -> tuple[int, int | None]:
    """`PORT` or `PORT:LOCAL`, as `orch forward` takes them.

    Raises:
        InputError: not a port number (1-65535; LOCAL may be 0: any free port).
    """
    try:
        return port_pair(text)
    except ValueError:
        raise InputError(
            f"not a port: {text!r}",
            "give PORT or PORT:LOCAL, e.g. 6006 or 6006:16006 (ports 1 to 65535; LOCAL 0: "
            "any free port)",
        ) from None


def running_node(record: JobRecord, name: str | None, verb: str) -> NodeRecord:
    """The job's node on host `name` (None: its master, node rank 0), while it runs.

    Raises:
        InputError: the job has ended, or has no node on that host.
    """
    if record.state.is_terminal():
        master = min(record.nodes, key=lambda n: n.node_rank, default=None)
        files = f"; its files: {master.job_dir} on {master.host.name}" if master else ""
        raise InputError(
            f"job {record.id} has ended ({record.state.value}): {verb} reaches running jobs",
            f"its output: orch logs {record.id}; its outputs: orch pull {record.id}{files}",
        )
    if name is None:
        return min(record.nodes, key=lambda n: n.node_rank)
    for node in record.nodes:
        if node.host.name == name:
            return node
    names = ", ".join(n.host.name for n in record.nodes)
    raise InputError(f"job {record.id} has no node on {name}", f"its nodes: {names}")


class Forwarding:
    """A port of one host at 127.0.0.1 on this machine, until `close()`."""

    def __init__(
        self,
        host: Host,
        port: int,
        local_port: int | None,
        notice: Callable[[str], None],
        address: str = "127.0.0.1",
    ) -> None:
        """`port` at `address` as `host` reaches it: its own loopback, or (a Slurm
        node's, through its login node) the node's address."""
        self.host, self.port, self.notice, self.address_there = host, port, notice, address
        self._closed = threading.Event()
        self._refused = False
        self._listener = _listen(port if local_port is None else local_port)
        self.local_port = int(self._listener.getsockname()[1])
        self._transport: Transport = open_transport(host, ConnectOptions(notice=notice))
        try:
            self._transport.connect()
        except BaseException:
            self._listener.close()
            raise

    @property
    def address(self) -> str:
        """Where the browser goes: `http://127.0.0.1:LOCAL/`."""
        return f"http://127.0.0.1:{self.local_port}/"

    def serve(self) -> None:
        """Carry connections until `close()`.

        Raises:
            HostError: the SSH connection to the host was lost.
        """
        self._listener.settimeout(ACCEPT_WAKE_S)
        idle = 0.0
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:  # noqa: UP041 (Python 3.8 spelling kept with the agent's)
                idle += ACCEPT_WAKE_S
                if idle >= LINK_CHECK_S:
                    idle = 0.0
                    self._check_link()
                continue
            except OSError:
                if self._closed.is_set():
                    return
                raise
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _check_link(self) -> None:
        try:
            self._transport.run("true", timeout=10)
        except HostError:
            if not self._closed.is_set():
                raise

    def _carry(self, client: socket.socket) -> None:
        try:
            tunnel = self._transport.tunnel(self.port, self.address_there)
        except HostError as exc:
            client.close()
            if not self._refused:
                self.notice(f"{self.host.name}: {exc.what}")
            self._refused = True
            return
        self._refused = False
        back = threading.Thread(target=_pump_back, args=(tunnel, client), daemon=True)
        back.start()
        try:
            while True:
                data = client.recv(CHUNK)
                if not data:
                    break
                tunnel.sendall(data)
            with contextlib.suppress(OSError, EOFError):
                tunnel.shutdown_write()
        except (OSError, EOFError):
            pass
        back.join()
        tunnel.close()
        client.close()

    def close(self) -> None:
        """Stop listening and release the SSH connection; never raises."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._transport.close()

    def __enter__(self) -> Forwarding:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _pump_back(tunnel: Tunnel, client: socket.socket) -> None:
    """The host's answers to the client, until the host's side closes."""
    try:
        while True:
            data = tunnel.recv(CHUNK)
            if not data:
                break
            client.sendall(data)
        client.shutdown(socket.SHUT_WR)
    except (OSError, EOFError):
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)


def _listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1 only.

    Raises:
        InputError: the port is taken on this machine (exit 2).
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as exc:
        listener.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise InputError(
                f"port {port} on this machine is in use"
                if exc.errno == errno.EADDRINUSE
                else f"port {port} on this machine needs root",
                "pick another local port: orch forward JOB PORT:LOCAL (LOCAL 0: any free port)",
            ) from None
        raise
    listener.listen(16)
    return listener


def open_forwards(
    record: JobRecord, ports: Sequence[tuple[int, int | None]], notice: Callable[[str], None]
) -> list[Forwarding]:
    """The job file's `forward:`, opened for an attached submit: each port of the
    master's host served in a thread of its own until closed. One that cannot open
    (a local port in use, the host not answering) is said and skipped: the job runs
    on without it."""
    opened = []
    for port, local_port in ports:
        try:
            node = running_node(record, None, "forward:")
            forwarding = Forwarding(node.host, port, local_port, notice)
        except (InputError, HostError) as exc:
            notice(f"forward: port {port} not opened: {exc.message}")
            continue
        notice(f"forwarding port {port} of {node.host.name} to {forwarding.address}")
        threading.Thread(target=_serve_quietly, args=(forwarding,), daemon=True).start()
        opened.append(forwarding)
    return opened


def _serve_quietly(forwarding: Forwarding) -> None:
    with contextlib.suppress(HostError):  # the job's own watch says the host is lost
        forwarding.serve()
