"""`wheels: download` and wheels from outside the workdir (sync/wheels.py): the tags a
host's python accepts, the download's argv and cache, a real download from an index
served on loopback, and the tree that carries the wheels beside the code."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

import pytest

from orchestrator.agent.host.probe import wheel_tags
from orchestrator.models.environment import CARRIED_WHEELS, Environment, WheelTarget
from orchestrator.models.errors import InfraError, InputError
from orchestrator.sync import wheels
from orchestrator.sync.manifest import graft, scan
from orchestrator.sync.wire import encode_piece, pieces
from tests.index import serve_index
from tests.unit.conftest import Orch, WriteFile
from tests.wheels import tiny_wheel

X86 = WheelTarget("cp", "3.11", "cp311", "linux_x86_64", "2.36")


def here() -> WheelTarget:
    """This python's target, as the probe says it on a host."""
    t = wheel_tags()
    return WheelTarget(t.implementation, t.python_version, t.abi, t.platform, t.glibc)


def test_platforms_run_from_the_hosts_glibc_down_with_the_legacy_names_among_them() -> None:
    found = X86.platforms()
    assert found[:2] == ("linux_x86_64", "manylinux_2_36_x86_64")
    assert found[-1] == "manylinux1_x86_64"
    order = [found.index(n) for n in ("manylinux2014_x86_64", "manylinux2010_x86_64")]
    assert order == sorted(order) and "manylinux1_x86_64" in found
    assert found.index("manylinux2014_x86_64") == found.index("manylinux_2_17_x86_64") + 1
    arm = WheelTarget("cp", "3.12", "cp312", "linux_aarch64", "2.31").platforms()
    assert arm[0] == "linux_aarch64"
    assert arm[-2:] == ("manylinux_2_17_aarch64", "manylinux2014_aarch64")
    assert not any("manylinux1" in p or "manylinux_2_16" in p for p in arm)
    musl = WheelTarget("cp", "3.12", "cp312", "linux_x86_64", None)
    assert musl.platforms() == ("linux_x86_64",)
    mac = WheelTarget("cp", "3.12", "cp312", "macosx_14_0_arm64")
    assert mac.platforms() == ("macosx_14_0_arm64",)


def test_this_pythons_tags_are_ones_packaging_accepts_for_it() -> None:
    tags = pytest.importorskip("packaging.tags")
    accepted = list(tags.sys_tags())
    target = here()
    assert (f"{target.implementation}{target.python_version.replace('.', '')}", target.abi) == (
        accepted[0].interpreter,
        accepted[0].abi,
    )
    platforms = [p for p in dict.fromkeys(t.platform for t in accepted) if p != "any"]
    assert list(target.platforms()) == platforms


def test_the_cache_is_named_by_requirements_target_and_index_settings() -> None:
    base = wheels.cache_key(["a==1"], X86, {"PIP_INDEX_URL": "https://u:t1@idx/simple"})
    assert base == wheels.cache_key(["a==1"], X86, {"PIP_INDEX_URL": "https://u:t1@idx/simple"})
    assert base != wheels.cache_key(["a==2"], X86, {"PIP_INDEX_URL": "https://u:t1@idx/simple"})
    other = WheelTarget("cp", "3.12", "cp312", "linux_x86_64", "2.36")
    assert base != wheels.cache_key(["a==1"], other, {"PIP_INDEX_URL": "https://u:t1@idx/simple"})
    assert base != wheels.cache_key(["a==1"], X86, {"PIP_INDEX_URL": "https://u:t2@idx/simple"})
    assert wheels.index_settings({"PIP_INDEX_URL": "x", "HOME": "/h", "PIP_FIND_LINKS": ""}) == {
        "PIP_INDEX_URL": "x"
    }


def test_the_download_argv_holds_the_targets_tags_and_no_index() -> None:
    argv = wheels.download_argv("/py", X86, "/dest", "/reqs.txt")
    assert argv[:4] == ["/py", "-m", "pip", "download"]
    assert "--only-binary=:all:" in argv and argv[-2:] == ["-r", "/reqs.txt"]
    pairs = list(itertools.pairwise(argv))
    assert ("--python-version", "3.11") in pairs and ("--abi", "cp311") in pairs
    assert ("--implementation", "cp") in pairs
    assert [b for a, b in pairs if a == "--platform"] == list(X86.platforms())
    assert not any("://" in a or "index" in a for a in argv)
    odd = WheelTarget("cp", "3.11", "cp311", "--index-url=http://evil", "2.36")
    with pytest.raises(InfraError, match="wheel tag"):
        wheels.download_argv("/py", odd, "/dest", "/reqs.txt")


@pytest.fixture
def index_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Wheels in tmp/made: orchdep, orchtop (needs orchdep), orchplat (this python's
    manylinux_2_17 only), orchwin (Windows only); pip reads nothing but the index."""
    made = tmp_path / "made"
    tiny_wheel(made, "orchdep", "1.0")
    tiny_wheel(made, "orchtop", "1.0", ["orchdep>=1"])
    target = here()
    for name, platform in (
        ("orchplat", f"manylinux_2_17_{target.platform[6:]}"),
        ("orchwin", "win_amd64"),
    ):
        tiny_wheel(made, name, "1.0")
        (made / f"{name}-1.0-py3-none-any.whl").rename(
            made / f"{name}-1.0-{target.abi}-{target.abi}-{platform}.whl"
        )
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing"))
    (tmp_path / "nothing").mkdir()
    return made


def test_a_download_resolves_dependencies_for_the_target_once_and_keeps_it_owner_only(
    index_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Environment(("orchtop==1.0", "orchplat"), "job.yaml", CARRIED_WHEELS, download=True)
    said: list[str] = []
    with serve_index(index_env, tmp_path / "index", "orch:s3cret") as index:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        got = wheels.download(env, here(), ["node1"], said.append, cache=tmp_path / "cache")
        assert sorted(p.name.split("-")[0] for p in got.iterdir()) == [
            "orchdep",
            "orchplat",
            "orchtop",
        ]
        asked = len(index.asked)
        again = wheels.download(env, here(), ["node1"], said.append, cache=tmp_path / "cache")
        assert again == got and len(index.asked) == asked  # the cache: nothing asked
    assert said == [f"wheels: downloading for node1 ({here().describe()})"]
    cache = tmp_path / "cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(got.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in got.iterdir())
    assert [p.name for p in cache.iterdir()] == [got.name]  # no temporary left


def test_a_requirement_with_no_wheel_for_the_hosts_is_named_and_nothing_is_cached(
    index_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Environment(("orchtop", "orchwin"), "job.yaml", CARRIED_WHEELS, download=True)
    with serve_index(index_env, tmp_path / "index") as index:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        with pytest.raises(InfraError) as raised:
            wheels.download(env, here(), ["node1", "node2"], cache=tmp_path / "cache")
    message = raised.value.message
    assert message.startswith("environment: cannot download orchwin for node1, node2 (")
    assert raised.value.exit_code == 3
    assert list((tmp_path / "cache").iterdir()) == []


def test_carried_wheels_are_grafted_beside_the_code_and_read_from_where_they_are(
    tmp_path: Path,
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    outside = tiny_wheel(tmp_path / "outside", "orchdep", "2.0")
    (outside / "notes.txt").write_text("not a wheel\n")
    tree = scan(code, ["train.py"], cache_dir=tmp_path / "stat")
    files = wheels._wheel_files([outside])
    grown = graft(tree, CARRIED_WHEELS, files)
    assert [e.path for e in grown.entries] == [
        f"{CARRIED_WHEELS}/orchdep-2.0-py3-none-any.whl",
        "train.py",
    ]
    assert grown.digest != tree.digest
    entry = grown.entries[0]
    source = grown.source(entry.path)
    assert source == str(outside / "orchdep-2.0-py3-none-any.whl")
    # The push reads it from there: root / an absolute path is that path.
    piece = pieces(entry.value, source, entry.size)[0]
    assert encode_piece(grown.root, piece)
    (code / CARRIED_WHEELS).mkdir()
    (code / CARRIED_WHEELS / "mine.whl").write_text("x")
    taken = scan(code, ["train.py", f"{CARRIED_WHEELS}/mine.whl"], cache_dir=tmp_path / "stat")
    with pytest.raises(InputError, match="where orch puts the wheels it carries"):
        graft(taken, CARRIED_WHEELS, files)


def test_the_probe_says_what_wheels_its_python_installs_when_asked(tmp_path: Path) -> None:
    """The agent's probe, run here as a host runs it; the controller's facts from it."""
    import json
    import subprocess
    import sys
    import time

    from orchestrator.agent.kernel.host_wire import ProbeFacts
    from orchestrator.agent.kernel.messages import parse_message
    from orchestrator.agent.kernel.requests import ProbeOptions
    from orchestrator.nodes import agent
    from orchestrator.nodes.probe import facts_from_probe

    def probe(options: ProbeOptions) -> ProbeFacts:
        loader = [sys.executable, "-c", agent.LOADER]
        where = [str(len(agent.packed())), agent.version(), str(tmp_path / "agent")]
        result = subprocess.run(
            [*loader, *where, "probe", options.to_json()],
            input=agent.packed(),
            capture_output=True,
            check=True,
        )
        out = result.stdout.decode().strip().splitlines()[-1]
        return parse_message(ProbeFacts, json.loads(out))

    asked = probe(ProbeOptions(gpus=False, target=True))
    assert asked.target is not None
    assert facts_from_probe(asked, time.time()).wheel_target == here()
    assert probe(ProbeOptions(gpus=False)).target is None  # not asked: not read


def test_dry_run_says_the_controller_downloads_the_wheels(
    orch: Orch, write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    job = write(
        "job.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\nwheels: download\n"
    )
    run = orch("submit", job, "--dry-run")
    assert run.returncode == 0, run
    assert (
        "environment of job.yaml (tqdm, installed with no index from wheels this machine "
        "downloads for the hosts' platform and Python)" in run.stdout.replace(str(job), "job.yaml")
    )
    via_flag = write("plain.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\n")
    run = orch("submit", via_flag, "--wheels", "download", "--dry-run")
    assert run.returncode == 0 and "downloads for the hosts'" in run.stdout, run


def test_wheels_download_on_a_slurm_cluster_is_taken_and_its_dry_run_asks_no_host(
    orch: Orch, write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    inventory = write("hpc.yaml", "slurm:\n  login: login1.hpc.example.edu\n  partition: gpu\n")
    job = write(
        "job.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\nwheels: download\n"
    )
    run = orch("submit", job, "-i", inventory, "--dry-run")
    assert run.returncode == 0, run
    assert "sbatch" in run.stdout and "Traceback" not in run.stderr


def test_wheels_that_are_not_a_directory_are_bad_input_naming_the_key(
    orch: Orch, write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    job = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\nwheels: gone\n")
    run = orch("submit", job, "--dry-run")
    assert run.returncode == 2, run
    assert f"error: {job}:4:9: wheels: gone is not a directory" in run.stderr
    assert "hint: give a directory of wheels" in run.stderr and "Traceback" not in run.stderr
    plain = write("plain.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\n")
    run = orch("submit", plain, "--wheels", "gone", "--dry-run")
    assert run.returncode == 2 and "error: --wheels gone is not a directory" in run.stderr, run


def test_a_build_that_reached_no_index_says_so_and_points_at_wheels_download() -> None:
    from orchestrator.agent.kernel.replies import EnvReady
    from orchestrator.nodes.envs import failure

    offline = EnvReady(
        error="installing failed",
        missing=["tqdm"],
        tail=[
            "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
            "status=None)) after connection broken by 'NewConnectionError('<pip._vendor."
            "urllib3.connection.HTTPSConnection object>: Failed to establish a new "
            "connection: [Errno 101] Network is unreachable')': /simple/tqdm/",
            "ERROR: Could not find a version that satisfies the requirement tqdm",
            "ERROR: No matching distribution found for tqdm",
        ],
    )
    online = EnvReady(
        error="installing failed",
        missing=["tqdm"],
        tail=["ERROR: No matching distribution found for tqdm"],
    )
    env = Environment(("tqdm",), "job.yaml")
    cut = failure(env, {"node3": offline})
    assert cut.message.startswith("environment: node3 cannot reach the package index")
    assert "Network is unreachable" in cut.message and "wheels: download" in cut.hint
    assert failure(env, {"node3": online}).message.startswith(
        "environment: cannot install tqdm on node3"
    )
    # From wheels, no index is asked: a missing package is the requirement's fault.
    carried = Environment(("tqdm",), "job.yaml", "wheels")
    assert "cannot install tqdm" in failure(carried, {"node3": offline}).message
