"""`env ensure|list|gc`: the jobs' virtual environments on this host
(docs/ENVIRONMENTS.md).

An environment is a venv over the host's python that sees exactly the packages that
python sees (each of its site directories, after the environment's own), named by
its key: the controller's digest of the requirements and wheels, this interpreter and
this machine. Each lives in `WORKDIR/envs/<key>` (the user's own, owner-only):

1. built in a temporary directory beside it (`.build-<key>-*`) and published whole by
   one rename, so that a build killed halfway (Ctrl-C, `orch kill`, a full disk)
   leaves nothing any job uses; its leftovers go at the next build of that key;
2. one build at a time per key: `<key>.lock` is held (flock) while a build runs, so a
   second job waits for the first and then uses what it built; hosts sharing the
   workdir's filesystem share the environment and its lock;
3. installed with uv where the host has it (much faster; it honours the same
   requirements), else with pip (the host python's own, through the system site
   packages, else ensurepip's): orch writes no installer;
4. `orch-env.json` inside records what it holds; its mtime is the last use (`env list`,
   `env gc`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from ..kernel.fileio import read_json, write_json
from ..kernel.messages import parse_message
from ..kernel.replies import EnvList, EnvReady, EnvRow
from ..kernel.requests import EnvRequest

RECORD = "orch-env.json"
BUILD_PREFIX = ".build-"
TAIL_LINES = 12
_SITES = "import site,json;print(json.dumps(site.getsitepackages()))"


def main(args: list[str]) -> int:
    if args[:1] == ["ensure"] and len(args) == 2:
        os.chdir(os.path.expanduser(args[1]))
        try:
            request = parse_message(EnvRequest, json.loads(sys.stdin.read()))
        except ValueError as exc:
            print(json.dumps({"error": f"the environment request: {exc}"}))
            return 2
        reply = ensure(request)
        print(reply.to_json())
        return 0 if reply.error is None else 1
    if args[:1] == ["ready"] and len(args) == 3:  # orch check: built here, or not yet
        print(EnvReady(python=ready_python(args[1], args[2])).to_json())
        return 0
    if args[:1] == ["list"] and len(args) == 2:
        print(EnvList(envs=listing(os.path.expanduser(args[1]))).to_json())
        return 0
    if args[:1] == ["gc"] and len(args) == 3:
        root = os.path.expanduser(args[1])
        removed = collect(root, float(args[2]))
        print(EnvList(envs=listing(root), removed=removed).to_json())
        return 0
    sys.stderr.write(
        "usage: env ensure JOB_DIR | env ready ENVS DIGEST | env list ENVS | env gc ENVS DAYS\n"
    )
    return 2


def env_key(digest: str) -> str:
    """The environment's name on this host: the controller's digest, this interpreter
    (as named, and what it resolves to: two venvs over one Python differ) and its
    version, and the machine."""
    import hashlib

    python = os.path.abspath(sys.executable)
    # os.uname, not platform.machine: importing platform costs every push ~10 ms.
    machine = os.uname().machine
    what = [digest, python, os.path.realpath(python), sys.version, sys.platform, machine]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def ready_python(envs: str, digest: str) -> str | None:
    """The python of the environment `digest` where it is built here (its use noted),
    else None: what the code push's snapshot answers, so that a later job with the same
    environment needs no round trip of its own for it."""
    root = os.path.expanduser(envs)
    try:
        st = os.stat(root)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None  # `ensure` refuses it, saying why
    final = os.path.join(root, env_key(digest))
    return os.path.join(final, "bin", "python") if _ready(final) else None


def ensure(request: EnvRequest) -> EnvReady:
    """The environment of `request` on this host, built first where it is missing."""
    import fcntl

    root = os.path.expanduser(request.envs)
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.stat(root)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return EnvReady(error=f"{root} is not this user's alone: refusing to use it")
    key = env_key(request.digest)
    final = os.path.join(root, key)
    python = os.path.join(final, "bin", "python")
    if _ready(final):  # the common case: no lock, one stat
        return EnvReady(key=key, python=python)
    started = time.time()
    fd = os.open(os.path.join(root, key + ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a build of the same key elsewhere: wait for it
        if _ready(final):
            return EnvReady(key=key, python=python, seconds=time.time() - started)
        _clear_leftovers(root, key)
        reply = _build(request, root, key, final)
        reply.seconds = time.time() - started
        return reply
    finally:
        os.close(fd)


def _ready(final: str) -> bool:
    record = os.path.join(final, RECORD)
    if not os.path.isfile(record):
        return False
    with contextlib.suppress(OSError):
        os.utime(record)  # its last use, for env list and gc
    return True


def _clear_leftovers(root: str, key: str) -> None:
    """A killed build's temporary directory (only ever removed under the key's lock)."""
    import shutil

    for name in os.listdir(root):
        if name.startswith(f"{BUILD_PREFIX}{key}-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _build(request: EnvRequest, root: str, key: str, final: str) -> EnvReady:
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{key}-", dir=root)
    try:
        error = _make(request, tmp)
        if error is not None:
            return error
        _relocate(tmp, final)
        write_json(
            os.path.join(tmp, RECORD),
            {"requirements": list(request.requirements), "digest": request.digest},
        )
        os.rename(tmp, final)  # published whole
    except OSError as exc:  # a full disk, most often
        return EnvReady(error=f"cannot build the environment in {root}: {exc}")
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    installer = "uv" if find_uv() else "pip"
    return EnvReady(
        key=key, python=os.path.join(final, "bin", "python"), built=True, installer=installer
    )


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    import subprocess

    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=None if env is None else {**os.environ, **env},
    )
    return proc.returncode, proc.stdout.decode(errors="replace")


def _make(request: EnvRequest, tmp: str) -> EnvReady | None:
    """The venv in `tmp`, its packages installed; an error reply, or None."""
    code, out = _run([sys.executable, "-m", "venv", "--without-pip", tmp])
    if code != 0:
        return EnvReady(error="python -m venv failed", tail=_tail(out))
    py = os.path.join(tmp, "bin", "python")
    # The environment sees what the host python sees, no more: each of its site
    # directories becomes one of the environment's (a .pth line each, so that their own
    # .pth files run: editable installs, say), after the environment's own packages.
    # Not --system-site-packages: where the host python is a venv, that reaches its
    # base interpreter's packages, which the host python itself does not see.
    code, theirs = _run([sys.executable, "-c", _SITES])
    code2, own = _run([py, "-c", _SITES])
    if code != 0 or code2 != 0:
        return EnvReady(error="cannot read the host python's site directories", tail=_tail(theirs))
    mine = json.loads(own.strip().splitlines()[-1])
    extra = [p for p in dict.fromkeys(json.loads(theirs.strip().splitlines()[-1])) if p not in mine]
    if extra:
        with open(os.path.join(mine[0], "_orch_host_python.pth"), "w") as f:
            f.write("".join(f"import site; site.addsitedir({p!r})\n" for p in extra))
    wanted = os.path.join(tmp, "orch-requirements.txt")
    with open(wanted, "w") as f:
        f.write("".join(r + "\n" for r in request.requirements))
    source = []
    if request.wheels is not None:
        source = [
            "--no-index",
            "--find-links",
            os.path.abspath(os.path.join("code", request.wheels)),
        ]
    # No bytecode is compiled at install (uv's default; pip's --no-compile): an
    # environment is this user's and writable, so each module is compiled once, when a
    # job first imports it (torchrun's launcher or the warm interpreter, before any
    # rank), and only the modules jobs import are: torch's build costs half the CPU.
    uv = find_uv()
    if uv:
        argv = [uv, "pip", "install", "--python", py, *source, "-r", wanted]
    else:
        # Whether pip imports there (from the host python's site, which the environment
        # sees): `import pip` is 20 ms, `pip --version` 0.24 s of its CLI's imports.
        if _run([py, "-c", "import pip"])[0] != 0:
            code, out = _run([py, "-m", "ensurepip", "--default-pip"])
            if code != 0:
                return EnvReady(error="no pip for this python (ensurepip failed)", tail=_tail(out))
        argv = [py, "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
        argv += ["--no-warn-script-location", "--no-compile", *source, "-r", wanted]
    code, out = _run(argv, request.installer_env)  # the job's index, as orch check asks it
    if code != 0:
        return EnvReady(error="installing failed", missing=_missing(out), tail=_tail(out))
    return None


# Where uv's own installer puts it: a non-interactive SSH session's PATH seldom has it.
UV_PLACES = ("~/.local/bin/uv", "~/.cargo/bin/uv")


def find_uv() -> str | None:
    """The host's uv: on PATH, else where its installer puts it; None: pip installs."""
    import shutil

    found = shutil.which("uv")
    if found:
        return found
    for place in UV_PLACES:
        path = os.path.expanduser(place)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _missing(output: str) -> list[str]:
    """The requirements the installer said it could not find (pip's and uv's words)."""
    import re

    found = re.findall(r"No matching distribution found for (\S+)", output)
    found += re.findall(r"Because (\S+) was not found", output)
    return list(dict.fromkeys(found))


def _tail(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()][-TAIL_LINES:]


def _relocate(tmp: str, final: str) -> None:
    """Scripts the installer wrote name the temporary directory (their #! line, the
    activate scripts): name the published one instead, as it will be after the rename."""
    bindir = os.path.join(tmp, "bin")
    old, new = tmp.encode(), final.encode()
    for name in os.listdir(bindir):
        path = os.path.join(bindir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if old in data and b"\0" not in data[:1024]:
            mode = os.stat(path).st_mode & 0o777
            with open(path, "wb") as f:
                f.write(data.replace(old, new))
            os.chmod(path, mode)


def _size(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def listing(root: str) -> list[EnvRow]:
    """Every published environment of this user here, most recently used first."""
    rows = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    for name in names:
        record = os.path.join(root, name, RECORD)
        if name.startswith(".") or not os.path.isfile(record):
            continue
        data = read_json(record) or {}
        requirements = [str(r) for r in data.get("requirements") or []]
        used = os.stat(record).st_mtime
        rows.append(
            EnvRow(
                key=name, size=_size(os.path.join(root, name)), used=used, requirements=requirements
            )
        )
    return sorted(rows, key=lambda r: -r.used)


def collect(root: str, days: float) -> list[str]:
    """Remove the environments unused for `days` (and killed builds' leftovers), each
    under its lock taken without waiting: one being built or checked is left."""
    import fcntl
    import shutil

    removed = []
    horizon = time.time() - days * 86400
    for row in listing(root):
        if row.used >= horizon:
            continue
        fd = os.open(os.path.join(root, row.key + ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # A job may have used it since it was listed (a use touches the record).
                if os.stat(os.path.join(root, row.key, RECORD)).st_mtime >= horizon:
                    continue
            except OSError:
                continue
            gone = os.path.join(root, f"{BUILD_PREFIX}{row.key}-gc")
            try:  # unpublished first, then removed
                os.rename(os.path.join(root, row.key), gone)
            except OSError:  # a host sharing this filesystem collected it meanwhile
                continue
            shutil.rmtree(gone, ignore_errors=True)
            removed.append(row.key)
        finally:
            os.close(fd)
    return removed
