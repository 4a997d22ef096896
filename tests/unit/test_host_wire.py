"""The probe's and the network tests' replies (agent/kernel/host_wire.py): the agent
builds each as its class, the controller parses it, and a field of the wrong type is
an error that names the host. Real agent commands on this machine; a host whose
"python" answers something else is a script in its place."""

from __future__ import annotations

import json
import socket
import stat
import sys
from pathlib import Path

import pytest

from orchestrator.agent.kernel import messages
from orchestrator.agent.kernel.host_wire import (
    Bandwidth,
    GpuFacts,
    GpuRow,
    NetDone,
    NetReady,
    PortFacts,
    PortHolder,
    ProbeFacts,
    Reached,
)
from orchestrator.agent.kernel.messages import Message, parse_message
from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.probe import probe_host
from orchestrator.ssh.check import net
from orchestrator.transport.local import LocalTransport


def here(tmp_path: Path, python: str = sys.executable) -> Host:
    return Host(name="node7", address="localhost", python=python, workdir=str(tmp_path / "w"))


def answering(tmp_path: Path, reply: object) -> Host:
    """A host whose python reads its input and answers `reply`, whatever it was asked."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{json.dumps(reply)}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return here(tmp_path, str(script))


@pytest.mark.parametrize(
    "message",
    [
        ProbeFacts(
            hostname="gpu-node7",
            torch="2.5.1+cu124",
            addresses={"10.0.0.7": "ens3"},
            port=PortFacts(port=29500, free=False, holders=[PortHolder(pid=4, user="bob")]),
            gpus=GpuFacts(count=1, source="nvidia-smi", list=[GpuRow(index=0, name="A100")]),
            modules={"numpy": False},
            fs_seen=["ab12"],
            time=1.5,
        ),
        NetReady(ready=True, port=29500),
        NetReady(ready=False, error="Address already in use"),
        NetDone(done=True, peers=["10.0.0.8"]),
        NetDone(done=True, served=2),
        Reached(ok=True, ms=0.4),
        Reached(ok=False, error="connection refused"),
        Bandwidth(up_gbps=9.4, down_gbps=None),
        Bandwidth(error="timed out"),
    ],
)
def test_host_replies_round_trip(message: Message) -> None:
    parsed = parse_message(type(message), json.loads(message.to_json()), host="h")
    assert parsed == message and parsed.as_dict() == message.as_dict()


def test_the_probe_of_this_machine_parses_as_its_class(tmp_path: Path) -> None:
    found = probe_host(here(tmp_path), LocalTransport("node7"), "127.0.0.1", port=1)
    assert found.facts.python_version == sys.version.split()[0]
    assert (found.facts.iface, found.facts.port) == ("lo", 1)
    assert found.facts.clock is not None


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ({"hostname": 7}, "ProbeFacts.hostname is int, not str"),
        ({"gpus": {"count": "seven"}}, "ProbeFacts.gpus: GpuFacts.count is str, not int | None"),
        ({"port": {"port": 1}}, "ProbeFacts.port: PortFacts lacks 'free'"),
        ({"fs_seen": "ab12"}, "ProbeFacts.fs_seen is str, not Sequence[str] | None"),
        ({"time": "now"}, "ProbeFacts.time is str, not float | None"),
    ],
)
def test_a_probe_answer_of_the_wrong_type_is_an_error_naming_the_host(
    tmp_path: Path, reply: object, said: str
) -> None:
    with pytest.raises(HostError) as caught:
        probe_host(answering(tmp_path, reply), LocalTransport("node7"))
    assert caught.value.host == "node7"
    assert said in caught.value.message and caught.value.hint


def test_a_connection_test_to_a_closed_port_answers_reached_not_ok(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        args = ["nettest", "connect", "127.0.0.1", str(port), "2", "tok"]
        record = agent.run(here(tmp_path), LocalTransport("node7"), args)
    reached = agent.parse(here(tmp_path), Reached, record)
    assert reached == Reached(ok=False, error="connection refused")


def test_a_test_servers_first_record_of_the_wrong_type_names_the_host(tmp_path: Path) -> None:
    host = here(tmp_path)
    process = LocalTransport("node7").stream('echo \'{"ready": "yes"}\'', idle_timeout=10)
    with pytest.raises(HostError) as caught:
        net._first_record(host, process)
    assert caught.value.host == "node7" and "NetReady.ready is str, not bool" in str(caught.value)
    silent = LocalTransport("node7").stream("echo nothing >&2", idle_timeout=10)
    assert net._first_record(host, silent) == NetReady(ready=False, error="nothing")


def test_a_bandwidth_answer_of_the_wrong_type_is_that_nodes_error(tmp_path: Path) -> None:
    host = answering(tmp_path, {"up_gbps": "fast"})
    measured = net._measure(LocalTransport("node7"), host, "127.0.0.1", 1)
    assert measured.up_gbps is None and measured.error is not None
    assert "Bandwidth.up_gbps is str, not float | None" in measured.error


def test_every_host_wire_annotation_can_be_checked() -> None:
    classes = (ProbeFacts, GpuFacts, GpuRow, PortFacts, PortHolder, NetReady, NetDone)
    for cls in (*classes, Reached, Bandwidth):
        for annotation in cls.fields().values():
            messages._compile(annotation)
