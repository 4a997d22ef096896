"""Slurm's words read into orch's: job states, squeue, sacct, sinfo, node lists."""

from __future__ import annotations

import pytest

from orchestrator.agent.kernel.slurm import expand_nodelist
from orchestrator.models.states import JobState
from orchestrator.slurm.jobs import note
from orchestrator.slurm.queue import (
    QueuedJob,
    from_exit_record,
    map_state,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)


@pytest.mark.parametrize(
    ("slurm_state", "state"),
    [
        ("PENDING", JobState.PENDING),
        ("CONFIGURING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("COMPLETED", JobState.SUCCEEDED),
        ("FAILED", JobState.FAILED),
        ("TIMEOUT", JobState.FAILED),
        ("NODE_FAIL", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("PREEMPTED", JobState.FAILED),
        ("CANCELLED", JobState.KILLED),
        ("CANCELLED by 1000", JobState.KILLED),
        ("cancelled+", JobState.KILLED),
        ("SOMETHING_NEW", JobState.UNKNOWN),
    ],
)
def test_slurm_states_map_to_orchs(slurm_state: str, state: JobState) -> None:
    assert map_state(slurm_state) is state


def test_a_failed_jobs_cause_is_slurms_state_and_only_live_jobs_hold_an_allocation() -> None:
    assert QueuedJob("7", "TIMEOUT").cause == "TIMEOUT"
    assert QueuedJob("7", "CANCELLED by 0").cause is None
    assert [QueuedJob("7", s).allocated for s in ("PENDING", "COMPLETING", "COMPLETED")] == [
        True,
        True,
        False,
    ]


def test_squeue_lines_are_read_by_job_id_and_noise_is_skipped() -> None:
    text = "12|RUNNING|None|node[2-4]|debug\n13|PENDING|Resources||debug\n\nslurm_load_jobs error\n"
    jobs = parse_squeue(text)
    assert list(jobs) == ["12", "13"]
    assert jobs["12"] == QueuedJob("12", "RUNNING", "None", "node[2-4]", "debug")
    assert (jobs["13"].state, jobs["13"].reason, jobs["13"].nodelist) == (
        JobState.PENDING,
        "Resources",
        "",
    )


def test_sacct_gives_the_jobs_own_line_not_its_steps() -> None:
    text = "40.batch|FAILED|1:0|node2|\n40|TIMEOUT|0:15|node[2-3]|gpu\n40.0|CANCELLED|0:15|node[2-3]|\n"
    found = parse_sacct(text, "40")
    assert found == QueuedJob("40", "TIMEOUT", "", "node[2-3]", "gpu", 0)
    assert found.state is JobState.FAILED and found.cause == "TIMEOUT"
    assert parse_sacct("", "40") is None


def test_the_batch_scripts_exit_record_stands_in_where_accounting_is_off() -> None:
    assert from_exit_record('{"returncode": 0, "ended": 1}', "5") == QueuedJob(
        "5", "COMPLETED", exit_code=0
    )
    failed = from_exit_record('{"returncode": 1, "ended": 1}\n', "5")
    assert failed is not None and failed.state is JobState.FAILED
    assert from_exit_record(None, "5") is None
    assert from_exit_record("{half", "5") is None


def test_sinfo_lines_sum_to_partitions_and_mark_the_default() -> None:
    text = "debug*|2|up|idle\ndebug*|1|up|allocated\ngpu|4|down|down\nbad line\n"
    parts = parse_sinfo(text)
    assert (parts["debug"].nodes, parts["debug"].default, parts["debug"].available) == (
        3,
        True,
        True,
    )
    assert (parts["gpu"].nodes, parts["gpu"].default, parts["gpu"].available) == (4, False, False)


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("node[2-4]", ["node2", "node3", "node4"]),
        ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
        ("a1", ["a1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
    ],
)
def test_node_lists_expand_as_scontrol_show_hostnames_does(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


def test_status_notes_say_why_a_job_waits_or_how_slurm_ended_it() -> None:
    def spec(**slurm: object) -> dict[str, object]:
        return {"backend": "slurm", "slurm": {"job_id": "9", **slurm}}

    assert note(spec(state="PENDING", reason="Resources")) == " (slurm 9, Resources)"
    assert note(spec(state="RUNNING")) == " (slurm 9)"
    assert note(spec(state="TIMEOUT")) == " (slurm 9, TIMEOUT)"
    assert note({"path": "job.yaml"}) == ""
