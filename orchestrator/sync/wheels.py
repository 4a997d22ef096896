"""Wheels that travel beside the code (docs/ENVIRONMENTS.md, "Offline hosts").

A job's environment installs on the hosts with no index from wheels pushed with its
code. Those of a `wheels:` directory in the workdir are part of the code already; two
other kinds are grafted onto the pushed tree under CARRIED_WHEELS (manifest.graft), so
that they travel exactly as the code does (by hash, once per host, over the laptop's
link once through the relay, checked by hash on the host):

1. `wheels: DIR` outside the workdir: its `.whl` files, read where they are.
2. `wheels: download`: this machine's pip (`pip download --only-binary=:all:` with the
   hosts' platform, Python version, implementation and ABI, each host's as its probe
   said: `WheelTarget`) resolves and downloads the wheels once per distinct target.
   They are cached owner-only under $ORCH_HOME/wheels, named by a hash of the
   requirements, the target and the index settings pip reads from this machine's
   environment (by hash: an index URL may hold a token), so that the next submit with
   the same requirements downloads nothing. A download is made in a temporary
   directory and published by one rename: a failed or interrupted one leaves nothing
   a later submit uses.

No index URL is ever in an argv: pip reads PIP_INDEX_URL (and pip.conf) itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from orchestrator.models.environment import CARRIED_WHEELS, Environment, WheelTarget
from orchestrator.models.errors import InfraError, InputError
from orchestrator.models.job import JobSpec
from orchestrator.records.home import orch_home, private_dir
from orchestrator.sync.manifest import Tree, encode, graft, scan

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 1800.0  # torch's CUDA wheels are gigabytes
# What pip reads from the environment about where packages come from: part of the
# cache's name (hashed), never of an argv.
INDEX_SETTINGS = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_CONFIG_FILE",
)
_TAG_RE = re.compile(r"^[A-Za-z0-9_.]+$")  # a tag from a host goes in this machine's argv
TAIL_LINES = 12


def carried(job: JobSpec, tree: Tree) -> Tree:
    """`tree` with the wheels of a `wheels:` directory outside the workdir beside its
    code; any other job's tree as it is.

    Raises:
        InputError: the directory cannot be read, or the workdir has a path of its own
            where the wheels go.
    """
    env = job.environment
    if env is None or env.wheels_dir is None:
        return tree
    return graft(tree, CARRIED_WHEELS, _wheel_files([Path(env.wheels_dir)]))


def downloaded(
    job: JobSpec,
    tree: Tree,
    targets: Mapping[str, WheelTarget],
    notice: Callable[[str], None] | None = None,
) -> Tree:
    """`tree` with the wheels of a job with `wheels: download` beside its code, each
    downloaded once per distinct target of its hosts (or found in the cache); any
    other job's tree as it is.

    Args:
        targets: host name -> what its python installs (its probe's `wheel_target`).
        notice: one line where wheels are downloaded.

    Raises:
        InfraError: a download failed: the packages (or pip's last lines) and hosts.
    """
    env = job.environment
    if env is None or not env.download:
        return tree
    by_target: dict[WheelTarget, list[str]] = {}
    for name, target in targets.items():
        by_target.setdefault(target, []).append(name)
    dirs = [download(env, t, hosts, notice) for t, hosts in by_target.items()]
    return graft(tree, CARRIED_WHEELS, _wheel_files(dirs))


def _wheel_files(dirs: Sequence[Path]) -> Tree:
    """The `.whl` files of `dirs` as one tree of bare names (the first of a name wins:
    a pure wheel downloaded for two targets is the same file)."""
    entries = {}
    sources = {}
    for directory in dirs:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".whl"))
        except OSError as exc:
            raise InputError(
                f"wheels: cannot read {directory}: {exc.strerror}",
                "give a directory of wheels that you can read",
            ) from None
        # The stat cache keeps an unchanged wheel from being hashed again.
        for entry in scan(directory, names).entries:
            if entry.path not in entries:
                entries[entry.path] = entry
                sources[entry.path] = str(directory / entry.path)
    body, digest = encode(entries.values())
    root = dirs[0] if dirs else Path(".")
    return Tree(root, tuple(sorted(entries.values(), key=lambda e: e.path)), body, digest, sources)


def index_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """pip's settings of where packages come from, in this machine's environment."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in INDEX_SETTINGS if environ.get(k)}


def cache_key(requirements: Sequence[str], target: WheelTarget, settings: Mapping[str, str]) -> str:
    """The name of one download in the cache: the requirements in order, the target's
    tags, and the index settings by hash (a URL may hold a token: none is kept)."""
    what = [
        list(requirements),
        [target.implementation, target.python_version, target.abi, list(target.platforms())],
        sorted((k, hashlib.sha256(v.encode()).hexdigest()) for k, v in settings.items()),
    ]
    return hashlib.sha256(json.dumps(what, separators=(",", ":")).encode()).hexdigest()[:32]


def download_argv(python: str, target: WheelTarget, dest: str, requirements: str) -> list[str]:
    """This machine's `pip download` of a requirements file's wheels for `target`:
    binary wheels only (a source distribution would be built here, for this machine),
    every platform tag the host accepts. No index in it: pip reads its own settings.

    Raises:
        InfraError: a tag that is not one (a host's probe said something odd).
    """
    tags = [target.implementation, target.python_version, target.abi, *target.platforms()]
    bad = [t for t in tags if not _TAG_RE.match(t)]
    if bad:
        raise InfraError(
            f"environment: a host's python reported the wheel tag {bad[0]!r}",
            "check the host's python: sysconfig.get_platform() and its SOABI",
        )
    argv = [python, "-m", "pip", "download", "--only-binary=:all:", "--no-input"]
    argv += ["--disable-pip-version-check", "--progress-bar", "off", "--dest", dest]
    argv += ["--python-version", target.python_version, "--implementation"]
    argv += [target.implementation, "--abi", target.abi]
    for platform in target.platforms():
        argv += ["--platform", platform]
    return [*argv, "-r", requirements]


def download(
    env: Environment,
    target: WheelTarget,
    hosts: Sequence[str],
    notice: Callable[[str], None] | None = None,
    cache: Path | None = None,
) -> Path:
    """The directory of the wheels of `env` for `target`: from the cache, else
    downloaded by this machine's pip first and published there whole.

    Args:
        hosts: the hosts of this target, for messages.
        cache: the cache (default $ORCH_HOME/wheels).

    Raises:
        InfraError: pip found no version or wheel of a requirement for the target
            (named), or failed otherwise (its last lines); nothing is cached.
    """
    root = private_dir(cache or orch_home() / "wheels")
    key = cache_key(env.requirements, target, index_settings())
    final = root / key
    if final.is_dir():
        log.info("wheels for %s: cached in %s", ", ".join(hosts), final)
        return final
    if notice is not None:
        notice(f"wheels: downloading for {', '.join(hosts)} ({target.describe()})")
    tmp = Path(tempfile.mkdtemp(prefix=f".download-{key}-", dir=root))  # owner-only
    try:
        requirements = tmp / "requirements.txt"
        requirements.write_text("".join(r + "\n" for r in env.requirements))
        dest = tmp / "wheels"
        dest.mkdir(mode=0o700)
        argv = download_argv(sys.executable, target, str(dest), str(requirements))
        try:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=DOWNLOAD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise InfraError(
                f"environment: downloading the wheels for {', '.join(hosts)} took over "
                f"{DOWNLOAD_TIMEOUT_S:.0f} s",
                "check this machine's link to its package index; nothing was started",
            ) from None
        output = proc.stdout.decode(errors="replace")
        if proc.returncode != 0:
            raise failure(env, target, hosts, output)
        for wheel in dest.iterdir():  # owner-only, as everything orch keeps
            wheel.chmod(0o600)
        try:
            os.rename(dest, final)  # published whole
        except OSError:
            if not final.is_dir():  # (else another submit published the same first)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def failure(env: Environment, target: WheelTarget, hosts: Sequence[str], output: str) -> InfraError:
    """The error of a failed `pip download`: the requirements pip found nothing of,
    else its last lines."""
    missing = list(dict.fromkeys(re.findall(r"No matching distribution found for (\S+)", output)))
    where = f"{', '.join(hosts)} ({target.describe()})"
    if "No module named pip" in output:
        return InfraError(
            f"environment: this machine's python ({sys.executable}) has no pip to download "
            f"the wheels for {where}",
            f"install pip for it ({sys.executable} -m ensurepip), or download the wheels "
            "yourself and give wheels: DIR; nothing was started",
        )
    if missing:
        return InfraError(
            f"environment: cannot download {', '.join(missing)} for {where}: no version or "
            f"wheel of it found by this machine's pip ({env.source})",
            "correct the requirement, or check that the index this machine's pip reads "
            "(PIP_INDEX_URL, pip.conf) has a wheel of it for that platform and Python; "
            "nothing was started",
        )
    tail = [line for line in output.splitlines() if line.strip()][-TAIL_LINES:]
    return InfraError(
        f"environment: downloading the wheels for {where} failed:\n"
        + "\n".join("  " + line for line in tail),
        "fix what pip says above (this machine's index: PIP_INDEX_URL, pip.conf); "
        "nothing was started",
    )
