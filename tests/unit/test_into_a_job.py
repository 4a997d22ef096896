"""Into a running job, the pure parts: `orch forward`'s PORT[:LOCAL] and local port,
`orch ssh`'s NODE and COMMAND."""

from __future__ import annotations

import socket

import pytest

from orchestrator.cli.cmd_exec import job_and_command
from orchestrator.cli.cmd_ssh import node_and_command
from orchestrator.models.errors import InputError
from orchestrator.models.job import load_job
from orchestrator.nodes.into import _listen, parse_ports
from tests.unit.conftest import WriteFile, expect_input_error


def test_ports_are_port_or_port_colon_local() -> None:
    assert parse_ports("6006") == (6006, None)
    assert parse_ports("6006:16006") == (6006, 16006)
    assert parse_ports("8888:0") == (8888, 0)


@pytest.mark.parametrize("text", ["", "http", "0", "70000", "6006:", "6006:-1", "6006:x"])
def test_a_port_that_is_not_one_is_an_input_error_with_a_hint(text: str) -> None:
    if text == "6006:":  # an empty LOCAL is the same number
        assert parse_ports(text) == (6006, None)
        return
    with pytest.raises(InputError) as caught:
        parse_ports(text)
    assert "not a port" in caught.value.message and caught.value.hint


def test_the_local_side_listens_on_loopback_only_and_a_taken_port_is_exit_2() -> None:
    listener = _listen(0)
    try:
        address, port = listener.getsockname()
        assert address == "127.0.0.1"
        with pytest.raises(InputError) as caught:
            _listen(port)
        assert f"port {port} on this machine is in use" in caught.value.message
        assert caught.value.exit_code == 2 and "PORT:LOCAL" in caught.value.hint
    finally:
        listener.close()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_orch_ssh_takes_a_node_and_after_the_double_dash_a_command() -> None:
    argv = ["orch", "ssh", "job-1"]
    assert node_and_command([], argv) == (None, [])
    assert node_and_command(["node2"], [*argv, "node2"]) == ("node2", [])
    assert node_and_command(["pwd"], [*argv, "--", "pwd"]) == (None, ["pwd"])
    both = [*argv, "node2", "--", "ls", "-la"]
    assert node_and_command(["node2", "ls", "-la"], both) == ("node2", ["ls", "-la"])
    with pytest.raises(InputError):
        node_and_command(["node2", "node3"], [*argv, "node2", "node3"])


def test_forward_in_the_job_file_takes_ports_and_rejects_the_rest_at_load(
    write: WriteFile,
) -> None:
    write("train.py", "")
    base = "name: t\nscript: train.py\n"
    job = load_job(write("job.yaml", base + "forward: [6006, '8888:18888', '9000:0']\n"))
    assert job.forward == ((6006, None), (8888, 18888), (9000, 0))
    assert load_job(write("one.yaml", base + "forward: 6006\n")).forward == ((6006, None),)
    assert load_job(write("none.yaml", base)).forward == ()
    for bad in ("forward: [http]", "forward: [70000]", "forward: [true]", "forward: {a: 1}"):
        error = expect_input_error(lambda b=bad: load_job(write("bad.yaml", base + b + "\n")))
        assert "not a port" in error.message and error.hint and error.line == 3


def test_exec_takes_one_word_before_its_dashes_as_a_job_and_the_rest_as_hosts_commands() -> None:
    argv = ["orch", "exec"]
    job = ["work-1a2b3c", "--", "nvidia-smi", "-L"]
    assert job_and_command(job, [*argv, *job]) == ("work-1a2b3c", ["nvidia-smi", "-L"])
    # `orch exec -- rm -- f`: click took the first `--`; rm is the hosts' command.
    assert job_and_command(["rm", "--", "f"], [*argv, "--", "rm", "--", "f"]) == (
        None,
        ["rm", "--", "f"],
    )
    assert job_and_command(["nvidia-smi"], [*argv, "nvidia-smi"]) == (None, ["nvidia-smi"])
    assert job_and_command(["echo", "a", "--"], [*argv, "echo", "a", "--"]) == (
        None,
        ["echo", "a", "--"],
    )
    assert job_and_command(["work-1", "--"], [*argv, "work-1", "--"]) == ("work-1", [])
