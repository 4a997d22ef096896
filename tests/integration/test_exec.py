"""`orch exec` against real sshd hosts: prefixes, exit codes, selection, Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster import REPO_ROOT, SUBNET, Cluster, OrchRunner, orch_command

pytestmark = pytest.mark.cluster

BY_HOST = 'echo "out $(hostname)"; echo "err $(hostname)" >&2; case $(hostname) in node2) exit 7;; node3) exit 4;; esac'


def test_lines_are_prefixed_and_the_worst_exit_code_wins(orch: OrchRunner, inventory: Path) -> None:
    result = orch("exec", "-i", inventory, "--", BY_HOST, timeout=60)
    assert result.returncode == 7, result.stderr
    lines = result.stdout.splitlines()
    for name in ("node1", "node2", "node3"):
        assert f"[{name}] out {name}" in lines
        assert f"[{name}] err {name}" in lines, "stderr comes merged, with the same prefix"
        assert lines.index(f"[{name}] out {name}") < lines.index(f"[{name}] err {name}")
    assert len(lines) == 6
    assert result.stderr.splitlines()[-2:] == [
        "error: command failed on node2 (exit 7), node3 (exit 4); succeeded on node1",
        "hint: each host's output is above",
    ]


def test_several_words_are_one_exact_argv_on_the_selected_hosts(
    orch: OrchRunner, inventory: Path
) -> None:
    result = orch(
        "exec",
        "-i",
        inventory,
        "--hosts",
        "node3,node1",
        "--",
        "printf",
        "%s|",
        "a b",
        "$HOME",
        "it's",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "[node1] a b|$HOME|it's|",
        "[node3] a b|$HOME|it's|",
    ]


def test_labels_select_hosts_and_unknown_hosts_exit_2(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", node2={"labels": ["gpu"]})
    result = orch("exec", "-i", inventory, "--labels", "gpu", "--", "hostname", timeout=60)
    assert (result.returncode, result.stdout) == (0, "[node2] node2\n")
    unknown = orch("exec", "-i", inventory, "--hosts", "node9", "--", "true", timeout=60)
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines()[0] == f"error: host 'node9' is not in inventory {inventory}"


def test_unreachable_host_is_named_and_the_others_still_run(
    cluster: Cluster, orch: OrchRunner, inventory: Path
) -> None:
    cluster.crash(2)
    result = orch("exec", "-i", inventory, "--", "hostname", timeout=60)
    assert result.returncode == 3, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[node1] node1", "[node3] node3"]
    assert (
        f"error: command failed on node2 (connection refused by root@{SUBNET}.12)" in result.stderr
    )


def test_ctrl_c_stops_the_command_on_every_host(
    cluster: Cluster, orch: OrchRunner, inventory: Path
) -> None:
    proc = subprocess.Popen(
        [*orch_command(), "exec", "-i", str(inventory), "--", "echo started; sleep 97; echo never"],
        cwd=REPO_ROOT,
        env=orch.controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    started = {proc.stdout.readline().strip() for _ in range(3)}
    assert started == {"[node1] started", "[node2] started", "[node3] started"}
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "never" not in out
    assert "error: interrupted: stopped the command on node1, node2, node3" in err
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [cmd for i in (1, 2, 3) for _, cmd in cluster.host_pids(i) if "sleep 97" in cmd]
        if not left:
            break
        time.sleep(0.2)
    assert left == []
