"""`orch stack` of a Slurm job: one `srun --overlap` from the login node reads every node
of the allocation (tests/cluster/slurm.py: node1 the login node, node2..node4 compute
nodes, one shared home), py-spy carried once to the shared home; the odd rank named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster import OrchRunner, SlurmCluster
from tests.support import assert_slurm_clean, job_id_of, slurm_job_root, wait_for, write_workdir_job

pytestmark = [pytest.mark.cluster, pytest.mark.slurm, pytest.mark.xdist_group("slurm-stack")]

# No torch import: rank 1 sleeps in load_batch, the others in wait_peers.
HANG = """\
import os, time
def load_batch():
    time.sleep(600)
def wait_peers():
    time.sleep(600)
print(f"ready {os.environ['RANK']}", flush=True)
if os.environ["RANK"] == "1":
    load_batch()
else:
    wait_peers()
"""


def test_stack_reads_every_node_of_a_slurm_job_through_srun(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    work = tmp_path / "hang"
    work.mkdir()
    (work / "hang.py").write_text(HANG)
    job = write_workdir_job(tmp_path, work, "hang.py", name="hang", nodes=2)
    submitted = orch("submit", "-d", job, "-i", hpc, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    root = slurm_job_root(slurm, job_id)

    def ready() -> bool:
        logs = list(root.glob("*/logs/rank-*.log"))
        return len(logs) == 2 and all(b"ready" in p.read_bytes() for p in logs)

    try:
        wait_for(ready, 90, "both ranks' first lines")
        taken = orch("stack", job_id, "--json", timeout=120)
        assert taken.returncode == 0, taken.stderr
        view = json.loads(taken.stdout)
        groups = {g["frames"][0]["function"]: g for g in view["groups"]}
        assert set(groups) == {"wait_peers", "load_batch"}, view["groups"]
        assert [r["rank"] for r in groups["load_batch"]["ranks"]] == [1]
        assert groups["load_batch"]["frames"][0]["file"] == "hang.py"
        assert {r["via"] for r in view["ranks"]} == {"py-spy"}
        assert Path(view["saved"]).is_file()
        one = orch("stack", job_id, "--rank", "0", timeout=120)
        assert one.returncode == 0, one.stderr
        assert one.stdout.splitlines()[0].endswith(" r0") and "load_batch" not in one.stdout
    finally:
        killed = orch("kill", job_id, timeout=120)
    assert killed.returncode == 0, killed.stderr
    assert_slurm_clean(slurm)
    ended = orch("stack", job_id, timeout=60)
    assert ended.returncode == 2 and "has ended" in ended.stderr
    assert "Traceback" not in ended.stderr
