"""`orch check`, `orch exec` and `orch bench` through the CLI on this machine: local
hosts run without SSH, so these are the real commands, probes and all."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.bench.allreduce import (
    BENCH_HEADER,
    SizeResult,
    choose_backend,
    format_row,
    parse_sizes,
)
from orchestrator.models.errors import InputError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.nodes.execute import PGID_MARK, remote_command
from orchestrator.ssh.check.run import HostStatus
from orchestrator.ssh.check.view import host_cells
from tests.unit.conftest import Orch, WriteFile

LOCAL_PAIR = """
hosts:
  - {name: local1, address: localhost}
  - {name: local2, address: localhost}
"""


@pytest.fixture
def pair(write: WriteFile) -> Path:
    return write("inv.yaml", LOCAL_PAIR)


@pytest.fixture
def job(write: WriteFile, tmp_path: Path) -> Callable[..., Path]:
    (tmp_path / "train.py").write_text("print('hi')\n")

    def make(extra: str = "") -> Path:
        return write("job.yaml", f"script: train.py\nnodes: 2\n{extra}")

    return make


def test_check_on_this_machine_passes_with_its_row(orch: Orch) -> None:
    result = orch("check")
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("localhost"))
    cells = row.split()
    assert cells[:3] == ["localhost", "(master)", "local"]
    assert sys.version.split()[0] in cells
    assert result.stdout.rstrip().endswith("1 host: all checks passed")


def test_check_names_a_missing_python_and_exits_3(orch: Orch, write: WriteFile) -> None:
    inventory = write(
        "bad.yaml", LOCAL_PAIR + "  - {name: local3, address: localhost, python: /nonexistent/py}\n"
    )
    result = orch("check", "-i", inventory)
    assert result.returncode == 3
    assert "error: python not found at /nonexistent/py (host local3)" in result.stdout
    assert "hint: set 'python:' for local3" in result.stdout
    assert "3 hosts: 1 error" in result.stdout


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        yield s.getsockname()[1]


def test_pinned_busy_port_is_named_by_check_and_refused_by_submit(
    orch: Orch, pair: Path, job: Callable[..., Path], held_port: int, tmp_path: Path
) -> None:
    spec = job(f"rendezvous: {{port: {held_port}}}\n")
    checked = orch("check", "-i", pair, spec)
    assert checked.returncode == 3
    error = next(line for line in checked.stdout.splitlines() if line.startswith("error:"))
    assert error.startswith(
        f"error: rendezvous port {held_port} on the master 127.0.0.1 is busy: "
        f"held by pid {os.getpid()} ("
    )
    submitted = orch("submit", spec, "-i", pair)
    assert submitted.returncode == 3
    assert submitted.stdout == ""
    assert submitted.stderr.splitlines()[0] == error
    assert not (tmp_path / "home" / ".orch" / "jobs").exists(), "nothing started"


def test_unpinned_job_takes_a_free_port(orch: Orch, pair: Path, job: Callable[..., Path]) -> None:
    result = orch("check", "-i", pair, job())
    assert result.returncode == 0, result.stdout
    assert re.search(r"rendezvous: local1 at 127\.0\.0\.1:\d+ \(a free port\)", result.stdout)


def test_exec_prefixes_lines_and_exits_with_the_worst_code(orch: Orch, pair: Path) -> None:
    result = orch("exec", "-i", pair, "--", "echo out; echo err >&2; exit 4")
    assert result.returncode == 4
    assert sorted(result.stdout.splitlines()) == [
        "[local1] err",
        "[local1] out",
        "[local2] err",
        "[local2] out",
    ]
    assert "error: command failed on local1 (exit 4), local2 (exit 4)\n" in result.stderr


def test_exec_runs_several_words_as_one_exact_argv(orch: Orch) -> None:
    result = orch("exec", "--", "printf", "%s|", "a b", "$HOME", "it's", "")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[localhost] a b|$HOME|it's||\n"


def test_exec_without_a_command_is_bad_input(orch: Orch) -> None:
    assert orch("exec").returncode == 2


def test_exec_reads_no_stdin_and_reports_its_session() -> None:
    command = remote_command(["cat; echo done"])
    out = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=10, input="ignored"
    ).stdout.splitlines()
    assert out[0].startswith(PGID_MARK) and out[0].removeprefix(PGID_MARK).isdigit()
    assert out[1:] == ["done"]


def test_unknown_exec_host_lists_the_known_ones(orch: Orch, pair: Path) -> None:
    result = orch("exec", "-i", pair, "--hosts", "local9", "--", "true")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: host 'local9' is not in inventory {pair}",
        "hint: known hosts: local1, local2",
    ]


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("1K,64K,1M", (1024, 65536, 1 << 20)),
        ("8:64", (8, 16, 32, 64)),
        ("1K:1M:32", (1024, 32768, 1 << 20)),
        ("4M,1K:4K", (1024, 2048, 4096, 4 << 20)),
        ("2G", (2 << 30,)),
    ],
)
def test_sizes_parse_like_nccl_tests_ranges(text: str, sizes: tuple[int, ...]) -> None:
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text", ["1X", "0", "64M:1K", "1K:1M:1", "1:2:3:4", ""])
def test_bad_sizes_are_input_errors(text: str) -> None:
    with pytest.raises(InputError):
        parse_sizes(text)


def test_bench_with_bad_sizes_exits_2_before_touching_a_host(orch: Orch) -> None:
    result = orch("bench", "allreduce", "--sizes", "12Q")
    assert result.returncode == 2
    assert result.stderr.startswith("error: bad size '12Q'")


def test_backend_is_nccl_only_when_every_host_has_gpus() -> None:
    gpu, cpu = Host("a", "10.0.0.1", gpus=(0, 1)), Host("b", "10.0.0.2")
    assert choose_backend([gpu, gpu]) == "nccl"
    assert choose_backend([gpu, cpu]) == "gloo"
    assert choose_backend([gpu, gpu], "gloo") == "gloo"


def test_bench_rows_line_up_under_the_header_and_carry_bus_bandwidth() -> None:
    result = SizeResult(size=1 << 20, count=1 << 18, time_us=1000.0, wrong=0, world=8)
    assert result.algbw == pytest.approx(1.048576)
    assert result.busbw == pytest.approx(1.048576 * 14 / 8)
    row = format_row(result)
    header = BENCH_HEADER[0].replace("#", " ", 1)
    assert [m.end() for m in re.finditer(r"\S+", header)] == [
        m.end() for m in re.finditer(r"\S+", row)
    ]
    assert row.split() == ["1048576", "262144", "float", "sum", "1000.0", "1.049", "1.835", "0"]


def test_a_gpu_host_row_shows_seen_over_declared_and_cuda_nccl() -> None:
    facts = HostFacts(
        torch_version="2.5.1+cu124",
        torch_cuda="12.4",
        nccl_version="2.21.5",
        python_version="3.10.12",
        os="Ubuntu 22.04.4 LTS",
        gpu_count=7,
        gpu_names=("NVIDIA A100-SXM4-80GB",) * 7,
        disk_free=412_387_205_120,
        clock_offset_s=0.21,
        iface="ens3",
        local_addr="10.57.23.170",
    )
    host = Host("gpu7", "10.57.23.170", gpus=tuple(range(8)), env={"NCCL_SOCKET_IFNAME": "ens"})
    cells = host_cells(HostStatus(host, facts, ssh_ms=2.4))
    assert cells == [
        "gpu7",
        "ok 2 ms",
        "Ubuntu 22.04.4 LTS",
        "3.10.12",
        "2.5.1+cu124",
        "12.4 / 2.21.5",
        "7/8 A100-SXM4-80GB",
        "412.4 GB",
        "+0.2 s",
        "ens3 10.57.23.170 (NCCL_SOCKET_IFNAME=ens)",
    ]
