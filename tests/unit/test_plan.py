"""The launch plan: host selection, node and global ranks, each host's argv and env."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Protocol

import pytest

from orchestrator.models.inventory import Host, Inventory
from orchestrator.models.job import JobSpec, load_job
from orchestrator.ssh.plan import HostFacts, build_plan, describe, select_hosts, static_master_addr
from tests.unit.conftest import WriteFile, expect_input_error


class MakeJob(Protocol):
    def __call__(self, extra: str = "") -> JobSpec: ...


@pytest.fixture
def make_job(write: WriteFile, tmp_path: Path) -> MakeJob:
    """make_job('''nodes: 2''') -> the JobSpec of `script: train.py` plus those lines."""
    (tmp_path / "train.py").write_text("")

    def _make(extra: str = "") -> JobSpec:
        return load_job(write("job.yaml", "script: train.py\n" + extra))

    return _make


def host(name: str, address: str | None = None, **kwargs: object) -> Host:
    return Host(name=name, address=address or f"10.77.0.{name[-1]}", **kwargs)  # type: ignore[arg-type]


def inventory(*hosts: Host) -> Inventory:
    return Inventory(path="inv.yaml", hosts=hosts)


THREE = inventory(host("node1"), host("node2"), host("node3"))


# ---------------------------------------------------------------- select_hosts


def test_nodes_n_takes_the_first_n_hosts_of_the_inventory(make_job: MakeJob) -> None:
    selected = select_hosts(make_job("nodes: 2\n"), THREE)
    assert [h.name for h in selected] == ["node1", "node2"]


def test_without_nodes_every_host_is_used(make_job: MakeJob) -> None:
    assert [h.name for h in select_hosts(make_job(), THREE)] == ["node1", "node2", "node3"]


def test_hosts_list_gives_the_node_order(make_job: MakeJob) -> None:
    selected = select_hosts(make_job("hosts: [node3, node1]\n"), THREE)
    assert [h.name for h in selected] == ["node3", "node1"]


def test_labels_select_hosts_that_carry_every_label(make_job: MakeJob) -> None:
    inv = inventory(
        host("node1", labels=("a100",)),
        host("node2", labels=("h100", "ib")),
        host("node3", labels=("a100", "ib")),
        host("node4", labels=("ib",)),
    )
    assert [h.name for h in select_hosts(make_job("labels: [ib]\n"), inv)] == [
        "node2",
        "node3",
        "node4",
    ]
    assert [h.name for h in select_hosts(make_job("labels: [a100, ib]\n"), inv)] == ["node3"]
    assert [h.name for h in select_hosts(make_job("labels: [ib]\nnodes: 2\n"), inv)] == [
        "node2",
        "node3",
    ]


def test_more_nodes_than_hosts_is_an_error_at_the_nodes_line(make_job: MakeJob) -> None:
    job = make_job("args: [--x]\nnodes: 5\n")
    error = expect_input_error(lambda: select_hosts(job, THREE))
    assert error.line == 3
    assert "nodes=5 but inventory has 3 hosts" in error.message
    assert error.message.startswith(f"{job.path}:3:")
    assert "inv.yaml" in error.hint


def test_more_nodes_than_labelled_hosts_names_the_labels(make_job: MakeJob) -> None:
    inv = inventory(host("node1", labels=("a100",)), host("node2"))
    error = expect_input_error(lambda: select_hosts(make_job("nodes: 2\nlabels: [a100]\n"), inv))
    assert "nodes=2 but inventory has 1 hosts with labels ['a100']" in error.message


def test_label_no_host_has_is_an_error(make_job: MakeJob) -> None:
    error = expect_input_error(lambda: select_hosts(make_job("labels: [tpu]\n"), THREE))
    assert error.line == 2
    assert "no host in inv.yaml has labels ['tpu']" in error.message


def test_unknown_host_name_is_an_error_listing_known_hosts(make_job: MakeJob) -> None:
    error = expect_input_error(lambda: select_hosts(make_job("hosts: [node1, node9]\n"), THREE))
    assert error.line == 2
    assert "host 'node9' is not in inventory inv.yaml" in error.message
    assert error.hint == "known hosts: node1, node2, node3"


def test_mixing_localhost_and_remote_hosts_is_an_error(make_job: MakeJob) -> None:
    inv = inventory(host("me", "localhost"), host("node1"))
    error = expect_input_error(lambda: select_hosts(make_job("nodes: 2\n"), inv))
    assert "cannot mix localhost and remote hosts" in error.message


def test_several_local_hosts_may_run_together(make_job: MakeJob) -> None:
    inv = inventory(host("a", "localhost"), host("b", "127.0.0.1"))
    assert [h.name for h in select_hosts(make_job(), inv)] == ["a", "b"]


# ---------------------------------------------------------------- ranks


def test_first_selected_host_is_node_rank_zero_and_master(make_job: MakeJob) -> None:
    job = make_job("hosts: [node3, node1, node2]\n")
    plan = build_plan(job, select_hosts(job, THREE), "j-1", "10.77.0.3", 29500)
    assert [(n.host.name, n.node_rank) for n in plan.nodes] == [
        ("node3", 0),
        ("node1", 1),
        ("node2", 2),
    ]
    assert plan.master.host.name == "node3"
    assert plan.master_addr == "10.77.0.3"


def test_mixed_slots_give_contiguous_global_ranks(make_job: MakeJob) -> None:
    hosts = [host("node1", slots=1), host("node2", slots=2), host("node3", slots=1)]
    plan = build_plan(make_job(), hosts, "j-1", "10.77.0.1", 29500)
    assert plan.world_size == 4
    assert [n.nproc for n in plan.nodes] == [1, 2, 1]
    assert [n.first_rank for n in plan.nodes] == [0, 1, 3]
    assert [list(n.ranks) for n in plan.nodes] == [[0], [1, 2], [3]]


def test_nproc_per_node_auto_uses_each_hosts_slots(make_job: MakeJob) -> None:
    hosts = [host("node1", slots=8), host("node2", slots=2)]
    plan = build_plan(make_job("nproc_per_node: auto\n"), hosts, "j-1", "10.77.0.1", 29500)
    assert [n.nproc for n in plan.nodes] == [8, 2]
    assert plan.world_size == 10


def test_fixed_nproc_per_node_applies_to_every_host(make_job: MakeJob) -> None:
    hosts = [host("node1", slots=8), host("node2", slots=2)]
    plan = build_plan(make_job("nproc_per_node: 2\n"), hosts, "j-1", "10.77.0.1", 29500)
    assert [n.nproc for n in plan.nodes] == [2, 2]
    assert [list(n.ranks) for n in plan.nodes] == [[0, 1], [2, 3]]


def test_nproc_per_node_above_a_hosts_slots_is_an_error(make_job: MakeJob) -> None:
    hosts = [host("node1", slots=4), host("node2", slots=2)]
    job = make_job("nproc_per_node: 3\n")
    error = expect_input_error(lambda: build_plan(job, hosts, "j-1", "10.77.0.1", 29500))
    assert error.line == 2
    assert "nproc_per_node=3 but host node2 has 2 slots" in error.message


# ---------------------------------------------------------------- argv


def test_torchrun_argv_is_exact_for_every_node(make_job: MakeJob) -> None:
    job = make_job('args: [--epochs, "3", "a b", "--", "$HOME"]\nmax_restarts: 2\n')
    hosts = [
        host("node1", python="/opt/venv/bin/python", slots=1),
        host("node2", "node2.example.com", slots=2),
    ]
    facts = {"node2": HostFacts(iface="eth1", local_addr="10.77.0.12")}
    plan = build_plan(job, hosts, "j-1", "10.77.0.11", 29511, facts)
    tail = ("agent/run.py", "rank", "logs", "code", "script", "train.py", "--")
    user = ("--epochs", "3", "a b", "--", "$HOME")
    common = ("--nnodes", "2")
    assert plan.nodes[0].argv == (
        "/opt/venv/bin/python", "-m", "torch.distributed.run", *common,
        "--node-rank", "0", "--nproc-per-node", "1",
        "--master-addr", "10.77.0.11", "--master-port", "29511", "--max-restarts", "2",
        "--local-addr", "10.77.0.11", *tail, *user,
    )  # fmt: skip
    assert plan.nodes[1].argv == (
        "python3", "-m", "torch.distributed.run", *common,
        "--node-rank", "1", "--nproc-per-node", "2",
        "--master-addr", "10.77.0.11", "--master-port", "29511", "--max-restarts", "2",
        "--local-addr", "10.77.0.12", *tail, *user,
    )  # fmt: skip


def _option(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_local_addr_without_facts_is_the_hosts_ip(make_job: MakeJob) -> None:
    hosts = [host("node1"), host("node2")]
    plan = build_plan(make_job(), hosts, "j-1", "10.77.0.1", 29500)
    assert _option(plan.nodes[1].argv, "--local-addr") == "10.77.0.2"


def test_local_addr_is_left_out_for_an_unprobed_dns_name(make_job: MakeJob) -> None:
    hosts = [host("node1"), host("node2", "node2.example.com")]
    plan = build_plan(make_job(), hosts, "j-1", "10.77.0.1", 29500)
    assert "--local-addr" not in plan.nodes[1].argv
    assert _option(plan.nodes[0].argv, "--local-addr") == "10.77.0.1"


def test_module_job_runs_the_module_through_the_supervisor(write: WriteFile) -> None:
    job = load_job(write("mod.yaml", "module: pkg.train\nargs: [-x]\n"))
    plan = build_plan(job, [host("node1")], "j-1", "10.77.0.1", 29500)
    assert plan.nodes[0].argv[-7:] == ("rank", "logs", "code", "module", "pkg.train", "--", "-x")


def test_unknown_port_shows_a_placeholder(make_job: MakeJob) -> None:
    plan = build_plan(make_job(), [host("node1")], "j-1", "10.77.0.1", None)
    assert _option(plan.nodes[0].argv, "--master-port") == "<free port on master>"


def test_job_dir_is_under_the_hosts_workdir(make_job: MakeJob) -> None:
    hosts = [host("node1", workdir="~/.orch/"), host("node2", workdir="/scratch")]
    plan = build_plan(make_job(), hosts, "digits-ab12cd", "10.77.0.1", 29500)
    assert plan.nodes[0].job_dir == "~/.orch/jobs/digits-ab12cd/node1"
    assert plan.nodes[1].code_dir == "/scratch/jobs/digits-ab12cd/node2/code"


# ---------------------------------------------------------------- env


def test_every_node_gets_the_orch_variables(make_job: MakeJob) -> None:
    hosts = [host("node1"), host("node2"), host("node3")]
    plan = build_plan(make_job(), hosts, "digits-ab12cd", "10.77.0.1", 29500)
    for rank, node in enumerate(plan.nodes):
        assert node.env["ORCH_JOB_ID"] == "digits-ab12cd"
        assert node.env["ORCH_NODE_RANK"] == str(rank)
        assert node.env["ORCH_NUM_NODES"] == "3"
        assert node.env["ORCH_HOSTS"] == "node1,node2,node3"


def test_probed_interface_sets_gloo_and_nccl_ifname(make_job: MakeJob) -> None:
    hosts = [host("node1"), host("node2")]
    facts = {"node1": HostFacts(iface="eth0"), "node2": HostFacts(iface="ens3")}
    plan = build_plan(make_job(), hosts, "j-1", "10.77.0.1", 29500, facts)
    assert plan.nodes[0].env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert plan.nodes[0].env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert plan.nodes[1].env["GLOO_SOCKET_IFNAME"] == "ens3"
    assert plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "ens3"


def test_no_ifname_is_invented_without_a_probe(make_job: MakeJob) -> None:
    plan = build_plan(make_job(), [host("node1")], "j-1", "10.77.0.1", 29500)
    assert "GLOO_SOCKET_IFNAME" not in plan.nodes[0].env
    assert "NCCL_SOCKET_IFNAME" not in plan.nodes[0].env


def test_job_env_ifname_wins_over_the_probed_interface(make_job: MakeJob) -> None:
    job = make_job("env: {NCCL_SOCKET_IFNAME: ib0}\n")
    plan = build_plan(
        job, [host("node1")], "j-1", "10.77.0.1", 29500, {"node1": HostFacts(iface="eth0")}
    )
    assert plan.nodes[0].env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert plan.nodes[0].env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_inventory_env_ifname_wins_over_the_probed_interface(make_job: MakeJob) -> None:
    hosts = [host("node1", env={"GLOO_SOCKET_IFNAME": "bond0"})]
    plan = build_plan(
        make_job(), hosts, "j-1", "10.77.0.1", 29500, {"node1": HostFacts(iface="eth0")}
    )
    assert plan.nodes[0].env["GLOO_SOCKET_IFNAME"] == "bond0"
    assert plan.nodes[0].env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_job_env_wins_over_inventory_env(make_job: MakeJob) -> None:
    job = make_job("env: {NCCL_DEBUG: INFO}\n")
    hosts = [host("node1", env={"NCCL_DEBUG": "WARN", "HOST_ONLY": "1"})]
    env = build_plan(job, hosts, "j-1", "10.77.0.1", 29500).nodes[0].env
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["HOST_ONLY"] == "1"


def test_job_env_cannot_override_the_job_id_tag(make_job: MakeJob) -> None:
    # kill finds stray processes by ORCH_JOB_ID: a job must not be able to change it
    job = make_job("env: {ORCH_JOB_ID: other}\n")
    env = build_plan(job, [host("node1")], "j-1", "10.77.0.1", 29500).nodes[0].env
    assert env["ORCH_JOB_ID"] == "j-1"


def test_gpu_index_list_sets_cuda_visible_devices(make_job: MakeJob) -> None:
    hosts = [host("node1", gpus=(2, 3), slots=2), host("node2", gpus=(0, 1), slots=2)]
    plan = build_plan(make_job(), hosts, "j-1", "10.77.0.1", 29500)
    assert plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in plan.nodes[1].env


# ---------------------------------------------------------------- master address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.57.23.164", "10.57.23.164"),
        ("fd00::5", "fd00::5"),
        ("localhost", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
        ("node1.example.com", None),
        ("gpu-box", None),  # an ~/.ssh/config alias: only a probe can tell
    ],
)
def test_static_master_addr(address: str, expected: str | None) -> None:
    assert static_master_addr(host("node1", address)) == expected


# ---------------------------------------------------------------- describe


def test_describe_shows_each_hosts_ranks_env_and_exact_command(make_job: MakeJob) -> None:
    job = make_job("args: [--name, 'a b']\nenv: {MSG: \"it's\"}\n")
    hosts = [host("node1", slots=1), host("node2", slots=2)]
    facts = {"node2": HostFacts(iface="eth0", local_addr="10.77.0.2")}
    plan = build_plan(job, hosts, "j-1", "10.77.0.1", 29500, facts)
    text = "\n".join(describe(plan))
    assert text.splitlines()[:2] == ["job j-1", "train.py on 2 nodes, world size 3"]
    assert "master node1 at 10.77.0.1:29500" in text
    assert "[node1] node rank 0, 1 processes (r0)" in text
    assert "[node2] node rank 1, 2 processes (r1-r2)" in text
    for node in plan.nodes:
        assert "  " + shlex.join(node.argv) in text.splitlines()
        assert f"  cd {node.job_dir}" in text.splitlines()
        assert f"  # each rank runs in {node.code_dir}" in text.splitlines()
    assert "  MSG='it'\"'\"'s'" in text.splitlines()
    # node1 has no probed interface: the plan says what still has to be found out
    assert "  GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME=<interface routing to 10.77.0.1>" in text
    assert "  NCCL_SOCKET_IFNAME=eth0" in text.splitlines()
