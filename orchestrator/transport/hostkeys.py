"""Host keys, checked as OpenSSH checks them.

paramiko's own check reads one file, ignores wildcard patterns and markers, and fails
on `@cert-authority` lines; a user whose `ssh` pins a host through a wildcard, a
hashed entry, a global file or a CA would have orch trust a key `ssh` refuses. So
orch leaves paramiko's lists empty and decides every host key here:

1. The files: `UserKnownHostsFile` (default `~/.ssh/known_hosts ~/.ssh/known_hosts2`,
   `$ORCH_KNOWN_HOSTS` replaces it) and `GlobalKnownHostsFile` (default
   `/etc/ssh/ssh_known_hosts ssh_known_hosts2`), from `~/.ssh/config` as `ssh -G`
   resolves them.
2. An entry names its hosts by patterns (`*`, `?`, `!negation`, `[host]:port`) or by
   a hashed name (`|1|salt|hmac`); `@revoked` refuses a key, and `@cert-authority`
   trusts host certificates that its key signed for this host name and time.
3. A key is trusted when an entry for the host holds it, or it is a certificate a
   listed CA signed. A revoked key never is, whatever `StrictHostKeyChecking` says.
4. Trust on first use only when no entry of any kind matches the host, and then as
   `StrictHostKeyChecking` says: `yes` refuses, `accept-new` (also `ask`, and the
   default: orch cannot ask 32 hosts at once) records the key in the first user
   file, hashed when `HashKnownHosts` says so, and `no` does too and connects to a
   changed key with a loud warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.transport.certificates import CERT_SUFFIX, Certificate, key_type_of

USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MARKERS = ("@cert-authority", "@revoked")
HASH_MAGIC = "|1|"
MAX_FILE = 16 << 20  # a known_hosts file larger than this is not one
ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}

# Certificate algorithms, best first, for hosts whose certificates a listed CA signs.
CERT_ALGORITHMS = tuple(
    f"{t}{CERT_SUFFIX}"
    for t in (
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "rsa-sha2-512",
        "rsa-sha2-256",
    )
)

Notice = Callable[[str], None]
_append_lock = threading.Lock()


class Untrusted(Exception):
    """A host key that must not be used; `hint` says how to fix it."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class KnownKey:
    """One line of a known_hosts file."""

    marker: str  # "", "@cert-authority" or "@revoked"
    patterns: str
    key_type: str
    blob: bytes
    where: str  # FILE:LINE
    path: Path

    def names(self, name: str) -> bool:
        """Whether this entry is about the host called `name` (`host` or `[host]:port`)."""
        return pattern_matches(self.patterns, name)


def pattern_matches(patterns: str, name: str) -> bool:
    """OpenSSH's host matching: a hashed name, or comma-separated patterns with `*`,
    `?` and `!`, case-insensitive; a negated pattern that matches wins over the rest."""
    if patterns.startswith(HASH_MAGIC):
        salt_b64, _, digest_b64 = patterns[len(HASH_MAGIC) :].partition("|")
        try:
            salt, digest = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
        except (binascii.Error, ValueError):
            return False
        mine = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mine, digest)
    found = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if glob_matches(pattern[negated:], name.lower()):
            if negated:
                return False
            found = True
    return found


def glob_matches(pattern: str, name: str) -> bool:
    """`*` and `?` only, as OpenSSH's match_pattern: no character classes."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def hashed_name(name: str, salt: bytes | None = None) -> str:
    """`name` as HashKnownHosts writes it."""
    salt = salt or os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"{HASH_MAGIC}{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def host_name(host: str, port: int) -> str:
    """The name known_hosts keeps for a host: `[host]:port` unless the port is 22."""
    return host if port == 22 else f"[{host}]:{port}"


def parse_line(line: str, where: str, path: Path) -> KnownKey | None:
    """The entry on one line, or None for a comment, blank or malformed line (OpenSSH
    skips those too)."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = fields.pop(0) if fields[0] in MARKERS else ""
    if len(fields) < 3:
        return None
    patterns, key_type, encoded = fields[:3]
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return KnownKey(marker, patterns, key_type, blob, where, path)


def read_known_hosts(paths: Iterable[Path]) -> list[KnownKey]:
    """Every entry of the files that exist, in order; unreadable files count as empty."""
    entries: list[KnownKey] = []
    for path in paths:
        try:
            with path.open("rb") as f:
                text = f.read(MAX_FILE).decode("utf-8", "replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            entry = parse_line(line, f"{path}:{n}", path)
            if entry is not None:
                entries.append(entry)
    return entries


def fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class Offered:
    """The key a host offered: its own blob, and its certificate when it sent one."""

    blob: bytes
    certificate: bytes | None = None

    @property
    def described(self) -> str:
        what = "certificate for " if self.certificate else ""
        return f"{what}{key_type_of(self.blob)} {fingerprint(self.blob)}"


@dataclass(frozen=True)
class Verdict:
    """What known_hosts says of an offered key: `trusted`, `unknown` (no entry of any
    kind names the host), `revoked`, or `mismatch` (entries name the host, none
    vouches for this key); `problem` says why, `entry` is the entry concerned."""

    status: str
    problem: str = ""
    entry: KnownKey | None = None


def judge(
    known: Sequence[KnownKey], name: str, principal: str, offered: Offered, now: float
) -> Verdict:
    """Decide on the key a host called `name` offered.

    Args:
        known: the entries of every known_hosts file, in order.
        name: the host as known_hosts names it (`host`, `[host]:port`, or the alias).
        principal: the name its certificate must carry (the host, without the port).
        offered: the key, and its certificate if it sent one.
        now: the time certificates are checked at.
    """
    entries = [e for e in known if e.names(name)]
    cert = _parsed(offered.certificate)
    suspects = [offered.blob] + ([cert.signature_key] if cert else [])
    for entry in entries:
        if entry.marker == "@revoked" and entry.blob in suspects:
            which = (
                "its key" if entry.blob == offered.blob else "the CA that signed its certificate"
            )
            return Verdict("revoked", f"{which} is marked @revoked", entry)
    authorities = [e for e in entries if e.marker == "@cert-authority"]
    cert_problem = ""
    if cert is not None and authorities:
        signer = next((e for e in authorities if e.blob == cert.signature_key), None)
        if signer is None:
            cert_problem = "its certificate is signed by a CA that known_hosts does not list for it"
        elif (problem := cert.problem(principal, now)) is None:
            return Verdict("trusted", entry=signer)
        else:
            cert_problem = problem
    plain = [e for e in entries if not e.marker]
    same = next((e for e in plain if e.blob == offered.blob), None)
    if same is not None:
        return Verdict("trusted", entry=same)
    if not plain and not authorities:
        return Verdict("unknown")
    offered_type = key_type_of(offered.blob)
    rival = next((e for e in plain if e.key_type == offered_type), None)
    if rival is not None:
        return Verdict("mismatch", "changed", rival)
    if authorities and not cert_problem:
        cert_problem = "it offered a plain key, no certificate"
    if authorities:
        return Verdict("mismatch", cert_problem, authorities[0])
    kinds = ", ".join(sorted({e.key_type for e in plain}))
    return Verdict(
        "mismatch", f"it offered {offered_type}; known_hosts has {kinds} for it", plain[0]
    )


def _parsed(blob: bytes | None) -> Certificate | None:
    if blob is None:
        return None
    try:
        return Certificate.parse(blob)
    except ValueError:
        return None


@dataclass(frozen=True)
class KeyPolicy:
    """Where host keys come from and what to do with a new or changed one, for one
    host, as its `~/.ssh/config` entry (and `$ORCH_KNOWN_HOSTS`) says."""

    user_files: tuple[Path, ...]
    global_files: tuple[Path, ...]
    strict: str = "accept-new"  # "yes", "accept-new" or "no"
    hash_new: bool = False
    alias: str | None = None
    known: tuple[KnownKey, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, config: Mapping[str, str], override: Path | None = None) -> KeyPolicy:
        """The policy of an ssh_config entry (paramiko's lookup: lower-case keys), with
        the entries of its files read now."""
        user = (override,) if override else _paths(config.get("userknownhostsfile"), USER_FILES)
        found = _paths(config.get("globalknownhostsfile"), GLOBAL_FILES)
        return cls(
            user_files=user,
            global_files=found,
            strict=_strictness(config.get("stricthostkeychecking", "")),
            hash_new=config.get("hashknownhosts", "no").lower() in ("yes", "true"),
            alias=config.get("hostkeyalias"),
            known=tuple(read_known_hosts(user + found)),
        )

    def name(self, host: str, port: int) -> str:
        return self.alias or host_name(host, port)

    def key_types(self, name: str, offered: Sequence[str]) -> list[str]:
        """The host key algorithms to ask for, in order: those known_hosts can vouch
        for first (certificates first when a CA is listed for the host), as OpenSSH
        orders them, so that a host with several keys offers the one on file."""
        entries = [e for e in self.known if e.names(name) and e.marker != "@revoked"]
        first: list[str] = []
        for entry in entries:
            names = ALGORITHMS.get(entry.key_type, (entry.key_type,))
            if entry.marker == "@cert-authority":
                first.extend(t for t in CERT_ALGORITHMS if t in offered)
            else:
                first.extend(t for t in names if t in offered)
        ordered = list(dict.fromkeys(first))
        return ordered + [t for t in offered if t not in ordered and CERT_SUFFIX not in t]

    def decide(self, name: str, principal: str, offered: Offered, notice: Notice) -> None:
        """Accept the key (recording it when new) or raise Untrusted."""
        verdict = judge(self.known, name, principal, offered, time.time())
        if verdict.status == "trusted":
            return
        if verdict.status == "revoked":
            raise Untrusted(
                f"the host key of {name} is REVOKED: {verdict.problem} ({_where(verdict)}); "
                f"it offered {offered.described}",
                "the host's key was revoked on purpose: ask its administrator for the new one",
            )
        if verdict.status == "mismatch":
            message = _mismatch_message(name, offered, verdict)
            if self.strict != "no":
                raise Untrusted(message, _mismatch_hint(name, verdict))
            notice(f"{message}; connecting anyway, as StrictHostKeyChecking=no asks")
            return
        if self.strict == "yes":
            raise Untrusted(
                f"the host key of {name} is not known and StrictHostKeyChecking is yes; "
                f"it offered {offered.described}",
                f"check the fingerprint with the host's administrator, then: ssh {principal}",
            )
        self.record(name, offered, notice)

    def record(self, name: str, offered: Offered, notice: Notice) -> None:
        """Add the key to the first user file, owner-only, as `ssh` would."""
        if not self.user_files:
            notice(
                f"accepted host key for {name} ({offered.described}); no known_hosts file to record it in"
            )
            return
        path = self.user_files[0]
        written = hashed_name(name) if self.hash_new else name
        line = f"{written} {key_type_of(offered.blob)} {base64.b64encode(offered.blob).decode()}\n"
        with _append_lock:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line)
        notice(f"added host key for {name} ({offered.described}) to {path}")


def _where(verdict: Verdict) -> str:
    return verdict.entry.where if verdict.entry else "known_hosts"


def _mismatch_message(name: str, offered: Offered, verdict: Verdict) -> str:
    entry = verdict.entry
    if verdict.problem == "changed" and entry is not None:
        return (
            f"WARNING: the host key of {name} has CHANGED: expected {entry.key_type} "
            f"{fingerprint(entry.blob)} ({entry.where}), got {fingerprint(offered.blob)}; "
            "someone may be intercepting the connection, or the host was reinstalled"
        )
    return (
        f"WARNING: the host key of {name} is not the one known_hosts vouches for: "
        f"{verdict.problem} ({_where(verdict)}); it offered {offered.described}"
    )


def _mismatch_hint(name: str, verdict: Verdict) -> str:
    entry = verdict.entry
    if entry is None or entry.marker:
        return f"ask the host's administrator; the entry is at {_where(verdict)}"
    remove = f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(entry.path))}"
    return f"if the host was reinstalled, remove its old key: {remove}"


def _paths(value: str | None, default: Sequence[str]) -> tuple[Path, ...]:
    words = value.split() if value else list(default)
    return tuple(
        Path(os.path.expanduser(w.replace("%d", "~"))) for w in words if w.lower() != "none"
    )


def _strictness(value: str) -> str:
    value = value.lower()
    if value in ("yes", "true"):
        return "yes"
    if value in ("no", "off", "false"):
        return "no"
    return "accept-new"  # also "ask" and unset: orch cannot ask 32 hosts at once
