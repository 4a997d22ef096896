"""check's rules on facts: which problems are errors (submit refuses), which are
warnings, and that every one names its host and says how to fix it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.agent.kernel.host_wire import ProbeFacts
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.models.errors import EXIT_INFRA, PreflightError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.nodes.probe import facts_from_probe
from orchestrator.ssh.check.rules import (
    Problem,
    Severity,
    bandwidth_problems,
    cluster_problems,
    host_problems,
    human_bytes,
    ifname_matches,
    merge_hosts,
    port_problems,
    reach_problems,
)

FIXTURES = Path(__file__).parent / "fixtures"
HEALTHY = HostFacts(
    torch_version="2.13.0+cpu",
    iface="eth0",
    local_addr="10.77.0.12",
    addresses=(("10.77.0.12", "eth0"), ("127.0.0.1", "lo")),
    disk_free=50 * 10**9,
    clock_offset_s=0.01,
)


def host(name: str = "node2", **keys: object) -> Host:
    return Host(name=name, address="10.77.0.12", python="/opt/venv/bin/python", **keys)  # type: ignore[arg-type]


def gpu_host_facts() -> HostFacts:
    data = json.loads((FIXTURES / "probe-a100-gpu-lost.json").read_text())
    return facts_from_probe(parse_message(ProbeFacts, data), data["time"])


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]


def test_healthy_host_has_no_problem() -> None:
    assert host_problems(host(), HEALTHY, {}) == []


def test_fewer_gpus_than_declared_is_an_error_naming_both_counts() -> None:
    problem = only(
        host_problems(host("gpu-node7", gpus=tuple(range(8)), slots=8), gpu_host_facts(), {})
    )
    assert problem.severity is Severity.ERROR and problem.topic == "gpus"
    assert problem.message.startswith(
        "nvidia-smi shows 7 GPUs, inventory declares 8: Unable to determine"
    )
    assert problem.message.endswith("(host gpu-node7)")
    assert "fallen off the bus" in problem.hint and "gpus:" in problem.hint


def test_gpu_indices_beyond_what_is_seen_are_an_error() -> None:
    facts = HostFacts(torch_version="2.5.1+cu124", torch_cuda="12.4", gpu_count=4)
    problem = only(host_problems(host(gpus=(4, 5, 6, 7)), facts, {}))
    assert "shows 4 GPUs, inventory uses GPUs [4, 5, 6, 7]" in problem.message


def test_all_declared_gpus_seen_is_fine() -> None:
    facts = HostFacts(torch_version="2.5.1+cu124", torch_cuda="12.4", gpu_count=8)
    assert host_problems(host(gpus=tuple(range(8))), facts, {}) == []


def test_no_driver_on_a_gpu_host_is_an_error_with_nvidia_smis_words() -> None:
    facts = HostFacts(
        torch_version="2.5.1+cu124", gpu_count=None, gpu_error="NVIDIA-SMI has failed"
    )
    problem = only(host_problems(host(gpus=(0, 1)), facts, {}))
    assert problem.is_error and "cannot count GPUs (NVIDIA-SMI has failed)" in problem.message


def test_undeclared_gpus_and_cpu_torch_are_warnings() -> None:
    facts = HostFacts(torch_version="2.13.0+cpu", gpu_count=8, gpu_names=("NVIDIA H100",) * 8)
    problems = host_problems(host(), facts, {})
    assert [p.severity for p in problems] == [Severity.WARNING, Severity.WARNING]
    assert "CPU-only build, but the host has 8 GPUs" in problems[0].message
    assert "inventory declares none" in problems[1].message and problems[1].hint == (
        "add 'gpus: 8' to node2 in the inventory"
    )


def test_no_route_to_master_is_an_error() -> None:
    facts = HostFacts(
        torch_version="2.13.0", route_error="RTNETLINK answers: Network is unreachable"
    )
    problem = only(host_problems(host(), facts, {}))
    assert problem.is_error and problem.topic == "route"
    assert (
        problem.message
        == "no route to the master: RTNETLINK answers: Network is unreachable (host node2)"
    )


def test_ifname_set_to_a_missing_interface_is_an_error() -> None:
    problem = only(host_problems(host(), HEALTHY, {"GLOO_SOCKET_IFNAME": "ens3"}))
    assert problem.is_error
    assert (
        problem.message
        == "GLOO_SOCKET_IFNAME=ens3 matches no interface (it has eth0, lo) (host node2)"
    )
    assert "let orch choose eth0" in problem.hint


def test_ifname_set_to_another_interface_than_the_route_is_a_warning() -> None:
    facts = HostFacts(
        torch_version="2.13.0",
        iface="eth1",
        addresses=(("10.0.0.2", "eth0"), ("10.77.0.242", "eth1")),
    )
    problem = only(host_problems(host(), facts, {"NCCL_SOCKET_IFNAME": "eth0"}))
    assert problem.severity is Severity.WARNING
    assert (
        "NCCL_SOCKET_IFNAME=eth0, but the route to the master goes through eth1" in problem.message
    )


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("NCCL_SOCKET_IFNAME", "eth", ["eth0", "eth1"]),
        ("NCCL_SOCKET_IFNAME", "=eth0", ["eth0"]),
        ("NCCL_SOCKET_IFNAME", "^docker,lo", ["eth0", "eth1", "ib0"]),
        ("NCCL_SOCKET_IFNAME", "^=eth1", ["docker0", "eth0", "ib0", "lo"]),
        ("NCCL_SOCKET_IFNAME", "ib,eth1", ["eth1", "ib0"]),
        ("GLOO_SOCKET_IFNAME", "eth", []),
        ("GLOO_SOCKET_IFNAME", "eth1,ib0", ["eth1", "ib0"]),
    ],
)
def test_ifname_values_select_interfaces_as_nccl_and_gloo_do(
    var: str, value: str, expected: list[str]
) -> None:
    assert ifname_matches(var, value, ["docker0", "eth0", "eth1", "ib0", "lo"]) == expected


def test_low_disk_and_clock_skew_are_warnings() -> None:
    facts = HostFacts(torch_version="2.13.0", disk_free=300 * 10**6, clock_offset_s=-4.2)
    problems = host_problems(host(), facts, {})
    assert [(p.severity, p.topic) for p in problems] == [
        (Severity.WARNING, "disk"),
        (Severity.WARNING, "clock"),
    ]
    assert problems[0].message == "only 300.0 MB free in ~/.orch (host node2)"
    assert problems[1].message == "clock is -4.2 s off this machine's (host node2)"


def test_missing_module_is_an_error() -> None:
    facts = HostFacts(torch_version="2.13.0", modules_missing=("mypkg",))
    problem = only(host_problems(host(), facts, {}))
    assert problem.is_error and "module mypkg" in problem.message


def facts_with(**versions: str) -> tuple[list[Host], dict[str, HostFacts]]:
    hosts = [host(name) for name in versions]
    return hosts, {name: HostFacts(torch_version=v) for name, v in versions.items()}


def test_the_host_with_the_odd_torch_version_is_named() -> None:
    hosts, facts = facts_with(node1="2.13.0+cpu", node2="2.13.0+cpu", node3="2.12.0+cpu")
    problem = only(cluster_problems(hosts, facts))
    assert problem.is_error and problem.host == "node3"
    assert problem.message == "torch 2.12.0+cpu differs from 2.13.0 on node1, node2 (host node3)"
    assert problem.hint.startswith("install torch==2.13.0 for /opt/venv/bin/python")


def test_a_tie_in_torch_versions_goes_to_the_master() -> None:
    hosts, facts = facts_with(node1="2.13.0", node2="2.12.0")
    assert only(cluster_problems(hosts, facts)).host == "node2"


def test_same_torch_release_with_other_builds_is_a_warning() -> None:
    hosts, facts = facts_with(node1="2.5.1+cu124", node2="2.5.1+cpu")
    problem = only(cluster_problems(hosts, facts))
    assert problem.severity is Severity.WARNING
    assert problem.message == "torch build 2.5.1+cpu differs from 2.5.1+cu124 on node1 (host node2)"


def test_differing_nccl_is_a_warning() -> None:
    hosts = [host("node1"), host("node2")]
    facts = {
        "node1": HostFacts(torch_version="2.5.1", nccl_version="2.21.5"),
        "node2": HostFacts(torch_version="2.5.1", nccl_version="2.20.3"),
    }
    problem = only(cluster_problems(hosts, facts))
    assert (
        problem.severity is Severity.WARNING
        and "NCCL 2.20.3 differs from 2.21.5" in problem.message
    )


def test_pinned_busy_port_is_an_error_naming_port_and_holder() -> None:
    holders = ("pid 4242 (python train.py) of user bob",)
    problem = only(port_problems("node1", "10.77.0.11", 29500, True, False, holders))
    assert problem.message == (
        "rendezvous port 29500 on the master 10.77.0.11 is busy: held by "
        "pid 4242 (python train.py) of user bob (host node1)"
    )
    assert port_problems("node1", "10.77.0.11", 29500, False, False, holders) == []
    assert port_problems("node1", "10.77.0.11", 29500, True, True, ()) == []


def test_unreachable_port_names_the_node_that_failed() -> None:
    problem = only(reach_problems("node1", "10.77.0.11", 29500, {"node3": "connection refused"}))
    assert problem.host == "node3" and problem.is_error
    assert (
        "cannot connect to the master node1 at 10.77.0.11:29500: connection refused"
        in problem.message
    )
    assert "open TCP port 29500 on node1" in problem.hint


def test_slow_links_warn_only_when_hosts_have_gpus() -> None:
    rates = {"node2": (0.94, 0.93), "node3": (23.5, 22.1)}
    assert bandwidth_problems(rates, with_gpus=False) == []
    problem = only(bandwidth_problems(rates, with_gpus=True))
    assert problem.host == "node2" and problem.severity is Severity.WARNING
    assert problem.message == "0.9 Gbit/s to the master: GPU training needs 10+ (host node2)"


def test_preflight_error_prints_every_problem_as_an_error_hint_pair() -> None:
    problems = [
        Problem(Severity.ERROR, "a is wrong", "fix a", ("node1",)),
        Problem(Severity.ERROR, "b is wrong", "fix b", ("node2",)),
    ]
    error = PreflightError(problems)
    assert error.exit_code == EXIT_INFRA
    shown = [f"error: {error.message}", f"hint: {error.hint}"]  # as cli._fail prints it
    assert "\n".join(shown).splitlines() == [
        "error: a is wrong (host node1)",
        "hint: fix a",
        "error: b is wrong (host node2)",
        "hint: fix b",
    ]


def test_the_same_problem_on_several_hosts_is_said_once() -> None:
    facts = HostFacts(torch_version="2.13.0", iface="eth0", addresses=(("10.77.0.12", "eth0"),))
    env = {"GLOO_SOCKET_IFNAME": "ens3"}
    found = [
        p for name in ("node1", "node2", "node3") for p in host_problems(host(name), facts, env)
    ]
    found += host_problems(host("node3"), HostFacts(torch_version="2.13.0", clock_offset_s=9.0), {})
    merged = merge_hosts(found)
    assert [p.message for p in merged] == [
        "GLOO_SOCKET_IFNAME=ens3 matches no interface (it has eth0) (hosts node1, node2, node3)",
        "clock is +9.0 s off this machine's (host node3)",
    ]


def test_sizes_read_in_decimal_units() -> None:
    assert [human_bytes(n) for n in (512, 41_234_000_000, 1_500_000_000_000)] == [
        "512 B",
        "41.2 GB",
        "1.5 TB",
    ]
