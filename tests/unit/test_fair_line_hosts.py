"""The fair line on a host and at the controller: the policy file trusted only from
its administrator (agent/leases/admin.py), a supervisor refused what the policy
does not allow (holder.py), `priority:` and `--priority`, and the `waiting:` line.
Real files; the unit tests run as root, so files of another owner are chowned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.kernel.lease_wire import Waiting
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.leases import admin, fairness, holder, storage
from orchestrator.models import job_run
from orchestrator.models.errors import InputError
from orchestrator.models.job import Overrides, load_job, with_overrides
from orchestrator.ssh.queue import PolicyRefused, waiting_text
from tests.unit.conftest import WriteFile
from tests.unit.test_leases import wait_turn

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="chowns files to another user")


@pytest.fixture
def policy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder only root can write, and ORCH_POLICY_FILE at its `policy`."""
    folder = tmp_path / "orch"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    monkeypatch.setenv("ORCH_POLICY_FILE", str(folder / "policy"))
    monkeypatch.setenv("ORCH_LEASE_DIR", str(tmp_path / "leases"))
    return folder


def put(path: Path, text: str, mode: int = 0o644, owner: int = 0) -> None:
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, owner, -1)


def test_a_root_policy_in_a_root_folder_applies(policy_dir: Path) -> None:
    put(policy_dir / "policy", "high root\nlimit * slots 2\n")
    rules, warnings = admin.load_policy()
    assert warnings == [] and rules.may_use(0, "high") and rules.limit(1234, "slot") == 2
    assert rules.source == str(policy_dir / "policy")


def test_where_the_administrator_wrote_the_policy_no_users_environment_moves_it(
    policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORCH_POLICY_FILE at a root-owned file of no rules would lift its user's limit:
    where the host has its policy file, the variable is not read."""
    put(policy_dir / "policy", "limit * slots 2\n")
    monkeypatch.setattr(admin, "POLICY_FILE", str(policy_dir / "policy"))
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir(mode=0o755)
    put(elsewhere / "none", "# no rules\n")
    monkeypatch.setenv("ORCH_POLICY_FILE", str(elsewhere / "none"))
    rules, _ = admin.load_policy()
    assert rules.limit(1234, "slot") == 2 and rules.source == str(policy_dir / "policy")


def test_no_policy_file_is_no_policy_and_no_warning(policy_dir: Path) -> None:
    rules, warnings = admin.load_policy()
    assert warnings == [] and rules.limits == {} and not rules.may_use(0, "high")


@pytest.mark.parametrize(
    ("mode", "owner", "folder_mode", "folder_owner", "why"),
    [
        (0o644, NOBODY, 0o755, 0, "it belongs to nobody, not root"),
        (0o666, 0, 0o755, 0, "its mode is 666: others than its owner can change it"),
        (0o664, 0, 0o755, 0, "its mode is 664"),
        (0o644, 0, 0o777, 0, "has mode 777: others can replace it"),
        (0o644, 0, 0o755, NOBODY, "belongs to nobody, not root"),
    ],
)
def test_a_policy_file_someone_else_could_write_is_ignored_with_a_warning_naming_it(
    policy_dir: Path, mode: int, owner: int, folder_mode: int, folder_owner: int, why: str
) -> None:
    put(policy_dir / "policy", "high *\n", mode, owner)
    policy_dir.chmod(folder_mode)
    os.chown(policy_dir, folder_owner, -1)
    rules, warnings = admin.load_policy()
    assert not rules.may_use(0, "high")  # the default: high for nobody
    assert len(warnings) == 1 and why in warnings[0], warnings
    assert warnings[0].startswith(f"ignored the policy file {policy_dir / 'policy'}: ")


def test_a_policy_that_is_a_link_or_not_a_file_is_ignored(policy_dir: Path, tmp_path: Path) -> None:
    put(tmp_path / "elsewhere", "high *\n")
    (policy_dir / "policy").symlink_to(tmp_path / "elsewhere")
    rules, warnings = admin.load_policy()
    assert not rules.may_use(0, "high") and "cannot be read" in warnings[0]
    (policy_dir / "policy").unlink()
    (policy_dir / "policy").mkdir()
    rules, warnings = admin.load_policy()
    assert not rules.may_use(0, "high") and "not a regular file" in warnings[0]


def test_a_bad_line_of_a_trusted_policy_is_named_and_the_rest_applies(policy_dir: Path) -> None:
    put(policy_dir / "policy", "limit * slots 2\nlimit nosuchuser-x slots 9\n")
    rules, warnings = admin.load_policy()
    assert rules.limit(0, "slot") == 2
    assert warnings == [
        f"{policy_dir / 'policy'}:2: no user 'nosuchuser-x' on this host: "
        "ignored the line 'limit nosuchuser-x slots 9'"
    ]


def test_a_user_name_no_host_could_have_is_a_bad_line_not_a_crash(policy_dir: Path) -> None:
    put(
        policy_dir / "policy",
        "limit a\0b slots 1\nhigh \udcff\nlimit * slots 3\n".encode(
            "utf-8", "surrogateescape"
        ).decode("utf-8", "replace"),
    )
    rules, warnings = admin.load_policy()
    assert rules.limit(0, "slot") == 3 and len(warnings) == 2, warnings


def test_a_high_the_policy_does_not_open_to_the_user_is_refused_before_it_joins_the_line(
    policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    req = {"kind": "slot", "pool": [0, 1], "count": 1, "ticket": [1.0, "a"], "job": "a"}
    turn, said = wait_turn(tmp_path / "a", {**req, "priority": "high"})
    assert turn is None
    assert (
        said["refused"]
        == "priority high is not open to root here (no policy file names who may use it)"
    )
    put(policy_dir / "policy", "high root\nlimit root slots 1\n")
    turn, said = wait_turn(tmp_path / "b", {**req, "count": 2})
    assert turn is None and "lets root hold at most 1 here" in str(said["refused"])
    turn, said = wait_turn(tmp_path / "c", {**req, "priority": "high"})
    assert isinstance(turn, holder.Turn) and turn.units == [0]
    lease_file = next(p for p in Path(storage.lease_dir()).iterdir() if p.name.startswith("L-"))
    assert json.loads(lease_file.read_text())["priority"] == "high"
    holder.release(turn)


def test_the_job_files_priority_and_priority_override(write: WriteFile) -> None:
    base = "name: p\nworkdir: .\nscript: train.py\nnodes: 1\n"
    write("train.py", "")
    assert load_job(write("a.yaml", base)).priority == "normal"
    job = load_job(write("b.yaml", base + "priority: low\n"))
    assert job.priority == "low"
    assert with_overrides(job, Overrides(priority="high")).priority == "high"
    with pytest.raises(InputError, match="--priority: unknown priority 'urgent'"):
        with_overrides(job, Overrides(priority="urgent"))
    with pytest.raises(InputError, match="unknown priority 'soon'"):
        load_job(write("c.yaml", base + "priority: soon\n"))


def test_the_job_files_priorities_are_the_agents() -> None:
    assert job_run.PRIORITIES == fairness.PRIORITIES


def test_a_job_at_its_users_limit_says_who_holds_how_many_of_how_many_where() -> None:
    info = {
        "kind": "gpu",
        "want": 1,
        "position": 2,
        "limit": {"user": "alice", "held": 4, "most": 4},
    }
    parsed = parse_message(Waiting, info)
    text = waiting_text({"node2": parsed, "node1": parsed}, {})
    assert text == "waiting: alice holds 4 of their 4 GPUs on node1, node2"


def test_a_refusal_by_the_policy_is_bad_input_naming_the_hosts() -> None:
    error = PolicyRefused({"node2": "priority high is not open to bob here", "node1": "x"})
    assert error.exit_code == 2 and "(hosts node1, node2)" in error.message


def test_check_warns_of_a_policy_file_that_was_ignored_or_has_a_bad_line() -> None:
    from orchestrator.agent.kernel.lease_wire import LeaseDir
    from orchestrator.ssh.check.rules import lease_dir_problems

    said = "ignored the policy file /etc/orch/policy: it belongs to bob, not root\x1b[2J"
    found = LeaseDir(dir="/d", exists=True, owner="root", policy=[said])
    problems = lease_dir_problems("node1", found)
    assert [p.what for p in problems] == [
        "ignored the policy file /etc/orch/policy: it belongs to bob, not root[2J"
    ]
    assert "docs/SHARING.md#the-policy-file" in problems[0].hint


def test_the_lease_dir_command_names_what_of_the_policy_was_ignored(
    policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.agent.leases import commands

    put(policy_dir / "policy", "high *\n", owner=NOBODY)
    found = commands.dir_view()
    assert len(found.policy) == 1 and "it belongs to nobody, not root" in found.policy[0]
