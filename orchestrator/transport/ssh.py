"""SshTransport: one SSH connection per host (fabric/paramiko), a channel per command.

With terminal.py (`orch ssh`'s stdio), the only modules of orch that import fabric or
paramiko. `~/.ssh/config` (User, Port,
IdentityFile, ProxyJump) applies where the inventory is silent; fabric resolves it.

Host keys are checked as OpenSSH checks them (hostkeys.py): every known_hosts file,
patterns, hashed names, `@cert-authority` and `@revoked`, and StrictHostKeyChecking.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

import paramiko
from fabric import Config, Connection

from orchestrator.models.errors import HostError, Refused
from orchestrator.models.inventory import Host
from orchestrator.transport.base import (
    CommandResult,
    ConnectOptions,
    Stdin,
    coalesced,
    stdin_parts,
)
from orchestrator.transport.certificates import CERT_SUFFIX
from orchestrator.transport.dial import Dialled
from orchestrator.transport.hostkeys import KeyPolicy, Notice, Offered, Untrusted

log = logging.getLogger(__name__)
IDLE_WAKE_S = 5.0  # paramiko's thread looks at the keepalive clock this often when idle
PROMPT_READS = 64  # reads of a new connection whose data is ACKed at once (_PromptAckSocket)


class AuthRefused(HostError):
    """The host answered and refused the login: the key (or the password) is not one
    it takes. `orch keys` tells it from a host it cannot reach."""


class PasswordRefused(AuthRefused):
    """The host takes passwords, and refused this one."""


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key goes through hostkeys.KeyPolicy: paramiko's own lists stay
    empty, so it asks here for each one."""

    def __init__(
        self, policy: KeyPolicy, name: str, principal: str, host: str, notice: Notice
    ) -> None:
        self.policy, self.name, self.principal = policy, name, principal
        self.host, self.notice = host, notice

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        blob = key.public_blob
        certificate = blob.key_blob if blob is not None and CERT_SUFFIX in blob.key_type else None
        try:
            self.policy.decide(
                self.name, self.principal, Offered(key.asbytes(), certificate), self.notice
            )
        except Untrusted as exc:
            client.close()
            raise HostError(self.host, exc.message, exc.hint) from None


def idle_wake_s(keepalive_s: float) -> float:
    """How long paramiko's thread may sleep on a silent socket: a third of the keepalive,
    at most IDLE_WAKE_S; IDLE_WAKE_S without a keepalive (0 would make the socket
    non-blocking, and the thread spin)."""
    return min(IDLE_WAKE_S, keepalive_s / 3) if keepalive_s > 0 else IDLE_WAKE_S


class _TimeoutReader:
    """A channel file whose reads raise TimeoutError (not socket.timeout's other
    spellings) when the channel stays silent, and return b"" when it breaks."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def readline(self, size: int = -1) -> bytes:
        return self._call(self._raw.readline, size)

    def read(self, size: int = -1) -> bytes:
        return self._call(self._raw.read, size)

    def _call(self, method: Any, size: int) -> bytes:
        try:
            data: bytes = method(size)
            return data
        except TimeoutError:
            raise TimeoutError("no data from the host within the idle timeout") from None
        except (OSError, EOFError, paramiko.SSHException):
            return b""

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


class SshProcess:
    """A command on an SSH channel, followed line by line (RemoteProcess)."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel
        self._stdout = _TimeoutReader(channel.makefile("rb"))

    @property
    def stdout(self) -> IO[bytes]:
        return self._stdout  # type: ignore[return-value]

    def lines(self) -> Iterator[str]:
        try:
            for raw in self._stdout:
                yield raw.decode("utf-8", "replace").rstrip("\n")
        except (OSError, EOFError, paramiko.SSHException):
            return  # the connection dropped; wait() says -1

    def wait(self) -> int:
        if self._channel.closed and not self._channel.exit_status_ready():
            return -1
        try:
            return self._channel.recv_exit_status()
        except (OSError, paramiko.SSHException):
            return -1

    def stderr(self) -> str:
        try:
            return self._channel.makefile_stderr("rb").read().decode("utf-8", "replace")
        except (OSError, paramiko.SSHException):
            return ""

    def close(self) -> None:
        self._channel.close()


class SshTransport:
    """Runs commands on a remote host over a single SSH connection."""

    def __init__(self, host: Host, options: ConnectOptions, dialled: Dialled | None = None) -> None:
        self.name = host.name
        self.host = host
        self.options = options
        self._dialled = dialled
        key_files = [str(Path(host.identity_file).expanduser())] if host.identity_file else []
        self._conn = Connection(
            host.address,
            user=host.user,
            port=host.port,
            connect_timeout=int(options.connect_timeout),
            connect_kwargs={
                "key_filename": key_files,
                "banner_timeout": options.connect_timeout,
                "auth_timeout": options.connect_timeout,
            },
            config=Config(),
        )
        self._target = f"{self._conn.user}@{host.address}" + (
            f":{self._conn.port}" if self._conn.port != 22 else ""
        )

    def connect(self) -> None:
        """Open the connection, mapping every way it can fail to a HostError that names the host."""
        # Over complexity 10 on purpose: one except clause per way a connection fails,
        # each with its own fix, read top to bottom; splitting it would hide the mapping.
        for conn in _hops(self._conn):
            policy = KeyPolicy.of(conn.ssh_config, self.options.known_hosts)
            name, principal = policy.name(conn.host, conn.port), policy.alias or conn.host
            conn.client.set_missing_host_key_policy(
                KnownHostsPolicy(policy, name, principal, self.name, self.options.notice)
            )
            conn.connect_kwargs["transport_factory"] = partial(
                _new_transport, key_types=partial(policy.key_types, name)
            )
        by_password = "password" in self._conn.connect_kwargs
        dialled, self._dialled = self._dialled, None
        try:
            if dialled is not None:
                self._take_dialled(dialled)
            self._conn.open()
        except paramiko.BadAuthenticationType as exc:
            if not by_password:
                raise self._key_refused() from None
            raise AuthRefused(
                self.name,
                f"{self._target} takes no password (it allows {', '.join(exc.allowed_types)})",
                "install the key another way, or ask the host's administrator to",
            ) from None
        except paramiko.AuthenticationException:
            if by_password:
                raise PasswordRefused(
                    self.name,
                    f"password refused for {self._target}",
                    "check the password; on a terminal orch keys asks again",
                ) from None
            raise self._key_refused(self._failed_hop()) from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            errors = [e for e in exc.errors.values() if isinstance(e, OSError)]
            if errors and all(e.errno == errno.ECONNREFUSED for e in errors):
                raise Refused(
                    self.name,
                    f"connection refused by {self._where()}",
                    "is sshd running there, and is the port right?",
                ) from None
            raise HostError(
                self.name,
                f"cannot connect to {self._where()}: {errors[0].strerror if errors else exc}",
                "check the network here, and the route to the host",
            ) from None
        except TimeoutError:
            raise HostError(
                self.name,
                f"no answer from {self._where()} within {self.options.connect_timeout:.0f} s",
                "check that the host is up and reachable from this machine",
            ) from None
        except socket.gaierror:
            raise HostError(
                self.name,
                f"cannot resolve address '{self.host.address}'",
                "fix the address in the inventory or ~/.ssh/config",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(
                self.name,
                f"cannot connect to {self._where()}: {exc}",
                "check the address, the network route and sshd on the host",
            ) from None
        finally:
            self._conn.connect_kwargs.pop("sock", None)  # used once: a reconnect dials
        transport = self._conn.client.get_transport()
        if transport is not None:
            log.debug("[host=%s] connected, cipher %s", self.name, self.cipher)
            transport.set_keepalive(self.options.keepalive_s)
            # paramiko's thread wakes whenever a read of the socket times out, 0.1 s by
            # default, only to look at the keepalive's clock: 10 wake-ups a second per
            # host, 0.5 ms of CPU per host per second here, most of a 32-host launch's
            # controller CPU; once a second still cost a followed job's controller 0.2
            # ms per host per second, as much as the streams' heartbeats. A third of the
            # keepalive is enough for it. Data wakes it at once; closing it does not
            # wait for it (the socket is closed under it, and it sees that and ends).
            transport.sock.settimeout(idle_wake_s(self.options.keepalive_s))

    def _take_dialled(self, dialled: Dialled) -> None:
        """Connect over the connection dialled ahead where it goes where fabric resolved
        this host to, straight (dial.py); else it is closed and fabric dials.

        Raises:
            TimeoutError: the dial timed out (mapped as any connect timeout).
        """
        if self._conn.gateway is not None:
            dialled.close()
            return
        sock = dialled.take(self._conn.host, self._conn.port)
        if sock is not None:
            self._conn.connect_kwargs["sock"] = sock

    def _key_refused(self, hop: Any = None) -> AuthRefused:
        ident = f" -i {self.host.identity_file}" if self.host.identity_file else ""
        if hop is not None and hop is not self._conn:  # a ProxyJump gateway refused us
            gateway = _hop_target(hop)
            return AuthRefused(
                self.name,
                f"authentication refused for {gateway}, the ProxyJump gateway to {self._target}",
                f"install your public key on the gateway: ssh-copy-id "
                f"{gateway.rsplit(':', 1)[0]}, or fix ProxyJump in ~/.ssh/config",
            )
        return AuthRefused(
            self.name,
            f"authentication refused for {self._target}",
            f"install your public key on the host: ssh-copy-id{ident} "
            f"{self._target.rsplit(':', 1)[0]} (or orch keys, for every host at once)",
        )

    def _failed_hop(self) -> Any:
        """The connection that failed: the first of the ProxyJump chain, from its far
        end (opened first), that is not open; the host's own without gateways."""
        for conn in reversed(list(_hops(self._conn))):
            if not conn.is_connected:
                return conn
        return self._conn

    def _where(self) -> str:
        """The target, or the gateway on the way to it whose connection failed."""
        hop = self._failed_hop()
        if hop is self._conn:
            return self._target
        return f"{_hop_target(hop)} (the ProxyJump gateway to {self._target})"

    @property
    def target(self) -> str:
        """Who logs in where: `user@address`, with `:port` unless it is 22."""
        return self._target

    @property
    def cipher(self) -> str | None:
        """The cipher the connection negotiated (None before it is open)."""
        transport = self._conn.client.get_transport()
        return None if transport is None else str(transport.remote_cipher)

    def _active(self) -> paramiko.Transport:
        transport: paramiko.Transport | None = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError(
                self.name,
                f"lost the SSH connection to {self._target}",
                "check that the host is up and reachable from this machine",
            )
        return transport

    def _channel(self) -> paramiko.Channel:
        transport = self._active()
        try:
            channel: paramiko.Channel = transport.open_session(timeout=self.options.connect_timeout)
            return channel
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(
                self.name,
                f"cannot open an SSH channel to {self._target}: {exc}",
                "raise MaxSessions in the host's sshd_config",
            ) from None

    def run(
        self, command: str, stdin: Stdin | None = None, timeout: float | None = None
    ) -> CommandResult:
        channel = self._channel()
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            self._send_stdin(channel, stdin_parts(stdin))
            stdout = channel.makefile("rb").read()
            stderr = channel.makefile_stderr("rb").read()
            code = channel.recv_exit_status()
        except TimeoutError:
            raise HostError(self.name, f"command timed out after {timeout} s: {command}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(
                self.name,
                f"lost the SSH connection to {self._target}: {exc}",
                "check that the host is up and reachable from this machine",
            ) from None
        finally:
            channel.close()
        return CommandResult(
            code, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        )

    @staticmethod
    def _send_stdin(channel: paramiko.Channel, stdin: Iterable[bytes]) -> None:
        """Send all of stdin, then EOF. A command that exits without reading it all
        (python missing: exit 127) closes the channel under us: its exit status, read
        next, says why, so a refused send is not an error of its own."""
        try:
            # sendall() slices what is left after every packet: on bytes that is a copy
            # each time, quadratic in the size (17 s for 50 MB); a memoryview is not.
            for part in coalesced(stdin):
                channel.sendall(memoryview(part))  # type: ignore[arg-type]  # any buffer works
            channel.shutdown_write()
        except OSError:
            if not channel.exit_status_ready() and not channel.closed:
                raise
            log.debug("the command stopped reading its stdin early")

    def stream(
        self, command: str, idle_timeout: float | None = None, stdin: bytes | None = None
    ) -> SshProcess:
        channel = self._channel()
        try:
            channel.settimeout(idle_timeout)
            channel.exec_command(command)
            if stdin is not None:
                self._send_stdin(channel, [stdin])
        except (OSError, paramiko.SSHException, EOFError) as exc:
            channel.close()
            raise HostError(
                self.name, f"lost the SSH connection to {self._target}: {exc}"
            ) from None
        return SshProcess(channel)

    def interactive(self, command: str) -> int:
        channel = self._channel()
        try:
            from orchestrator.transport.terminal import interactive

            return interactive(channel, command)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(
                self.name, f"lost the SSH connection to {self._target}: {exc}"
            ) from None
        finally:
            channel.close()

    def tunnel(self, port: int, address: str = "127.0.0.1") -> paramiko.Channel:
        transport = self._active()
        try:
            channel: paramiko.Channel = transport.open_channel(
                "direct-tcpip",
                (address, port),
                ("127.0.0.1", 0),
                timeout=self.options.connect_timeout,
            )
            return channel
        except paramiko.ChannelException as exc:
            raise HostError(
                self.name,
                f"nothing answers on port {port} of {_seen_from(address, self.name)} "
                f"({exc.text.lower()})",
                "start the server there first, bound to 127.0.0.1 or 0.0.0.0, or "
                "allow TCP forwarding in the host's sshd_config (AllowTcpForwarding)",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(
                self.name, f"lost the SSH connection to {self._target}: {exc}"
            ) from None

    def close(self) -> None:
        if self._dialled is not None:  # never connected
            self._dialled.close()
        try:
            self._conn.close()
        except Exception:  # closing must never hide the error that led here
            log.debug("closing %s failed", self.name, exc_info=True)


def _seen_from(address: str, host: str) -> str:
    """The tunnel's far end in words: the host itself, or an address seen from it."""
    return host if address == "127.0.0.1" else f"{address} (seen from {host})"


def connect_with_password(host: Host, options: ConnectOptions, password: str) -> SshTransport:
    """A connected SshTransport to `host` that logged in with `password` alone: no
    key, no agent (`orch keys`, before the host takes a key). Host keys are checked
    as for every connection.

    The password goes to paramiko (which falls back to keyboard-interactive where the
    host asks that way) and is dropped once the login is done: it is never logged,
    stored, nor part of any command line or environment.

    Raises:
        PasswordRefused: the password was refused.
        AuthRefused: the host takes no password.
        HostError: the host cannot be reached (as `SshTransport.connect`).
    """
    transport = SshTransport(host, options)
    kwargs = transport._conn.connect_kwargs
    kwargs.pop("key_filename", None)
    kwargs.update(password=password, look_for_keys=False, allow_agent=False)
    try:
        transport.connect()
    except BaseException:
        transport.close()
        raise
    finally:
        kwargs.pop("password", None)
    return transport


def ssh_config_aliases(path: Path) -> list[str]:
    """The host names an ssh_config file declares (`Host` lines without wildcards or
    negations), sorted; none when it cannot be read."""
    try:
        config = paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.SSHException, ValueError):
        return []
    return sorted(
        name for name in config.get_hostnames() if name and not any(c in name for c in "*?!")
    )


def _new_transport(
    sock: Any, key_types: Callable[[Sequence[str]], list[str]], **kwargs: Any
) -> paramiko.Transport:
    """paramiko's Transport, asking for the host key algorithms `key_types` orders
    (of all paramiko can check, certificates included), and preferring AES-GCM
    where the server offers it.

    paramiko's default, aes128-ctr with hmac-sha2-256, costs two passes and a Python
    HMAC object per packet; GCM encrypts and authenticates in one call to OpenSSL.
    Pushes and log streams are bound by the controller's CPU: measured on 8 hosts,
    the controller spends about 40% less CPU sending the same bytes. Servers without
    GCM (OpenSSH has it since 6.2) still get the usual ciphers.
    """
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        # Every orch step is a short request and answer, and so is the handshake:
        # Nagle's algorithm holds a small packet back until the last one is ACKed, and
        # the host delays its ACK by 40 ms (a command's round trip took 48 ms, not 4;
        # set only once connected, it still stalled every login by 40 ms: 64 ms, not
        # 24, for one host here).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = _prompt_acks(sock)
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    certificates = [k for k in getattr(transport, "_key_info", {}) if k.endswith(CERT_SUFFIX)]
    options.key_types = tuple(key_types([*options.key_types, *certificates]))
    aead = [c for c in options.ciphers if c.endswith("-gcm@openssh.com")]
    options.ciphers = tuple(aead + [c for c in options.ciphers if c not in aead])
    return transport


class _PromptAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once, through the login and
    the first channel.

    Right after the login, sshd sends a message that wants no answer
    (`hostkeys-00@openssh.com`): this kernel delays its ACK by up to 40 ms, and the
    host's Nagle algorithm holds its next packet, the answer to the first channel
    this side opens, until that ACK comes. Every command's first step waited 42 ms
    for it here, 0.8 ms with prompt ACKs. Linux keeps ACKing at once only for a
    while (TCP_QUICKACK is not sticky), so it is asked again after each read, for the
    first PROMPT_READS reads (the login and the first channel took 19 here); then
    ACKs are delayed as usual again: prompt ACKs all along cost a stream of 135 MB 38%
    more CPU here.
    """

    prompt_reads = PROMPT_READS

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if self.prompt_reads > 0:
            self.prompt_reads -= 1
            with contextlib.suppress(OSError):  # closed under the read: the data counts
                self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data


def _prompt_acks(sock: socket.socket) -> socket.socket:
    """The same connection as a _PromptAckSocket, where the system has TCP_QUICKACK
    (elsewhere, as it is)."""
    if not hasattr(socket, "TCP_QUICKACK"):  # Linux only
        return sock
    timeout = sock.gettimeout()
    prompt = _PromptAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    prompt.settimeout(timeout)
    return prompt


def _hop_target(conn: Any) -> str:
    return f"{conn.user}@{conn.host}" + (f":{conn.port}" if conn.port != 22 else "")


def _hops(conn: Any) -> Iterator[Any]:
    """The connection and its ProxyJump gateways, which need the same host-key policy."""
    while isinstance(conn, Connection):
        yield conn
        conn = conn.gateway
