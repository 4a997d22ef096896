"""A job's `environment:`: loading and its errors, its name (key), and the host's build
(agent/host/envs.py) run here on this machine's python with a wheel made in the test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.agent.host import envs
from orchestrator.agent.kernel.requests import EnvRequest
from orchestrator.models.environment import Environment, environment_digest
from orchestrator.models.job import load_job
from tests.unit.conftest import Orch, WriteFile, expect_input_error
from tests.wheels import tiny_wheel


@pytest.fixture
def code(tmp_path: Path) -> Path:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hello')\n")
    return workdir


def test_requirements_file_loads_without_comments(
    write: WriteFile, code: Path, tmp_path: Path
) -> None:
    (code / "requirements.txt").write_text(
        "# pinned\nnumpy==2.3.1  # fast\n\ntqdm>=4,<5\nfoo[bar]\n"
    )
    job = load_job(
        write("job.yaml", "workdir: code\nscript: train.py\nenvironment: requirements.txt\n")
    )
    assert job.environment == Environment(
        ("numpy==2.3.1", "tqdm>=4,<5", "foo[bar]"), "requirements.txt"
    )


def test_inline_list_and_wheels_load(write: WriteFile, code: Path) -> None:
    (code / "wheels").mkdir()
    job = load_job(
        write(
            "job.yaml",
            "workdir: code\nscript: train.py\nenvironment: [numpy==2.3.1, tqdm]\nwheels: code/wheels\n",
        )
    )
    assert job.environment is not None
    assert job.environment.requirements == ("numpy==2.3.1", "tqdm")
    assert job.environment.wheels == "wheels"


def test_missing_requirements_file_is_bad_input_at_its_key(write: WriteFile, code: Path) -> None:
    path = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: reqs.txt\n")
    error = expect_input_error(lambda: load_job(path))
    assert "job.yaml:3" in str(error)
    assert "reqs.txt not found" in str(error)


def test_unparsable_requirement_line_is_named_by_its_line(write: WriteFile, code: Path) -> None:
    (code / "requirements.txt").write_text("numpy\n\nnot a requirement!\n")
    path = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: requirements.txt\n")
    error = expect_input_error(lambda: load_job(path))
    assert "requirements.txt:3" in str(error)
    assert "not a requirement!" in str(error)


def test_pip_options_are_refused(write: WriteFile, code: Path) -> None:
    path = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: [--index-url=x]\n")
    assert "pip option" in str(expect_input_error(lambda: load_job(path)))


def test_wheels_outside_the_workdir_are_carried_and_download_is_a_value_of_its_own(
    write: WriteFile, code: Path, tmp_path: Path
) -> None:
    from orchestrator.models.environment import CARRIED_WHEELS

    (tmp_path / "elsewhere").mkdir()
    path = write(
        "job.yaml", "workdir: code\nscript: train.py\nenvironment: [a]\nwheels: elsewhere\n"
    )
    env = load_job(path).environment
    assert env == Environment(
        ("a",), str(path), CARRIED_WHEELS, wheels_dir=str(tmp_path / "elsewhere")
    )
    path = write(
        "job.yaml", "workdir: code\nscript: train.py\nenvironment: [a]\nwheels: download\n"
    )
    env = load_job(path).environment
    assert env is not None and env.download and env.wheels == CARRIED_WHEELS
    assert env.wheels_dir is None and env.wheels_said == "download"
    # ./download is the directory of that name.
    (code / "download").mkdir()
    path = write(
        "job.yaml",
        "workdir: code\nscript: train.py\nenvironment: [a]\nwheels: code/download\n",
    )
    assert load_job(path).environment == Environment(("a",), str(path), "download")
    path = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: [a]\nwheels: nope\n")
    error = str(expect_input_error(lambda: load_job(path)))
    assert "job.yaml:4" in error and "nope is not a directory" in error


def test_digest_follows_requirements_and_wheels() -> None:
    one = Environment(("a==1",), "x")
    assert environment_digest(one, {}) == environment_digest(Environment(("a==1",), "y"), {})
    assert environment_digest(one, {}) != environment_digest(Environment(("a==2",), "x"), {})
    assert environment_digest(one, {"a.whl": "1"}) != environment_digest(one, {"a.whl": "2"})


def test_env_key_differs_per_digest_and_is_stable() -> None:
    assert envs.env_key("a" * 64) == envs.env_key("a" * 64)
    assert envs.env_key("a" * 64) != envs.env_key("b" * 64)


def _tiny_wheel(tmp_path: Path, name: str, version: str) -> Path:
    """A wheel of a one-module package `name` (tests/wheels.py), where the job's code has its wheels."""
    return tiny_wheel(tmp_path / "code" / "wheels", name, version)


def _request(envs_dir: Path, requirements: list[str]) -> EnvRequest:
    digest = environment_digest(Environment(tuple(requirements), "t"), {})
    return EnvRequest(envs=str(envs_dir), digest=digest, requirements=requirements, wheels="wheels")


@pytest.mark.skipif(sys.platform != "linux", reason="venvs as the hosts have them")
def test_build_publishes_one_owner_only_env_reused_and_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_wheel(tmp_path, "orchtiny", "1.0")
    monkeypatch.chdir(tmp_path)  # the job directory: code/wheels is beside
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # pip, not a uv of this machine
    monkeypatch.setenv("HOME", str(tmp_path))  # nor one in ~/.local/bin
    envs_dir = tmp_path / "envs"
    request = _request(envs_dir, ["orchtiny==1.0"])
    replies: list[object] = []
    # Two builds of one environment at once: one builds, the other waits and uses it.
    threads = [
        threading.Thread(target=lambda: replies.append(envs.ensure(request))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    built = [r for r in replies if getattr(r, "built", False)]
    assert len(built) == 1, replies
    first = built[0]
    assert first.error is None
    python = str(first.python)
    assert {r.python for r in replies} == {python}
    out = subprocess.run(
        [python, "-c", "import orchtiny, pytest; print(orchtiny.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.0"  # its own package, and the host python's (pytest)
    assert os.stat(envs_dir).st_mode & 0o077 == 0
    assert [p.name for p in envs_dir.iterdir() if p.name.startswith(".build-")] == []
    again = envs.ensure(request)
    assert again.python == python and not again.built
    rows = envs.listing(str(envs_dir))
    assert [r.requirements for r in rows] == [["orchtiny==1.0"]]
    assert envs.collect(str(envs_dir), days=1.0) == []
    assert envs.collect(str(envs_dir), days=-1.0) == [rows[0].key]
    assert envs.listing(str(envs_dir)) == []


@pytest.mark.skipif(sys.platform != "linux", reason="venvs as the hosts have them")
def test_a_host_python_without_pip_gets_it_from_ensurepip_offline_and_builds(
    tmp_path: Path,
) -> None:
    """A host python with no pip (as Debian's python3 without python3-pip): the
    environment gets pip from ensurepip, which needs no index, then installs."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0
    _tiny_wheel(tmp_path, "orchtiny", "1.0")
    request = _request(tmp_path / "envs", ["orchtiny==1.0"])
    repo = str(Path(__file__).resolve().parents[2])
    agent = "import sys; sys.path.insert(0, sys.argv[1]); from orchestrator.agent import main; "
    agent += "sys.exit(main.main(sys.argv[2:]))"  # the agent's own `env ensure JOB_DIR`
    ran = subprocess.run(
        [python, "-I", "-S", "-c", agent, repo, "env", "ensure", str(tmp_path)],
        input=request.to_json(),
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # pip: no uv of this machine
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    ready = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "error" not in ready and ready["built"], ran.stdout + ran.stderr
    out = subprocess.run(
        [ready["python"], "-c", "import orchtiny, pip; print(orchtiny.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.0"


def test_unresolvable_requirement_names_it_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "code" / "wheels").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    envs_dir = tmp_path / "envs"
    reply = envs.ensure(_request(envs_dir, ["orch-no-such-package==9"]))
    assert reply.error is not None
    assert reply.missing == ["orch-no-such-package==9"]
    assert [p for p in envs_dir.iterdir() if not p.name.endswith(".lock")] == []
    assert json.loads(reply.to_json()).get("python") is None


def test_dry_run_with_an_unparsable_requirement_exits_2_naming_the_line(
    orch: Orch, write: WriteFile, code: Path
) -> None:
    (code / "requirements.txt").write_text("tqdm\nnumpy=2\n")
    job = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: requirements.txt\n")
    run = orch("submit", job, "--dry-run")
    assert run.returncode == 2, run
    assert f"error: {code / 'requirements.txt'}:2:1: not a requirement: 'numpy=2'" in run.stderr
    assert "hint: " in run.stderr and "Traceback" not in run.stderr


def test_wheels_option_replaces_the_jobs_a_directory_anywhere_or_download(
    write: WriteFile, code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.models.environment import CARRIED_WHEELS
    from orchestrator.models.errors import InputError
    from orchestrator.models.job import Overrides, with_overrides

    (code / "offline").mkdir()
    job = load_job(write("job.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\n"))
    over = with_overrides(job, Overrides(wheels=str(code / "offline")))
    assert over.environment == Environment(("tqdm",), job.path, "offline")
    outside = with_overrides(job, Overrides(wheels=str(tmp_path)))
    assert outside.environment == Environment(
        ("tqdm",), job.path, CARRIED_WHEELS, wheels_dir=str(tmp_path)
    )
    monkeypatch.chdir(code)  # relative to where orch runs, as a shell's path is
    assert with_overrides(job, Overrides(wheels="offline")).environment == over.environment
    downloaded = with_overrides(job, Overrides(wheels="download")).environment
    assert downloaded is not None and downloaded.download
    with pytest.raises(InputError, match="missing is not a directory"):
        with_overrides(job, Overrides(wheels="missing"))
    bare = load_job(write("bare.yaml", "workdir: code\nscript: train.py\n"))
    with pytest.raises(InputError, match="has no environment"):
        with_overrides(bare, Overrides(wheels=str(code / "offline")))


def test_setup_inputs_key_follows_only_the_named_files() -> None:
    from orchestrator.sync.store import setup_inputs_digest

    tree = [("train.py", "a"), ("requirements.txt", "b"), ("scripts/x.sh", "c")]
    key = setup_inputs_digest(tree, ["requirements.txt", "scripts/*.sh"])
    edited = [("train.py", "z"), ("requirements.txt", "b"), ("scripts/x.sh", "c")]
    assert setup_inputs_digest(edited, ["requirements.txt", "scripts/*.sh"]) == key
    changed = [("train.py", "a"), ("requirements.txt", "B"), ("scripts/x.sh", "c")]
    assert setup_inputs_digest(changed, ["requirements.txt", "scripts/*.sh"]) != key


def test_setup_inputs_without_setup_is_bad_input(write: WriteFile, code: Path) -> None:
    path = write("job.yaml", "workdir: code\nscript: train.py\nsetup_inputs: [a.txt]\n")
    error = expect_input_error(lambda: load_job(path))
    assert "job.yaml:3" in str(error) and "setup_inputs: without setup:" in str(error)


def test_a_killed_builds_leftovers_are_never_used_and_go_at_the_next_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_wheel(tmp_path, "orchtiny", "1.0")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    envs_dir = tmp_path / "envs"
    envs_dir.mkdir(mode=0o700)
    request = _request(envs_dir, ["orchtiny==1.0"])
    key = envs.env_key(request.digest)
    # What a build killed halfway leaves: its temporary directory, never published.
    half = envs_dir / f".build-{key}-killed"
    (half / "bin").mkdir(parents=True)
    assert envs.ready_python(str(envs_dir), request.digest) is None
    assert envs.listing(str(envs_dir)) == []
    reply = envs.ensure(request)
    assert reply.built and reply.error is None
    assert not half.exists()
    assert envs.ready_python(str(envs_dir), request.digest) == reply.python


def test_dry_run_says_the_environment_each_node_runs_in(
    orch: Orch, write: WriteFile, code: Path
) -> None:
    (code / "requirements.txt").write_text("tqdm\n")
    (code / "wheels").mkdir()
    job = write(
        "job.yaml",
        "workdir: code\nscript: train.py\nenvironment: requirements.txt\nwheels: code/wheels\n",
    )
    run = orch("submit", job, "--dry-run")
    assert run.returncode == 0, run
    assert (
        "runs each node in its host's environment of requirements.txt (tqdm, installed "
        "from wheels with no index), built where missing" in run.stdout
    )


def test_pyproject_dependencies_pinned_by_its_uv_lock(write: WriteFile, code: Path) -> None:
    (code / "pyproject.toml").write_text(
        '[project]\nname = "mine"\nversion = "0"\n'
        'dependencies = ["numpy", "Tqdm_Extra>=4", "rich ; python_version >= \'3.8\'"]\n'
    )
    (code / "uv.lock").write_text(
        'version = 1\n[[package]]\nname = "numpy"\nversion = "2.3.1"\n'
        '[[package]]\nname = "tqdm-extra"\nversion = "4.6"\n'
        '[[package]]\nname = "rich"\nversion = "13.0"\n'
    )
    job = load_job(
        write("job.yaml", "workdir: code\nscript: train.py\nenvironment: pyproject.toml\n")
    )
    assert job.environment is not None
    assert job.environment.requirements == (
        "numpy==2.3.1",
        "Tqdm_Extra>=4",  # its own specifier stands
        "rich==13.0 ; python_version >= '3.8'",
    )


def test_a_pyproject_without_dependencies_is_bad_input(write: WriteFile, code: Path) -> None:
    (code / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    path = write("job.yaml", "workdir: code\nscript: train.py\nenvironment: pyproject.toml\n")
    assert "no [project] dependencies list" in str(expect_input_error(lambda: load_job(path)))


def test_wheels_that_carry_no_wheel_are_refused_at_submit_before_any_host(
    orch: Orch, write: WriteFile, code: Path
) -> None:
    (code / "wheels").mkdir()
    (code / "wheels" / "README").write_text("put wheels here\n")
    job = write(
        "job.yaml", "workdir: code\nscript: train.py\nenvironment: [tqdm]\nwheels: code/wheels\n"
    )
    inventory = write("inv.yaml", "hosts:\n  - {name: far, address: 192.0.2.1}\n")
    run = orch("submit", job, "-i", inventory)
    assert run.returncode == 2, run
    assert "no .whl file in wheels travels with the code" in run.stderr
    assert "job " not in run.stdout and "Traceback" not in run.stderr


def test_every_way_a_node_starts_runs_the_environments_python() -> None:
    from orchestrator.agent.node import spawn

    argv = ["~/py/bin/python", "-m", "torch.distributed.run", "train.py"]
    for way in spawn.WAYS:
        start = spawn.plan(way, argv, {}, "/j", "/o", python="/e/bin/python")
        assert start.argv == ["/e/bin/python", *argv[1:]]
        assert start.command[0] == "/e/bin/python"
    plain = spawn.plan(spawn.COLD, argv, {}, "/j", "/o")
    assert plain.argv[0] == os.path.expanduser("~/py/bin/python")


def test_orch_env_on_a_slurm_cluster_asks_its_login_node_and_names_it_when_unreachable(
    orch: Orch, write: WriteFile
) -> None:
    with socket.socket() as gone:  # a port nothing listens on, for the login node's sshd
        gone.bind(("127.0.0.2", 0))
        port = gone.getsockname()[1]
    inventory = write("hpc.yaml", f"defaults: {{port: {port}}}\nslurm: {{login: 127.0.0.2}}\n")
    run = orch("env", "-i", inventory)
    assert run.returncode == 3, run
    assert "127.0.0.2" in run.stderr and "hint: " in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "not for the slurm backend" not in run.stderr


def test_the_probe_says_whether_a_package_index_answers_and_why_not() -> None:
    from orchestrator.agent.host.probe import index_reach

    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen(1)
        assert index_reach(f"http://127.0.0.1:{index.getsockname()[1]}/simple") == "ok"
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
    assert index_reach(f"http://127.0.0.1:{port}/simple") == "Connection refused"
    assert index_reach("ftp://mirror.example/simple") == "not an http(s) URL"


def test_check_asks_for_the_index_an_environment_would_be_built_from(write: WriteFile) -> None:
    from orchestrator.models.facts import HostFacts
    from orchestrator.models.inventory import Host
    from orchestrator.ssh.check.rules import host_problems
    from orchestrator.ssh.check.run import DEFAULT_INDEX, index_to_reach

    host = Host(name="node1", address="10.0.0.1")
    (write("w/x.py", "").parent / "wheels").mkdir()  # a wheel directory for the third job
    plain = load_job(write("a.yaml", "workdir: w\nscript: x.py\nenvironment: [tqdm]\n"))
    assert index_to_reach(host, plain) == DEFAULT_INDEX
    mirror = "https://user:secret@mirror.example/simple"
    own = load_job(
        write(
            "b.yaml",
            f"workdir: w\nscript: x.py\nenvironment: [tqdm]\nenv: {{PIP_INDEX_URL: '{mirror}'}}\n",
        )
    )
    assert index_to_reach(host, own) == mirror
    wheels = load_job(
        write("c.yaml", "workdir: w\nscript: x.py\nenvironment: [tqdm]\nwheels: w/wheels\n")
    )
    assert index_to_reach(host, wheels) is None
    assert index_to_reach(host, load_job(write("d.yaml", "workdir: w\nscript: x.py\n"))) is None
    downloaded = load_job(
        write("e.yaml", "workdir: w\nscript: x.py\nenvironment: [tqdm]\nwheels: download\n")
    )
    assert index_to_reach(host, downloaded) is None  # the hosts install with no index

    cut = host_problems(host, HostFacts(index=(mirror, "Connection refused")), {})
    assert [p.message for p in cut] == [
        "cannot reach the package index https://mirror.example/… (Connection refused): "
        "the job's environment cannot be built there (host node1)"
    ]
    assert "secret" not in cut[0].lines()[0] and "wheels: download" in cut[0].lines()[-1]
    assert host_problems(host, HostFacts(index=(mirror, "ok")), {}) == []


def test_only_the_index_s_origin_goes_to_the_hosts_probe() -> None:
    """The probe's options are in its argv, which every user of the host can read: a
    token in PIP_INDEX_URL stays on the laptop."""
    from orchestrator.nodes.probe import index_origin

    assert index_origin("https://user:secret@mirror.example:8443/simple?t=x") == (
        "https://mirror.example:8443/"
    )
    assert index_origin("https://pypi.org/simple") == "https://pypi.org/"
    assert index_origin("http://[fd00::1]:3141/root/pypi/") == "http://[fd00::1]:3141/"


def test_uv_is_found_on_path_else_where_its_installer_puts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert envs.find_uv() is None  # pip installs
    local = tmp_path / ".local" / "bin"
    local.mkdir(parents=True)
    (local / "uv").write_text("#!/bin/sh\n")
    assert envs.find_uv() is None, "not executable: not a uv"
    (local / "uv").chmod(0o755)
    assert envs.find_uv() == str(local / "uv")
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "uv").write_text("#!/bin/sh\n")
    (on_path / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    assert envs.find_uv() == str(on_path / "uv")


def test_an_environments_directory_another_user_owns_or_can_write_is_never_used(
    tmp_path: Path,
) -> None:
    envs_dir = tmp_path / "envs"
    envs_dir.mkdir(mode=0o700)
    request = _request(envs_dir, ["orchtiny==1.0"])
    envs_dir.chmod(0o777)  # anyone could put an environment there
    refused = envs.ensure(request)
    assert refused.error and "not this user's alone" in refused.error and refused.python is None
    envs_dir.chmod(0o700)
    if os.getuid() == 0:  # another user's directory: only root can make one here
        os.chown(envs_dir, 4011, 4011)
        other = envs.ensure(request)
        assert other.error and "not this user's alone" in other.error and other.python is None
        os.chown(envs_dir, 0, 0)
    assert list(envs_dir.iterdir()) == []  # nothing made or changed there


@pytest.mark.skipif(sys.platform != "linux", reason="venvs as the hosts have them")
def test_the_installer_gets_the_index_the_jobs_env_names_and_the_agents_own_env_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `orch check` asks the index of the job's env (PIP_INDEX_URL), the build
    installs from it: through the installer's environment, never an argv."""
    from tests.index import serve_index

    _tiny_wheel(tmp_path, "orchtiny", "3.0")
    made = tmp_path / "code" / "wheels"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # pip, not a uv of this machine
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # nor this machine's pip.conf
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    digest = environment_digest(Environment(("orchtiny==3.0",), None), {})
    with serve_index(made, tmp_path / "index") as index:
        bare = EnvRequest(
            envs=str(tmp_path / "envs"), digest=digest, requirements=["orchtiny==3.0"]
        )
        refused = envs.ensure(bare)  # the agent's own env names no index that has it
        assert refused.error and refused.python is None, refused
        told = EnvRequest(
            envs=str(tmp_path / "envs"),
            digest=digest,
            requirements=["orchtiny==3.0"],
            installer_env={"PIP_INDEX_URL": index.url},
        )
        built = envs.ensure(told)
    assert built.built and built.python and built.error is None, built
    assert any("orchtiny" in path for path in index.asked), index.asked
    ran = subprocess.run(
        [built.python, "-c", "import orchtiny; print(orchtiny.VERSION)"],
        capture_output=True,
        text=True,
    )
    assert ran.stdout.strip() == "3.0", ran.stderr
