"""`orch bench allreduce` on three real sshd hosts: a sane nccl-tests style table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster import OrchRunner

pytestmark = pytest.mark.cluster

ROW = re.compile(
    r"^\s+(?P<size>\d+)\s+(?P<count>\d+)\s+float\s+sum\s+(?P<time>[\d.]+)\s+"
    r"(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\d+)$"
)


def test_allreduce_sweep_on_three_hosts_prints_a_sane_table(
    orch: OrchRunner, inventory: Path
) -> None:
    result = orch(
        "bench",
        "allreduce",
        "-i",
        inventory,
        "--sizes",
        "4K:256K:8",
        "--iters",
        "5",
        "--warmup",
        "1",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# orch bench allreduce: 3 ranks on node1, node2, node3; gloo")
    rows = [m for line in lines if (m := ROW.match(line))]
    assert [int(m["size"]) for m in rows] == [4096, 32768, 262144]
    for m in rows:
        size, time_us = int(m["size"]), float(m["time"])
        assert int(m["count"]) == size // 4
        assert int(m["wrong"]) == 0, "every element summed right on every rank"
        assert 1 < time_us < 5e6
        algbw = size / time_us / 1e3
        assert float(m["algbw"]) == pytest.approx(algbw, abs=1e-3)
        assert float(m["busbw"]) == pytest.approx(algbw * 4 / 3, abs=2e-3), "busbw = algbw 2(n-1)/n"
    assert re.fullmatch(r"# Avg bus bandwidth    : [\d.]+ GB/s", lines[-1])
    assert re.search(r"^orch: job bench-allreduce-[0-9a-f]{6}$", result.stderr, re.M)
