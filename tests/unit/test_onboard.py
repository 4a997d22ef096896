"""The pure parts of `orch keys` and `orch init`: the authorized_keys script (run by a
real /bin/sh in a scratch home), public keys, a new key, hosts from the command line,
the search for a python, and the inventory written, read back by the project's loader."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import paramiko
import pytest
from typer.testing import CliRunner

from orchestrator.cli.app import app
from orchestrator.models.errors import HostError, InputError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host, load_inventory
from orchestrator.onboard.init import Found, Probed, list_command, parse_listing, places
from orchestrator.onboard.keys import (
    create_key,
    install_command,
    key_of,
    load_public_key,
    missing_keys,
    parse_public_key,
)
from orchestrator.onboard.render import render_inventory, scalar
from orchestrator.onboard.targets import hosts_from_words, split_words

KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMn7SY4wLo8vIB4juhGVLwyVwyV6h2Fk8GslvAA++TlT alice@laptop"
)
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB1bGAN/uvQAy5gqHz3DQy5BfGQfvbXm7J2qr6l3ZVnZ bob@desk"


def install(home: Path, key: str = KEY) -> list[str]:
    """Run the install command as a host would: /bin/sh, HOME=home, the key on stdin."""
    done = subprocess.run(
        ["/bin/sh", "-c", install_command()],
        input=key + "\n",
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_install_makes_ssh_dir_and_file_owner_only_and_adds_the_key_once(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    assert install(tmp_path) == ["added"]
    assert install(tmp_path) == ["present"]
    authorized = tmp_path / ".ssh" / "authorized_keys"
    assert authorized.read_text() == KEY + "\n"
    assert mode(tmp_path / ".ssh") == 0o700 and mode(authorized) == 0o600


def test_install_keeps_other_keys_ends_their_last_line_and_tightens_modes(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o755)
    ssh.chmod(0o755)
    authorized = ssh / "authorized_keys"
    authorized.write_text(f'from="10.0.0.1" {OTHER}')  # no final newline
    authorized.chmod(0o644)

    assert install(tmp_path) == ["added"]
    assert authorized.read_text() == f'from="10.0.0.1" {OTHER}\n{KEY}\n'
    assert mode(ssh) == 0o700 and mode(authorized) == 0o600


def test_install_finds_the_key_with_options_or_another_comment_but_not_commented_out(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o755)
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    blob = KEY.split()[1]
    (ssh / "authorized_keys").write_text(f"# ssh-ed25519 {blob} old\n")
    assert install(tmp_path) == ["added"]
    (ssh / "authorized_keys").write_text(f"restrict ssh-ed25519 {blob} elsewhere\n")
    assert install(tmp_path) == ["present"]


def test_install_says_when_sshd_would_refuse_a_writable_home(tmp_path: Path) -> None:
    tmp_path.chmod(0o775)
    assert install(tmp_path) == ["added", "home-writable"]


def test_install_refuses_an_empty_key_and_writes_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/sh", "-c", install_command()],
        input="\n",
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "no public key" in done.stderr
    assert not (tmp_path / ".ssh").exists()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----\n",
        "ssh-ed25519 not*base64\n",
        f"{KEY}\n{OTHER}\n",
        "hello world\n",
    ],
)
def test_a_file_that_is_not_one_public_key_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError, match=r"k\.pub: not an OpenSSH public key"):
        parse_public_key(text, "k.pub")


def test_a_public_key_reads_back_as_its_line() -> None:
    key = parse_public_key(f"\n{KEY}\n", "k.pub")
    assert (key.key_type, key.comment, key.line) == ("ssh-ed25519", "alice@laptop", KEY)


def test_a_new_key_is_owner_only_and_its_pub_matches_the_private_key(tmp_path: Path) -> None:
    private = tmp_path / "ssh" / "id_ed25519"
    public = create_key(private)
    assert mode(private.parent) == 0o700
    assert mode(private) == 0o600 and mode(private.with_name("id_ed25519.pub")) == 0o600
    assert load_public_key(private) == public
    loaded = paramiko.Ed25519Key.from_private_key_file(str(private))
    assert loaded.get_base64() == public.blob
    with pytest.raises(InputError, match="cannot create the key"):
        create_key(private)  # never over an existing key
    assert paramiko.Ed25519Key.from_private_key_file(str(private)).get_base64() == public.blob


def test_the_key_to_install_is_the_option_else_the_hosts_identity_else_the_usual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    plain = Host(name="a", address="a")
    named = Host(name="b", address="b", identity_file="~/keys/work")
    assert key_of(plain, None) == tmp_path / ".ssh" / "id_ed25519"
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("x")
    assert key_of(plain, None) == tmp_path / ".ssh" / "id_rsa"
    assert key_of(named, None) == tmp_path / "keys" / "work"
    assert key_of(named, Path("/k/other.pub")) == Path("/k/other")
    local = Host(name="l", address="localhost")
    assert missing_keys([plain, named, local], None) == [tmp_path / "keys" / "work"]


def test_hosts_from_the_command_line_are_aliases_or_named_addresses() -> None:
    words = split_words(["node1"], " gpu=10.0.0.5, node3 ,")
    hosts = hosts_from_words(words, user="alice")
    assert [(h.name, h.address, h.user) for h in hosts] == [
        ("node1", "node1", "alice"),
        ("gpu", "10.0.0.5", "alice"),
        ("node3", "node3", "alice"),
    ]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["a", "a"], "named twice"),
        (["=10.0.0.1"], "expected ALIAS or NAME=ADDRESS"),
        (["x="], "expected ALIAS or NAME=ADDRESS"),
        (["code=10.0.0.1"], "cannot name a host"),
        (["a/b"], "cannot name a host"),
    ],
)
def test_a_bad_host_word_is_an_input_error(words: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        hosts_from_words(words)


def test_the_python_search_lists_what_exists_in_order_with_globs_and_home(tmp_path: Path) -> None:
    def python(path: Path, executable: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755 if executable else 0o644)

    python(tmp_path / "venv" / "bin" / "python")
    python(tmp_path / "miniconda3" / "envs" / "b" / "bin" / "python")
    python(tmp_path / "miniconda3" / "envs" / "a" / "bin" / "python")
    python(tmp_path / "miniconda3" / "envs" / "c d" / "bin" / "python")
    python(tmp_path / ".venv" / "bin" / "python", executable=False)
    where = places(None, str(tmp_path / "venv" / "bin" / "python"))
    assert where[-1] == str(tmp_path / "venv" / "bin" / "python")
    done = subprocess.run(
        ["/bin/sh", "-c", list_command(where)],
        env={"HOME": str(tmp_path), "PATH": "/nonexistent"},
        capture_output=True,
        text=True,
        check=True,
    )
    cpus, found = parse_listing(done.stdout)
    envs = tmp_path / "miniconda3" / "envs"
    assert found == [
        f"{tmp_path}/venv/bin/python",
        f"{envs}/a/bin/python",
        f"{envs}/b/bin/python",
        f"{envs}/c d/bin/python",
    ]
    assert cpus is None or cpus >= 1
    assert places("/opt/x/python", None)[:2] == ["/opt/x/python", "python3"]


def facts(**kwargs: object) -> HostFacts:
    base: dict[str, object] = {
        "os": "Debian GNU/Linux 12",
        "python_version": "3.11.2",
        "torch_version": "2.13.0",
        "python_executable": "/opt/venv/bin/python",
    }
    return HostFacts(**{**base, **kwargs})  # type: ignore[arg-type]


def probed(name: str, address: str, **kwargs: object) -> Probed:
    python = str(kwargs.pop("python", "/opt/venv/bin/python"))
    cpus = int(str(kwargs.pop("cpus", 8)))
    host_facts = facts(python_executable=python, **kwargs)
    torch = python if host_facts.torch_version else None
    return Probed(Host(name=name, address=address), Found(cpus, host_facts, (python,), torch))


def written(tmp_path: Path, items: list[Probed], user: str | None = None) -> tuple[str, Path]:
    text = render_inventory(items, "orch init a b", "inventory/hosts.yaml", user)
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return text, path


def test_the_inventory_written_loads_with_gpus_slots_and_the_shared_python(tmp_path: Path) -> None:
    items = [
        probed("gpu1", "gpu1", gpu_count=8, gpu_names=("NVIDIA A100",) * 8, torch_cuda="12.4"),
        probed("cpu-box.lab", "10.0.0.7", cpus=2),
    ]
    text, path = written(tmp_path, items, user="alice")
    inventory = load_inventory(path)
    gpu1, cpu = inventory.hosts
    assert (gpu1.name, gpu1.address, gpu1.gpus, gpu1.slots) == ("gpu1", "gpu1", tuple(range(8)), 8)
    assert (cpu.name, cpu.address, cpu.gpus, cpu.slots) == ("cpu-box.lab", "10.0.0.7", (), 1)
    assert {h.python for h in inventory.hosts} == {"/opt/venv/bin/python"}
    assert {h.user for h in inventory.hosts} == {"alice"}
    assert (
        "# gpu1: Debian GNU/Linux 12, 8 CPUs, 8 GPUs (NVIDIA A100), torch 2.13.0 (CUDA 12.4)"
        in text
    )
    assert "# Next: orch check -i inventory/hosts.yaml" in text


def test_a_host_not_reached_is_a_comment_with_its_reason_and_others_keep_their_python(
    tmp_path: Path,
) -> None:
    error = HostError("gone", "connection refused by root@gone:22")
    items = [
        probed("a", "a", python="/a/bin/python"),
        Probed(Host(name="gone", address="gone"), error=error),
        probed("b", "b", python="/b/bin/python"),
        probed("c", "c", python="/usr/bin/python3", torch_version=None),
    ]
    text, path = written(tmp_path, items)
    inventory = load_inventory(path)
    assert inventory.names() == ["a", "b", "c"]
    assert [h.python for h in inventory.hosts] == [
        "/a/bin/python",
        "/b/bin/python",
        "/usr/bin/python3",
    ]
    assert "  # gone: not probed, so left out: connection refused by root@gone:22\n" in text
    assert "  # - name: gone\n  #   address: gone\n" in text
    assert "NO TORCH in any python found (/usr/bin/python3)" in text
    assert "list torch in the job's environment:" in text
    assert "\n  user:" not in text  # ~/.ssh/config's, unless --user


def test_odd_values_are_quoted_and_read_back_the_same(tmp_path: Path) -> None:
    items = [probed("yes", "10.0.0.1", python="/opt/my env/#1/python: 3")]
    _, path = written(tmp_path, items)
    (host,) = load_inventory(path).hosts
    assert (host.name, host.python) == ("yes", "/opt/my env/#1/python: 3")
    assert scalar("node1") == "node1" and scalar("yes") == "'yes'" and scalar(8) == "8"


def test_init_refuses_an_existing_file_before_probing_anything(tmp_path: Path) -> None:
    output = tmp_path / "hosts.yaml"
    output.write_text("hosts: []\n")
    result = CliRunner().invoke(app, ["init", "10.255.255.1", "-o", str(output)])
    assert isinstance(result.exception, InputError)
    assert "exists already" in result.exception.message and "--force" in result.exception.hint
    assert output.read_text() == "hosts: []\n"


@pytest.mark.parametrize("verb", ["keys", "init"])
def test_no_hosts_is_an_input_error_with_the_ssh_config_aliases(
    verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ORCH_INVENTORY", raising=False)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu1 gpu2\n  User a\nHost *\n  User b\n")
    result = CliRunner().invoke(app, [verb])
    assert isinstance(result.exception, InputError)
    assert result.exception.message == "no hosts given (in ~/.ssh/config: gpu1, gpu2)"
    assert f"orch {verb} node1 node2" in result.exception.hint


def test_shell_completion_offers_the_ssh_config_aliases(tmp_path: Path) -> None:
    import sys

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu1 gpu2 box\n  User a\nHost g*\n  User b\n")
    orch = str(Path(sys.executable).with_name("orch"))  # completion keys on the program name
    for verb in ("keys", "init"):
        env = {**os.environ, "HOME": str(tmp_path), "_ORCH_COMPLETE": "complete_bash"}
        env.update(COMP_WORDS=f"orch {verb} g", COMP_CWORD="2")
        done = subprocess.run([orch], env=env, capture_output=True, text=True, check=False)
        assert done.stdout.split() == ["gpu1", "gpu2"], (verb, done)
