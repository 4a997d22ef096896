"""Hostile job and inventory files get one `error:` (a SpecError: exit 2), within a
second and in bounded memory, never an internal error."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.models.errors import SpecError
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job

LAUGHS = (
    "\n".join(
        ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
        + [
            f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        ]
    )
    + "\nhosts: *i\n"
)


def refused_quickly(load: object, path: Path) -> SpecError:
    started = time.monotonic()
    with pytest.raises(SpecError) as info:
        load(path)  # type: ignore[operator]
    # Not a speed target (those are in bench/): a guard against the exponential and
    # the unbounded, which took 21 s and 2 GB, or forever.
    assert time.monotonic() - started < 5.0
    return info.value


@pytest.mark.parametrize("load", [load_job, load_inventory])
def test_alias_expansion_is_refused(tmp_path: Path, load: object) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    assert "YAML aliases" in refused_quickly(load, path).message


@pytest.mark.parametrize("load", [load_job, load_inventory])
def test_deep_nesting_is_refused(tmp_path: Path, load: object) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 5_000 + "]" * 5_000 + "\n")
    refused_quickly(load, path)


def test_a_name_too_long_a_symlink_loop_and_dev_zero_are_refused(tmp_path: Path) -> None:
    assert "cannot read" in refused_quickly(load_job, tmp_path / ("x" * 5000)).message
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    assert "cannot read" in refused_quickly(load_job, loop).message
    assert "larger than 1 MB" in refused_quickly(load_inventory, Path("/dev/zero")).message
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00hosts")
    assert "not UTF-8" in refused_quickly(load_inventory, tmp_path / "bin.yaml").message


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.one_of(
        st.binary(max_size=300),
        st.text(alphabet="abcdefhostnmeaddr:-[]{}&*!|>'\"\n #,.0123456789", max_size=300).map(
            str.encode
        ),
    )
)
def test_any_bytes_give_a_job_or_a_spec_error(tmp_path: Path, text: bytes) -> None:
    for load, name in ((load_job, "job.yaml"), (load_inventory, "inv.yaml")):
        path = tmp_path / name
        path.write_bytes(text)
        with contextlib.suppress(SpecError):
            load(path)  # type: ignore[operator]


@pytest.mark.parametrize("pattern", ["!", "\\", "[z-a]"])
def test_a_bad_exclude_pattern_is_refused_at_load_at_its_line(tmp_path: Path, pattern: str) -> None:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nscript: train.py\nexclude:\n  - data/\n  - '{pattern}'\n")
    with pytest.raises(SpecError, match="bad pattern") as info:
        load_job(path)
    assert info.value.line == 4  # where the list starts


def test_a_bad_gitignore_line_stops_a_dry_run_naming_the_file_and_line(tmp_path: Path) -> None:
    from tests.unit.test_cli import orch_process

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("")
    (work / "sub").mkdir()
    (work / "sub" / ".gitignore").write_text("*.pyc\n[z-a]\n")
    (tmp_path / "job.yaml").write_text(f"name: j\nworkdir: {work}\nscript: train.py\n")
    result = orch_process("submit", tmp_path / "job.yaml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"bad ignore pattern '[z-a]' at {work}/sub/.gitignore:2" in result.stderr
    assert "Traceback" not in result.stderr
    (work / "sub" / ".gitignore").write_text("*.pyc\n")
    result = orch_process("submit", tmp_path / "job.yaml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0 and "pushes 2 files from " in result.stdout
