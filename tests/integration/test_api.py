"""The Python API (orchestrator.api) against the real test cluster: a sweep submitted
from Python, typed lines followed to the job's end, wait, kill; the README's example
run as written; and nothing printed by the library."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.models.errors import JobFailed
from orchestrator.models.states import JobState
from tests.cluster import REPO_ROOT, Cluster
from tests.support import job_processes, wait_for, write_workdir_job

pytestmark = pytest.mark.cluster

# Each rank prints COUNT numbered lines with its LR and its other arguments, then
# "ready", then rank 1 exits 3 (--fail) or every rank sleeps (--sleep S).
SCRIPT = """\
import os, sys, time
rank, args = os.environ["RANK"], sys.argv[1:]
count, rest = int(args[0]), args[1:]
for i in range(count):
    print(f"r{rank} {i} LR={os.environ.get('LR')} {' '.join(rest)}".rstrip(), flush=True)
print(f"ready r{rank}", flush=True)
if "--fail" in rest and rank == "1":
    sys.exit(3)
time.sleep(float(rest[rest.index("--sleep") + 1]) if "--sleep" in rest else 0)
"""


@pytest.fixture
def controller(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is a fresh controller: its own HOME, job store and known_hosts
    (the API reads them from the environment, as the CLI does)."""
    for key in [k for k in os.environ if k.startswith("ORCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    env = cluster.new_controller().env()
    for key in ("HOME", "ORCH_HOME", "ORCH_KNOWN_HOSTS"):
        monkeypatch.setenv(key, env[key])


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "lines.py").write_text(SCRIPT)
    return code


def test_a_sweep_from_python_follows_typed_lines_to_the_end_and_prints_nothing(
    cluster: Cluster,
    controller: None,
    workdir: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(tmp_path, workdir, "lines.py", nodes=2, args=["200"])
    old = os.umask(0o022)  # what a notebook has: the API must still keep its files private
    try:
        runs = {
            lr: api.submit(
                job,
                inventory,
                detach=True,
                overrides=api.Overrides(name=f"sweep-{lr}", env={"LR": lr}),
            )
            for lr in ("0.1", "0.01")
        }
    finally:
        os.umask(old)
    for lr, run in runs.items():
        assert run.id.startswith(f"sweep-{lr}-")
        lines = list(run.logs(follow=True))  # ends when the job ends
        for rank, host in ((0, "node1"), (1, "node2")):
            mine = [line for line in lines if line.rank == rank]
            assert all(line.host == host and line.kind is api.LineKind.RANK for line in mine)
            assert [line.text for line in mine] == [
                *(f"r{rank} {i} LR={lr}" for i in range(200)),
                f"ready r{rank}",
            ]
            assert str(mine[0]) == f"[{host} r{rank}] r{rank} 0 LR={lr}"
        final = run.wait()
        assert final.state is JobState.SUCCEEDED and final.exit_code == 0
        assert [(n.host, n.state) for n in final.nodes] == [
            ("node1", JobState.SUCCEEDED),
            ("node2", JobState.SUCCEEDED),
        ]
    assert {j.id for j in api.jobs()} == {r.id for r in runs.values()}
    store = Path(os.environ["ORCH_HOME"]) / "jobs.db"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_an_attached_submit_hands_on_typed_lines_and_raises_when_the_job_fails(
    cluster: Cluster,
    controller: None,
    workdir: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(tmp_path, workdir, "lines.py", name="fails", nodes=2, args=["2"])
    lines: list[api.LogLine] = []
    with pytest.raises(JobFailed, match=r"node node2 exited with code 1") as failed:
        api.submit(
            job,
            inventory,
            overrides=api.Overrides(args=("--fail",)),
            reporter=api.LineReporter(lines.append),
        )
    assert failed.value.exit_code == 1
    ranks = [(line.host, line.text) for line in lines if line.kind is api.LineKind.RANK]
    for rank, host in ((0, "node1"), (1, "node2")):
        assert [text for h, text in ranks if h == host] == [
            f"r{rank} 0 LR=None --fail",
            f"r{rank} 1 LR=None --fail",
            f"ready r{rank}",
        ]
    assert any(line.kind is api.LineKind.NODE for line in lines), "torchrun's own report"
    (handle,) = api.jobs()
    assert handle.wait().state is JobState.FAILED  # ended: at once
    assert capfd.readouterr() == ("", "")


def test_kill_from_python_stops_a_long_job_everywhere(
    cluster: Cluster,
    controller: None,
    workdir: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path, workdir, "lines.py", name="long", nodes=2, args=["3", "--sleep", "600"]
    )
    run = api.submit(job, inventory, detach=True)
    seen = []
    for line in run.logs(follow=True):  # left before the job ends
        seen.append(line.text)
        if sum(text.startswith("ready") for text in seen) == 2:
            break
    assert run.status().state is JobState.RUNNING
    with pytest.raises(api.WaitTimeout):
        run.wait(timeout=0.5)
    killed = run.kill()
    assert killed.already is None and killed.unreachable == ()
    assert set(killed.killed) == {"node1", "node2"}
    for procs in killed.killed.values():  # torchrun and its rank, on each host
        assert [p.command.split()[-3:] for p in procs if "lines.py" in p.command] == [
            ["3", "--sleep", "600"]
        ], procs
    assert killed.port_free is True
    for i in (1, 2):  # the iterator and wait() left followers: they end with the job
        wait_for(lambda i=i: job_processes(cluster, i) == [], 10, f"node{i} to be empty")
    final = run.wait(timeout=10)
    assert final.state is JobState.KILLED
    assert {n.state for n in final.nodes} == {JobState.KILLED}
    again = api.job(run.id[:8]).kill()
    assert again.already is JobState.KILLED and again.killed == {}
    assert capfd.readouterr() == ("", "")


def readme_example() -> str:
    """The README's "From Python" example, as written there."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under 'From Python'"
    return match.group(1)


def test_the_readme_example_runs_as_written(
    cluster: Cluster,
    controller: None,
    workdir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(tmp_path, workdir, "lines.py", name="digits", nodes=2, args=["2"])
    code = readme_example()
    setting = 'job, inventory = "jobs/digits.yaml", "inventory/cluster.yaml"\n'
    assert setting in code
    exec(code.replace(setting, f"job, inventory = {str(job)!r}, {str(inventory)!r}\n"), {})
    out = capsys.readouterr().out.splitlines()
    for lr in ("0.1", "0.01"):  # rank 0's lines (with the --lr given), then how it ended
        mine = [line for line in out if line.startswith(f"{lr} ")]
        assert mine[:3] == [
            f"{lr} r0 0 LR=None --lr {lr}",
            f"{lr} r0 1 LR=None --lr {lr}",
            f"{lr} ready r0",
        ], out
        assert re.fullmatch(rf"{re.escape(lr)} digits-lr{re.escape(lr)}-\w+ succeeded 0", mine[3])
    assert len(out) == 8, out
