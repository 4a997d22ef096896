"""The test cluster itself: separate hosts, reachable over real SSH, faults that bite, clean teardown."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster import (
    BRIDGE,
    ROOT_HOME,
    SUBNET,
    Cluster,
    ClusterError,
    repo_python,
    skip_or_fail,
)
from tests.cluster.network import (
    MAX_HOSTS,
    NETNS_PREFIX,
    PEER_PREFIX,
    VETH_PREFIX,
    _neighbour_limits,
)
from tests.support import wait_for


def machine_pids_running(cmdline: str) -> list[int]:
    """Pids, in the machine's own process table, of processes whose command line is ``cmdline``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and (entry / "cmdline").read_bytes().split(b"\0")[:-1] == cmdline.encode().split()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def start_background(cluster: Cluster, i: int, command: str) -> None:
    """Start ``command`` detached on host ``i`` over SSH, as a job left behind would be."""
    result = cluster.ssh(i, f"setsid {command} </dev/null >/dev/null 2>&1 &")
    assert result.returncode == 0, result.stderr


def sshd_accepts(address: str, timeout: float = 2) -> bool:
    """Whether something accepts TCP on ``address:22``."""
    try:
        socket.create_connection((address, 22), timeout=timeout).close()
        return True
    except OSError:
        return False


def orch_links() -> list[str]:
    """Names of the links on this machine that belong to this network's harness."""
    out = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return [
        name
        for name in names
        if name == BRIDGE or re.fullmatch(rf"({VETH_PREFIX}|{PEER_PREFIX})l?\d+", name)
    ]


def orch_namespaces() -> list[str]:
    """Names of the network namespaces on this machine that belong to this network's harness."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    names = [line.split()[0] for line in out.splitlines()]
    return [name for name in names if re.fullmatch(rf"{NETNS_PREFIX}\d+", name)]


@pytest.mark.cluster
def test_every_host_answers_ssh_with_its_own_hostname(cluster: Cluster) -> None:
    for host in cluster.hosts:
        result = cluster.ssh(host.index, "hostname")
        assert (result.returncode, result.stdout.strip()) == (0, host.name), result.stderr


@pytest.mark.cluster
def test_hosts_have_their_own_process_table_and_home(cluster: Cluster) -> None:
    start_background(cluster, 1, "sleep 4242")
    assert cluster.ssh(1, "echo mine > ~/marker").returncode == 0

    wait_for(
        lambda: any(cmd == "sleep 4242" for _, cmd in cluster.host_pids(1)),
        what="sleep 4242 in node1's process table",
    )
    assert not any("sleep 4242" in cmd for _, cmd in cluster.host_pids(2))
    assert "sshd" in dict(cluster.host_pids(2))[1]  # PID 1 there is the host's own sshd
    assert (cluster.home(1) / "marker").read_text() == "mine\n"
    assert cluster.ssh(2, "test -e ~/marker").returncode == 1

    # Killed orphans must be reaped, or "no process left" checks would see zombies.
    (pid,) = [pid for pid, cmd in cluster.host_pids(1) if cmd == "sleep 4242"]
    assert cluster.exec_on(1, ["kill", str(pid)]).returncode == 0
    wait_for(lambda: pid not in dict(cluster.host_pids(1)), what=f"pid {pid} reaped on node1")
    (cluster.home(1) / "marker").unlink()


@pytest.mark.cluster
def test_exec_on_runs_inside_the_host(cluster: Cluster) -> None:
    (cluster.home(2) / "seen-from-inside").touch()

    assert cluster.exec_on(2, ["hostname"]).stdout.strip() == "node2"
    assert (
        f"{SUBNET}.12/24"
        in cluster.exec_on(2, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
    )
    assert "seen-from-inside" in cluster.exec_on(2, ["ls", "-A", str(ROOT_HOME)]).stdout.split()


@pytest.mark.cluster
def test_venv_python_imports_torch_over_ssh(cluster: Cluster) -> None:
    code = "import socket, torch; print(socket.gethostname(), torch.__version__)"
    result = cluster.ssh(
        3, f"{shlex.quote(str(repo_python()))} -c {shlex.quote(code)}", timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "node3"


@pytest.mark.cluster
def test_partition_cuts_host_off_until_healed(cluster: Cluster) -> None:
    cluster.partition(3)
    assert not sshd_accepts(f"{SUBNET}.13", timeout=1)
    assert cluster.ssh(2, "true").returncode == 0  # the others stay reachable

    cluster.heal(3)
    wait_for(lambda: sshd_accepts(f"{SUBNET}.13"), what="node3 to accept again")


@pytest.mark.cluster
def test_crash_kills_every_process_of_the_host_and_restart_boots_it(cluster: Cluster) -> None:
    start_background(cluster, 2, "sleep 4343")
    wait_for(lambda: machine_pids_running("sleep 4343") != [], what="sleep 4343 to start")

    cluster.crash(2)

    assert machine_pids_running("sleep 4343") == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((f"{SUBNET}.12", 22), timeout=2)
    assert cluster.ssh(2, "true").returncode == 255
    cluster.restart(2)
    assert cluster.ssh(2, "hostname").stdout.strip() == "node2"


@pytest.mark.cluster
def test_stop_after_a_crash_leaves_nothing_behind(cluster: Cluster) -> None:
    cluster.crash(1)
    pids = [host.process.pid for host in cluster.hosts if host.process is not None]
    pids += [host.init_pid for host in cluster.hosts if host.init_pid is not None]
    workdir = cluster.workdir
    assert workdir is not None and len(pids) == 2 * len(cluster.hosts) - 1

    cluster.stop()

    assert orch_namespaces() == []
    assert orch_links() == []
    assert not workdir.exists()
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    cluster.start()  # the rest of the session still needs its cluster
    assert sorted(orch_namespaces()) == [f"{NETNS_PREFIX}{i}" for i in (1, 2, 3)]


@pytest.mark.cluster
def test_second_cluster_waits_for_the_machine_instead_of_tearing_down_the_first(
    cluster: Cluster,
) -> None:
    with pytest.raises(ClusterError, match="another test cluster"):
        Cluster(1).start(lock_timeout=0)

    assert cluster.ssh(1, "hostname").stdout.strip() == "node1"


@pytest.mark.cluster
def test_inventory_and_env_point_orch_at_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    path = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, "node3"], node3={"slots": 2})

    doc = yaml.safe_load(path.read_text())
    assert doc["defaults"] == {
        "user": "root",
        "identity_file": str(cluster.client_key),
        "python": str(repo_python()),
    }
    assert doc["hosts"] == [
        {"name": "node1", "address": f"{SUBNET}.11"},
        {"name": "node3", "address": f"{SUBNET}.13", "slots": 2},
    ]
    env = cluster.env(inventory=path)
    assert env["ORCH_INVENTORY"] == str(path)
    assert Path(env["HOME"]).is_dir() and Path(env["ORCH_HOME"]).is_dir()
    assert f"{SUBNET}.11 ssh-ed25519 " in Path(env["ORCH_KNOWN_HOSTS"]).read_text()


def root_has(cluster: Cluster, i: int, name: str) -> str | None:
    """The text of ``name`` in ``/root`` as host ``i`` itself sees it, or None if absent."""
    result = cluster.exec_on(i, ["cat", str(ROOT_HOME / name)])
    return result.stdout if result.returncode == 0 else None


@pytest.mark.cluster
def test_hosts_sharing_a_home_see_each_others_files_while_a_third_keeps_its_own(
    cluster: Cluster,
) -> None:
    (cluster.home(1) / "own-marker").write_text("node1's own\n")
    private = {i: cluster.home(i) for i in (1, 2, 3)}
    start_background(cluster, 1, "sleep 4646")  # from before: lives on (a warm interpreter)
    wait_for(lambda: machine_pids_running("sleep 4646") != [], what="sleep 4646 to start")
    before = machine_pids_running("sleep 4646")

    with cluster.shared_home([1, 2]) as home:
        start_background(cluster, 1, "sleep 4747")  # born inside: gone with the block
        wait_for(lambda: machine_pids_running("sleep 4747") != [], what="sleep 4747 to start")
        written = cluster.exec_on(1, ["sh", "-c", f"echo from-node1 > {ROOT_HOME}/shared-marker"])
        assert written.returncode == 0, written.stderr
        assert root_has(cluster, 2, "shared-marker") == "from-node1\n"
        assert cluster.ssh(2, "cat ~/shared-marker").stdout == "from-node1\n"
        assert root_has(cluster, 3, "shared-marker") is None
        assert root_has(cluster, 1, "own-marker") is None
        assert cluster.home(1) == cluster.home(2) == home
        assert cluster.home(3) == private[3]
        assert (home / "shared-marker").read_text() == "from-node1\n"
        # What hides under a home (the venv, the repository) is bound back into this one too.
        python = cluster.ssh(2, f"{shlex.quote(str(repo_python()))} -c 'import yaml'")
        assert python.returncode == 0, python.stderr
        with pytest.raises(ClusterError, match="node2 already share"), cluster.shared_home([2, 3]):
            pass

    assert not home.exists()
    assert {i: cluster.home(i) for i in (1, 2, 3)} == private
    assert root_has(cluster, 1, "shared-marker") is None
    assert root_has(cluster, 2, "shared-marker") is None
    assert root_has(cluster, 1, "own-marker") == "node1's own\n"
    assert cluster.ssh(1, "cat ~/own-marker").stdout == "node1's own\n"  # a new login too
    (cluster.home(1) / "own-marker").unlink()
    assert machine_pids_running("sleep 4747") == []
    assert machine_pids_running("sleep 4646") == before  # the host did not reboot
    for pid in before:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.cluster
def test_extra_host_answers_ssh_and_is_gone_after_the_block(cluster: Cluster) -> None:
    hosts_before = list(cluster.hosts)
    controller_before = cluster.new_controller()

    with cluster.extra_hosts(1) as (node4,):
        assert (node4.name, node4.address) == ("node4", f"{SUBNET}.14")
        assert cluster.ssh(4, "hostname").stdout.strip() == "node4"
        reach = f"import socket; socket.create_connection(('{SUBNET}.11', 22), timeout=3).close()"
        reached = cluster.exec_on(4, [sys.executable, "-I", "-S", "-c", reach])
        assert reached.returncode == 0, reached.stderr  # through the bridge, like the others
        start_background(cluster, 4, "sleep 4545")
        wait_for(lambda: machine_pids_running("sleep 4545") != [], what="sleep 4545 to start")
        trusted = cluster.new_controller().known_hosts.read_text()
        assert node4.known_hosts_line() in trusted
        assert f"{SUBNET}.14 " not in controller_before.known_hosts.read_text()
        assert node4.process is not None and node4.init_pid is not None
        pids = [node4.process.pid, node4.init_pid]

    assert cluster.hosts == hosts_before
    assert f"{NETNS_PREFIX}4" not in orch_namespaces()
    assert not {f"{VETH_PREFIX}4", f"{PEER_PREFIX}4"} & set(orch_links())
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert machine_pids_running("sleep 4545") == []
    assert not sshd_accepts(f"{SUBNET}.14", timeout=1)
    assert not node4.workdir.exists()
    assert f"{SUBNET}.14 " not in Path(cluster.env()["ORCH_KNOWN_HOSTS"]).read_text()


@pytest.mark.cluster
def test_extra_host_plugged_in_again_answers_at_once(cluster: Cluster) -> None:
    # The machine's ARP cache still holds the first node4 when the second one comes up.
    for _ in range(2):
        with cluster.extra_hosts(1):
            assert cluster.ssh(4, "hostname").stdout.strip() == "node4"
            assert cluster.ssh(1, "hostname").stdout.strip() == "node1"


@pytest.mark.cluster
def test_stop_inside_shared_home_and_extra_hosts_still_removes_everything(
    cluster: Cluster,
) -> None:
    with cluster.extra_hosts(1), cluster.shared_home([3, 4]) as home:
        pids = [host.init_pid for host in cluster.hosts if host.init_pid is not None]
        assert len(pids) == 4

        cluster.stop()

        assert orch_namespaces() == []
        assert orch_links() == []
        assert not home.exists()
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
        cluster.start()  # the rest of the session still needs its cluster

    assert sorted(orch_namespaces()) == [f"{NETNS_PREFIX}{i}" for i in (1, 2, 3)]
    assert cluster.home(3) == cluster.host(3).private_home
    assert cluster.ssh(3, "hostname").stdout.strip() == "node3"


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_unavailable_cluster_skips_locally_but_fails_in_ci(
    ci: str, outcome: type[BaseException]
) -> None:
    with pytest.raises(outcome, match="no sshd"):
        skip_or_fail("no sshd", environ={"CI": ci})


@pytest.mark.parametrize("n_hosts", [3, 16, 32, MAX_HOSTS])
def test_arp_table_limits_hold_a_full_mesh_of_every_host_and_never_shrink(n_hosts: int) -> None:
    defaults = {"gc_thresh2": 512, "gc_thresh3": 1024}  # the kernel's

    limits = _neighbour_limits(n_hosts, defaults)

    mesh = (n_hosts + 1) ** 2  # every host's entry for every other, and this machine's
    assert limits["gc_thresh3"] >= mesh and limits["gc_thresh2"] >= mesh
    assert limits["gc_thresh2"] <= limits["gc_thresh3"]
    assert all(limits[name] >= value for name, value in defaults.items())
    if n_hosts <= 8:  # the test suite's clusters leave the machine's settings alone
        assert limits == defaults
    assert _neighbour_limits(n_hosts, {"gc_thresh2": 10**6, "gc_thresh3": 10**6}) == {
        "gc_thresh2": 10**6,
        "gc_thresh3": 10**6,
    }
