"""The login node's file work and the launcher's pieces, run for real with /bin/sh and
this interpreter (a LocalTransport): the files' modes, the nodes' directories, the
rendezvous port handed from node rank 0 to the others, how a job's end is judged."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.kernel.replies import ExitRecord
from orchestrator.agent.node import srun
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.reporting.follow import NodeExit
from orchestrator.slurm.follow import _first_failure
from orchestrator.slurm.login import LoginNode
from orchestrator.transport.local import LocalTransport


@pytest.fixture(autouse=True)
def _lax_umask() -> Iterator[None]:
    """A login shell's usual umask: the owner-only modes must not come from this one."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def login_in(tmp_path: Path) -> LoginNode:
    host = Host(name="login", address="localhost", python=sys.executable, workdir=str(tmp_path))
    return LoginNode(host, LocalTransport("login"))


def test_files_land_with_their_modes_in_new_owner_only_directories(tmp_path: Path) -> None:
    login = login_in(tmp_path)
    root = tmp_path / "jobs" / "j1"
    login.write_files(
        {
            f"{root}/slurm/batch.sh": ("#!/bin/sh\necho hi\n", 0o700),
            f"{root}/slurm/spec.json": ('{"TOKEN": "s3cret"}', 0o600),
        }
    )
    assert (root / "slurm" / "batch.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((root / "slurm" / "spec.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "slurm" / "batch.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "slurm").stat().st_mode) == 0o700


def test_node_directories_link_to_the_jobs_code_and_agent_and_keep_a_launchers_spec(
    tmp_path: Path,
) -> None:
    login = login_in(tmp_path)
    root = tmp_path / "jobs" / "j1"
    (root / "code").mkdir(parents=True)
    login.prepare_node_dirs(str(root), ["node2", "code"])
    assert os.readlink(root / "node2" / "code") == "../code"
    assert os.readlink(root / "node2" / "agent") == "../agent"
    assert (root / "node2" / "logs").is_dir() and (root / "node-code" / "node.json").exists()
    assert stat.S_IMODE((root / "node2").stat().st_mode) == 0o700  # whatever umask the login has
    assert stat.S_IMODE((root / "node2" / "node.json").stat().st_mode) == 0o600
    (root / "node2" / "node.json").write_text('{"argv": ["torchrun"]}')
    login.prepare_node_dirs(str(root), ["node2"])  # again: the launcher's spec stays
    assert json.loads((root / "node2" / "node.json").read_text()) == {"argv": ["torchrun"]}


def test_node_rank_0_hands_its_free_port_to_the_others_through_the_shared_home(
    tmp_path: Path,
) -> None:
    (tmp_path / "slurm").mkdir()
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(srun.rendezvous_port(str(tmp_path), "7", 1, "127.0.0.1"))
    )
    waiter.start()
    port = srun.rendezvous_port(str(tmp_path), "7", 0, "127.0.0.1")
    waiter.join(10)
    assert got == [port] and 1024 < port < 65536
    record = json.loads((tmp_path / "slurm" / "rdzv-7.json").read_text())
    assert record == {"port": port, "master_addr": "127.0.0.1"}


def test_the_route_to_this_machine_itself_leaves_by_the_interface_that_holds_it() -> None:
    address, iface = srun.route_to("127.0.0.1")
    assert address == "127.0.0.1"
    assert iface in ("lo", None)  # None only where the ip tool is missing


def test_the_first_failure_is_a_nodes_own_exit_code_before_one_slurms_kill_gave() -> None:
    killed_first = NodeExit(
        "node2", 0, ExitRecord(returncode=-9, ended=100.0, error="stopped by Slurm")
    )
    own = NodeExit("node4", 2, ExitRecord(returncode=1, ended=101.0))
    later = NodeExit("node3", 1, ExitRecord(returncode=1, ended=102.0))
    first = _first_failure([killed_first, later, own])
    assert first is own
    assert _first_failure([killed_first]) is killed_first
    assert _first_failure([]) is None


def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lacking: str = "") -> Path:
    """Slurm's commands as scripts on PATH: sinfo lists one partition, sbatch queues
    job 42 and leaves the batch script it was given where a test can see it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sinfo": "echo 'debug*|3|up|idle'",
        "sbatch": f'cp "$2" {tmp_path}/queued.sh && echo "42;orchtest"',
        "srun": "true",
        "squeue": "true",
        "scancel": "true",
    }
    for name, body in scripts.items():
        if name != lacking:
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_one_round_trip_checks_slurms_commands_and_lists_the_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_slurm(tmp_path, monkeypatch)
    parts = login_in(tmp_path).survey()
    assert list(parts) == ["debug"] and parts["debug"].nodes == 3 and parts["debug"].default
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    bin_dir = _fake_slurm(lacking, monkeypatch, lacking="srun")
    monkeypatch.setenv("PATH", str(bin_dir))  # this machine may have Slurm's own
    with pytest.raises(HostError, match=r"no srun on the Slurm login node login"):
        login_in(tmp_path).survey()


def test_the_batch_files_are_written_then_sbatch_queues_them_in_one_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_slurm(tmp_path, monkeypatch)
    root = tmp_path / "jobs" / "j1"
    batch = {f"{root}/slurm/batch.sh": ("#!/bin/sh\necho hi\n", 0o700)}
    slurm_id = login_in(tmp_path).write_and_sbatch(
        batch, f"sbatch --parsable {root}/slurm/batch.sh"
    )
    assert slurm_id == "42"
    assert (tmp_path / "queued.sh").read_text() == "#!/bin/sh\necho hi\n"  # written first
    (tmp_path / "queued.sh").unlink()
    (tmp_path / "afile").write_text("")  # a file where the batch script's directory goes
    blocked = {f"{tmp_path}/afile/batch.sh": ("#!/bin/sh\n", 0o700)}
    with pytest.raises(RemoteCommandError, match="writing the batch script"):
        login_in(tmp_path).write_and_sbatch(blocked, f"sbatch --parsable {root}/slurm/batch.sh")
    assert not (tmp_path / "queued.sh").exists()  # nothing was queued
