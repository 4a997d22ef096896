"""A host's TCP connection dialled ahead, while this process still imports paramiko.

`orch stack` on 8 hosts spent its first 0.15 s importing the CLI and then paramiko and
fabric (0.08 s), with every host idle; an OpenSSH client connects at once. Dialled
ahead, each host's sshd accepts, forks and sends its banner during that import, and
the SSH handshake starts from a connection that is already there.

1. Only where the connection surely goes straight to the inventory's address and
   port (22 unless it says): neither ssh_config file that fabric reads names a
   HostName, Port, ProxyJump, ProxyCommand or Match (`direct`; paramiko follows no
   Include); anything else is left to fabric alone, as before. Local hosts need no
   SSH, and are not dialled.
2. The transport takes the connection only where fabric resolved the same address
   and port with no gateway (`Dialled.take`); otherwise it is closed unused.
3. A dial that fails costs nothing but the try: the transport connects as it always
   did, and says why it cannot as it always did; a dial that timed out is that
   error at once (connecting again would wait the timeout again).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.models.inventory import Host

# ssh_config keywords that can send a connection elsewhere than address:port.
REDIRECTS = ("hostname", "port", "proxyjump", "proxycommand", "match")
SSH_CONFIGS = (Path("~/.ssh/config"), Path("/etc/ssh/ssh_config"))


def direct(configs: tuple[Path, ...] = SSH_CONFIGS) -> bool:
    """Whether no ssh_config file here can redirect a connection (module docstring, 1);
    a file that exists and cannot be read counts as one that can."""
    for path in configs:
        try:
            text = path.expanduser().read_text(errors="replace")
        except FileNotFoundError:
            continue
        except OSError:
            return False
        for line in text.splitlines():
            words = line.replace("=", " ").split()
            if words and words[0].lower() in REDIRECTS:
                return False
    return True


class Dialled:
    """A TCP connection to `address`:`port` being opened in the background.

    An IP address is dialled at once, from the caller's thread, without blocking: its
    SYN leaves in microseconds (a thread per host took up to 4 ms each to start while
    paramiko was being imported, 30 ms for 8 hosts). A name is resolved and dialled
    in a thread of its own: DNS may take its time.
    """

    def __init__(self, address: str, port: int, timeout: float) -> None:
        self.address, self.port = address, port
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._sock: socket.socket | None = None
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None
        self._opening = False  # a non-blocking connect that may still be under way
        try:
            info = socket.getaddrinfo(
                address, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )[0]
        except (socket.gaierror, IndexError):
            # A daemon: a host that never answers must not hold this process's exit.
            self._thread = threading.Thread(target=self._dial, daemon=True)
            self._thread.start()
            return
        family, kind, proto, _, where = info
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        code = sock.connect_ex(where)
        if code in (0, errno.EINPROGRESS):
            self._sock, self._opening = sock, True
        else:
            sock.close()
            self._error = OSError(code, os.strerror(code))

    def _dial(self) -> None:
        try:
            self._sock = socket.create_connection((self.address, self.port), timeout=self._timeout)
        except OSError as exc:
            self._error = exc

    def _wait(self) -> None:
        """Until the connection is open or failed (`_sock`, else `_error`)."""
        if self._thread is not None:
            self._thread.join()
            return
        sock = self._sock
        if not self._opening or sock is None:
            return
        self._opening = False
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        if not poller.poll(max(self._deadline - time.monotonic(), 0) * 1000):
            self._error = TimeoutError("timed out")
        elif code := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._error = OSError(code, os.strerror(code))
        else:
            sock.settimeout(self._timeout)  # blocking again, as create_connection leaves it
            return
        self._sock = None
        sock.close()

    def take(self, address: str, port: int) -> socket.socket | None:
        """The connection, once open, where `address`:`port` is where it goes; None
        where it goes elsewhere or failed other than by timing out (it is closed).

        Raises:
            TimeoutError: the dial timed out.
        """
        self._wait()
        sock, self._sock = self._sock, None
        if (address, port) != (self.address, self.port):
            if sock is not None:
                sock.close()
            return None
        if isinstance(self._error, TimeoutError):
            raise TimeoutError(str(self._error))
        return sock

    def close(self) -> None:
        """Drop the connection if nobody took it (a name's may still be opening: then
        the dialling thread's socket is left to be collected)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def ahead(hosts: Iterable[Host], timeout: float) -> dict[str, Dialled]:
    """Start dialling each of `hosts` that surely connects straight to its address and
    port (module docstring, 1), by name; none where an ssh_config could redirect them,
    nor for local hosts (no SSH)."""
    dialled: dict[str, Dialled] = {}
    if not direct():
        return dialled
    for host in hosts:
        if not host.is_local and host.name not in dialled:  # two nodes on one host: once
            dialled[host.name] = Dialled(host.address, host.port or 22, timeout)
    return dialled
