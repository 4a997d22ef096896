"""A Slurm partition's nodes and jobs read from sinfo and squeue, as `orch status
--hosts` shows them, and a job's GPUs checked against them before sbatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.models.errors import InputError, SpecError
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.slurm import nodes
from orchestrator.slurm.submit import slurm_job
from tests.unit.conftest import WriteFile

SINFO = """\
node2|debug*|gpu:2|2|allocated
node3|debug*|gpu:2|2|idle
node4|debug*|gpu:tesla:2(S:0-1)|2|down*
node9|other|(null)|8|idle
"""
SQUEUE = """\
41|alice|RUNNING|node[2-3]|gres:gpu:1|4|2|2026-11-25T19:30:02|2026-11-25T19:30:00|train
42|bob|PENDING||gres:gpu:2|2|1|N/A|2026-11-25T19:31:00|wait|ing
"""


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:2", 2),
        ("gpu:a100:4(S:0-1)", 4),
        ("gres:gpu:3", 3),
        ("gres/gpu=2", 2),
        ("nvme:1,gpu:2", 2),
        ("gpu", 1),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_the_gpus_of_a_gres_string(gres: str, count: int) -> None:
    assert nodes.gres_gpus(gres) == count


def test_a_nodes_gpus_are_rows_held_by_the_job_slurm_runs_there_or_free() -> None:
    found = nodes.parse_nodes(SINFO, "debug")
    assert [(n.name, n.gpus, n.state) for n in found] == [
        ("node2", 2, "allocated"),
        ("node3", 2, "idle"),
        ("node4", 2, "down*"),
    ]
    jobs = nodes.parse_jobs(SQUEUE)
    assert jobs[0].nodes == ("node2", "node3") and (jobs[0].gpus, jobs[0].cpus) == (1, 2)
    assert jobs[1].name == "wait|ing" and jobs[1].nodes == ()
    rows = nodes.unit_rows(found, jobs, {"41": "train-ab12"})
    assert [(r.host, r.unit, r.state, r.job) for r in rows] == [
        ("node2", 0, "held", "train-ab12"),
        ("node2", 1, "free", None),
        ("node3", 0, "held", "train-ab12"),
        ("node3", 1, "free", None),
        ("node4", 0, "down*", None),
        ("node4", 1, "down*", None),
    ]
    assert rows[0].user == "alice" and rows[0].since is not None
    (waiting,) = nodes.queue_rows("debug", jobs, {})
    assert waiting.job == "slurm 42 (wait|ing)" and (waiting.kind, waiting.count) == (
        "gpu",
        2,
    )


def test_a_node_without_gpus_shows_its_cpus_as_slots() -> None:
    found = nodes.parse_nodes(SINFO, "other")
    rows = nodes.unit_rows(found, [], {})
    assert {(r.kind, r.state) for r in rows} == {("slot", "free")} and len(rows) == 8


def test_more_gpus_than_the_partitions_nodes_have_names_the_job_files_key(
    write: WriteFile,
) -> None:
    write("train.py", "")
    inventory = load_inventory(write("hpc.yaml", "slurm: {login: l1}\n"))
    job = load_job(write("job.yaml", "script: train.py\nnodes: 2\ngpus_per_node: 4\n"))
    partition = nodes.parse_nodes(SINFO, "debug")
    with pytest.raises(SpecError) as caught:
        nodes.check_gpus(slurm_job(job, inventory, "j-1"), "debug", partition)
    assert (
        "gpus_per_node=4 on 2 nodes, but the nodes of Slurm partition 'debug' have at most 2"
        in (caught.value.message)
    )
    assert caught.value.message.startswith(f"{job.path}:3:")
    assert "lower gpus_per_node (at most 2)" in caught.value.hint
    fits = load_job(write("fits.yaml", "script: train.py\nnodes: 3\ngpus_per_node: 2\n"))
    nodes.check_gpus(slurm_job(fits, inventory, "j-2"), "debug", partition)


def test_the_inventorys_gpus_per_node_is_named_when_the_job_says_none(
    write: WriteFile, tmp_path: Path
) -> None:
    write("train.py", "")
    inventory = load_inventory(write("hpc.yaml", "slurm: {login: l1, gpus_per_node: 8}\n"))
    job = load_job(write("job.yaml", "script: train.py\nnodes: 1\n"))
    with pytest.raises(InputError, match=r"slurm.gpus_per_node: gpus_per_node=8 on 1 node, "):
        nodes.check_gpus(
            slurm_job(job, inventory, "j-1"), "debug", nodes.parse_nodes(SINFO, "debug")
        )
