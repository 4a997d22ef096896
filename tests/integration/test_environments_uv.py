"""`environment:` built by uv where the host has it, by pip where it has not, in one job
(docs/ENVIRONMENTS.md, "Installer"): uv is found where its own installer puts it
(`~/.local/bin/uv`), which a non-interactive SSH session's PATH does not name."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import write_workdir_job
from tests.wheels import tiny_wheel

pytestmark = pytest.mark.cluster

SCRIPT = (
    "import importlib.util, os, socket\n"
    "from importlib.metadata import distribution\n"
    "cached = importlib.util.cache_from_source(importlib.util.find_spec('orchtiny').origin)\n"
    "before = os.path.exists(cached)\n"
    "import orchtiny\n"
    "installer = distribution('orchtiny').read_text('INSTALLER').strip()\n"
    "print('BY', socket.gethostname(), installer, orchtiny.VERSION, before,\n"
    "      os.path.exists(cached), flush=True)\n"
)


@pytest.fixture
def uv_on_node1(cluster: Cluster) -> Iterator[Path]:
    """node1 gets uv in `~/.local/bin` (the repository's, from the dev extra); node2 none."""
    uv = shutil.which("uv", path=str(Path(__file__).resolve().parents[2] / ".venv" / "bin"))
    if uv is None:
        pytest.fail("no uv in .venv/bin: make setup installs it (the dev extra)")
    place = cluster.home(1) / ".local" / "bin"
    place.mkdir(parents=True, exist_ok=True)
    link = place / "uv"
    link.symlink_to(uv)
    try:
        yield link
    finally:
        link.unlink()
        shutil.rmtree(cluster.home(1) / ".cache" / "uv", ignore_errors=True)


def test_uv_builds_where_the_host_has_it_and_pip_where_it_has_not(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path, uv_on_node1: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "by.py").write_text(SCRIPT)
    tiny_wheel(work / "wheels", "orchtiny", "7.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, 2])
    job = write_workdir_job(
        tmp_path,
        work,
        "by.py",
        launcher="python",
        nodes=2,
        environment=["orchtiny==7.0"],
        wheels=str(work / "wheels"),
    )
    ran = orch("submit", job, "-i", inventory, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # node1's packages were installed by uv, node2's by pip; neither compiled them at
    # install: the first import wrote the bytecode, into the environment, once.
    found = re.finditer(r"BY (\S+) (\S+) (\S+) (\S+) (\S+)", ran.stdout)
    by = {m[1]: m.groups()[1:] for m in found}
    assert by == {
        "node1": ("uv", "7.0", "False", "True"),
        "node2": ("pip", "7.0", "False", "True"),
    }, ran.stdout
    built = [line for line in ran.stderr.splitlines() if "environment: built on" in line]
    assert len(built) == 1, ran.stderr
    assert re.search(r"node1 \(uv, [\d.]+ s\)", built[0]), built[0]
    assert re.search(r"node2 \(pip, [\d.]+ s\)", built[0]), built[0]


SEES = (
    "import json, site, sys, yaml, orchtiny\n"
    "print('SEES', json.dumps({'path': sys.path, 'yaml': yaml.__file__}), flush=True)\n"
)


def test_an_environment_sees_the_host_pythons_packages_and_not_its_base_interpreters(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """The hosts' python is this repository's venv, which does not see its base
    interpreter's site-packages: nor does an environment over it."""
    import json
    import site
    import sys

    if sys.prefix == sys.base_prefix:
        pytest.skip("the hosts' python is no venv here")
    base_sites = set(site.getsitepackages([sys.base_prefix]))
    work = tmp_path / "work"
    work.mkdir()
    (work / "sees.py").write_text(SEES)
    tiny_wheel(work / "wheels", "orchtiny", "7.1")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[2])
    job = write_workdir_job(
        tmp_path,
        work,
        "sees.py",
        launcher="python",
        hosts=["node2"],
        environment=["orchtiny==7.1"],
        wheels=str(work / "wheels"),
    )
    ran = orch("submit", job, "-i", inventory, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    seen = json.loads(ran.stdout.split("SEES ", 1)[1].splitlines()[0])
    venv_sites = set(site.getsitepackages())
    assert venv_sites & set(seen["path"]), seen  # the host python's packages (yaml)
    assert seen["yaml"].startswith(tuple(venv_sites)), seen
    assert not base_sites & set(seen["path"]), seen  # not its base interpreter's
