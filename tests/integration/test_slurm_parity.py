"""The same job file on Slurm as over SSH: outputs and `orch pull` through the
login node, launcher python and torch.distributed.launch, reattaching after an attached
submit was killed, `orch top` and `orch status --hosts` of a Slurm job and partition
(and `orch ui`'s hosts page of them),
and `gpus_per_node:` as Slurm's own GPU request.

One Slurm cluster serves the module (tests/cluster/slurm.py): node1 is the login node,
node2..node4 the compute nodes, each declaring 2 GPUs that are plain files (GRES that
Slurm schedules and counts, under select/cons_tres; no GPU is there). The job files are the SSH
tests' own (tests/integration/jobs/) where they fit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.cluster import OrchRunner, SlurmCluster, orch_command
from tests.support import (
    Lines,
    UiProcess,
    assert_slurm_clean,
    chromium,
    expected_data,
    job_id_of,
    outputs_job,
    slurm_job_root,
    spawn_job,
    wait_for,
    write_job,
    write_workdir_job,
)

GPUS = 2  # count-only GRES per compute node
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slurm(gpus_per_node=GPUS),
    pytest.mark.xdist_group("slurm-parity"),
]
TALK = """\
import os, socket, sys, time
if os.environ.get("SERVE_PORT") and os.environ.get("LOCAL_RANK") == "0":
    import http.server, threading
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"talk from {socket.gethostname()}\\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    page = http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["SERVE_PORT"])), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
for i in range(int(os.environ.get("LINES", "3"))):
    print(f"line {i} of rank {os.environ['RANK']}", flush=True)
    time.sleep(float(os.environ.get("EVERY", "0")))
keys = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
seen = " ".join(f"{k}={os.environ.get(k)}" for k in keys)
print(f"rank {os.environ['RANK']} on {socket.gethostname()} {seen}", flush=True)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


def talk_job(tmp_path: Path, **keys: object) -> Path:
    workdir = tmp_path / "talk"
    workdir.mkdir(exist_ok=True)
    (workdir / "talk.py").write_text(TALK)
    return write_workdir_job(tmp_path, workdir, "talk.py", name="talk", **keys)


# ---------------------------------------------------------------- outputs and pull


def writers(stdout: str) -> list[str]:
    """The nodes whose script wrote its outputs: `[node3] wrote node3`."""
    return sorted(re.findall(r"^\[(\S+)\] wrote \1$", stdout, re.M))


def assert_came_back(where: Path, hosts: list[str]) -> None:
    """Every node's files in the one directory the nodes shared."""
    assert len(hosts) == 2
    for host in hosts:
        assert (where / f"data-{host}.bin").read_bytes() == expected_data(host)
        assert (where / "logs" / f"{host}.txt").read_text() == f"log of {host}\n"
        assert (where / f"data-{host}.bin").stat().st_mode & 0o777 == 0o600
    assert os.readlink(where / "latest") in {f"data-{h}.bin" for h in hosts}


def test_outputs_come_back_through_the_login_node_when_the_job_ends(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    result = orch("submit", outputs_job(tmp_path), "-i", hpc, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    job_id = job_id_of(result.stdout)
    assert f"outputs: 4 files (2.1 MB) in orch-outputs/{job_id}" in result.stderr
    assert_came_back(tmp_path / "orch-outputs" / job_id, writers(result.stdout))


def test_outputs_come_back_after_a_failure_too(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    result = orch("submit", outputs_job(tmp_path, "--fail-on", "node3"), "-i", hpc, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    job_id = job_id_of(result.stdout)
    assert "outputs: 4 files" in result.stderr, result.stderr[-3000:]
    assert_came_back(tmp_path / "orch-outputs" / job_id, writers(result.stdout))
    assert_slurm_clean(slurm)


def test_pull_while_running_moves_only_the_change_and_kill_brings_the_rest(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = outputs_job(tmp_path, "--wait", paths=["data-*", "more-*", "next"])
    submitted = orch("submit", "-d", job, "-i", hpc, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    outputs = slurm_job_root(slurm, job_id) / "outputs"
    wait_for(lambda: len(list(outputs.glob("data-*.bin"))) == 2, 60, "both nodes' outputs")
    hosts = sorted(p.name[5:-4] for p in outputs.glob("data-*.bin"))

    first = orch("pull", job_id, timeout=60)
    assert first.returncode == 0, first.stderr
    target = tmp_path / "orch-outputs" / job_id
    login = slurm.login.address
    assert first.stdout.strip() == f"[{login}] 2 files (2.1 MB) -> orch-outputs/{job_id}"
    assert (target / f"data-{hosts[1]}.bin").read_bytes() == expected_data(hosts[1])

    (outputs / "next").write_text("")
    for host in hosts:
        wait_for(lambda h=host: (outputs / f"more-{h}.txt").exists(), 30, f"{host}'s next output")
    second = orch("pull", job_id, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        f"[{login}] 3 files (0.0 MB), 2 unchanged -> orch-outputs/{job_id}"
    ), "only next and the two more-*.txt moved"

    (outputs / "more-late.txt").write_text("late\n")
    killed = orch("kill", job_id, timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert "outputs: 6 files" in killed.stderr, killed.stderr
    assert (target / "more-late.txt").read_text() == "late\n"
    assert_slurm_clean(slurm)


# ---------------------------------------------------------------- launchers


def rank_lines(stdout: str) -> list[tuple[str, ...]]:
    """(prefix host, rank, host the rank ran on, the rest) of each result line."""
    found = re.findall(r"^\[(\S+?)(?: r\d+)?\] rank=(\d+) (.*)host=(\S+) (.*)$", stdout, re.M)
    return sorted(
        (prefix, rank, host, f"{middle}{rest}") for prefix, rank, middle, host, rest in found
    )


def test_a_self_spawning_script_gets_its_node_arguments_and_master_under_slurm(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = spawn_job(tmp_path, nproc_per_node=2)
    result = orch("submit", job, "-i", hpc, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = rank_lines(result.stdout)
    assert [(r, rest) for _, r, _, rest in lines] == [
        ("0", "world=4 node=0 sum=10"),
        ("1", "world=4 node=0 sum=10"),
        ("2", "world=4 node=1 sum=10"),
        ("3", "world=4 node=1 sum=10"),
    ], result.stdout
    assert all(prefix == host for prefix, _, host, _ in lines)  # one prefix per node: no rank
    assert lines[0][2] == lines[1][2] != lines[2][2] == lines[3][2]


def test_a_legacy_script_gets_local_rank_as_an_argument_under_slurm(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "launchers",
        "legacy.py",
        launcher="torch.distributed.launch",
        nodes=2,
        nproc_per_node=2,
        args=["--tag", "{node_rank}"],
    )
    result = orch("submit", job, "-i", hpc, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = rank_lines(result.stdout)
    assert [(r, rest) for _, r, _, rest in lines] == [
        ("0", "local_rank=0 sum=10 tag=0"),
        ("1", "local_rank=1 sum=10 tag=0"),
        ("2", "local_rank=0 sum=10 tag=1"),
        ("3", "local_rank=1 sum=10 tag=1"),
    ], result.stdout
    assert all(prefix == host for prefix, _, host, _ in lines)


def test_kill_of_a_detached_self_spawning_job_leaves_nothing_on_any_node(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = spawn_job(tmp_path, "--sleep", "120", "--plain", nproc_per_node=2)
    submitted = orch("submit", "-d", job, "-i", hpc, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    # The script and both of its spawned processes run on each of the two nodes.
    wait_for(
        lambda: (
            sum(
                "spawn.py" in cmd or "multiprocessing" in cmd
                for h in slurm.compute
                for _, cmd in slurm.job_processes(h)
            )
            >= 6
        ),
        60,
        "every spawned process",
    )
    killed = orch("kill", job_id, timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert_slurm_clean(slurm)


# ---------------------------------------------------------------- reattach and watch


def test_after_an_attached_submit_is_killed_status_logs_and_kill_pick_the_job_up(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = talk_job(tmp_path, nodes=2, env={"LINES": "3", "SLEEP": "300"})
    submit = orch.popen("submit", job, "-i", hpc)
    assert submit.stdout is not None and submit.stderr is not None
    out = Lines(submit.stdout)
    out.wait_for("line 2 of rank 1", 90)
    os.killpg(submit.pid, signal.SIGKILL)
    submit.wait(10)
    job_id = out.lines[0].split()[1]

    status = orch("status", job_id, "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["state"] == "running"
    follower = orch.popen("logs", "-f", job_id)
    assert follower.stdout is not None and follower.stderr is not None
    followed, follower_err = Lines(follower.stdout), Lines(follower.stderr)
    followed.wait_for("r1] line 2 of rank 1", 60)  # from the shared home, once more
    killed = orch("kill", job_id, timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert f"job {job_id} killed" in killed.stdout + killed.stderr
    assert follower.wait(60) == 1, follower_err.text()
    after = orch("status", job_id, "--json", timeout=60)
    assert json.loads(after.stdout)[0]["state"] == "killed"
    assert_slurm_clean(slurm)


def test_top_shows_every_rank_of_a_running_job_and_hosts_shows_the_gpus_it_holds(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    env = {"LINES": "400", "EVERY": "0.2", "SLEEP": "300", "SERVE_PORT": str(SERVE_PORT)}
    job = talk_job(tmp_path, nodes=2, gpus_per_node=GPUS, env=env)
    submitted = orch("submit", "-d", job, "-i", hpc, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    root = slurm_job_root(slurm, job_id)
    wait_for(lambda: len(list(root.glob("*/logs/rank-*.log"))) == 4, 60, "every rank's log")
    try:
        top = orch("top", job_id, "--once", "--json", "--interval", "1", timeout=90)
        assert top.returncode == 0, top.stderr
        view = json.loads(top.stdout)
        assert view["job"] == job_id and view["state"] == "running"
        nodes = {n["host"]: n for n in view["nodes"]}
        assert len(nodes) == 2 and {n["state"] for n in nodes.values()} == {"running"}
        ranks = sorted(r["rank"] for n in nodes.values() for r in n["ranks"])
        assert ranks == [0, 1, 2, 3], view
        for node in nodes.values():
            for rank in node["ranks"]:
                assert rank["pids"] and rank["rss_bytes"] > 0, rank
                assert rank["lines"] is not None and rank["lines"] > 0, rank

        hosts = orch("status", "--hosts", "-i", hpc, "--json", timeout=60)
        assert hosts.returncode == 0, hosts.stderr
        units = json.loads(hosts.stdout)["units"]
        assert {(u["host"], u["kind"]) for u in units} == {(h.name, "gpu") for h in slurm.compute}
        held = sorted((u["host"], u["unit"]) for u in units if u.get("job") == job_id)
        assert held == sorted((h, i) for h in nodes for i in range(GPUS)), units
        free = [u for u in units if u["host"] not in nodes]
        assert len(free) == GPUS and {u["state"] for u in free} == {"free"}
        assert_the_page_shows_the_allocation(orch, hpc, job_id, sorted(nodes), tmp_path)
        assert_ssh_exec_and_forward_reach_the_allocation(orch, job_id, sorted(nodes), root)
    finally:
        orch("kill", job_id, timeout=90)
    assert_slurm_clean(slurm)


SERVE_PORT = 8632  # on each compute node: a network namespace of its own


def assert_ssh_exec_and_forward_reach_the_allocation(
    orch: OrchRunner, job_id: str, nodes: list[str], root: Path
) -> None:
    """`orch exec JOB`, `orch ssh JOB NODE` and `orch forward JOB` on a running Slurm job
    reach its allocation's nodes through the login node, each in its node's directory
    with the job's environment."""
    line = 'echo "at $(pwd -P) sleep=$SLEEP node=$ORCH_NODE_RANK"; exit $((ORCH_NODE_RANK * 3))'
    everywhere = orch("exec", job_id, "--", line, timeout=90)
    assert everywhere.returncode == 3, everywhere.stderr
    said = sorted(everywhere.stdout.splitlines())
    assert len(said) == 2, said
    for i, (node, seen) in enumerate(
        zip(nodes, said, strict=True)
    ):  # the job root's code, on the node
        assert seen.startswith(f"[{node}] at /") and seen.endswith(
            f"/{root.name}/code sleep=300 node={i}"
        ), said
    assert f"command failed on {nodes[1]} (exit 3)" in everywhere.stderr

    ran = orch("ssh", job_id, nodes[1], "--", "hostname; exit 4", timeout=90)
    assert (ran.returncode, ran.stdout.strip()) == (4, nodes[1]), ran.stderr

    forward = subprocess.Popen(
        [*orch_command(), "forward", job_id, f"{SERVE_PORT}:0", "--node", nodes[1]],
        env=orch.controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        address = forward.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:"), address

        def page() -> str | None:
            try:
                with urllib.request.urlopen(address, timeout=5) as answer:
                    return str(answer.read().decode())
            except OSError:
                return None

        wait_for(lambda: page() == f"talk from {nodes[1]}\n", 30, "the node's page", poll=0.2)
    finally:
        forward.send_signal(signal.SIGINT)
        _, err = forward.communicate(timeout=30)
    assert forward.returncode == 130 and "Traceback" not in err, err


def assert_the_page_shows_the_allocation(
    orch: OrchRunner, hpc: Path, job_id: str, nodes: list[str], tmp_path: Path
) -> None:
    """`orch ui -i` a Slurm inventory: the hosts page lists the running job with its
    allocation's nodes, and draws those nodes over time from the job's samples."""
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    ui = UiProcess(orch, hpc)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(ui.url + "#/hosts")
                held = page.locator(f'#holdings tr[data-job="{job_id}"] td[data-hosts]')
                held.wait_for(timeout=30_000)
                assert sorted((held.get_attribute("data-hosts") or "").split(",")) == nodes
                page.wait_for_selector("#chart-cpu canvas", timeout=45_000)
                drawn = page.eval_on_selector_all(
                    "#chart-cpu .u-legend .u-series .u-label", "ls => ls.map(l => l.textContent)"
                )
                assert drawn[1:] == nodes, "the allocation's nodes over time"
                page.screenshot(path=tmp_path / "ui-hosts-slurm.png", full_page=True)
                assert errors == []
            finally:
                browser.close()
    finally:
        code, err = ui.stop()
    assert (code, "Traceback" in err) == (130, False), err


# ---------------------------------------------------------------- GPUs


def test_gpus_per_node_is_slurms_gpu_request_and_the_ranks_see_what_slurm_gives(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = talk_job(tmp_path, nodes=2, gpus_per_node=GPUS, env={"LINES": "1"})
    result = orch("submit", job, "-i", hpc, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = re.findall(r"^\[(\S+) r(\d)\] rank \2 on \1 (.*)$", result.stdout, re.M)
    assert len(seen) == 2 * GPUS, result.stdout  # one rank per GPU: nproc_per_node's default
    for _, _, env in seen:
        # What Slurm sets, as it set it: the GPUs it gave the node. The test cluster's
        # GPUs have no device numbers, so Slurm names none in CUDA_VISIBLE_DEVICES, and
        # orch adds none of its own.
        assert f"SLURM_GPUS_ON_NODE={GPUS}" in env and "CUDA_VISIBLE_DEVICES=None" in env, env
    batch = slurm_job_root(slurm, job_id_of(result.stdout)) / "slurm" / "batch.sh"
    assert f"#SBATCH --gres=gpu:{GPUS}\n" in batch.read_text()


def test_more_gpus_per_node_than_a_node_has_is_refused_before_anything_is_queued(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = talk_job(tmp_path, nodes=2, gpus_per_node=GPUS + 2)
    result = orch("submit", job, "-i", hpc, timeout=60)
    assert result.returncode == 2, result.stderr
    assert (
        f"gpus_per_node={GPUS + 2} on 2 nodes, but the nodes of Slurm partition 'debug' "
        f"have at most {GPUS} GPUs" in result.stderr
    )
    assert f"hint: lower gpus_per_node (at most {GPUS})" in result.stderr
    assert "Traceback" not in result.stderr
    assert slurm.active_jobs() == []
    checked = orch("check", "-i", hpc, job, timeout=60)
    assert checked.returncode == 3, checked.stderr  # what submit would refuse
    assert f"but the nodes of Slurm partition 'debug' have at most {GPUS} GPUs" in (
        checked.stdout + checked.stderr
    )
    # Past orch's check, Slurm's own refusal is one error too.
    sbatch = slurm.write_inventory(tmp_path / "raw.yaml", sbatch=[f"--gres=gpu:{GPUS + 2}"])
    raw = orch("submit", talk_job(tmp_path, nodes=1), "-i", sbatch, timeout=60)
    assert raw.returncode == 2, raw.stderr
    assert "error: sbatch refused the job" in raw.stderr and "hint: " in raw.stderr
    assert slurm.active_jobs() == []
