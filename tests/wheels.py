"""A wheel of a one-module package, written here as the wheel format lays it out (a zip
of the module, METADATA, WHEEL and RECORD): what the environment tests install offline
(`wheels:`). Written, not built: pip's build of the same tree through setuptools took
half a CPU-second a wheel, and the tests made 33 a run; what they test is orch's
handling and the installer's, not the build."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path


def tiny_wheel(
    out: Path,
    name: str,
    version: str,
    dependencies: Sequence[str] = (),
    payload_bytes: int = 0,
) -> Path:
    """Write `name==version` (its module `name` says `VERSION = version`) into `out` as
    `name-version-py3-none-any.whl`; returns `out`.

    Args:
        dependencies: its `Requires-Dist`, which an installer resolves.
        payload_bytes: a file of that many random bytes in the package (a wheel that
            takes room, and time, to install).
    """
    dist = re.sub(r"[-_.]+", "_", name).lower()  # the name as file names spell it
    info = f"{dist}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode()}
    if payload_bytes:
        files[f"{name}/payload.bin"] = os.urandom(payload_bytes)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {d}" for d in dependencies]
    files[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    wheel = ["Wheel-Version: 1.0", "Generator: orch-tests", "Root-Is-Purelib: true"]
    files[f"{info}/WHEEL"] = ("\n".join([*wheel, "Tag: py3-none-any"]) + "\n").encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out / f"{dist}-{version}-py3-none-any.whl", "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data, compress_type=zipfile.ZIP_DEFLATED)
    return out


def _digest(data: bytes) -> str:
    """RECORD's hash: urlsafe base64 of the sha256, without its padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
