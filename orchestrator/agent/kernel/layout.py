"""The job directory and the content store on a host: their names, written once for
the controller and the agent.

**The job directory** `WORKDIR/jobs/<job id>/<host>` (`job_dir`) holds the files named
below. Where hosts share a filesystem, their nodes share one snapshot: code/, agent
and snapshot.json sit one level up, in `WORKDIR/jobs/<job id>` (`job_root`), and each
node's directory links to them. **The content store** `WORKDIR/store` holds
objects/<sha256>[.x] (read-only; `.x` executable), manifests/<digest> and setup/<key>
(done markers); **the agent** is unpacked once per version under `WORKDIR/agent/<version>`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    import re

NODE_SPEC = "node.json"  # argv and env of the node's torchrun
PIDS = "pid.json"  # torchrun's pid and group, the supervisor's pid
EXIT = "exit.json"  # how torchrun ended (ExitRecord)
KILLED = "killed"  # present once orch kill ran
LOGS = "logs"  # rank-N.log and rank-N.pid of every rank
TORCHRUN_LOG = "torchrun.log"
SETUP_LOG = "setup.log"
SUPERVISOR_LOG = "supervisor.log"
CODE = "code"  # the job's snapshot of the pushed tree
OUTPUTS = "outputs"  # beside the nodes' directories: what the job keeps (ORCH_OUTPUT_DIR)
SNAPSHOT = "snapshot.json"  # which manifest code/ was built from
AGENT = "agent"  # link to the agent version that built the snapshot: the job's own
RUN_SCRIPT = "run.py"  # the agent's entry as a script, in each version's directory
# Names a node's directory may not have: a shared snapshot's entries beside it.
SEAL = "seal.json"  # beside snapshot.json, as root: each file's inode and ctime (takeover.py)
RESERVED_NAMES = frozenset({CODE, AGENT, SNAPSHOT, SEAL, OUTPUTS, ".", ".."})
FS_MARKS = "fsmarks"  # WORKDIR/fsmarks/<nonce>: which hosts see one filesystem (probe)
HEARTBEAT_S = 60.0  # a supervisor touches its PIDS file this often while torchrun runs
MEMBER_FILE = "member.json"  # a keeper's member lives in this node directory (touched too)
STACKS = "stacks"  # every stack dump taken of the node's ranks (orch stack), one JSON each
FLIGHT_PREFIX = "nccl-trace-rank-"  # + the rank: PyTorch's NCCL flight-recorder dumps, here
# Where the job's env may name that prefix itself: PyTorch's current name, then the older.
FLIGHT_FILES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PYSPY = "py-spy"  # the tool that reads a rank's stack, kept per hash in `tools_dir`


def job_root(workdir: str, job_id: str) -> str:
    """A job's directory on a host: its nodes' directories, and a shared snapshot."""
    return f"{workdir.rstrip('/')}/jobs/{job_id}"


def job_dir(workdir: str, job_id: str, host: str, attempt: int = 0) -> str:
    """A node's job directory on its host (may start with ~); a restarted job's nodes
    get one per attempt, beside the first: the output directory stays theirs."""
    name = host if attempt == 0 else f"{host}.attempt{attempt}"
    return f"{job_root(workdir, job_id)}/{name}"


def outputs_dir(job_dir: str) -> str:
    """A node's output directory, beside its job directory: kept when gc removes the
    code, and one for every node of a shared filesystem (may start with ~)."""
    return f"{job_dir.rstrip('/').rpartition('/')[0]}/{OUTPUTS}"


def tools_dir(workdir: str) -> str:
    """Where the host keeps the tools orch carries (py-spy), each by its hash, as the
    agent is (may start with ~)."""
    return f"{workdir.rstrip('/')}/tools"


def tool_name(name: str, sha256: str) -> str:
    """A carried tool's file name in `tools_dir`."""
    if not DIGEST_RE.fullmatch(sha256) or not TOKEN_RE.fullmatch(name):
        raise ValueError(f"bad tool {name!r} {sha256!r}")
    return f"{name}-{sha256[:16]}"


def store_dir(workdir: str) -> str:
    """The host's content store (may start with ~)."""
    return f"{workdir.rstrip('/')}/store"


def envs_dir(workdir: str) -> str:
    """Where the host keeps the jobs' virtual environments, each by its key
    (agent/host/envs.py; may start with ~)."""
    return f"{workdir.rstrip('/')}/envs"


def agent_dir(workdir: str) -> str:
    """Where the host keeps each agent version it was sent (may start with ~)."""
    return f"{workdir.rstrip('/')}/agent"


def setup_marker(store: str, key: str) -> str:
    """Where a store records that setup `key` succeeded."""
    if not DIGEST_RE.fullmatch(key):
        raise ValueError(f"bad setup key {key!r}")
    return f"{store}/setup/{key}"


# Content keys: how the store names an object.
KIND_FILE, KIND_EXEC, KIND_LINK, KIND_DIR = "f", "x", "l", "d"


class Pattern:
    """A regular expression compiled on its first match: importing `re` (and `enum`
    with it) cost every host command, most of which match no key, 4 ms of CPU."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def fullmatch(self, text: str) -> re.Match[str] | None:
        if self._compiled is None:
            import re

            self._compiled = re.compile(self.pattern)
        return self._compiled.fullmatch(text)


KEY_RE = Pattern(r"[0-9a-f]{64}(\.x)?")
DIGEST_RE = Pattern(r"[0-9a-f]{64}")
TOKEN_RE = Pattern(r"[0-9A-Za-z_-]{1,64}")


def entry_key(kind: str, value: str) -> str | None:
    """The content-store key of a manifest entry: a file's hash, marked when executable
    (hard links share their mode, so the same bytes with and without the executable
    bit are two objects); None for links and directories."""
    if kind == KIND_FILE:
        return value
    if kind == KIND_EXEC:
        return value + ".x"
    return None
