"""`orch keys`: the user's public key installed on every host that does not take it
yet, logging in once with a password, then key login proved.

For each host, in order:
1. Key login is tried as orch always logs in (the host's `identity_file`, else
   `~/.ssh/config`'s, the usual `~/.ssh/id_*` and an agent): when it works, nothing
   is done.
2. Where the host refuses the key, orch logs in with a password (asked once and
   tried on the next hosts too; asked again only where it is refused), host keys
   checked as for every connection.
3. A POSIX sh script, reading the public key on stdin, makes `~/.ssh` (0700) and
   `~/.ssh/authorized_keys` (0600) if missing, and appends the key unless a line
   already holds it.
4. A fresh connection logs in with the key alone: only that counts as installed.

The password lives in this process's memory only: paramiko gets it for the login and
it is dropped; no log, file, argv or environment ever holds it.
"""

from __future__ import annotations

import base64
import binascii
import enum
import getpass
import logging
import os
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orchestrator.models.errors import (
    EXIT_INFRA,
    HostError,
    InfraError,
    InputError,
    OrchError,
    RemoteCommandError,
)
from orchestrator.models.inventory import Host
from orchestrator.transport.base import ConnectOptions

if TYPE_CHECKING:
    from orchestrator.transport.ssh import SshTransport

log = logging.getLogger(__name__)

DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
MAX_TRIES = 3  # passwords asked for one host, as ssh asks
INSTALL_TIMEOUT_S = 30.0
KEY_TYPES = ("ssh-", "ecdsa-", "sk-")

# Runs under /bin/sh whatever the user's login shell, in the home directory; the key
# comes on stdin. `present`: a line that is not a comment holds the key's blob as a
# field (a commented-out copy does not count). `home-writable`: sshd's StrictModes
# refuses keys while the home is group- or world-writable, and orch leaves a home's
# mode alone: it only says so.
INSTALL_SCRIPT = r"""set -e
umask 077
key=$(cat)
blob=$(printf '%s\n' "$key" | awk '{ print $2 }')
[ -n "$blob" ] || { echo "no public key on stdin" >&2; exit 2; }
cd
[ -d .ssh ] || mkdir .ssh
chmod 700 .ssh
f=.ssh/authorized_keys
[ -e "$f" ] || : >"$f"
chmod 600 "$f"
if awk -v b="$blob" '$1 !~ /^#/ { for (i = 1; i <= NF; i++) if ($i == b) found = 1 }
    END { exit !found }' "$f"; then
  echo present
else
  if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >>"$f"; fi
  printf '%s\n' "$key" >>"$f"
  echo added
fi
if command -v restorecon >/dev/null 2>&1; then restorecon -F .ssh "$f" >/dev/null 2>&1 || :; fi
if [ -n "$(find . -maxdepth 0 -perm /022 2>/dev/null)" ]; then echo home-writable; fi
"""


def install_command() -> str:
    """The command line that runs INSTALL_SCRIPT (the key on its stdin)."""
    return f"/bin/sh -c {shlex.quote(INSTALL_SCRIPT)}"


@dataclass(frozen=True)
class PublicKey:
    """One OpenSSH public key: `type base64 [comment]`."""

    key_type: str
    blob: str
    comment: str = ""

    @property
    def line(self) -> str:
        return " ".join(p for p in (self.key_type, self.blob, self.comment) if p)


def parse_public_key(text: str, where: str) -> PublicKey:
    """The key in a `.pub` file's text.

    Raises:
        InputError: it is not one OpenSSH public key (a private key, say).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    fields = lines[0].split(None, 2) if len(lines) == 1 else []
    if len(fields) >= 2 and fields[0].startswith(KEY_TYPES):
        try:
            base64.b64decode(fields[1], validate=True)
            return PublicKey(fields[0], fields[1], fields[2].strip() if len(fields) > 2 else "")
        except (binascii.Error, ValueError):
            pass
    raise InputError(
        f"{where}: not an OpenSSH public key (expected one line: TYPE BASE64 [COMMENT])",
        "point --key at a private key whose .pub file sits beside it",
    )


def public_path(private: Path) -> Path:
    return private.with_name(private.name + ".pub")


def default_key() -> Path:
    """The user's usual key: the first of DEFAULT_KEYS that exists, else the first."""
    paths = [Path(p).expanduser() for p in DEFAULT_KEYS]
    return next((p for p in paths if p.exists()), paths[0])


def key_of(host: Host, chosen: Path | None) -> Path:
    """The private key to install on `host`: `--key`, else its identity_file, else
    the usual one. A `.pub` path names the private key beside it."""
    path = chosen or (Path(host.identity_file) if host.identity_file else default_key())
    path = path.expanduser()
    return path.with_suffix("") if path.suffix == ".pub" else path


def missing_keys(hosts: Sequence[Host], chosen: Path | None) -> list[Path]:
    """The keys the hosts need that do not exist yet (neither private nor public)."""
    paths = dict.fromkeys(key_of(h, chosen) for h in hosts if not h.is_local)
    return [p for p in paths if not p.exists() and not public_path(p).exists()]


def create_key(private: Path) -> PublicKey:
    """Write a new ed25519 key without passphrase at `private` and `private.pub`, owner-only,
    in OpenSSH's format, as `ssh-keygen -t ed25519 -N ''` would.

    Raises:
        InputError: the file appeared meanwhile, or its directory cannot be written.
    """
    # cryptography comes with paramiko (its SSH crypto), so orch has it wherever it runs.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    comment = f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_new(private, pem)
        _write_new(public_path(private), public + f" {comment}\n".encode())
    except OSError as exc:
        raise InputError(
            f"cannot create the key {private}: {exc.strerror or exc}",
            f"create one yourself: ssh-keygen -t ed25519 -f {private}",
        ) from None
    return PublicKey("ssh-ed25519", public.split()[1].decode(), comment)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def load_public_key(private: Path) -> PublicKey:
    """The public key beside `private`.

    Raises:
        InputError: there is none, or it is not a public key.
    """
    path = public_path(private)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        hint = (
            f"write it: ssh-keygen -y -f {private} > {path}"
            if private.exists()
            else f"create a key: ssh-keygen -t ed25519 -f {private}, or run orch keys on a terminal"
        )
        raise InputError(
            f"cannot read the public key {path}: {exc.strerror or exc}", hint
        ) from None
    return parse_public_key(text, str(path))


class Outcome(enum.Enum):
    INSTALLED = "key installed"
    WORKED = "key already works"
    LOCAL = "local host: no SSH"
    FAILED = "failed"


@dataclass(frozen=True)
class KeyResult:
    """What `orch keys` did on one host."""

    host: str
    outcome: Outcome
    error: OrchError | None = None

    def describe(self) -> str:
        if self.error is None:
            return self.outcome.value
        return "failed: " + " | ".join(self.error.what.splitlines())  # one line per host


class Passwords(Protocol):
    """Where passwords come from: a terminal prompt, or one line of stdin.

    1. `ask(target, refused)` returns a password for `target` (`user@address`), or
       None when there is none to give (stdin's was used, or the user gave none).
    2. `refused` says the last password given was refused for this target.
    """

    def ask(self, target: str, refused: bool) -> str | None: ...


@dataclass
class _Session:
    passwords: Passwords
    options: ConnectOptions
    last: str | None = None  # the last password a host took, tried on the next first


def install_keys(
    hosts: Sequence[Host],
    keys: Mapping[str, tuple[Path, PublicKey]],
    passwords: Passwords,
    options: ConnectOptions,
    report: Callable[[KeyResult], None],
) -> list[KeyResult]:
    """Make key login work on every host (the module's docstring says how), one host
    after another (a password prompt at a time).

    Args:
        keys: per host name, the private key path to log in with and its public key.
        report: called with each host's result as soon as it is known.

    Returns:
        Every host's result, in order; one host's failure never stops the others.
    """
    session = _Session(passwords, options)
    results: list[KeyResult] = []
    for host in hosts:
        if host.is_local:
            result = KeyResult(host.name, Outcome.LOCAL)
        else:
            private, public = keys[host.name]
            try:
                result = KeyResult(host.name, _one_host(host, private, public, session))
            except OrchError as exc:
                log.debug("[host=%s] %s", host.name, exc.message)
                result = KeyResult(host.name, Outcome.FAILED, exc)
        report(result)
        results.append(result)
    return results


def _one_host(host: Host, private: Path, public: PublicKey, session: _Session) -> Outcome:
    from orchestrator.transport.ssh import AuthRefused

    with_key = replace(host, identity_file=str(private))
    try:
        _key_login(with_key, session.options)
        return Outcome.WORKED
    except AuthRefused:
        log.debug("[host=%s] key refused: logging in with a password", host.name)
    conn = _password_login(host, session)
    try:
        result = conn.run(
            install_command(), stdin=(public.line + "\n").encode(), timeout=INSTALL_TIMEOUT_S
        )
    finally:
        conn.close()
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            "add the key to ~/.ssh/authorized_keys",
            result.exit_code,
            result.stderr,
            "check that the home directory there is yours and writable",
        )
    said = result.stdout.split()
    try:
        _key_login(with_key, session.options)
    except AuthRefused:
        why = "it was there already" if "present" in said else "it was added"
        refuses = "sshd refuses a key while the home directory is group- or world-writable: chmod go-w ~ there; "
        raise HostError(
            host.name,
            f"key login still refused: the key is in ~/.ssh/authorized_keys ({why})",
            (refuses if "home-writable" in said else "")
            + "sshd may read keys from elsewhere (AuthorizedKeysFile in its sshd_config): ask the host's administrator",
        ) from None
    return Outcome.INSTALLED


def _key_login(host: Host, options: ConnectOptions) -> None:
    """Log in with keys only, as orch always does, and leave.

    Raises:
        AuthRefused: the host refused every key; HostError: it cannot be reached.
    """
    from orchestrator.transport.ssh import SshTransport

    transport = SshTransport(host, options)
    try:
        transport.connect()
    finally:
        transport.close()


def _password_login(host: Host, session: _Session) -> SshTransport:
    """A connection logged in with a password: the last one a host took first, then
    as many as the user gives, MAX_TRIES at most.

    Raises:
        PasswordRefused: every password given was refused, or none was given.
        AuthRefused: the host takes no password; HostError: it cannot be reached.
    """
    from orchestrator.transport.ssh import PasswordRefused, SshTransport, connect_with_password

    target = SshTransport(host, session.options).target
    refused: PasswordRefused | None = None
    tried: set[str] = set()
    while len(tried) < MAX_TRIES:
        password = session.last if refused is None and session.last is not None else None
        if password is None or password in tried:
            password = session.passwords.ask(target, refused is not None)
        if password is None or password in tried:
            break
        tried.add(password)
        try:
            conn = connect_with_password(host, session.options, password)
        except PasswordRefused as exc:
            refused = exc
            continue
        session.last = password
        return conn
    if refused is not None:
        raise refused
    raise PasswordRefused(
        host.name,
        f"no password given for {target}",
        "run orch keys on a terminal, or give it with --password-stdin",
    )


class KeysFailed(InfraError):
    """Key login does not work on some hosts; names each, with the first one's fix."""

    def __init__(self, failed: Sequence[KeyResult], worked: Sequence[str]) -> None:
        errors = [r.error for r in failed if r.error is not None]
        names = ", ".join(r.host for r in failed)
        message = f"key login does not work on {names}"
        if worked:
            message += f" (it does on {', '.join(worked)})"
        super().__init__(message, errors[0].hint if errors else "")
        self.exit_code = max((e.exit_code for e in errors), default=EXIT_INFRA)


def check_results(results: Sequence[KeyResult]) -> None:
    """Raise KeysFailed when any host failed."""
    failed = [r for r in results if r.outcome is Outcome.FAILED]
    if failed:
        raise KeysFailed(failed, [r.host for r in results if r.outcome is not Outcome.FAILED])
