"""Loading inventories: defaults, slots and GPUs, local hosts, and every error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.models.inventory import builtin_local_inventory, load_inventory
from tests.unit.conftest import WriteFile, expect_input_error


def test_defaults_are_merged_into_every_host(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        defaults:
          user: alice
          port: 2222
          identity_file: ~/.ssh/id_ed25519
          python: /opt/venv/bin/python
          workdir: /scratch/orch
          labels: [a100]
          env: {NCCL_DEBUG: INFO, NCCL_SOCKET_IFNAME: eth0}
        hosts:
          - name: node1
            address: 10.0.0.1
          - name: node2
            address: node2.example.com
            user: bob
            port: 22
            python: /usr/bin/python3
            workdir: ~/w
            labels: [h100]
            env: {NCCL_SOCKET_IFNAME: ens3, EXTRA: "1"}
        """,
    )
    node1, node2 = load_inventory(path).hosts
    assert (node1.name, node1.address) == ("node1", "10.0.0.1")
    assert node1.user == "alice"
    assert node1.port == 2222
    assert node1.identity_file == "~/.ssh/id_ed25519"
    assert node1.python == "/opt/venv/bin/python"
    assert node1.workdir == "/scratch/orch"
    assert node1.labels == ("a100",)
    assert node1.env == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}

    assert node2.user == "bob"
    assert node2.port == 22
    assert node2.identity_file == "~/.ssh/id_ed25519"
    assert node2.python == "/usr/bin/python3"
    assert node2.workdir == "~/w"
    assert node2.labels == ("h100",)
    # env is merged key by key, the host's own value winning
    assert node2.env == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ens3", "EXTRA": "1"}


def test_remote_host_without_settings_gets_the_defaults(write: WriteFile) -> None:
    path = write("inv.yaml", "hosts:\n  - {name: n1, address: 10.0.0.1}\n")
    (host,) = load_inventory(path).hosts
    assert host.user is None  # left to ~/.ssh/config
    assert host.port is None
    assert host.python == "python3"
    assert host.workdir == "~/.orch"
    assert host.gpus == ()
    assert host.slots == 1
    assert host.labels == ()
    assert host.env == {}
    assert not host.is_local


@pytest.mark.parametrize(
    ("gpus", "expected_gpus", "expected_slots"),
    [("4", (0, 1, 2, 3), 4), ("[2, 3]", (2, 3), 2), ("0", (), 1), ("[]", (), 1)],
)
def test_slots_default_to_the_gpu_count(
    write: WriteFile, gpus: str, expected_gpus: tuple[int, ...], expected_slots: int
) -> None:
    path = write("inv.yaml", f"hosts:\n  - {{name: n1, address: 10.0.0.1, gpus: {gpus}}}\n")
    (host,) = load_inventory(path).hosts
    assert host.gpus == expected_gpus
    assert host.slots == expected_slots


def test_explicit_slots_win_over_the_gpu_count(write: WriteFile) -> None:
    path = write("inv.yaml", "hosts:\n  - {name: n1, address: 10.0.0.1, gpus: 8, slots: 2}\n")
    assert load_inventory(path).hosts[0].slots == 2


def test_default_slots_apply_to_hosts_without_their_own(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        defaults: {slots: 3}
        hosts:
          - {name: n1, address: 10.0.0.1}
          - {name: n2, address: 10.0.0.2, slots: 1}
        """,
    )
    assert [h.slots for h in load_inventory(path).hosts] == [3, 1]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("-1", "must be at least 0"),
        ("[0, 0]", "GPU indices must be unique"),
        ("[0, -1]", "expected a GPU count or a list of GPU indices"),
        ("many", "expected a GPU count or a list of GPU indices"),
        ("true", "expected a GPU count or a list of GPU indices"),
    ],
)
def test_invalid_gpus_is_an_error(write: WriteFile, gpus: str, message: str) -> None:
    path = write(
        "inv.yaml",
        f"""
        hosts:
          - name: n1
            address: 10.0.0.1
            gpus: {gpus}
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 4
    assert "hosts[0].gpus" in error.message
    assert message in error.message


def test_duplicate_host_name_points_at_the_second_definition(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        hosts:
          - name: node1
            address: 10.0.0.1
          - name: node2
            address: 10.0.0.2
          - name: node1
            address: 10.0.0.3
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 6
    assert "duplicate host name 'node1' (first defined on line 2)" in error.message
    assert error.hint


def test_unknown_host_key_suggests_the_closest_known_key(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        hosts:
          - name: node1
            adress: 10.0.0.1
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 3
    assert "hosts[0].adress: unknown key" in error.message
    assert error.hint == "did you mean 'address'?"


def test_unknown_defaults_key_suggests_the_closest_known_key(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        defaults:
          usr: alice
        hosts:
          - {name: node1, address: 10.0.0.1}
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 2
    assert "defaults.usr: unknown key" in error.message
    assert error.hint == "did you mean 'user'?"


def test_name_and_address_are_not_allowed_in_defaults(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        "defaults: {address: 10.0.0.1}\nhosts:\n  - {name: n1, address: 10.0.0.2}\n",
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert "defaults.address: unknown key" in error.message


def test_unknown_top_level_key_suggests_hosts(write: WriteFile) -> None:
    path = write("inv.yaml", "host:\n  - {name: n1, address: 10.0.0.1}\n")
    error = expect_input_error(lambda: load_inventory(path))
    assert "host: unknown key" in error.message
    assert error.hint == "did you mean 'hosts'?"


@pytest.mark.parametrize(
    ("entry", "missing"),
    [("{address: 10.0.0.2}", "name"), ("{name: node2}", "address")],
)
def test_host_without_name_or_address_is_an_error(
    write: WriteFile, entry: str, missing: str
) -> None:
    path = write(
        "inv.yaml",
        f"""
        hosts:
          - {{name: node1, address: 10.0.0.1}}
          - {entry}
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 3
    assert f"hosts[1]: missing required key '{missing}'" in error.message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("port: ssh", "hosts[0].port: expected an integer, got a string 'ssh'"),
        ("port: 0", "hosts[0].port: must be at least 1, got 0"),
        ("slots: 0", "hosts[0].slots: must be at least 1, got 0"),
        ("slots: two", "hosts[0].slots: expected an integer"),
        ("labels: a100", "hosts[0].labels: expected a list"),
        ("user: [a, b]", "hosts[0].user: expected a string"),
        ("env: [A]", "hosts[0].env: expected a mapping of NAME: value"),
    ],
)
def test_wrong_type_names_the_key_and_its_line(write: WriteFile, line: str, message: str) -> None:
    path = write(
        "inv.yaml",
        f"""
        hosts:
          - name: node1
            address: 10.0.0.1
            {line}
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 4
    assert message in error.message


def test_wrong_type_in_defaults_names_the_defaults_key(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        defaults:
          port: twenty-two
        hosts:
          - {name: node1, address: 10.0.0.1}
        """,
    )
    error = expect_input_error(lambda: load_inventory(path))
    assert error.line == 2
    assert "defaults.port: expected an integer" in error.message


@pytest.mark.parametrize("hosts", ["[]", "", "node1"])
def test_empty_or_non_list_hosts_is_an_error(write: WriteFile, hosts: str) -> None:
    path = write("inv.yaml", f"hosts: {hosts}\n")
    error = expect_input_error(lambda: load_inventory(path))
    assert "hosts: expected a non-empty list of hosts" in error.message


def test_missing_hosts_key_is_an_error(write: WriteFile) -> None:
    path = write("inv.yaml", "defaults: {user: alice}\n")
    error = expect_input_error(lambda: load_inventory(path))
    assert "missing required key 'hosts'" in error.message


def test_host_entry_that_is_not_a_mapping_is_an_error(write: WriteFile) -> None:
    path = write("inv.yaml", "hosts:\n  - node1\n")
    error = expect_input_error(lambda: load_inventory(path))
    assert "host #1 must be a mapping" in error.message


@pytest.mark.parametrize("name", ["a b", "x/y", "n[1]", ""])
def test_invalid_host_name_is_an_error(write: WriteFile, name: str) -> None:
    path = write("inv.yaml", f"hosts:\n  - {{name: '{name}', address: 10.0.0.1}}\n")
    error = expect_input_error(lambda: load_inventory(path))
    assert "invalid host name" in error.message


def test_missing_inventory_file_is_an_input_error(tmp_path: Path) -> None:
    error = expect_input_error(lambda: load_inventory(tmp_path / "nope.yaml"))
    assert "inventory file not found" in error.message


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1", "::1"])
def test_local_host_gets_the_controllers_python_by_default(write: WriteFile, address: str) -> None:
    path = write("inv.yaml", f"hosts:\n  - {{name: me, address: '{address}'}}\n")
    (host,) = load_inventory(path).hosts
    assert host.is_local
    assert host.python == sys.executable


def test_local_python_argument_overrides_the_controllers_python(write: WriteFile) -> None:
    path = write("inv.yaml", "hosts:\n  - {name: me, address: localhost}\n")
    (host,) = load_inventory(path, local_python="/opt/py/bin/python").hosts
    assert host.python == "/opt/py/bin/python"


def test_local_host_keeps_an_explicit_python(write: WriteFile) -> None:
    path = write(
        "inv.yaml", "hosts:\n  - {name: me, address: localhost, python: /usr/bin/python3}\n"
    )
    assert load_inventory(path).hosts[0].python == "/usr/bin/python3"


def test_hosts_keep_file_order_and_are_found_by_name(write: WriteFile) -> None:
    path = write(
        "inv.yaml",
        """
        hosts:
          - {name: c, address: 10.0.0.3}
          - {name: a, address: 10.0.0.1}
          - {name: b, address: 10.0.0.2}
        """,
    )
    inventory = load_inventory(path)
    assert inventory.names() == ["c", "a", "b"]
    found = inventory.by_name("a")
    assert found is not None
    assert found.address == "10.0.0.1"
    assert inventory.by_name("z") is None
    assert inventory.path == str(path)


def test_builtin_local_inventory_is_one_local_slot_on_this_python() -> None:
    inventory = builtin_local_inventory()
    (host,) = inventory.hosts
    assert host.name == "localhost"
    assert host.is_local
    assert host.python == sys.executable
    assert host.slots == 1
    assert host.workdir == "~/.orch"
    assert builtin_local_inventory("/x/python").hosts[0].python == "/x/python"
