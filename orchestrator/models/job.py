"""The job spec: what to run, where, and how many processes."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.models import placeholders
from orchestrator.models.environment import (
    CARRIED_WHEELS,
    DOWNLOAD,
    Environment,
    parse_requirement,
    read_pyproject,
    read_requirements,
)
from orchestrator.models.errors import SpecError, place
from orchestrator.models.job_run import (
    PRIORITIES,
    PRIORITY_HINT,
    STALL_HINT,
    STALL_MIN_S,
    load_forward,
    load_metrics,
    load_on_stall,
    load_preload,
    load_priority,
    load_stall_after,
    load_warm,
    pattern_error,
)
from orchestrator.models.notify import check_flag, load_notify
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
TORCHRUN, PYTHON, LEGACY_LAUNCH = "torchrun", "python", "torch.distributed.launch"
LAUNCHERS = (TORCHRUN, PYTHON, LEGACY_LAUNCH)
LOCAL_RANK_ARGS = ("--local-rank", "--local_rank")

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
    "launcher": None,
    "local_rank_arg": None,
    "outputs": None,
    "restarts": None,
    "gpus_per_node": None,
    "preload": None,
    "warm": None,
    "warm_idle": None,
    "stall_after": None,
    "on_stall": None,
    "environment": None,
    "wheels": None,
    "setup_inputs": None,
    "forward": None,
    "metrics": None,
    "notify": None,
    "priority": None,
}
OUTPUTS_FROM = ("rank0", "all")
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
    launcher: str = TORCHRUN  # one of LAUNCHERS
    local_rank_arg: str | None = None  # the flag torch.distributed.launch passes
    outputs: tuple[str, ...] = ()  # globs in ORCH_OUTPUT_DIR, copied back when the job ends
    outputs_from: str = "rank0"  # "rank0": node rank 0's; "all": every node's, per host
    restarts: int = 0  # whole-job restarts after a node failed or was lost
    gpus_per_node: int | None = None  # GPUs each node leases (None: one per process)
    # Warm starts (docs/WARM.md): the modules a host's warm interpreter imports,
    # how long it waits unused, and why the job starts cold instead (None: it may start
    # warm; `warm: false` or `orch submit --cold` say why not).
    preload: tuple[str, ...] = ("torch",)
    warm_idle: int = 600
    cold: str | None = None
    # The stall watchdog (docs/STACKS.md): seconds without a line from any rank before
    # every rank's stack is taken and the job fails as stalled (None: off); `warn`: only
    # reported, once per stall.
    stall_after: int | None = None
    on_stall: str = "fail"
    # The packages each host's virtual environment holds over its python
    # (docs/ENVIRONMENTS.md); None: the host's python as it is.
    environment: Environment | None = None
    # Workdir paths (fnmatch patterns) whose contents, with the setup text, interpreter
    # and environment, key `setup:` instead of the code version (docs/CODE_PUSH.md).
    setup_inputs: tuple[str, ...] | None = None
    # Ports of the master's host at the laptop's 127.0.0.1 while an attached submit
    # follows the job (`orch forward`): (port, local port; None: the same number).
    forward: tuple[tuple[int, int | None], ...] = ()
    # Regular expressions whose named groups are numbers `orch ui` plots, beside the
    # forms it finds by default (reporting/metrics.py).
    metrics: tuple[str, ...] = ()
    # Where word of the job's events goes (models/notify.py): a webhook's URL or a shell
    # command; None: nowhere (the SSH backend then takes the user's default).
    notify: str | None = None
    # Its place in a shared host's line (docs/SHARING.md): low, normal or high.
    priority: str = "normal"
    positions: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, hash=False)

    def error(self, key: str, message: str, hint: str = "") -> SpecError:
        """A SpecError pointing at `key` of this job file."""
        line, column = self.positions.get(key, (None, None))
        return SpecError(self.path, message, hint, line, column)

    def where(self, key: str) -> str:
        """Where `key` is in this job file, as errors name it: `job.yaml:7:1`."""
        return place(self.path, *self.positions.get(key, (None, None)))

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
    args, env = get_str_list(where, "args"), get_env(where, "env")
    _check_placeholders(where, "args", args)
    _check_placeholders(where, "env", tuple(env.values()))
    launcher = _load_launcher(where)
    outputs, outputs_from = _load_outputs(where)
    max_restarts = get_int(where, "max_restarts", default=0, minimum=0) or 0
    if launcher == PYTHON and max_restarts:
        raise where.error(
            "max_restarts",
            "max_restarts restarts torchrun's workers, and launcher python has no torchrun",
            "drop max_restarts, or use launcher: torchrun",
        )
    return JobSpec(
        path=shown,
        name=name,
        workdir=workdir,
        script=script,
        module=module,
        args=args,
        nodes=nodes,
        hosts=hosts,
        labels=get_str_list(where, "labels"),
        nproc_per_node=_load_nproc(where),
        env=env,
        setup=get_str(where, "setup"),
        rendezvous_port=port,
        max_restarts=max_restarts,
        lost_after=get_int(where, "lost_after", minimum=3),
        inventory=(base / inventory).resolve() if inventory else None,
        exclude=_load_exclude(where),
        launcher=launcher,
        local_rank_arg=_load_local_rank_arg(where, launcher, workdir, script, module),
        outputs=outputs,
        outputs_from=outputs_from,
        restarts=get_int(where, "restarts", default=0, minimum=0) or 0,
        gpus_per_node=get_int(where, "gpus_per_node", minimum=0),
        preload=load_preload(where),
        warm_idle=get_int(where, "warm_idle", default=600, minimum=1) or 600,
        cold=load_warm(where),
        stall_after=load_stall_after(where),
        on_stall=load_on_stall(where),
        environment=_load_environment(where, base, workdir),
        setup_inputs=_load_setup_inputs(where),
        forward=load_forward(where),
        metrics=load_metrics(where),
        notify=load_notify(where),
        priority=load_priority(where),
        positions=dict(where.mapping.positions),
    )


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


def _load_setup_inputs(where: Where) -> tuple[str, ...] | None:
    """`setup_inputs:`: the workdir's files that `setup:` reads (patterns; [] for none)."""
    if where.mapping.get("setup_inputs") is None:
        return None
    patterns = get_str_list(where, "setup_inputs")
    if not get_str(where, "setup"):
        raise where.error(
            "setup_inputs", "setup_inputs: without setup:", "drop setup_inputs:, or add setup:"
        )
    for pattern in patterns:
        if not pattern or pattern.startswith("/"):
            raise where.error(
                "setup_inputs",
                f"bad path {pattern!r}",
                "paths in the workdir, relative to it: [requirements.txt, setup/*.sh]",
            )
    return patterns


def _load_environment(where: Where, base: Path, workdir: Path) -> Environment | None:
    """`environment:` (a requirements file in the workdir, or a list) and `wheels:` (a
    directory inside the workdir), each line checked as pip would read it."""
    value = where.mapping.get("environment")
    wheels = get_str(where, "wheels")
    if value is None:
        if wheels is not None:
            raise where.error(
                "wheels", "wheels: without environment:", "add environment: requirements.txt"
            )
        return None
    if isinstance(value, list):
        requirements = []
        for item in get_str_list(where, "environment"):
            try:
                found = parse_requirement(item)
            except ValueError as exc:
                raise where.error(
                    "environment", str(exc), "list requirements as pip reads them: numpy==2.3.1"
                ) from None
            if found is not None:
                requirements.append(found)
        env = Environment(tuple(requirements), where.path)
    else:
        name = get_str(where, "environment") or ""
        path = (workdir / name).resolve()
        if not path.is_relative_to(workdir) or not path.is_file():
            raise where.error(
                "environment",
                f"requirements file {name} not found in workdir {workdir}",
                "give a requirements file's path relative to the workdir, or a list "
                "of requirements: environment: [numpy==2.3.1, tqdm]",
            )
        read = read_pyproject if path.name == "pyproject.toml" else read_requirements
        env = Environment(read(path, str(path)), name)
    if wheels is None:
        return env
    try:
        return with_wheels(env, wheels, base, workdir)
    except ValueError as exc:
        raise where.error("wheels", str(exc), WHEELS_HINT) from None


WHEELS_HINT = (
    "give a directory of wheels (in the workdir or not: they travel with the code), "
    "or wheels: download for the controller to download them (docs/ENVIRONMENTS.md)"
)


def with_wheels(env: Environment, wheels: str, base: Path, workdir: Path) -> Environment:
    """`env` installed from `wheels`: `download` (the controller downloads them), or a
    directory (relative to `base`): one in the workdir travels as part of the code, one
    outside it is carried beside the code (CARRIED_WHEELS). `./download` names a
    directory of that name.

    Raises:
        ValueError: not a directory, saying which.
    """
    if wheels == DOWNLOAD:
        return Environment(env.requirements, env.source, CARRIED_WHEELS, download=True)
    directory = (base / wheels).resolve()
    if not directory.is_dir():
        raise ValueError(f"{wheels} is not a directory ({directory})")
    if directory.is_relative_to(workdir):
        return Environment(env.requirements, env.source, directory.relative_to(workdir).as_posix())
    return Environment(env.requirements, env.source, CARRIED_WHEELS, wheels_dir=str(directory))


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


def _check_placeholders(where: Where, key: str, values: tuple[str, ...]) -> None:
    for value in values:
        for name in placeholders.unknown(value):
            raise where.error(
                key, f"unknown placeholder {{{name}}} in {value!r}", placeholders.suggestion(name)
            )


def _load_launcher(where: Where) -> str:
    launcher = get_str(where, "launcher") or TORCHRUN
    if launcher not in LAUNCHERS:
        close = difflib.get_close_matches(launcher, LAUNCHERS, n=1)
        maybe = f"did you mean '{close[0]}'? " if close else ""
        raise where.error(
            "launcher", f"unknown launcher {launcher!r}", f"{maybe}one of: {', '.join(LAUNCHERS)}"
        )
    return launcher


def _load_local_rank_arg(
    where: Where, launcher: str, workdir: Path, script: str | None, module: str | None
) -> str | None:
    """The flag that carries each worker's local rank under torch.distributed.launch:
    the job file's `local_rank_arg`, else the spelling the script's own source uses
    (argparse accepts only what it declares), else `--local-rank` (torch 2's)."""
    given = get_str(where, "local_rank_arg")
    if given is not None and launcher != LEGACY_LAUNCH:
        raise where.error(
            "local_rank_arg",
            f"local_rank_arg applies to launcher: {LEGACY_LAUNCH} only",
            f"drop it, or set launcher: {LEGACY_LAUNCH}",
        )
    if given is not None and given not in LOCAL_RANK_ARGS:
        raise where.error(
            "local_rank_arg", f"expected one of {', '.join(LOCAL_RANK_ARGS)}, got {given!r}"
        )
    if launcher != LEGACY_LAUNCH or given is not None:
        return given
    return local_rank_spelling(entry_source(workdir, script, module))


def entry_source(workdir: Path, script: str | None, module: str | None) -> str:
    """The text of the job's script, or of its module when it lies in the workdir
    (`pkg.train` as pkg/train.py or pkg/train/__main__.py); "" when neither is found."""
    relative = [script] if script else []
    if module:
        stem = module.replace(".", "/")
        relative = [f"{stem}.py", f"{stem}/__main__.py"]
    for name in relative:
        try:
            with (workdir / name).open("rb") as f:
                return f.read(4 << 20).decode("utf-8", "replace")
        except OSError:
            continue
    return ""


def local_rank_spelling(source: str) -> str:
    """`--local_rank` when the source declares only that spelling, else `--local-rank`."""
    underscore = re.search(r"""["']--local_rank["']""", source) is not None
    hyphen = re.search(r"""["']--local-rank["']""", source) is not None
    return "--local_rank" if underscore and not hyphen else "--local-rank"


def _load_outputs(where: Where) -> tuple[tuple[str, ...], str]:
    """`outputs: [globs]` or `outputs: {from: rank0|all, paths: [globs]}`: what comes
    back from ORCH_OUTPUT_DIR, each glob relative to it and inside it."""
    value = where.mapping.get("outputs")
    source = "rank0"
    if isinstance(value, dict):
        owhere = where.child(value, "outputs.")  # type: ignore[arg-type]
        check_keys(owhere, {"from": None, "paths": None}, required=("paths",))
        source = get_str(owhere, "from") or source
        if source not in OUTPUTS_FROM:
            raise owhere.error("from", f"expected rank0 or all, got {source!r}")
        paths = get_str_list(owhere, "paths")
    else:
        paths = get_str_list(where, "outputs")
    for path in paths:
        parts = path.split("/")
        if path.startswith("/") or ".." in parts or not path.strip("/"):
            raise where.error(
                "outputs",
                f"output path {path!r} is not inside the output directory",
                "give paths or globs relative to ORCH_OUTPUT_DIR, e.g. checkpoints/*.pt",
            )
    return paths, source


@dataclass(frozen=True)
class Overrides:
    """What `orch submit` options change in a job file, for a sweep without YAML copies.

    `args` extends the job's args (a flag given again wins in argparse: the last one
    counts), or replaces them with `replace_args`.
    """

    env: dict[str, str] = field(default_factory=dict)
    nodes: int | None = None
    name: str | None = None
    nproc_per_node: int | None = None
    args: tuple[str, ...] = ()
    replace_args: bool = False
    no_wait: bool = False  # where the GPUs or slots are held, fail at once (exit 3)
    cold: bool = False  # start cold even where a warm interpreter waits (--cold)
    stall_after: int | None = None  # --stall-after: the job's stall_after: instead
    wheels: str | None = None  # --wheels: the job's wheels: instead (a directory, or download)
    notify: str | None = None  # --notify: the job's notify: instead
    priority: str | None = None  # --priority: the job's priority: instead


def with_overrides(job: JobSpec, over: Overrides) -> JobSpec:
    """The job with `over` applied, checked as the job file's own keys are.

    Raises:
        InputError: a bad value, naming the option (exit 2).
    """
    from dataclasses import replace

    from orchestrator.models.errors import InputError

    if over.name is not None and not _NAME_RE.match(over.name):
        raise InputError(
            f"--name: invalid job name {over.name!r}", "use letters, digits, '.', '_' and '-'"
        )
    if over.nodes is not None and job.hosts and over.nodes != len(job.hosts):
        raise InputError(
            f"--nodes {over.nodes}, but {job.path} lists {len(job.hosts)} hosts",
            "drop --nodes, or the job's hosts: list",
        )
    for key in over.env:
        if not key or not key.replace("_", "a").isalnum() or not key.isascii() or key[0].isdigit():
            raise InputError(
                f"--env: {key!r} is not a valid environment variable name", "write --env NAME=value"
            )
    if over.stall_after is not None and over.stall_after < STALL_MIN_S:
        raise InputError(
            f"--stall-after {over.stall_after}: must be at least {STALL_MIN_S} s", STALL_HINT
        )
    if over.priority is not None and over.priority not in PRIORITIES:
        raise InputError(f"--priority: unknown priority {over.priority!r}", PRIORITY_HINT)
    environment = job.environment
    if over.wheels is not None:
        if environment is None:
            raise InputError(
                f"--wheels {over.wheels}: {job.path} has no environment:",
                "add environment: requirements.txt (or a list) to the job file",
            )
        try:
            environment = with_wheels(environment, over.wheels, Path.cwd(), job.workdir)
        except ValueError as exc:
            raise InputError(f"--wheels {exc}", WHEELS_HINT) from None
    for value in (*over.args, *over.env.values()):
        for name in placeholders.unknown(value):
            raise InputError(
                f"unknown placeholder {{{name}}} in {value!r}", placeholders.suggestion(name)
            )
    return replace(
        job,
        name=over.name or job.name,
        nodes=over.nodes if over.nodes is not None else job.nodes,
        nproc_per_node=over.nproc_per_node
        if over.nproc_per_node is not None
        else job.nproc_per_node,
        env={**job.env, **over.env},
        args=over.args if over.replace_args else (*job.args, *over.args),
        cold="--cold" if over.cold else job.cold,
        stall_after=over.stall_after if over.stall_after is not None else job.stall_after,
        environment=environment,
        notify=check_flag(over.notify) if over.notify is not None else job.notify,
        priority=over.priority or job.priority,
    )
