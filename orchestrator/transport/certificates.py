"""OpenSSH certificates as a host presents them (PROTOCOL.certkeys): parsed with bounds
checked, and judged for one host name at one time, the CA's signature included."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
HOST_CERT = 2
# The public key's fields after its type name, per type: what a certificate embeds.
KEY_FIELDS = {
    "ssh-rsa": 2,
    "ssh-dss": 4,
    "ssh-ed25519": 1,
    "ecdsa-sha2-nistp256": 2,
    "ecdsa-sha2-nistp384": 2,
    "ecdsa-sha2-nistp521": 2,
    "sk-ecdsa-sha2-nistp256@openssh.com": 3,
    "sk-ssh-ed25519@openssh.com": 2,
}
# What a key type is called in key exchange, where it differs (RSA signs with SHA-2).


class _Reader:
    """SSH wire fields, bounds-checked: a hostile host sends the certificate."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("certificate cut short")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uint32(self) -> int:
        value: int = struct.unpack(">I", self.take(4))[0]
        return value

    def uint64(self) -> int:
        value: int = struct.unpack(">Q", self.take(8))[0]
        return value

    def string(self) -> bytes:
        return self.take(self.uint32())

    def strings(self) -> list[bytes]:
        inner = _Reader(self.string())
        items = []
        while inner.pos < len(inner.data):
            items.append(inner.string())
        return items


@dataclass(frozen=True)
class Certificate:
    """An OpenSSH certificate (PROTOCOL.certkeys), as a host presents it."""

    key_type: str  # of the certified key, e.g. ssh-ed25519
    plain: bytes  # the certified key's own blob
    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical: tuple[str, ...]
    signature_key: bytes
    signature: bytes
    signed: bytes  # everything the signature covers

    @classmethod
    def parse(cls, blob: bytes) -> Certificate:
        """Raises ValueError for anything that is not a well-formed certificate."""
        r = _Reader(blob)
        cert_type_name = r.string().decode("ascii", "replace")
        base = cert_type_name.removesuffix(CERT_SUFFIX)
        if base == cert_type_name or base not in KEY_FIELDS:
            raise ValueError(f"not a known certificate type: {cert_type_name}")
        r.string()  # nonce
        start = r.pos
        for _ in range(KEY_FIELDS[base]):
            r.string()
        key_fields = blob[start : r.pos]
        r.uint64()  # serial
        kind, key_id, principals = r.uint32(), r.string(), r.strings()
        after, before = r.uint64(), r.uint64()
        critical = [name for i, name in enumerate(r.strings()) if i % 2 == 0]
        r.string()  # extensions
        r.string()  # reserved
        signature_key = r.string()
        signed = blob[: r.pos]
        signature = r.string()
        return cls(
            key_type=base,
            plain=_ssh_string(base.encode()) + key_fields,
            cert_type=kind,
            key_id=key_id.decode("utf-8", "replace"),
            principals=tuple(p.decode("utf-8", "replace") for p in principals),
            valid_after=after,
            valid_before=before,
            critical=tuple(c.decode("utf-8", "replace") for c in critical),
            signature_key=signature_key,
            signature=signature,
            signed=signed,
        )

    def problem(self, host: str, now: float) -> str | None:
        """Why this certificate does not vouch for `host` now, or None when it does."""
        if self.cert_type != HOST_CERT:
            return "its certificate is not a host certificate"
        if host.lower() not in (p.lower() for p in self.principals):
            names = ", ".join(self.principals) or "no host"
            return f"its certificate is for {names}, not {host}"
        if now < self.valid_after:
            return "its certificate is not valid yet"
        if now >= self.valid_before:
            return "its certificate has expired"
        if self.critical:
            return f"its certificate has critical options orch does not know: {', '.join(self.critical)}"
        if not self.signature_valid():
            return "its certificate's signature does not verify"
        return None

    def signature_valid(self) -> bool:
        try:
            ca_type = _Reader(self.signature_key).string().decode("ascii")
            ca = paramiko.PKey.from_type_string(ca_type, self.signature_key)
            return bool(ca.verify_ssh_sig(self.signed, paramiko.Message(self.signature)))
        except Exception:  # any malformed CA key or signature is a bad signature
            return False


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def key_type_of(blob: bytes) -> str:
    try:
        return _Reader(blob).string().decode("ascii", "replace")
    except ValueError:
        return "unknown"
