"""The job spec: what to run, where, and how many processes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from orchestrator.models.errors import SpecError
from orchestrator.models.schema import (
    Where,
    check_keys,
    get_env,
    get_int,
    get_mapping,
    get_str,
    get_str_list,
    load_yaml,
)

AUTO = "auto"

_JOB_KEYS = {
    "name": None,
    "workdir": None,
    "script": None,
    "module": None,
    "args": None,
    "nodes": None,
    "hosts": None,
    "labels": None,
    "nproc_per_node": None,
    "env": None,
    "setup": None,
    "rendezvous": None,
    "max_restarts": None,
    "lost_after": None,
    "inventory": None,
    "exclude": None,
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class JobSpec:
    """A validated job file. Paths are absolute; `positions` locate keys for errors."""

    path: str
    name: str
    workdir: Path
    script: str | None
    module: str | None
    args: tuple[str, ...] = ()
    nodes: int | None = None
    hosts: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    nproc_per_node: int | None = None  # None means auto: the host's slots
    env: dict[str, str] = field(default_factory=dict, hash=False)
    setup: str | None = None
    rendezvous_port: int | None = None
    max_restarts: int = 0
    lost_after: int | None = None  # seconds of confirmed silence before a node is lost
    inventory: Path | None = None
    exclude: tuple[str, ...] = ()
    positions: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, hash=False)

    def error(self, key: str, message: str, hint: str = "") -> SpecError:
        """A SpecError pointing at `key` of this job file."""
        line, column = self.positions.get(key, (None, None))
        return SpecError(self.path, message, hint, line, column)

    @property
    def entry(self) -> str:
        """What the job runs, for messages: the script path or `-m module`."""
        return self.script if self.script else f"-m {self.module}"


def load_job(path: Path) -> JobSpec:
    """Load and validate a job file.

    Args:
        path: the YAML file. Relative paths inside it are relative to its directory.

    Returns:
        The validated JobSpec.

    Raises:
        SpecError: missing file, YAML error, unknown or missing key, wrong type, or a
            script that is not inside the workdir.
    """
    shown = str(path)
    where = Where(shown, load_yaml(path, "job"))
    check_keys(where, _JOB_KEYS)
    base = path.resolve().parent

    name = (
        get_str(where, "name") or re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-._") or "job"
    )
    if not _NAME_RE.match(name):
        raise where.error(
            "name", f"invalid job name {name!r}", "use letters, digits, '.', '_' and '-'"
        )

    script, module = get_str(where, "script"), get_str(where, "module")
    if bool(script) == bool(module):
        raise where.error(
            "script" if script else None,
            "give exactly one of 'script' or 'module'"
            if script
            else "missing required key 'script' (or 'module')",
            "add 'script: train.py' (a file in the workdir) or 'module: pkg.train'",
        )

    workdir = (base / (get_str(where, "workdir") or ".")).resolve()
    if not workdir.is_dir():
        raise where.error(
            "workdir", f"workdir {workdir} is not a directory", "point workdir at the code to push"
        )
    if script:
        script = _check_script(where, workdir, script)

    nodes = get_int(where, "nodes", minimum=1)
    hosts = get_str_list(where, "hosts")
    if nodes is not None and hosts and nodes != len(hosts):
        raise where.error(
            "nodes",
            f"nodes={nodes} but {len(hosts)} hosts are listed",
            "drop 'nodes' or make them agree",
        )
    if len(set(hosts)) != len(hosts):
        raise where.error("hosts", "a host is listed twice")

    rendezvous = get_mapping(where, "rendezvous")
    port = None
    if rendezvous is not None:
        rwhere = where.child(rendezvous, "rendezvous.")
        check_keys(rwhere, {"port": None})
        port = get_int(rwhere, "port", minimum=1)
        if port is not None and port > 65535:
            raise rwhere.error(
                "port", f"port {port} is out of range", "use a port between 1024 and 65535"
            )

    inventory = get_str(where, "inventory")
    return JobSpec(
        path=shown,
        name=name,
        workdir=workdir,
        script=script,
        module=module,
        args=get_str_list(where, "args"),
        nodes=nodes,
        hosts=hosts,
        labels=get_str_list(where, "labels"),
        nproc_per_node=_load_nproc(where),
        env=get_env(where, "env"),
        setup=get_str(where, "setup"),
        rendezvous_port=port,
        max_restarts=get_int(where, "max_restarts", default=0, minimum=0) or 0,
        lost_after=get_int(where, "lost_after", minimum=3),
        inventory=(base / inventory).resolve() if inventory else None,
        exclude=_load_exclude(where),
        positions=dict(where.mapping.positions),
    )


def pattern_error(pattern: str) -> str | None:
    """Why no gitignore matcher can read `pattern` (`!` alone, a lone backslash,
    `[z-a]`), or None: the one rule for `exclude:` and the workdir's ignore files."""
    try:
        pathspec.GitIgnoreSpec.from_lines([pattern])
    except (ValueError, re.error) as exc:
        return str(exc)
    return None


def _load_exclude(where: Where) -> tuple[str, ...]:
    """The `exclude:` patterns, each one a gitignore pattern that can be read."""
    patterns = get_str_list(where, "exclude")
    for pattern in patterns:
        if (why := pattern_error(pattern)) is not None:
            raise where.error(
                "exclude",
                f"bad pattern {pattern!r}: {why}",
                "write gitignore patterns, e.g. data/ or *.ckpt",
            )
    return patterns


def _check_script(where: Where, workdir: Path, script: str) -> str:
    """The script's path relative to the workdir: where it will be on every host."""
    candidate = (workdir / script).resolve()
    if not candidate.is_relative_to(workdir):
        raise where.error(
            "script",
            f"script {script} is outside the workdir {workdir}",
            "only the workdir is pushed: move the script into it",
        )
    if not candidate.is_file():
        raise where.error(
            "script",
            f"script {script} not found in workdir {workdir}",
            "give the script's path relative to the workdir",
        )
    return candidate.relative_to(workdir).as_posix()


def _load_nproc(where: Where) -> int | None:
    value = where.mapping.get("nproc_per_node", AUTO)
    if value == AUTO:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.error(
            "nproc_per_node",
            f"expected 'auto' or a positive integer, got {value!r}",
            "write nproc_per_node: auto (the host's slots) or a number",
        )
    return value
