"""The probe's host-side parsing, on recorded outputs (tests/unit/fixtures/README.md),
and the probe itself on this machine: versions without importing torch, GPUs from
nvidia-smi, a held port and who holds it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.host import probe as agent_probe
from orchestrator.agent.host import proc
from orchestrator.agent.kernel.host_wire import PortFacts, PortHolder, ProbeFacts
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.nodes import agent
from orchestrator.nodes.probe import describe_holder, facts_from_probe

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nvidia_smi_lists_eight_a100s_with_memory_and_driver() -> None:
    gpus = agent_probe.parse_gpu_query(fixture("nvidia-smi-8xA100.csv"), 0)
    assert gpus.count == 8 and "error" not in gpus.as_dict()
    assert [g.index for g in gpus.list] == list(range(8))
    assert gpus.list[0].as_dict() == {
        "index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "driver": "535.129.03",
    }


def test_nvidia_smi_with_a_lost_gpu_counts_seven_and_keeps_what_it_said() -> None:
    gpus = agent_probe.parse_gpu_query(fixture("nvidia-smi-gpu-lost.txt"), 15)
    assert gpus.count == 7 and gpus.error is not None
    assert gpus.error.startswith("Unable to determine the device handle for GPU 0000:CA:00.0")


def test_nvidia_smi_without_driver_counts_nothing_and_says_why() -> None:
    gpus = agent_probe.parse_gpu_query(fixture("nvidia-smi-no-driver.txt"), 9)
    assert gpus.count is None and gpus.error is not None
    assert gpus.error.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_device_nodes_count_gpus_where_nvidia_smi_is_missing() -> None:
    names = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null", "nvidia10"]
    assert agent_probe.device_gpu_count(names) == 3


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch-version-cu124.txt", {"__version__": "2.5.1+cu124", "cuda": "12.4", "hip": None}),
        ("torch-version-cpu.txt", {"__version__": "2.13.0+cpu", "cuda": None, "hip": None}),
    ],
)
def test_torch_version_py_gives_version_and_cuda_without_import(
    name: str, expected: dict[str, str | None]
) -> None:
    values = agent_probe.parse_version_py(fixture(name))
    assert {k: values[k] for k in expected} == expected


def test_nccl_version_comes_from_the_wheel_beside_torch() -> None:
    assert agent_probe.nccl_from_listing(fixture("site-packages-cu124.txt").split()) == "2.21.5"
    assert agent_probe.nccl_from_listing(["torch", "torch-2.13.0+cpu.dist-info"]) is None


def test_tcp_tables_give_port_state_owner_uid_and_inode() -> None:
    rows = proc.parse_tcp_table(fixture("proc-net-tcp.txt"))
    on_29500 = [(r["addr"], r["state"], r["uid"], r["inode"]) for r in rows if r["port"] == 29500]
    assert on_29500 == [
        ("10.77.0.11", "LISTEN", 1001, 48213),
        ("10.77.0.11", "ESTABLISHED", 1001, 48377),
        ("10.77.0.11", "TIME_WAIT", 0, 0),
    ]
    rows6 = proc.parse_tcp_table(fixture("proc-net-tcp6.txt"))
    assert [(r["addr"], r["port"], r["state"]) for r in rows6] == [
        ("::", 29500, "LISTEN"),
        ("::1", 631, "LISTEN"),
    ]


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_busy_port_names_this_process_as_its_holder(held: int) -> None:
    status = agent_probe.port_status(held)
    assert status.free is False
    listening = [h for h in status.holders if h.state == "LISTEN"]
    assert listening and listening[0].pid == os.getpid()
    assert "pytest" in str(listening[0].command) or "python" in str(listening[0].command)


def test_free_port_is_free() -> None:
    port = agent_probe.free_port()
    assert agent_probe.port_status(port) == PortFacts(port=port, free=True)
    assert agent_probe.port_status(port).as_dict() == {"port": port, "free": True}


def test_holder_description_keeps_both_ends_of_a_long_command() -> None:
    long = PortHolder(pid=42, command="python -c " + "x" * 100 + " leftover-trainer", user="bob")
    text = describe_holder(long)
    assert text.startswith("pid 42 (python -c xxx") and text.endswith(
        "leftover-trainer) of user bob"
    )
    hidden = describe_holder(PortHolder(pid=None, user="alice"))
    assert hidden.startswith("a process of user alice (hidden")


def test_probe_answers_in_one_json_line_without_importing_torch(tmp_path: Path) -> None:
    options = {
        "master": "127.0.0.1",
        "port": 1,
        "workdir": str(tmp_path),
        "modules": ["json", "nope_x"],
    }
    loader = [sys.executable, "-X", "importtime", "-c", agent.LOADER]
    where = [str(len(agent.packed())), agent.version(), str(tmp_path / "agent")]
    result = subprocess.run(
        [*loader, *where, "probe", json.dumps(options)],
        input=agent.packed(),
        capture_output=True,
        check=True,
    )
    facts = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert facts["torch"] and facts["python"] == sys.version.split()[0]
    assert (facts["iface"], facts["local_addr"]) == ("lo", "127.0.0.1")
    assert facts["disk_free"] > 0
    assert facts["modules"] == {"json": True, "nope_x": False}
    assert facts["port"]["port"] == 1
    assert "gpus" in facts and isinstance(facts["time"], float)
    imported = result.stderr.decode()
    assert "| torch" not in imported and "importlib.metadata" not in imported


def test_probe_json_of_a_gpu_host_becomes_host_facts() -> None:
    data = json.loads(fixture("probe-a100-gpu-lost.json"))
    facts = facts_from_probe(parse_message(ProbeFacts, data), received_at=data["time"] - 0.5)
    assert (facts.torch_version, facts.torch_cuda, facts.nccl_version) == (
        "2.5.1+cu124",
        "12.4",
        "2.21.5",
    )
    assert facts.gpu_count == 7 and facts.gpu_names == ("NVIDIA A100-SXM4-80GB",) * 7
    assert facts.gpu_error is not None and "GPU is lost" in facts.gpu_error
    assert ("192.168.100.7", "ib0") in facts.addresses
    assert facts.clock_offset_s == pytest.approx(0.5)
    assert (facts.iface, facts.local_addr) == ("ens3", "10.57.23.170")
