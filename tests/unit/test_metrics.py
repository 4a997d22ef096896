"""The numbers a rank prints, found for orch ui's curves (reporting/metrics.py), the
job file's `metrics:` patterns, and the curves read back from a job's log copy with
the time each piece arrived (reporting/curves.py, records/logmirror.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from orchestrator.models.errors import SpecError
from orchestrator.models.job import load_job
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.curves import CurveReader, to_csv
from orchestrator.reporting.metrics import SCAN_CHARS, MetricParser, Reading

PARSER = MetricParser()


def found(line: str, parser: MetricParser = PARSER) -> dict[str, float]:
    return {r.name: r.value for r in parser.parse(line)}


@pytest.mark.parametrize(
    "line", ["loss 1.23", "loss=1.23", "loss: 1.23", "loss = 1.23", "Loss: 1.23", "loss:1.23"]
)
def test_the_three_forms_of_a_loss_are_found(line: str) -> None:
    assert found(line) == {"loss": 1.23}


def test_a_hugging_face_trainer_dict_line_gives_every_pair() -> None:
    line = "{'loss': 2.1, 'grad_norm': 1.52, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert found(line) == {"loss": 2.1, "grad_norm": 1.52, "learning_rate": 5e-05, "epoch": 0.5}
    end = (
        "{'train_runtime': 12.3, 'train_samples_per_second': 80.1, 'train_loss': 1.9, 'epoch': 3.0}"
    )
    assert found(end)["train_loss"] == 1.9
    wrapped = "{'loss': 0.69, 'grad_norm': np.float64(0.53), 'x': tensor(2.5, device='cuda:0')}"
    assert found(wrapped) == {"loss": 0.69, "grad_norm": 0.53, "x": 2.5}


def test_a_training_loops_line_gives_each_number_and_its_step() -> None:
    assert found("epoch 1 loss 0.41 acc 0.9") == {"epoch": 1, "loss": 0.41, "acc": 0.9}
    readings = PARSER.parse("step=120 loss=0.3 lr=3e-4 val_loss 0.5")
    assert readings == [
        Reading("loss", 0.3, 120.0),
        Reading("lr", 3e-4, 120.0),
        Reading("val_loss", 0.5, 120.0),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "at 12:30:01 the job started",
        "[node1 r0] rank 3 of 8",
        "Downloading 50 files",
        "loss nan",
        "version 2.13.0.dev",
        "",
        "x" * 100_000,
    ],
)
def test_lines_without_a_metric_give_nothing(line: str) -> None:
    assert found(line) == {}


def test_only_a_lines_start_is_searched() -> None:
    assert found("x" * SCAN_CHARS + " loss=1") == {}
    assert found("loss=1 " + "x" * 1_000_000) == {"loss": 1}


def test_a_jobs_own_patterns_name_its_metrics_and_step() -> None:
    own = MetricParser([r"val acc (?P<val_acc>[0-9.]+) at it (?P<step>\d+)"])
    assert own.parse("val acc 0.91 at it 400")[0] == Reading("val_acc", 0.91, 400.0)
    quiet = MetricParser([r"tok/s (?P<tps>\d+)"], defaults=False)
    assert found("loss=1 tok/s 900", quiet) == {"tps": 900}


def job_file(tmp_path: Path, metrics: str) -> Path:
    (tmp_path / "train.py").write_text("print('loss 1')\n")
    path = tmp_path / "job.yaml"
    path.write_text(f"script: train.py\nmetrics: {metrics}\n")
    return path


def test_the_job_files_metrics_key_is_loaded_and_checked(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "['acc (?P<acc>[0-9.]+)']"))
    assert job.metrics == ("acc (?P<acc>[0-9.]+)",)
    with pytest.raises(SpecError, match=r"job.yaml:2:\d+: metrics: bad pattern .*no group"):
        load_job(job_file(tmp_path, "['acc [0-9.]+']"))
    with pytest.raises(SpecError, match="not a regular expression"):
        load_job(job_file(tmp_path, "['(?P<acc>[0-9']"))


def test_curves_come_from_the_log_copy_with_each_lines_arrival_time(tmp_path: Path) -> None:
    mirror = LogMirror(tmp_path / "logs", "job-1")
    first = b"epoch 0 loss=2.0\n{'loss': 1.5, 'epoch': 0.5}\n"
    mirror.write("node1", "0", 0, first)
    mirror.write("node1", "node", 0, b"loss=99\n")  # torchrun's own output: no curve
    reader = CurveReader(tmp_path / "logs", "job-1", MetricParser())
    points = reader.read()
    assert [(p.name, p.value, p.step) for p in points] == [
        ("epoch", 0.0, 0.0),
        ("loss", 2.0, 0.0),
        ("loss", 1.5, 1.0),
        ("epoch", 0.5, 1.0),
    ]
    assert all(p.time is not None and p.host == "node1" and p.rank == 0 for p in points)
    # A bar redrawn with \r, then its line's end in a later write: one line, its last state.
    mirror.write("node1", "0", len(first), b"step=7 loss=1.0\rstep=8 lo")
    mirror.write("node1", "0", len(first) + 25, b"ss=0.9\n")
    assert [(p.name, p.value, p.step) for p in reader.read()] == [("loss", 0.9, 8.0)]
    assert reader.read() == [], "each point is read once"
    mirror.close()


def test_a_log_copy_written_without_arrival_times_still_gives_its_curves(tmp_path: Path) -> None:
    folder = tmp_path / "logs" / "job-2" / "node2"
    folder.mkdir(parents=True)
    (folder / "3.log").write_bytes(b"loss: 4\nloss: 3\n")
    points = CurveReader(tmp_path / "logs", "job-2", MetricParser()).read()
    assert [(p.rank, p.value, p.time) for p in points] == [(3, 4.0, None), (3, 3.0, None)]
    rows = list(csv.reader(io.StringIO(to_csv(points))))
    assert rows[0] == ["job", "host", "rank", "attempt", "metric", "step", "time", "value"]
    assert rows[1] == ["job-2", "node2", "3", "0", "loss", "0", "", "4.0"]
