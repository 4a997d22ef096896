"""Whether this machine can run the test cluster, and the skip (in CI, the failure) of a
test where it cannot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

from tests.cluster.hosts import SSHD

REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "mount", "ssh-keygen", "ssh")


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
