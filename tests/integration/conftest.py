"""Fixtures for integration tests against the namespace test cluster (tests/cluster/)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import (
    Cluster,
    OrchRunner,
    SlurmCluster,
    require_cluster_support,
    skip_or_fail,
    slurm_unavailable_reason,
)

# The helpers the tests share check what they find with assert: show its values on
# failure, as pytest does inside a test module. Must run before anything imports them.
pytest.register_assert_rewrite("tests.support")

CLUSTER_SIZE = 3  # most tests need 2 or 3 hosts; one boot per session serves them all


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cluster: needs the test cluster of real sshd hosts (root, Linux namespaces); "
        "skipped where unavailable, except in CI (CI=true) where that fails",
    )
    config.addinivalue_line(
        "markers",
        "slurm(gpus_per_node=0): the module runs on a Slurm cluster of the session's hosts "
        "(the slurm fixture), its compute nodes declaring gpus_per_node count-only GPUs",
    )
    _children_get_default_signals()


# The integration modules whose tests take longest (a minute of outage, a stall watchdog's wait,
# warm interpreters importing torch), longest first. Workers take tests in collection
# order, and pytest-xdist puts the groups (the Slurm modules) before single tests: these
# go next, so that none starts last and holds the whole run up while the other workers
# sit idle, and the many short tests fill in the end.
LONGEST_FIRST = (
    "test_laptop_faults.py",
    "test_stack.py",
    "test_warm.py",
    "test_environments.py",
    "test_ui.py",
    "test_restarts.py",
    "test_failures.py",
    "test_detached_restarts.py",
    "test_shared_fs.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (LONGEST_FIRST), the rest in their order.

    Under `--dist loadgroup` (make test), a module marked `xdist_group` runs on one
    worker, which boots its Slurm cluster once. pytest-xdist marks the group in each
    test's id; where a pytest release no longer lets it, the groups would be spread
    over every worker in silence, each booting its own Slurm cluster: those fail."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:  # tests/unit has modules of the same names
        here = item.path.parent.name == "integration"
        return rank.get(item.path.name, len(rank)) if here else len(rank)

    items.sort(key=place)  # stable: keeps the rest in their order
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[UNGROUPED] = True


UNGROUPED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _grouped(request: pytest.FixtureRequest) -> None:
    if request.node.stash.get(UNGROUPED, False):
        pytest.fail(
            "pytest-xdist could not put this test in its xdist_group under --dist "
            "loadgroup with this pytest: install the versions pyproject.toml names"
        )


def _children_get_default_signals() -> None:
    """Run in the background (`cmd &`) or under `nohup`, pytest inherits SIGINT or SIGHUP
    ignored, and so would every `orch` it starts: the Ctrl-C and closed-terminal tests
    would then test nothing. A handler that does nothing keeps them ignored here, and
    is reset to the default in every child at exec."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, lambda *_: None)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The session's cluster of hosts node1..node3 (10.77.N.11..13, N the worker's network)."""
    require_cluster_support()
    with Cluster(CLUSTER_SIZE) as started:
        yield started


@pytest.fixture(autouse=True)
def _cluster_healthy(request: pytest.FixtureRequest) -> None:
    """Start every cluster test with all hosts up and connected.

    The cluster outlives tests, so one that crashes or partitions a host must not
    leave the next one a broken cluster.
    """
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").ensure_healthy()


@pytest.fixture
def orch(cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path) -> OrchRunner:
    """Run the real ``orch`` CLI: ``orch("submit", job, timeout=60) -> CompletedProcess``.

    Each test gets a fresh controller (HOME, ORCH_HOME, ORCH_KNOWN_HOSTS), so jobs
    recorded by one test never show in another's ``orch status``. In a module marked
    ``slurm`` it runs in the test's tmp_path (where ``orch-outputs/`` lands), made once
    the Slurm cluster is up: a controller trusts the hosts that exist when it is made,
    and the Slurm cluster adds one.
    """
    if request.node.get_closest_marker("slurm"):
        slurm: SlurmCluster = request.getfixturevalue("slurm")
        return OrchRunner(slurm.new_controller(), cwd=tmp_path)
    return OrchRunner(cluster.new_controller())


@pytest.fixture
def inventory(cluster: Cluster, tmp_path: Path) -> Path:
    """An inventory file listing every host of the cluster."""
    return cluster.write_inventory(tmp_path / "inventory.yaml")


@pytest.fixture(scope="module")
def slurm(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The session's hosts, four of them sharing one home, running Slurm for one module
    (tests/cluster/slurm.py): node1 the login node, node2..node4 the compute nodes, each
    with the GPUs the module's ``slurm`` marker names."""
    reason = slurm_unavailable_reason()
    if reason:
        skip_or_fail(reason)
    marker = request.node.get_closest_marker("slurm")
    gpus = marker.kwargs.get("gpus_per_node", 0) if marker else 0
    with SlurmCluster(cluster, compute_nodes=3, gpus_per_node=gpus) as started:
        yield started


@pytest.fixture
def hpc(slurm: SlurmCluster, tmp_path: Path) -> Path:
    """An inventory of the Slurm cluster: its login node, its partition."""
    return slurm.write_inventory(tmp_path / "hpc.yaml")
