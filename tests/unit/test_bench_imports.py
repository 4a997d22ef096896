"""bench/ stays off the test suite's internals: of ``tests`` it imports only the public
surface of the test cluster, the names in ``tests.cluster.__all__`` (read with ast,
nothing run), so that the harness's rooms can change without breaking a benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_INIT = ROOT / "tests" / "cluster" / "__init__.py"


def public_names() -> set[str]:
    """The names listed in ``tests/cluster/__init__.py``'s ``__all__``."""
    for node in ast.parse(CLUSTER_INIT.read_text(), str(CLUSTER_INIT)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{CLUSTER_INIT} has no __all__")


def imports_of_tests(source: str, filename: str = "<bench>") -> tuple[set[str], list[str]]:
    """What ``source`` imports of ``tests``: the public names it takes from
    ``tests.cluster``, and every other import of ``tests`` (a module, or a name that is
    not public), spelled as in the code."""
    public = public_names()
    used: set[str] = set()
    off: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            off += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "tests":
                continue
            for alias in node.names:
                if node.module == "tests.cluster" and alias.name in public:
                    used.add(alias.name)
                else:
                    off.append(f"from {node.module} import {alias.name}")
    return used, off


def test_bench_imports_only_the_public_surface_of_the_test_cluster() -> None:
    offenders = {}
    used: set[str] = set()
    for path in sorted((ROOT / "bench").glob("*.py")):
        names, off = imports_of_tests(path.read_text(), str(path))
        used |= names
        if off:
            offenders[path.name] = off
    assert offenders == {}
    assert {"Cluster", "SlurmCluster"} <= used  # the check sees bench's real imports


def test_the_check_flags_internals_and_other_test_modules() -> None:
    source = (
        "from tests.cluster import Cluster, _child_pid\n"
        "from tests.cluster.network import NET\n"
        "from tests.support import wait_for\n"
        "import tests.cluster.hosts\n"
        "from bench.common import ssh_argv\n"
    )
    used, off = imports_of_tests(source)
    assert used == {"Cluster"}
    assert off == [
        "from tests.cluster import _child_pid",
        "from tests.cluster.network import NET",
        "from tests.support import wait_for",
        "import tests.cluster.hosts",
    ]
