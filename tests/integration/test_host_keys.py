"""Host keys against real sshd hosts, checked as OpenSSH checks them.

Each test gives a fresh controller a known_hosts and ~/.ssh/config shaped as users
have them, runs `orch exec`, and where it matters asks OpenSSH itself (`ssh`,
`ssh-keygen -F`) the same question: orch must trust exactly what `ssh` trusts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cluster import SUBNET, Cluster, Controller, OrchRunner

pytestmark = pytest.mark.cluster


def fresh(cluster: Cluster, known_hosts: str = "", ssh_config: str = "") -> Controller:
    controller = cluster.new_controller(trust_hosts=False)
    controller.known_hosts.write_text(known_hosts)
    if ssh_config:
        ssh_dir = controller.home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "config").write_text(ssh_config)
    return controller


def exec_on(
    controller: Controller, inventory: Path, hosts: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return OrchRunner(controller)(
        "exec", "-i", inventory, "--hosts", hosts, "--", "hostname", timeout=60, env=env
    )


def public_key(path: Path) -> str:
    """`TYPE BASE64` of a .pub file."""
    return " ".join(path.read_text().split()[:2])


def host_key(cluster: Cluster, i: int) -> str:
    return public_key(cluster.host(i).host_key.with_suffix(".pub"))


def new_key(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub")


def openssh_connects(
    cluster: Cluster, controller: Controller, i: int
) -> subprocess.CompletedProcess[str]:
    """The same connection by OpenSSH's own client, with the controller's files."""
    assert cluster.client_key is not None
    options = [
        f"UserKnownHostsFile={controller.known_hosts}",
        "StrictHostKeyChecking=accept-new",
        "BatchMode=yes",
        "ConnectTimeout=5",
    ]
    argv = ["ssh", "-F", "/dev/null", "-i", str(cluster.client_key)]
    argv += [arg for option in options for arg in ("-o", option)]
    return subprocess.run(
        [*argv, f"root@{cluster.host(i).address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_a_wildcard_entry_pins_every_host_it_names_as_ssh_does(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    impostor = public_key(new_key(tmp_path, "impostor"))
    controller = fresh(cluster, known_hosts=f"{SUBNET}.* {impostor}\n")
    before = controller.known_hosts.read_text()
    result = exec_on(controller, inventory, "node1")
    assert result.returncode == 3, result.stderr
    assert f"host key of {SUBNET}.11 has CHANGED" in result.stderr, result.stderr
    assert f"{controller.known_hosts}:1" in result.stderr, "the entry that pins it is named"
    assert controller.known_hosts.read_text() == before, "nothing was added beside it"
    by_ssh = openssh_connects(cluster, controller, 1)
    assert by_ssh.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in by_ssh.stderr


def test_global_and_hashed_entries_are_trusted_without_recording_anything(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    global_file = tmp_path / "ssh_known_hosts"
    global_file.write_text(
        f"{SUBNET}.11 {host_key(cluster, 1)}\n{SUBNET}.12 {host_key(cluster, 2)}\n"
    )
    subprocess.run(
        ["ssh-keygen", "-q", "-H", "-f", str(global_file)], check=True, capture_output=True
    )
    assert f"{SUBNET}" not in global_file.read_text(), "ssh-keygen hashed the names"
    controller = fresh(cluster, ssh_config=f"GlobalKnownHostsFile {global_file}\n")
    result = exec_on(controller, inventory, "node1,node2")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["[node1]", "[node2]", "node1", "node2"]
    assert "added host key" not in result.stderr
    assert controller.known_hosts.read_text() == ""


def test_certificates_signed_by_a_listed_ca_are_trusted_and_others_refused(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    assert cluster.host_ca is not None
    trusted = f"@cert-authority {SUBNET}.* {public_key(cluster.host_ca.with_suffix('.pub'))}\n"
    controller = fresh(cluster, known_hosts=trusted)
    result = exec_on(controller, inventory, "node1,node2")
    assert result.returncode == 0, result.stderr
    assert "added host key" not in result.stderr
    assert controller.known_hosts.read_text() == trusted

    other_ca = public_key(new_key(tmp_path, "other_ca"))
    controller = fresh(cluster, known_hosts=f"@cert-authority {SUBNET}.* {other_ca}\n")
    result = exec_on(controller, inventory, "node1")
    assert result.returncode == 3, result.stderr
    assert "signed by a CA that known_hosts does not list" in result.stderr, result.stderr
    assert "node1" in result.stderr and "Traceback" not in result.stderr
    assert controller.known_hosts.read_text() == f"@cert-authority {SUBNET}.* {other_ca}\n"


def test_a_revoked_key_is_refused_even_with_checking_off(cluster: Cluster, inventory: Path) -> None:
    key = host_key(cluster, 1)
    controller = fresh(
        cluster,
        known_hosts=f"{SUBNET}.11 {key}\n@revoked * {key}\n",
        ssh_config="StrictHostKeyChecking no\n",
    )
    result = exec_on(controller, inventory, "node1")
    assert result.returncode == 3, result.stderr
    assert f"host key of {SUBNET}.11 is REVOKED" in result.stderr, result.stderr


def test_ssh_config_sets_strictness_and_the_file_new_keys_go_to(
    cluster: Cluster, inventory: Path
) -> None:
    controller = fresh(
        cluster,
        ssh_config=(
            f"Host {SUBNET}.11\n  StrictHostKeyChecking yes\n"
            "Host *\n  UserKnownHostsFile ~/pinned_hosts\n"
        ),
    )
    pinned = controller.home / "pinned_hosts"
    refused = exec_on(controller, inventory, "node1", ORCH_KNOWN_HOSTS="")
    assert refused.returncode == 3, refused.stderr
    assert (
        f"host key of {SUBNET}.11 is not known and StrictHostKeyChecking is yes" in refused.stderr
    )
    assert not pinned.exists()

    accepted = exec_on(controller, inventory, "node2", ORCH_KNOWN_HOSTS="")
    assert accepted.returncode == 0, accepted.stderr
    assert f"added host key for {SUBNET}.12 (ssh-ed25519 SHA256:" in accepted.stderr
    assert pinned.stat().st_mode & 0o777 == 0o600
    found = subprocess.run(
        ["ssh-keygen", "-F", f"{SUBNET}.12", "-f", str(pinned)], capture_output=True, text=True
    )
    assert found.returncode == 0 and host_key(cluster, 2) in found.stdout, "OpenSSH finds it"
    assert controller.known_hosts.read_text() == "", "$ORCH_KNOWN_HOSTS unset: not used"


def test_checking_off_connects_to_a_changed_key_with_a_warning(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    impostor = public_key(new_key(tmp_path, "impostor"))
    controller = fresh(
        cluster, known_hosts=f"{SUBNET}.11 {impostor}\n", ssh_config="StrictHostKeyChecking no\n"
    )
    result = exec_on(controller, inventory, "node1")
    assert result.returncode == 0, result.stderr
    assert f"WARNING: the host key of {SUBNET}.11 has CHANGED" in result.stderr
    assert "connecting anyway, as StrictHostKeyChecking=no asks" in result.stderr
    assert controller.known_hosts.read_text() == f"{SUBNET}.11 {impostor}\n", "never replaced"


def test_a_proxyjump_gateway_is_checked_as_the_host_behind_it(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    jump = f"Host {SUBNET}.12\n  ProxyJump root@{SUBNET}.11\nHost *\n  IdentityFile {cluster.client_key}\n"
    controller = fresh(
        cluster, known_hosts=f"{SUBNET}.12 {host_key(cluster, 2)}\n", ssh_config=jump
    )
    result = exec_on(controller, inventory, "node2")
    assert result.returncode == 0, result.stderr
    assert f"added host key for {SUBNET}.11" in result.stderr, "the gateway, on first use"
    assert f"added host key for {SUBNET}.12" not in result.stderr

    impostor = public_key(new_key(tmp_path, "impostor"))
    pinned = f"{SUBNET}.12 {host_key(cluster, 2)}\n{SUBNET}.11 {impostor}\n"
    controller = fresh(cluster, known_hosts=pinned, ssh_config=jump)
    result = exec_on(controller, inventory, "node2")
    assert result.returncode == 3, result.stderr
    assert f"host key of {SUBNET}.11 has CHANGED" in result.stderr and "node2" in result.stderr

    refused = jump.replace(f"root@{SUBNET}.11", f"nobody@{SUBNET}.11")  # no key of ours there
    controller = fresh(cluster, known_hosts=pinned.splitlines()[0] + "\n", ssh_config=refused)
    result = exec_on(controller, inventory, "node2")
    assert result.returncode == 3, result.stderr
    assert (
        f"authentication refused for nobody@{SUBNET}.11, the ProxyJump gateway to root@{SUBNET}.12"
        in result.stderr
    ), result.stderr
    assert "hint: install your public key on the gateway" in result.stderr
