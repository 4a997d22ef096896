"""What the controller asks of a host's agent, each a message built by name on one side
and parsed by name on the other (messages.py): the node template a plan renders, the
start spec, setup, top, outputs, gc, the probe's options, a detached job's keeper and
members, a Slurm job's spec and restart chain, and the code push's H, R and S frames.
(The push's P frames stay the plain four keys in framing.py's table: one a piece, on
the push's hot path.)

The agent parses each at the boundary (`parse_message`): a field it lacks is an error
that names the request and the field; a field a newer controller adds is ignored. A
job's own commands run the agent version that built its snapshot, so a field added
here needs a default, or the older agents of running jobs refuse the request.

Standard library only, valid on Python 3.8, like the rest of the kernel.
"""

from __future__ import annotations

from .messages import Message

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class Request(Message):
    """What the controller sends an agent command: on stdin, in a frame or in an argument."""


class WarmOptions(Request):
    """How a node's supervisor starts warm (agent/node/warm.py): the modules its warm
    process imports ahead and how long it waits unused, or why the job starts cold
    (`off`: `warm: false` in the job, `orch submit --cold`)."""

    off: str | None = None
    preload: Sequence[str] = ()
    idle: float = 600.0


class NodeTemplate(Request):
    """What one host of a job runs wherever it stands in the job (ssh/plan.py
    `node_template`; placement.py `render` places it): the job's command and env with
    their placeholders unexpanded, and the host's python, workdir, env, GPUs, the
    interface and address its peers reach it at. A detached job's keeper renders a
    later attempt from it, on the hosts."""

    job_id: str
    launcher: str  # placement.TORCHRUN, PYTHON or LEGACY_LAUNCH
    entry: Sequence[str]  # ["script", PATH] or ["module", NAME]
    local_rank_arg: str | None = None  # the flag torch.distributed.launch passes
    max_restarts: int = 0
    args: Sequence[str] = ()
    env: dict[str, str]
    host: str
    python: str
    workdir: str
    host_env: dict[str, str]
    gpus: Sequence[int] = ()
    iface: str | None = None
    addr: str | None = None
    warm: WarmOptions | None = None


class LeaseUnits(Request):
    """What a node leases on a shared host (ssh/queue.py `lease_units`): `count` GPUs
    or slots (`kind`) of those in `pool`; a pool of none waits its turn, holds nothing."""

    kind: str  # "gpu" or "slot"
    pool: Sequence[int]
    count: int
    priority: str = "normal"  # the job's priority: (low, normal, high; leases/fairness.py)


class LeaseRequest(LeaseUnits):
    """A node's lease, as its supervisor's start asks for it (agent/leases/holder.py):
    the job, its ticket (submit time and job id: one place in every host's line),
    whether to wait when busy, and whether the node takes its turn alone (a job of one
    node) or its controller says go."""

    job: str
    ticket: Sequence[float | str]
    wait: bool = True
    self_start: bool = True


class StartRequest(Request):
    """`start` (stdin; the supervisor keeps it as NODE_SPEC): the node's torchrun
    command and environment, its lease on a shared host, its warm options. Also what
    `warm ahead` is given, without a lease."""

    argv: Sequence[str]
    env: dict[str, str]
    lease: LeaseRequest | None = None
    warm: WarmOptions | None = None
    python: str | None = None  # the job's environment's python (spawn.py `in_environment`)


class SetupRequest(Request):
    """`setup` (stdin): the job's `setup:` script, its env, and the store marker (`key`)
    that records it done for the code version `manifest`; `python`: the interpreter
    whose `bin/` leads PATH (a job's environment's), None for the agent's own."""

    script: str
    env: dict[str, str]
    store: str
    key: str
    manifest: str
    python: str | None = None


class EnvRequest(Request):
    """`env ensure JOB_DIR` (stdin): the job's environment on this host
    (agent/host/envs.py): its requirements, the wheel directory inside the job's code
    (None: the host's index), the controller's digest of both (models/environment.py),
    and where the host keeps environments; `installer_env`: the job's own settings of
    where packages come from there (PIP_INDEX_URL...), given to the installer's
    environment (never an argv: an index URL may hold a token)."""

    envs: str
    digest: str
    requirements: Sequence[str]
    wheels: str | None = None
    installer_env: dict[str, str] | None = None


class TopRequest(Request):
    """`top` (stdin): the job, and how far the controller read each log stream."""

    job_id: str | None = None
    offsets: dict[str, int] | None = None


class StackRequest(Request):
    """`stack` (stdin): the job, which ranks (None: all of the node's), native frames,
    and py-spy: where the host keeps carried tools and the hash of the controller's
    binary for each machine (`uname -m`) it has one for; `taken` names the dump."""

    job_id: str | None = None
    ranks: Sequence[int] | None = None
    native: bool = False
    tools_dir: str | None = None
    pyspy: Mapping[str, str] | None = None
    taken: str = "stack"
    timeout: float = 10.0
    if_idle: float | None = None  # the watchdog: only where the node has been silent this long


class SlurmTopRequest(Request):
    """`slurm-top` (an argument): the job, and each node's `TopRequest.offsets` by name."""

    job_id: str | None = None
    offsets: dict[str, dict[str, int]] | None = None


class OutputsRequest(Request):
    """`outputs` (stdin): which paths of the output directory to send (globs), and
    what the controller has of them already (path -> [size, mtime_ns])."""

    paths: Sequence[str] = ()
    have: Mapping[str, Sequence[int]] | None = None


class GcRequest(Request):
    """`gc` (its H frame): the workdir to collect, how many ended jobs' snapshots to
    keep, how old an unused object must be to go, and whether ended jobs' outputs go."""

    workdir: str
    keep: int
    grace: float | None = None
    outputs: bool = False


class Placement(Request):
    """Where a job's nodes go (placement.py `placement`): its hosts in node order (the
    first is the master), their process counts, the master's address and port, the
    attempt, and its ticket in the hosts' lines (a restart's: submit time, job id)."""

    hosts: Sequence[str]
    nprocs: Sequence[int]
    master_addr: str
    master_port: int | None
    attempt: int = 0
    ticket: Sequence[float | str] | None = None


class Candidate(Request):
    """A host a detached job's keeper may start a node on: its process count, the
    address its peers reach it at, its workdir."""

    host: str
    nproc: int
    addr: str | None = None
    workdir: str


class KeeperConfig(Request):
    """`keeper start` (stdin): a detached job's keeper (agent/keeper/decisions.py
    `Keeping`): its secret (hex), the job, how many restarts and how long a silent
    member counts as lost, the pinned rendezvous port (None: ask the master), the
    address it listens on (`bind`), its own host, whether attempt 0 waits in line
    ("together" or "alone"), attempt 0's placement, and the hosts it may use, in the
    selection's order."""

    secret: str
    job_id: str
    restarts: int
    lost_after: float
    rendezvous_port: int | None = None
    bind: str
    host: str | None = None
    line: str | None = None
    place: Placement
    candidates: Sequence[Candidate]
    # The stall watchdog (`stall_after:`, docs/STACKS.md), and the py-spy each machine's
    # hosts keep (StackRequest.pyspy): what the keeper asks its members for.
    stall_after: float | None = None
    on_stall: str = "fail"
    pyspy: Mapping[str, str] | None = None
    # Where the job's events go (`notify:`, kernel/notify.py): a shell command, or a
    # webhook's URL, which may hold a token: it travels only here, on stdin.
    notify: str | None = None


class MemberConfig(Request):
    """`keeper member` (stdin): how this host's member of a detached job reaches its
    keeper (`addr`, `port`, `secret` in hex), what it renders a later attempt's node
    from (`template`, the code version `digest` in `store`), where its node of the
    first attempt runs (`node_dir`; None on a spare), and what that node leases."""

    secret: str
    addr: str
    port: int
    template: NodeTemplate
    store: str
    digest: str
    node_dir: str | None = None
    attempt: int = 0
    lost_after: float = 0.0
    lease: LeaseUnits | None = None
    notify: str | None = None  # the job's `notify:`, for a keeper this member becomes


class ProbeOptions(Request):
    """`probe` (an argument, or a bare master address): the address to route to
    (`master`), a port to tell whether it is free, the workdir (free disk there),
    whether to ask nvidia-smi (`gpus`), top-level modules to find, and the marks that
    tell which hosts share the workdir's filesystem (probe.fs_marks)."""

    master: str | None = None
    port: int | None = None
    workdir: str | None = None
    gpus: bool = True
    modules: Sequence[str] = ()
    mark: str | None = None
    look: Sequence[str] = ()
    index: str | None = None  # a package index's URL: whether this host reaches it
    target: bool = False  # say what wheels this python installs (`wheels: download`)


class SlurmNode(Request):
    """One node of a Slurm job, by node rank: its process count, and its args and env
    with the job's placeholders expanded, the master's address and port left as marks
    (kernel/slurm.py) for the node to fill."""

    nproc: int
    args: Sequence[str]
    env: dict[str, str]


class SlurmSpec(Request):
    """`slurm-node` (the job root's spec file, written by slurm/script.py): what every
    node of a Slurm job runs under srun: the job, its interpreter, launcher, pinned
    rendezvous port (None: the master picks one), max_restarts, the entry before the
    user's args, and each node's part."""

    job_id: str
    python: str
    launcher: str = "torchrun"
    port: int | None = None
    max_restarts: int = 0
    entry: Sequence[str]
    nodes: Sequence[SlurmNode]


class SlurmChain(Request):
    """`slurm-attempt` (slurm_chain.CHAIN, written at submit): how many restarts a Slurm
    job has, and the inventory's sbatch options to queue the next attempt with."""

    restarts: int = 0
    sbatch: Sequence[str] = ()


# ---------------------------------------------------------------- the code push (sync)


class PushHeader(Request):
    """`sync`'s H frame, always first: the host's content store, and the push's token
    (it names the push's temporary files there; layout.TOKEN_RE)."""

    store: str
    push: str


class RelayOrder(Request):
    """`sync`'s R frame: fetch `keys` (those the host lacks) from the seed host's relay
    at `addr`:`port`, proving the push's `secret` (hex)."""

    addr: str
    port: int
    secret: str
    keys: Sequence[str] = ()


class SnapshotRequest(Request):
    """`sync`'s S frame: build `job_dir`/code from the manifest `digest`; link the nodes'
    directories beside it where hosts share it (`nodes`); say whether `setup` (a store
    key) ran there already; keep `keep` ended jobs' snapshots when gc runs after it."""

    digest: str
    job_dir: str
    setup: str | None = None
    keep: int | None = None
    nodes: Sequence[str] = ()
    # The job's environment (EnvRequest.digest) and where the host keeps environments:
    # the reply says its python where it is built, in this round trip.
    env: str | None = None
    envs: str | None = None


class RelayConfig(Request):
    """`relay` (stdin): the store to serve, the push's secret (hex), and how many hosts
    will come (0: any number, until the channel closes)."""

    store: str
    secret: str
    expect: int = 0
